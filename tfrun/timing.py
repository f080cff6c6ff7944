"""Per-action timing on every rank, gathered to rank 0 in float64.

CPU: `time.perf_counter` (CLOCK_MONOTONIC, one clock for every process of a host) around each compute call,
relative to the step's start taken right after a barrier, so ranks' timelines line up to within the barrier's
skew. GPU: CUDA events around each call, read after the step (no synchronisation inside the step), placed on
the same timeline through one event recorded at the step start.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from tfplan.actions import parse_action


@dataclass(frozen=True, slots=True)
class ActionTime:
    """One executed compute action of one step. Times in ms from the step start."""

    step: int
    action: str
    """torch grammar, e.g. "1B3"."""
    rank: int
    start_ms: float
    end_ms: float

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


class ActionTimer:
    """Collects ActionTimes for the actions this rank runs (only while `enabled`)."""

    def __init__(self, rank: int, device: torch.device) -> None:
        self.rank = rank
        self.cuda = device.type == "cuda"
        self.enabled = False
        self.step = -1
        self.records: list[ActionTime] = []
        self._t0 = 0.0
        self._pending: list[tuple[str, object, object]] = []  # CUDA: (action, start event, end event)
        self._origin = None

    def begin_step(self, step: int) -> None:
        """Mark the step start (call right after a barrier)."""
        self.step = step
        if self.cuda:
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin.record()
        self._t0 = time.perf_counter()

    def end_step(self) -> None:
        """Resolve CUDA events into ActionTimes (synchronises the device once)."""
        if self.cuda and self._pending:
            torch.cuda.synchronize()
            for action, start, end in self._pending:
                self.records.append(ActionTime(self.step, action, self.rank, self._origin.elapsed_time(start),
                                               self._origin.elapsed_time(end)))
            self._pending.clear()

    def time(self, action: str, fn, *args, **kwargs):
        """Run fn(*args, **kwargs), recording its span as `action` when enabled."""
        if not self.enabled:
            return fn(*args, **kwargs)
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            self._pending.append((action, start, end))
            return out
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        self.records.append(ActionTime(self.step, action, self.rank, (t - self._t0) * 1e3,
                                       (time.perf_counter() - self._t0) * 1e3))
        return out


def gather_records(records: list[ActionTime], group=None) -> list[ActionTime] | None:
    """All ranks' records on rank 0 (None elsewhere). Python floats are float64 end to end."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return list(records)
    rows = [(r.step, r.action, r.rank, r.start_ms, r.end_ms) for r in records]
    out = [None] * dist.get_world_size(group) if dist.get_rank(group) == 0 else None
    dist.gather_object(rows, out, dst=0, group=group)
    if out is None:
        return None
    return [ActionTime(*row) for rank_rows in out for row in rank_rows]


def medians_by_stage_kind(records: Iterable[ActionTime]) -> dict[tuple[int, str], float]:
    """(stage, kind) -> median duration (ms) over every micro-batch and step."""
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in records:
        stage, kind, _ = parse_action(r.action)
        groups[(stage, kind)].append(r.duration_ms)
    return {k: statistics.median(v) for k, v in groups.items()}


def medians_by_action(records: Iterable[ActionTime]) -> dict[str, float]:
    """Action string -> median duration (ms) over steps."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r in records:
        groups[r.action].append(r.duration_ms)
    return {k: statistics.median(v) for k, v in groups.items()}


def makespans(records: Iterable[ActionTime]) -> dict[int, float]:
    """Step -> measured makespan (last end - first start, ms)."""
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
    for r in records:
        lo[r.step] = min(lo.get(r.step, r.start_ms), r.start_ms)
        hi[r.step] = max(hi.get(r.step, r.end_ms), r.end_ms)
    return {s: hi[s] - lo[s] for s in lo}


def p2p_latency_ms(records: Sequence[ActionTime], stage_to_rank: Sequence[int]) -> float:
    """Median hand-over latency between stages on different ranks, measured where the receiver was idle.

    For a forward F(s, m) -> F(s+1, m) (and a backward B/I(s+1, m) -> B/I(s, m)) across ranks, if the
    receiving rank finished its previous action before the sender finished, the receiver's start minus the
    sender's end is the transfer latency (plus scheduling jitter). Returns 0 when nothing qualifies.
    """
    by_key: dict[tuple[int, str], ActionTime] = {(r.step, r.action): r for r in records}
    prev_end: dict[tuple[int, str], float] = {}
    per_rank: dict[tuple[int, int], list[ActionTime]] = defaultdict(list)
    for r in records:
        per_rank[(r.step, r.rank)].append(r)
    for items in per_rank.values():
        items.sort(key=lambda r: r.start_ms)
        for a, b in zip(items, items[1:]):
            prev_end[(b.step, b.action)] = a.end_ms
    lags = []
    for r in records:
        stage, kind, mb = parse_action(r.action)
        if kind == "F" and stage > 0:
            sources = [f"{stage - 1}F{mb}"]
        elif kind in "BI" and stage < len(stage_to_rank) - 1:
            sources = [f"{stage + 1}B{mb}", f"{stage + 1}I{mb}"]
        else:
            continue
        for src_name in sources:
            src = by_key.get((r.step, src_name))
            if src is None or stage_to_rank[parse_action(src_name).stage] == stage_to_rank[stage]:
                continue
            if prev_end.get((r.step, r.action), 0.0) <= src.end_ms:
                lags.append(max(0.0, r.start_ms - src.end_ms))
    return statistics.median(lags) if lags else 0.0
