"""Pipeline schedules as plain data: rank -> ordered list of compute actions (torch's grammar).

One generator per schedule, each equal action for action to the order torch 2.13 runs for the same
(ranks, stages per rank, micro-batches): `pipeline_order` of the multi-stage classes (compute actions only,
DualPipeV's overlapped F/B pairs written as the two actions in order) and the order that
`_step_microbatches` executes for GPipe and 1F1B (Note [1F1B order]). Every schedule, generated or
loaded from a CSV, passes `tfplan.schedule.validate.check_order` before anyone uses it.

Placement: "loop" puts stage s on rank s % P; "v" (ZBV, DualPipeV) puts stages r and 2P-1-r on rank r.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tfplan.errors import TfplanError
from tfplan.schedule.actions import Action, parse_csv
from tfplan.schedule.schedules_v import dualpipev, zbv
from tfplan.schedule.validate import check_order, infer_stage_to_rank

Order = tuple[tuple[Action, ...], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A validated pipeline schedule."""

    name: str
    """Schedule name (`gpipe`, `1f1b`, ...) or `custom` for a user's CSV."""
    num_ranks: int
    """Pipeline ranks P (devices)."""
    num_stages: int
    """Model stages S = P x stages per rank."""
    num_microbatches: int
    """Micro-batches M per training step."""
    order: Order
    """order[r] = rank r's compute actions in execution order."""
    stage_to_rank: tuple[int, ...]
    """stage_to_rank[s] = the rank that holds stage s."""

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.num_ranks

    @property
    def num_actions(self) -> int:
        return sum(len(actions) for actions in self.order)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a named schedule is and what it accepts."""

    name: str
    torch_class: str  # the name torch's get_schedule_class accepts
    description: str
    placement: str  # "loop" or "v"
    min_stages_per_rank: int
    max_stages_per_rank: int | None
    default_stages_per_rank: int
    generate: Callable[[int, int, int], list[list[Action]]]  # (ranks, stages per rank, mbs) -> order


# ---------------------------------------------------------------------------------------------------------
# Single-stage schedules


def _gpipe(p: int, v: int, m: int) -> list[list[Action]]:
    # Fill-drain: every forward, then every backward, in micro-batch order.
    return [[Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)] for r in range(p)]


def _one_f_one_b(p: int, v: int, m: int) -> list[list[Action]]:
    # Note [1F1B order]: torch's _step_microbatches runs min(M, P - r) warm-up forwards, then alternates
    # one backward and one forward until the forwards run out, then drains the backwards. torch 2.13's
    # Schedule1F1B.pipeline_order misnumbers the last rank's forwards, so it is not our ground truth.
    order = []
    for r in range(p):
        warmup = min(m, p - r)
        actions = [Action(r, "F", i) for i in range(warmup)]
        fwd, bwd = warmup, 0
        while True:
            actions.append(Action(r, "B", bwd))
            bwd += 1
            if fwd == m:
                break
            actions.append(Action(r, "F", fwd))
            fwd += 1
        actions.extend(Action(r, "B", i) for i in range(bwd, m))
        order.append(actions)
    return order


# ---------------------------------------------------------------------------------------------------------
# Multi-stage (looped) schedules


def _looped_bfs(p: int, v: int, m: int) -> list[list[Action]]:
    # Breadth first: all micro-batches of the earliest local stage first; backwards in reverse order.
    order = []
    for r in range(p):
        stages = range(r, p * v, p)
        actions = [Action(s, "F", i) for s in stages for i in range(m)]
        actions += [Action(s, "B", i) for s in reversed(stages) for i in reversed(range(m))]
        order.append(actions)
    return order


def _rounds(p: int, m: int) -> int:
    """Micro-batches per round of torch's interleaved schedules (they need M % rounds == 0)."""
    rounds = max(1, m // p)
    return m // rounds


def _interleaved(p: int, v: int, m: int, zero_bubble: bool) -> list[list[Action]]:
    # Depth-first interleaving (Megatron's interleaved 1F1B; with zero_bubble, torch's ZB1P variant that
    # splits backwards into I and W and fills bubbles with W). Phases per rank: warm-up forwards, steady
    # 1F1B(+W), cool-down backwards(+W), then the remaining W.
    return [_interleaved_rank(p, v, m, r, zero_bubble) for r in range(p)]


def _interleaved_rank(p: int, v: int, m: int, r: int, zero_bubble: bool) -> list[Action]:
    per_round = _rounds(p, m)
    hops = 1 if zero_bubble else 2  # extra warm-up forwards per hop away from the last rank
    warmup = min((v - 1) * per_round + hops * (p - 1 - r), m * v)
    total = m * v  # forwards (= backwards) on this rank
    bwd_kind = "I" if zero_bubble else "B"
    first_w_after = r  # zero bubble: steady steps before W starts (torch's num_1f1b_microbatches)

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % v) * p + r

    def bwd_stage(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * p + r

    next_mb: dict[tuple[int, str], int] = {}

    def take(stage: int, kind: str) -> Action:
        mb = next_mb.get((stage, kind), 0)
        next_mb[(stage, kind)] = mb + 1
        return Action(stage, kind, mb)

    actions: list[Action] = []
    bwd_steps: list[int] = []  # steps whose backward ran, in order; W follows the same order
    w_done = 0
    for step in range(total + warmup):
        if step < total:
            actions.append(take(fwd_stage(step), "F"))
        if step >= warmup:
            actions.append(take(bwd_stage(step), bwd_kind))
            bwd_steps.append(step)
            if zero_bubble and step - warmup >= first_w_after:
                actions.append(take(bwd_stage(bwd_steps[w_done]), "W"))
                w_done += 1
    if zero_bubble:
        actions.extend(take(bwd_stage(step), "W") for step in bwd_steps[w_done:])
    return actions


def _interleaved_1f1b(p: int, v: int, m: int) -> list[list[Action]]:
    return _interleaved(p, v, m, zero_bubble=False)


def _interleaved_zb(p: int, v: int, m: int) -> list[list[Action]]:
    return _interleaved(p, v, m, zero_bubble=True)


SCHEDULES: dict[str, ScheduleSpec] = {
    spec.name: spec
    for spec in (
        ScheduleSpec("gpipe", "GPipe", "fill-drain: all forwards, then all backwards", "loop", 1, 1, 1, _gpipe),
        ScheduleSpec(
            "1f1b",
            "1F1B",
            "one forward, one backward in steady state (needs M >= P)",
            "loop",
            1,
            1,
            1,
            _one_f_one_b,
        ),
        ScheduleSpec(
            "interleaved-1f1b",
            "Interleaved1F1B",
            "1F1B over V >= 2 looped stages per rank, depth first",
            "loop",
            2,
            None,
            2,
            _interleaved_1f1b,
        ),
        ScheduleSpec(
            "looped-bfs",
            "LoopedBFS",
            "looped stages per rank, breadth first (all mbs of a stage at once)",
            "loop",
            1,
            None,
            2,
            _looped_bfs,
        ),
        ScheduleSpec(
            "interleaved-zb",
            "InterleavedZeroBubble",
            "interleaved with split I/W backwards (ZB1P)",
            "loop",
            1,
            None,
            2,
            _interleaved_zb,
        ),
        ScheduleSpec(
            "zbv",
            "ZBVZeroBubble",
            "zero bubble with V placement, 2 stages per rank, split I/W",
            "v",
            2,
            2,
            2,
            zbv,
        ),
        ScheduleSpec(
            "dualpipev",
            "DualPipeV",
            "DeepSeek DualPipe folded into a V, 2 stages per rank (needs M >= 2P)",
            "v",
            2,
            2,
            2,
            dualpipev,
        ),
    )
}

_ALIASES = {spec.torch_class.lower(): name for name, spec in SCHEDULES.items()} | {
    "interleaved1f1b": "interleaved-1f1b",
    "zb": "interleaved-zb",
    "zero-bubble": "interleaved-zb",
}


def get_spec(name: str) -> ScheduleSpec:
    """Look a schedule up by our name or torch's class name, case-insensitively."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in SCHEDULES:
        raise TfplanError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    return SCHEDULES[key]


def stage_to_rank(placement: str, num_ranks: int, num_stages: int) -> tuple[int, ...]:
    """Which rank holds each stage: loop (s % P) or V (down the ranks, then back up).

    >>> stage_to_rank("v", 2, 4)
    (0, 1, 1, 0)
    """
    if placement == "loop":
        return tuple(s % num_ranks for s in range(num_stages))
    assert placement == "v" and num_stages % num_ranks == 0
    return tuple(
        s % num_ranks if (s // num_ranks) % 2 == 0 else num_ranks - 1 - s % num_ranks for s in range(num_stages)
    )


MAX_ACTIONS = 100_000_000  # a typo's 10**20 micro-batches filled the memory; 1e8 is 100x the largest plan measured


def check_arguments(spec: ScheduleSpec, num_ranks: int, stages_per_rank: int, num_microbatches: int) -> None:
    """Reject (ranks, stages per rank, micro-batches) that the schedule (or torch's class) cannot run."""
    if num_ranks < 1:
        raise TfplanError(f"ranks must be >= 1, got {num_ranks}")
    if num_microbatches < 1:
        raise TfplanError(f"micro-batches must be >= 1, got {num_microbatches}")
    lo, hi = spec.min_stages_per_rank, spec.max_stages_per_rank
    if stages_per_rank < lo or (hi is not None and stages_per_rank > hi):
        allowed = f"exactly {lo}" if lo == hi else f">= {lo}" if hi is None else f"{lo}..{hi}"
        raise TfplanError(f"schedule {spec.name} needs {allowed} stages per rank, got {stages_per_rank}")
    p, m = num_ranks, num_microbatches
    if (actions := 3 * p * stages_per_rank * m) > MAX_ACTIONS:  # at most F, I and W per (stage, micro-batch)
        raise TfplanError(f"{p} ranks x {stages_per_rank} stages per rank x {m} micro-batches is up to {actions:,} "
                          f"actions, over the {MAX_ACTIONS:,} a schedule may have (a million take about 1.4 GB)")
    if spec.name == "1f1b" and m < p:
        raise TfplanError(f"schedule 1f1b needs at least as many micro-batches as ranks ({p}), got {m}")
    if spec.name in ("interleaved-1f1b", "interleaved-zb"):
        rounds = max(1, m // p)
        if m % rounds:
            raise TfplanError(
                f"schedule {spec.name} needs micro-batches to be a multiple of the rounds max(1, M // P) = "
                f"{rounds} (as torch does), got M = {m} with P = {p}; try M = {rounds * (m // rounds)} or a "
                f"multiple of {p}"
            )
    if spec.name == "dualpipev" and m < 2 * p:
        raise TfplanError(f"schedule dualpipev needs at least as many micro-batches as stages ({2 * p}), got {m}")


def generate(name: str, num_ranks: int, num_microbatches: int, stages_per_rank: int | None = None) -> Schedule:
    """Generate and validate a named schedule.

    Args:
        name: a schedule name from SCHEDULES (or torch's class name).
        num_ranks: pipeline ranks P.
        num_microbatches: micro-batches M per step.
        stages_per_rank: V; None takes the schedule's default.

    Raises:
        TfplanError: unknown schedule or arguments it cannot run.
    """
    spec = get_spec(name)
    v = spec.default_stages_per_rank if stages_per_rank is None else stages_per_rank
    check_arguments(spec, num_ranks, v, num_microbatches)
    order = spec.generate(num_ranks, v, num_microbatches)
    mapping = stage_to_rank(spec.placement, num_ranks, num_ranks * v)
    check_order(order, num_ranks * v, num_microbatches, expected_stage_to_rank=mapping)
    return Schedule(
        name=spec.name,
        num_ranks=num_ranks,
        num_stages=num_ranks * v,
        num_microbatches=num_microbatches,
        order=tuple(tuple(actions) for actions in order),
        stage_to_rank=mapping,
    )


def from_order(order: list[list[Action]], name: str = "custom", num_microbatches: int | None = None) -> Schedule:
    """Build a validated Schedule from a per-rank order (a user's custom schedule).

    The stage count is inferred (largest stage + 1), as is the micro-batch count unless given.
    """
    actions = [a for rank in order for a in rank]
    if not actions:
        raise TfplanError("schedule has no actions")
    num_stages = max(a.stage for a in actions) + 1
    inferred_m = max(a.mb for a in actions) + 1
    m = inferred_m if num_microbatches is None else num_microbatches
    check_order(order, num_stages, m)
    return Schedule(
        name=name,
        num_ranks=len(order),
        num_stages=num_stages,
        num_microbatches=m,
        order=tuple(tuple(rank) for rank in order),
        stage_to_rank=infer_stage_to_rank(order, num_stages),
    )


def action_names(schedule: Schedule) -> list[list[str]]:
    """Per rank, its actions in torch's grammar (str(Action), without a method call per action; tfplan.plan.plan.write
    names a million actions once for both its JSON and its CSV)."""
    return [[f"{stage}{kind}{mb}" for stage, kind, mb in actions] for actions in schedule.order]


def to_csv(schedule: Schedule, names: list[list[str]] | None = None) -> str:
    """The schedule as torch's compute-only CSV: one row per rank, one action per cell; `names`: action_names of
    the schedule, when the caller has them. An action's name never needs quoting (digits and one letter)."""
    rows = action_names(schedule) if names is None else names
    return "".join(",".join(row) + "\n" for row in rows)


def load_csv(path: str, num_microbatches: int | None = None) -> Schedule:
    """Read and validate a user's schedule CSV (torch's compute-only format).

    Raises:
        TfplanError: unreadable file, bad cell, invalid schedule, or a micro-batch count that differs from
            `num_microbatches` when that is given.
    """
    try:
        with open(path, newline="") as f:
            text = f.read()
    except FileNotFoundError:
        raise TfplanError(f"schedule CSV not found: {path}") from None
    except OSError as exc:
        raise TfplanError(f"cannot read schedule CSV {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TfplanError(f"{path}: not a UTF-8 text file (byte {exc.start}); is it really a schedule CSV?") from None
    order = parse_csv(text, source=str(path))
    schedule = from_order(order, name="custom")
    if num_microbatches is not None and schedule.num_microbatches != num_microbatches:
        raise TfplanError(
            f"{path}: the schedule runs {schedule.num_microbatches} micro-batches but --microbatches is "
            f"{num_microbatches}"
        )
    return schedule
