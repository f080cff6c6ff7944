"""The TimelyFreeze linear program (METHOD.md section 4) and what its two backends share.

The backends: tfplan.solve.solver (OR-Tools GLOP on the full LP, the reference) and tfplan.solve.fastlp (periodic
compression, certified by a dual bound, for large plans). Neither imports the other; both import this module,
and so does tfplan.plan.plan, which therefore loads a plan without OR-Tools.

The LP. Variables: a start time t_v >= 0 per action, a freeze ratio r_a in [0, 1] per action of a freeze group
(Note [freeze groups] in tfplan.step.dag), and the makespan T. Duration d_a = d_max - r_a (d_max - d_min).
  precedence   t_v >= t_u + d_u + lag(u, v)          for every edge (u, v) (precedence_rows)
  finish       T   >= t_u + d_u                       for every action without successors
  cap          sum_{a in A_s} r_a <= c_s |A_s|        for every stage s (mean ratio <= cap)
A_s is stage s's freeze group (Dag.freeze_groups).

Note [three-phase LP]: a lexicographic objective without big-M.
  phase 1  makespan      min T                                                          -> T1
  phase 2  total_freeze  min sum_a r_a    s.t. T <= T1 (1 + 1e-9) (or the target)      -> R2
  phase 3  even_spread   min sum_a |r_a - mu_s|   s.t. also sum_a r_a <= R2 (1 + 1e-9) + 1e-9,
                           |A_s| mu_s = sum_{a in A_s} r_a        (mu_s: stage s's mean ratio)
Phase 2 freezes nothing that buys no time. Once a cap binds, phase 2's optimum is degenerate: a simplex solver
returns a vertex (most of a stage's actions at 1.0, one fractional), a different one per engine. Phase 3 picks
the most even plan among the equally fast, equally light ones: it minimises the total absolute deviation of
every ratio from its own stage's mean, so a stage that must freeze 5.2 actions' worth over 8 equivalent
actions gets 8 x 0.65 rather than 5 x 1.0 + 0.2 wherever the schedule allows it. Its value is the LP's
optimum, so every backend reports the same one (the plan itself can still differ where the optimum is not
unique, but only among equally even plans). The earlier phase 3, min sum_s max_{a in A_s} r_a, was inert: some
action of every stage usually has to sit at 1.0, so its value was the stage count and the plan was the
engine's vertex.

Note [one-sided deviation]: the rows stay sparse, one mean variable mu_s per stage and one deviation e_a >= 0
per action, never the dense pairwise form. A stage's deviations r_a - mu_s sum to 0 (its mean row), so
sum_a |r_a - mu_s| = 2 sum_a max(0, r_a - mu_s): phase 3 minimises 2 sum_a e_a subject to e_a >= r_a - mu_s
alone, the same value and the same optimal plans as e_a >= |r_a - mu_s| with half the rows. Measured on the
tied primal of 1F1B 32 x 512 (7,000 columns, GLOP's primal simplex, a shared 2-core machine): 5.0 s with both
rows per action, 2.2 s with one.

Note [redundant rows]: the same-stage edges F -> B/I and I -> W join two actions of one rank that the rank's
own chain already orders (a validated schedule runs F before B/I and I before W), with lag 0, so their rows
are implied and dropped.

Note [LP certificate]: a phase is OPTIMAL when its value is certified: GLOP's own OPTIMAL status on the full LP
(tfplan.solve.solver; no gap is computed), or, in tfplan.solve.fastlp, an upper bound U (a feasible point) and a safe
lower bound L (weak duality, recomputed from a dual vector over the full LP) with U - L <= gap_tol(phase) max(1, |U|):
GAP_TOL (1e-9) for phases 1-2, whose optima bound the next phase, EVEN_GAP_TOL (1e-7) for phase 3, whose value
bounds nothing. Phase 3's safe bound is a small difference of large terms: on 1F1B 32 x 16384 (random-0 profile) its
optimum is 428.8 while its terms reach 2.4e9 (flows of thousands of units per ms times start times of 75,000 ms),
which is why L is summed in double-double (Note [bound rounding] in tfplan.solve.fastlp.exact; in float64 it came out
1.1e-7 above its exact value). Exactly summed, the bound showed what the tied points are worth at that scale: the
first margin's U stood 3.4e-8 (relative) above the best L, and the next margin's tied primal (61,385 columns, three
minutes) came out 1.1e-8 *below* it, GLOP's feasibility tolerance times the thousands of actions a tied row stands
for. Phase 3's optimum is also only as sharp as the allowances it inherits: its total-freeze row's price (rho = 722
there) times phase 2's own tolerance (1e-9 of R2 = 49,642) is 3.6e-2, 8e-5 of the optimum. So phase 3 is certified
at 1e-7, the same scale as the 1e-7 by which U may fall below L (next paragraph); at 1e-8 it was certified on that
instance only through float64's rounding of L. The full-LP backend's OPTIMAL promises only GLOP's own tolerances
(absolute, on feasibility and reduced costs), no relative gap at all.
U may also come out below L, by GLOP's feasibility tolerance (a tied row stands for thousands of copies):
down to 1e-7 relative that counts as certified with gap 0 (in phase 3 also further, where the plan's own
rounding explains it: Note [explained negative gaps] in tfplan.solve.fastlp.lower), the phase reports
max(U, L), and the plan is re-simulated against its bounds (tfplan.solve.fastlp). A phase that stopped short
of all that (the time limit) is FEASIBLE: its point is a valid plan and its gap U - L says how far from optimal
it may be at most. A solve is as good as its worst phase (worst_status).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tfplan.errors import TfplanError
from tfplan.fileio import field_name
from tfplan.step.dag import Dag

REL_TOL = 1e-9  # phases 2-3 keep earlier optima within this relative tolerance (Note [three-phase LP])
GAP_TOL = 1e-9  # U - L <= GAP_TOL * max(1, |U|) certifies phases 1-2 (Note [LP certificate])
EVEN_GAP_TOL = 1e-7  # ... and phase 3 (even_spread)
CAP_TOL = 1e-7  # a stage's mean ratio may exceed its cap by this much: both solvers' final check and the loader
DEFAULT_TIME_LIMIT_S = 120.0  # the CLI's --time-limit
MAX_TIME_LIMIT_S = 1e9
"""About 30 years: GLOP takes its limit as int64 milliseconds, which 1e16 s and more overflowed."""
# GLOP's default primal feasibility tolerance (1e-8, absolute) lets a re-simulated plan exceed the phase-1
# makespan by more than REL_TOL on small instances; 1e-10 keeps it within (tests/tfplan/solve/). Both backends.
GLOP_PARAMS = "primal_feasibility_tolerance: 1e-10"
PHASE_NAMES = ("makespan", "total_freeze", "even_spread")
OPTIMAL, FEASIBLE = "OPTIMAL", "FEASIBLE"
STATUSES = (OPTIMAL, FEASIBLE)


def gap_tol(phase: int) -> float:
    """The relative gap U - L that certifies LP phase 1, 2 or 3 (Note [LP certificate])."""
    return EVEN_GAP_TOL if phase == 3 else GAP_TOL


class UnreachableTarget(TfplanError):
    """The requested makespan is below the phase-1 optimum under the caps."""

    def __init__(self, target_ms: float, best_makespan_ms: float) -> None:
        super().__init__(
            f"target makespan {target_ms:.6g} ms is unreachable under the caps; the best is {best_makespan_ms:.6g} ms"
        )
        self.best_makespan_ms = best_makespan_ms


class TimeLimitReached(TfplanError):
    """The time limit ran out before the solver had any feasible plan."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Deadline:
    """A solve's time budget (--time-limit), started when the solve starts."""

    limit_s: float | None
    """Seconds allowed in all; None = no limit."""
    start: float = field(default_factory=time.perf_counter)
    """time.perf_counter() at the start."""

    def remaining(self) -> float:
        """Seconds left (inf without a limit; may be negative once past)."""
        return math.inf if self.limit_s is None else self.limit_s - (time.perf_counter() - self.start)

    def expired(self) -> bool:
        return self.remaining() <= 0.0


