"""Exact timing of a DAG for given action durations: start/end of every action, makespan, bubbles and
the critical path.

Every action starts as soon as all its predecessors (plus lags) have ended: the earliest-start schedule,
which is also what a rank executing its list in order does. One pass over a topological order with three
predecessor slots per node; pure Python lists run it at a few million actions per second
(benchmarks/simulate_scale.py), faster than numpy for these scalar recurrences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tfplan.step.dag import Dag

_TIGHT = 1e-9  # relative tolerance when walking back along tight edges


@dataclass(frozen=True, kw_only=True, slots=True)
class Simulation:
    """Timing of one training step. Times in ms from the step's start."""

    start_ms: list[float]
    """Start of each node."""
    end_ms: list[float]
    """End of each node."""
    makespan_ms: float
    """The DAG's step time: the latest rank end plus that rank's tail (tfplan.step.dag Note [rank tails])."""
    actions_end_ms: float
    """End of the last action (= makespan_ms when every tail is 0)."""
    step_overhead_ms: float
    """Time per step outside the DAG (profile's step_overhead_ms)."""
    busy_ms: list[float]
    """Per rank: sum of its action durations."""
    critical_path: list[int]
    """Nodes on one longest path, first to last (ties broken by predecessor slot order)."""

    @property
    def batch_time_ms(self) -> float:
        """Predicted time of one training step: makespan plus the per-step overhead."""
        return self.makespan_ms + self.step_overhead_ms

    @property
    def idle_ms(self) -> list[float]:
        """Per rank: makespan minus busy time (bubbles, including before its first and after its last action)."""
        return [self.makespan_ms - b for b in self.busy_ms]

    @property
    def bubble_fraction(self) -> float:
        """Idle time over (ranks x makespan)."""
        if self.makespan_ms <= 0:
            return 0.0
        return sum(self.idle_ms) / (len(self.busy_ms) * self.makespan_ms)


def earliest_starts(topo: Sequence[int], preds: Sequence[Sequence[int]], lags: Sequence[Sequence[float]],
                    dur: Sequence[float]) -> tuple[list[float], list[float]]:
    """The forward pass of the longest-path recurrence, start_v = max over v's three predecessor slots of
    (end_u + lag), in topological order: (start, end) per action in ms. `preds` and `lags` are the DAG's three
    slots (tfplan.step.dag: -1 and 0.0 where a slot is empty). Pure Python over plain lists, the hot loop of every
    simulation (about 3 s per million actions on a busy 2-core machine); tfplan.solve.fastlp's windows use it too."""
    p0, p1, p2 = preds
    l0, l1, l2 = lags
    # end has one extra slot, end[n] = end[-1] = 0.0, so that a missing predecessor (-1) reads 0.
    end = [0.0] * (len(dur) + 1)
    start = [0.0] * len(dur)
    for v in topo:
        s = end[p0[v]] + l0[v]
        c = end[p1[v]] + l1[v]
        if c > s:
            s = c
        c = end[p2[v]] + l2[v]
        if c > s:
            s = c
        start[v] = s
        end[v] = s + dur[v]
    end.pop()
    return start, end


def simulate(dag: Dag, durations: Sequence[float] | None = None) -> Simulation:
    """Earliest start times of every action.

    Args:
        dag: the action graph.
        durations: per-node durations in ms; None = nothing frozen (d_max).
    """
    dur = dag.d_max if durations is None else durations
    n = dag.num_nodes
    assert len(dur) == n
    # A job simulates the unfrozen step and its plan more than once (fastlp, the predictions, the view): the
    # Dag's memo keeps the unfrozen simulation and the last other one, with a copy of its durations.
    memo = dag.memo
    if durations is not None and not isinstance(durations, list):
        durations = list(durations)  # compared with == below
    if durations is None or durations == dag.d_max:
        if "unfrozen" not in memo:
            memo["unfrozen"] = _simulate(dag, dag.d_max)
        return memo["unfrozen"]
    last = memo.get("last")
    if last is None or last[0] != durations:
        last = memo["last"] = (list(durations), _simulate(dag, durations))
    return last[1]


def _simulate(dag: Dag, dur: Sequence[float]) -> Simulation:
    n = dag.num_nodes
    start, end = earliest_starts(dag.topo, dag.preds, dag.lags, dur)
    finish = dag.finish() if n else []
    # A rank runs its actions one after another, so its last one ends last: the latest end is among the ranks'
    # last actions, and a rank's busy time is the sum of its slice of the durations (nodes are numbered rank
    # by rank). Both in C, where a loop over a million actions took 0.2 s per simulation.
    bounds = dag.rank_bounds()
    actions_end = max([end[hi - 1] for lo, hi in bounds if hi > lo], default=0.0)
    makespan = max([actions_end] + [end[u] + tail for u, tail in finish])
    busy = [math.fsum(dur[lo:hi]) for lo, hi in bounds]
    return Simulation(
        start_ms=start,
        end_ms=end,
        makespan_ms=makespan,
        actions_end_ms=actions_end,
        step_overhead_ms=dag.step_overhead_ms,
        busy_ms=busy,
        critical_path=_critical_path(dag, start, end, finish),
    )


def _critical_path(dag: Dag, start: list[float], end: list[float], finish: list[tuple[int, float]]) -> list[int]:
    """Walk back from the node that finishes the step (its end plus its rank's tail is the makespan) along
    predecessors whose end + lag equals the start."""
    if not end:
        return []
    v = max(finish, key=lambda f: (end[f[0]] + f[1], -f[0]))[0]
    path = [v]
    while True:
        for slot, lags in zip(dag.preds, dag.lags):
            u = slot[v]
            if u >= 0 and math.isclose(end[u] + lags[v], start[v], rel_tol=_TIGHT, abs_tol=1e-9):
                break
        else:
            break  # nothing binds: v starts at time 0
        path.append(u)
        v = u
    return path[::-1]
