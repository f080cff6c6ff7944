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

from tfplan.schedule.actions import parse_action
from tfrun.config.train_config import KEPT_STEPS


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
    """Collects ActionTimes for the actions this rank runs, and spans of other per-step work (the optimizer),
    only while `enabled` and on a `measured` process. Records are kept per step, the newest `kept_steps` timed
    steps, so that adding one and reading a window of steps cost O(1) in the run's length."""

    def __init__(self, rank: int, device: torch.device, measured: bool = True, kept_steps: int = KEPT_STEPS) -> None:
        self.rank = rank
        self.measured = measured
        """Whether this process's times are the run's measurement: with data parallelism only replica 0's
        (every replica runs the same schedule; interleaving two replicas' actions of one pipeline rank would
        make negative gaps and overwrite each other's actions). Other processes record nothing."""
        self.cuda = device.type == "cuda"
        self.enabled = False
        self.step = -1
        self.kept_steps = kept_steps
        self._records: dict[int, list[ActionTime]] = {}
        """Step -> its compute actions, oldest step first."""
        self._spans: dict[int, list[ActionTime]] = {}
        """Step -> other work, named in `action` (e.g. "optimizer": its step and zero_grad)."""
        self._t0 = 0.0
        self._pending: list[tuple[list, str, object, object]] = []  # CUDA: (target, name, start, end event)
        self._origin = None

    @property
    def records(self) -> list[ActionTime]:
        """Every kept compute action, oldest step first."""
        return [r for rows in self._records.values() for r in rows]

    @property
    def spans(self) -> list[ActionTime]:
        """Every kept span of other work, oldest step first."""
        return [r for rows in self._spans.values() for r in rows]

    def window(self, first: int, end: int) -> tuple[list[ActionTime], list[ActionTime]]:
        """(compute actions, spans) of the kept steps in [first, end)."""
        steps = range(max(first, 0), end)
        return ([r for s in steps for r in self._records.get(s, ())],
                [r for s in steps for r in self._spans.get(s, ())])

    def restore(self, records: list[ActionTime], spans: list[ActionTime]) -> None:
        """Put back records taken before a resume (tfrun.freeze.online keeps its measuring steps' in the checkpoint)."""
        for target, rows in ((self._records, records), (self._spans, spans)):
            for r in sorted(rows, key=lambda r: r.step):
                target.setdefault(r.step, []).append(r)

    def begin_step(self, step: int) -> None:
        """Mark the step start (call right after a barrier)."""
        self.step = step
        if self.cuda:
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin.record()
        self._t0 = time.perf_counter()

    def end_step(self) -> None:
        """Resolve CUDA events into ActionTimes (synchronises the device once); drop the oldest kept step
        beyond `kept_steps`."""
        if self.cuda and self._pending:
            torch.cuda.synchronize()
            for target, name, start, end in self._pending:
                target.append(ActionTime(self.step, name, self.rank, self._origin.elapsed_time(start),
                                         self._origin.elapsed_time(end)))
            self._pending.clear()
        for kept in (self._records, self._spans):
            while len(kept) > self.kept_steps:
                del kept[next(iter(kept))]

    def time(self, action: str, fn, *args, **kwargs):
        """Run fn(*args, **kwargs), recording its span as compute action `action` when enabled."""
        return self._timed(self._records, action, fn, *args, **kwargs)

    def span(self, name: str, fn, *args, **kwargs):
        """Run fn(*args, **kwargs), recording its span under `name` in `spans` when enabled."""
        return self._timed(self._spans, name, fn, *args, **kwargs)

    def extend_last(self, fn, *args, **kwargs):
        """Run fn(*args, **kwargs) and count its time in the action recorded last: the runtime computes the
        last stage's loss right after that stage's forward, outside forward_one_chunk, and the loss belongs to
        the F action (its time would otherwise fall between actions, where the DAG does not see it)."""
        out = fn(*args, **kwargs)
        if not (self.enabled and self.measured):
            return out
        current = self._records.get(self.step)
        if self.cuda and self._pending and self._pending[-1][0] is current:
            target, name, start, _ = self._pending[-1]
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending[-1] = (target, name, start, end)
        elif not self.cuda and current:
            r = current[-1]
            current[-1] = ActionTime(r.step, r.action, r.rank, r.start_ms, (time.perf_counter() - self._t0) * 1e3)
        return out

    def _timed(self, by_step: dict[int, list[ActionTime]], name: str, fn, *args, **kwargs):
        if not (self.enabled and self.measured):
            return fn(*args, **kwargs)
        target = by_step.setdefault(self.step, [])
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            self._pending.append((target, name, start, end))
            return out
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        target.append(ActionTime(self.step, name, self.rank, (t - self._t0) * 1e3,
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


def makespans(records: Iterable[ActionTime]) -> dict[int, float]:
    """Step -> measured makespan (last end - first start, ms)."""
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
    for r in records:
        lo[r.step] = min(lo.get(r.step, r.start_ms), r.start_ms)
        hi[r.step] = max(hi.get(r.step, r.end_ms), r.end_ms)
    return {s: hi[s] - lo[s] for s in lo}


def spread(values: Sequence[float]) -> float:
    """Relative spread (p75 - p25) / median of a sample (0 for fewer than 4 values or a zero median).

    >>> spread([1.0, 2.0, 3.0, 4.0, 100.0])
    0.6666666666666666
    """
    if len(values) < 4:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    med = statistics.median(values)
    return (q[2] - q[0]) / med if med > 0 else 0.0


def stats_by_stage_kind(records: Iterable[ActionTime]) -> dict[tuple[int, str], tuple[float, float]]:
    """(stage, kind) -> (median duration ms, relative spread) over every micro-batch and step."""
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in records:
        stage, kind, _ = parse_action(r.action)
        groups[(stage, kind)].append(r.duration_ms)
    return {k: (statistics.median(v), spread(v)) for k, v in groups.items()}


def action_table(records: Iterable[ActionTime]) -> dict[str, dict]:
    """Action -> its rank, median start and duration (ms from the step start), relative spread of the
    duration and number of samples: what `tfplan explain` lines up with a plan's predictions."""
    groups: dict[str, list[ActionTime]] = defaultdict(list)
    for r in records:
        groups[r.action].append(r)
    return {a: {"rank": rs[0].rank, "start_ms": statistics.median(r.start_ms for r in rs),
                "duration_ms": statistics.median(r.duration_ms for r in rs),
                "spread": spread([r.duration_ms for r in rs]), "n": len(rs)}
            for a, rs in sorted(groups.items())}


STEP_DURATIONS_KEPT = 200
"""Steps whose own durations timings.json keeps (the last ones): a median's worth, and a bounded file (8 ranks x
M = 64 x F, I, W is 1536 actions a step: 200 steps are about 2.5 MB)."""


def step_durations(records: Iterable[ActionTime], kept: int = STEP_DURATIONS_KEPT) -> dict:
    """The last `kept` timed steps' action durations: {"actions": [names, sorted], "ms": {step: [ms per action,
    in that order]}}, rounded to 1 us. `tfplan explain` replays each step on the DAG, which separates the waits that
    come from action times varying between steps (the longest path of each step's own times is longer than
    the path of the median times) from idle time the DAG does not explain. Steps that lack an action (a
    rank's records cut short) are left out."""
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for r in records:
        by_step[r.step][r.action] = r.duration_ms
    names = sorted({a for row in by_step.values() for a in row})
    complete = [(step, row) for step, row in sorted(by_step.items()) if len(row) == len(names)][-kept:]
    return {"actions": names, "ms": {str(step): [round(row[a], 3) for a in names] for step, row in complete}}


def _rank_sequences(records: Iterable[ActionTime]) -> dict[tuple[int, int], list[ActionTime]]:
    """(step, rank) -> that rank's actions of that step in execution order."""
    per_rank: dict[tuple[int, int], list[ActionTime]] = defaultdict(list)
    for r in records:
        per_rank[(r.step, r.rank)].append(r)
    for items in per_rank.values():
        items.sort(key=lambda r: r.start_ms)
    return per_rank


def _cross_rank_source(action: str, stage_to_rank: Sequence[int]) -> list[str]:
    """The actions on other ranks whose output `action` waits for (DAG pipeline edges)."""
    stage, kind, mb = parse_action(action)
    if kind == "F" and stage > 0:
        sources = [f"{stage - 1}F{mb}"]
    elif kind in "BI" and stage < len(stage_to_rank) - 1:
        sources = [f"{stage + 1}B{mb}", f"{stage + 1}I{mb}"]
    else:
        return []
    return [a for a in sources if stage_to_rank[parse_action(a).stage] != stage_to_rank[stage]]


def dispatch_ms(records: Sequence[ActionTime], stage_to_rank: Sequence[int]) -> float:
    """Median gap between consecutive compute actions of a rank when the second waits for nothing from
    another rank: the executor's own cost per action (bookkeeping, posting sends and receives). 0 when
    nothing qualifies."""
    gaps = [b.start_ms - a.end_ms for items in _rank_sequences(records).values() for a, b in zip(items, items[1:])
            if not _cross_rank_source(b.action, stage_to_rank)]
    return statistics.median(gaps) if gaps else 0.0


def p2p_latency_ms(records: Sequence[ActionTime], stage_to_rank: Sequence[int], dispatch: float = 0.0) -> float:
    """Median hand-over latency between stages on different ranks, measured where the receiver was idle.

    For a forward F(s, m) -> F(s+1, m) (and a backward B/I(s+1, m) -> B/I(s, m)) across ranks, if the
    receiving rank finished its previous action before the sender finished, the receiver's start minus the
    sender's end is the transfer latency plus the receiver's dispatch cost, which the DAG already counts in
    the action (`dispatch`, subtracted). Returns 0 when nothing qualifies.
    """
    by_key: dict[tuple[int, str], ActionTime] = {(r.step, r.action): r for r in records}
    prev_end: dict[tuple[int, str], float] = {}
    for items in _rank_sequences(records).values():
        for a, b in zip(items, items[1:]):
            prev_end[(b.step, b.action)] = a.end_ms
    lags = []
    for r in records:
        for src_name in _cross_rank_source(r.action, stage_to_rank):
            src = by_key.get((r.step, src_name))
            if src is not None and prev_end.get((r.step, r.action), 0.0) <= src.end_ms:
                lags.append(r.start_ms - src.end_ms)
    return max(0.0, statistics.median(lags) - dispatch) if lags else 0.0


def rank_tails(records: Iterable[ActionTime], spans: Iterable[ActionTime]) -> dict[int, float]:
    """Rank -> median over steps of (its optimizer span's end - its last action's end), ms: the rank's tail."""
    last: dict[tuple[int, int], float] = {}
    for r in records:
        last[(r.step, r.rank)] = max(last.get((r.step, r.rank), r.end_ms), r.end_ms)
    tails: dict[int, list[float]] = defaultdict(list)
    for sp in spans:
        if sp.action == "optimizer" and (sp.step, sp.rank) in last:
            tails[sp.rank].append(max(0.0, sp.end_ms - last[(sp.step, sp.rank)]))
    return {rank: statistics.median(v) for rank, v in sorted(tails.items())}