def check_time_limit(time_limit_s: float | None) -> None:
    """Raises TfplanError naming --time-limit unless it is None or a positive finite number of seconds."""
    if time_limit_s is not None and not (math.isfinite(time_limit_s) and 0 < time_limit_s <= MAX_TIME_LIMIT_S):
        raise TfplanError(f"--time-limit: must be a positive number of seconds up to {MAX_TIME_LIMIT_S:g}, "
                          f"got {time_limit_s:g}")


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseResult:
    """Outcome of one LP phase (also the plan file's solver.phases[i], docs/formats.md)."""

    name: str
    """One of PHASE_NAMES: `makespan`, `total_freeze` or `even_spread` (Note [three-phase LP])."""
    objective: float
    """The phase's value: ms for makespan, a sum of ratios otherwise (Note [three-phase LP])."""
    status: str
    """OPTIMAL (certified) or FEASIBLE (a valid point, not certified; Note [LP certificate])."""
    iterations: int
    """Simplex iterations, in all."""
    wall_s: float
    """Seconds spent solving this phase."""
    gap: float | None = None
    """Absolute, in the objective's unit: max(0, U - L), U the phase's value and L a safe lower bound on its
    optimum (Note [LP certificate]); None when not computed (GLOP's own OPTIMAL, or a FEASIBLE phase without a
    lower bound). The relative gap is gap / max(1, |objective|)."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "objective": self.objective, "status": self.status,
                "iterations": self.iterations, "wall_s": self.wall_s, "gap": self.gap}

    @classmethod
    def from_dict(cls, obj: Any, path: str, version: int) -> PhaseResult:
        """Validate one phase record; version-1 plans have no gap (loaded as None)."""
        _check_keys(obj, path, {"name", "objective", "status", "iterations", "wall_s"} | ({"gap"} if version > 1
                                                                                         else set()), {"gap"})
        name = _one_of(obj["name"], PHASE_NAMES, f"{path}.name")
        gap = obj.get("gap")
        return cls(
            name=name,
            objective=_number(obj["objective"], f"{path}.objective", minimum=None),
            status=_one_of(obj["status"], STATUSES, f"{path}.status"),
            iterations=_count(obj["iterations"], f"{path}.iterations"),
            wall_s=_number(obj["wall_s"], f"{path}.wall_s"),
            gap=None if gap is None else _number(gap, f"{path}.gap"),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class SolverRecord:
    """What a solve reports about itself: the plan file's `solver` section (docs/formats.md)."""

    backend: str
    """`glop` (tfplan.solve.solver) or `fastlp` (tfplan.solve.fastlp)."""
    status: str
    """The worst of the phases' statuses; FEASIBLE as well when fewer than three phases ran (the time limit)."""
    lp_makespan_ms: float
    """Phase 1's value: the smallest makespan the caps allow (ms); an upper bound on it when FEASIBLE."""
    phases: tuple[PhaseResult, ...]
    """The phases that ran, in the order of PHASE_NAMES."""
    build_s: float
    """Seconds spent building the model."""
    wall_s: float
    """Seconds spent building and solving, in all."""
    time_limit_s: float | None = None
    """The solve's time limit (s); None = none (and in version-1 plans)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "status": self.status, "lp_makespan_ms": self.lp_makespan_ms,
            "phases": [p.to_dict() for p in self.phases], "build_s": self.build_s, "wall_s": self.wall_s,
            "time_limit_s": self.time_limit_s,
        }

    @classmethod
    def from_dict(cls, obj: Any, path: str = "solver", version: int = 2) -> SolverRecord:
        """Validate a plan's solver section; every error names the field path (`solver.phases[2].objective`).

        Raises:
            TfplanError: a missing, unknown or malformed field, or a status that contradicts the phases.
        """
        required = {"backend", "status", "lp_makespan_ms", "phases", "build_s", "wall_s"}
        _check_keys(obj, path, required | ({"time_limit_s"} if version > 1 else set()), {"time_limit_s"})
        if not isinstance(obj["phases"], list):
            raise TfplanError(f"{path}.phases: must be a list, got {json.dumps(obj['phases'])}")
        phases = tuple(PhaseResult.from_dict(p, f"{path}.phases[{i}]", version) for i, p in enumerate(obj["phases"]))
        names = tuple(p.name for p in phases)
        if not phases or names != PHASE_NAMES[: len(names)]:
            raise TfplanError(f"{path}.phases: must be the first phases of {', '.join(PHASE_NAMES)} in order, "
                              f"got {', '.join(names) or 'none'}")
        status = _one_of(obj["status"], STATUSES, f"{path}.status")
        if status != worst_status(phases):
            raise TfplanError(f"{path}.status: says {status} but the phases make it {worst_status(phases)}")
        limit = obj.get("time_limit_s")
        backend = obj["backend"]
        if not isinstance(backend, str) or not backend:
            raise TfplanError(f"{path}.backend: must be a non-empty string, got {json.dumps(backend)}")
        return cls(
            backend=backend,
            status=status,
            lp_makespan_ms=_number(obj["lp_makespan_ms"], f"{path}.lp_makespan_ms"),
            phases=phases,
            build_s=_number(obj["build_s"], f"{path}.build_s"),
            wall_s=_number(obj["wall_s"], f"{path}.wall_s"),
            time_limit_s=None if limit is None else _number(limit, f"{path}.time_limit_s"),
        )


def worst_status(phases: Sequence[PhaseResult]) -> str:
    """OPTIMAL only when all three phases ran and each is OPTIMAL (Note [LP certificate])."""
    ok = len(phases) == len(PHASE_NAMES) and all(p.status == OPTIMAL for p in phases)
    return OPTIMAL if ok else FEASIBLE


@dataclass(frozen=True, kw_only=True, slots=True)
class Solution:
    """A freeze plan for every node of a DAG, and how it was found."""

    ratios: list[float]
    """Freeze ratio per node in [0, 1]; 0 for nodes outside the freeze groups (Note [freeze groups])."""
    durations: list[float]
    """Duration per node at those ratios (ms)."""
    makespan_ms: float
    """Phase-1 optimum: the smallest makespan the caps allow (ms); an upper bound on it when FEASIBLE."""
    phases: tuple[PhaseResult, ...]
    """Per-phase results, in order (fewer than three when the time limit stopped the solve)."""
    backend: str
    """Which solver produced it."""
    build_s: float
    """Seconds spent building the model."""
    wall_s: float
    """Seconds spent building and solving, in all."""
    time_limit_s: float | None = None
    """The time limit the solve ran under (s), None for none."""
    anchor_cost_ms: float = 0.0
    """How much longer the makespan is for keeping one stage-0 backward unfrozen (tfplan.plan.job Note [stage-0
    anchor]), ms; 0 when no anchor was needed."""

    @property
    def status(self) -> str:
        """OPTIMAL or FEASIBLE (worst_status)."""
        return worst_status(self.phases)

    def record(self) -> SolverRecord:
        """The plan file's solver section for this solution."""
        return SolverRecord(
            backend=self.backend, status=self.status, lp_makespan_ms=self.makespan_ms, phases=self.phases,
            build_s=self.build_s, wall_s=self.wall_s, time_limit_s=self.time_limit_s,
        )


