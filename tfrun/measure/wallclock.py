"""A run's wall time, step by step, with nothing left out but evaluation.

Note [wall time]: a step's `step_time_ms` (metrics.jsonl) is its compute: from the barrier before the
schedule to the barrier after the optimizer. What a user waits for also holds the work between steps: the
freezer's bookkeeping, the gathers for metrics, the online mode's solves and drift checks (tfrun.freeze.online,
tfrun.freeze.drift), metrics writes and checkpoints. Each step row therefore also carries `wall_ms`: the time from
the previous row's close (or the training loop's start) to this row's close, less the evaluation done in
between, which is recorded apart as the row's `eval_ms` (every method evaluates alike, so comparisons
leave it out, and say so). A row closes after the step's own between-step work (solve, drift check) and
before its metrics write and checkpoint, which therefore count in the next row. The rows' wall_ms add up to
the training time from the loop's start to the last row's close: no interval is counted twice or dropped.
`tfrun compare` takes that sum as a run's training time.
"""

from __future__ import annotations

import time


class WallClock:
    """Closes one row's wall time at a time, evaluation excluded (Note [wall time])."""

    def __init__(self) -> None:
        self._mark = time.perf_counter()
        self._excluded_s = 0.0

    def excluded(self, fn, *args, **kwargs):
        """Run fn(*args, **kwargs) outside the training time; returns (its result, its ms)."""
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds = time.perf_counter() - t0
        self._excluded_s += seconds
        return out, seconds * 1e3

    def close(self) -> float:
        """The ms since the last close (or the start), less what was excluded meanwhile; starts the next."""
        now = time.perf_counter()
        wall = (now - self._mark - self._excluded_s) * 1e3
        self._mark, self._excluded_s = now, 0.0
        return wall