def check_caps(caps: Sequence[float] | float, num_stages: int) -> list[float]:
    """One cap per stage, each in [0, 1].

    Raises:
        TfplanError: a cap outside [0, 1] or a per-stage list of the wrong length.
    """
    if isinstance(caps, (int, float)):
        caps = [float(caps)] * num_stages
    caps = [float(c) for c in caps]
    if len(caps) == 1:
        caps *= num_stages
    if len(caps) != num_stages:
        raise TfplanError(
            f"--max-freeze-ratio: got {len(caps)} per-stage caps but the schedule has {num_stages} stages"
        )
    for s, c in enumerate(caps):
        if not 0.0 <= c <= 1.0:
            raise TfplanError(f"--max-freeze-ratio: cap of stage {s} must be in [0, 1], got {c:g}")
    return caps


def cap_excess(dag: Dag, ratios: Sequence[float], caps: Sequence[float]) -> list[float]:
    """Per stage: its mean ratio over its freeze group minus its cap (<= CAP_TOL in every valid plan)."""
    sums, counts = [0.0] * len(caps), [0] * len(caps)
    for a, r, ok in zip(dag.actions, ratios, dag.freeze_mask()):
        if ok:
            sums[a.stage] += r
            counts[a.stage] += 1
    return [(total / count if count else 0.0) - cap for total, count, cap in zip(sums, counts, caps)]


def keep_caps(dag: Dag, ratios: list[float], caps: Sequence[float], backend: str) -> list[float]:
    """Both solvers' last step: every stage's mean ratio within its cap, as the plan loader asks.

    An LP solution may exceed a cap by its feasibility tolerance (1e-10 was seen on one-action stages); such a
    stage's ratios are scaled down to meet the cap exactly (which slows the plan by about as little). An
    excess above CAP_TOL is a solver bug (assert).
    """
    out = list(ratios)
    for group, cap, excess in zip(dag.freeze_groups(), caps, cap_excess(dag, ratios, caps)):
        assert excess <= CAP_TOL, f"{backend}: a stage's mean ratio exceeds its cap by {excess:.3g} (> {CAP_TOL:g})"
        if excess > 0.0:
            scale = cap / (cap + excess)
            for v in group:
                out[v] = ratios[v] * scale
    return out


def makespan_bound(best_ms: float, target_ms: float | None) -> float:
    """The bound on T in phases 2-3: T1 (1 + REL_TOL), or the target makespan if that is larger.

    A target within REL_TOL of T1, even below it, is T1 itself (the LP's optimum is only known to that
    tolerance): the fastest plan, as without a target, not an unreachable one.

    Raises:
        UnreachableTarget: the target is more than REL_TOL below T1.
    """
    if target_ms is not None and target_ms < best_ms * (1 - REL_TOL):
        raise UnreachableTarget(target_ms, best_ms)
    return max(best_ms * (1 + REL_TOL), target_ms or 0.0)


def total_bound(best_total: float) -> float:
    """The bound on sum r in phase 3: R2 (1 + REL_TOL) + REL_TOL (Note [three-phase LP])."""
    return best_total * (1 + REL_TOL) + REL_TOL


def precedence_rows(dag: Dag) -> tuple[list[tuple[int, int, float]], list[tuple[int, float]]]:
    """Rows of the LP: (u, v, lag) per non-redundant edge (Note [redundant rows]) and the finish rows
    (node, tail): T >= t_u + d_u + tail for each rank's last action (tfplan.step.dag Note [rank tails])."""
    pair_lag: dict[tuple[int, int], float] = {}
    for k, (slot, lags) in enumerate(zip(dag.preds, dag.lags)):
        for v, u in enumerate(slot):
            if u < 0:
                continue
            if k == 2 and lags[v] == 0.0 and dag.rank[u] == dag.rank[v]:
                continue  # implied by the rank chain
            key = (u, v)
            pair_lag[key] = max(lags[v], pair_lag.get(key, lags[v]))
    rows = [(u, v, lag) for (u, v), lag in pair_lag.items()]
    return rows, dag.finish()


# ---------------------------------------------------------------------------------------------------------
# Field checks for SolverRecord.from_dict (errors name the field path)


def _check_keys(obj: Any, path: str, required: set[str], allowed: set[str]) -> None:
    if not isinstance(obj, dict):
        raise TfplanError(f"{path}: must be an object, got {json.dumps(obj)[:40]}")
    for key in sorted(set(obj) - required - allowed):
        raise TfplanError(f"{path}.{field_name(key)}: unknown field (known: {', '.join(sorted(required | allowed))})")
    for key in sorted(required - set(obj)):
        raise TfplanError(f"{path}.{key}: missing required field")


def _number(value: Any, path: str, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TfplanError(f"{path}: must be a number, got {json.dumps(value)}")
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        raise TfplanError(f"{path}: must be finite{'' if minimum is None else f' and >= {minimum:g}'}, got {value}")
    return float(value)


def _count(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TfplanError(f"{path}: must be an integer >= 0, got {json.dumps(value)}")
    return value


def _one_of(value: Any, choices: Sequence[str], path: str) -> str:
    if value not in choices:
        raise TfplanError(f"{path}: must be one of {', '.join(choices)}, got {json.dumps(value)}")
    return value
