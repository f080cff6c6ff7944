"""Resolve a planning job from the user's options: profile + (named schedule | schedule CSV) -> DAG.

Shared by every planning command (simulate, solve, whatif) so they accept the same options the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tfplan.cost import goodput
from tfplan.cost import profile as profile_mod
from tfplan.errors import TfplanError
from tfplan.schedule import schedules
from tfplan.solve.lp import DEFAULT_TIME_LIMIT_S, TimeLimitReached, UnreachableTarget, check_caps, check_time_limit
from tfplan.step import dag as dag_mod

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """What the user asked to plan."""

    profile_path: str
    """Profile JSON file."""
    schedule: str | None = None
    """Named schedule (None when schedule_csv is given)."""
    schedule_csv: str | None = None
    """A user's schedule in torch's compute-only CSV format."""
    num_microbatches: int | None = None
    """Micro-batches per step (required for a named schedule)."""
    stages_per_rank: int | None = None
    """V for multi-stage schedules; None = the schedule's default."""
    num_ranks: int | None = None
    """Pipeline ranks; inferred from a per-stage profile, required for a per-layer one."""
    layers_per_stage: Sequence[int] | None = None
    """Explicit split of a per-layer profile."""
    dp: int = 1
    """Data-parallel replicas of the pipeline (tfplan.cost.dataparallel)."""
    dp_link: str | None = None
    """The link between replicas (tfplan.cost.dataparallel.parse_link); needed when dp differs from the profile's."""
    learning_model: str | None = None
    """Read the profile's noise section under this learning model (tfplan.cost.goodput Note [learning models]);
    None: the one it names."""


def resolve_schedule(spec: JobSpec, profile: profile_mod.Profile) -> schedules.Schedule:
    """The schedule the job asks for, generated or loaded, and validated."""
    if (spec.schedule is None) == (spec.schedule_csv is None):
        raise TfplanError("give exactly one of --schedule NAME or --schedule-csv PATH")
    if spec.schedule_csv is not None:
        if spec.stages_per_rank is not None:
            raise TfplanError("--stages-per-rank applies to named schedules, not to --schedule-csv")
        schedule = schedules.load_csv(spec.schedule_csv, spec.num_microbatches)
        if spec.num_ranks is not None and spec.num_ranks != schedule.num_ranks:
            raise TfplanError(f"--ranks is {spec.num_ranks} but the schedule CSV has {schedule.num_ranks} ranks")
        return schedule
    if spec.num_microbatches is None:
        raise TfplanError("--microbatches is required with --schedule")
    sched_spec = schedules.get_spec(spec.schedule)
    v = sched_spec.default_stages_per_rank if spec.stages_per_rank is None else spec.stages_per_rank
    ranks = spec.num_ranks
    if profile.stages is not None:
        num_stages = len(profile.stages)
        if num_stages % v:
            raise TfplanError(
                f"profile {profile.name!r} has {num_stages} stages, which {v} stages per rank do not divide "
                f"(schedule {sched_spec.name})"
            )
        if ranks is not None and ranks * v != num_stages:
            raise TfplanError(
                f"--ranks {ranks} x {v} stages per rank = {ranks * v} stages, but profile {profile.name!r} has "
                f"{num_stages}"
            )
        ranks = num_stages // v
    elif ranks is None:
        raise TfplanError(f"profile {profile.name!r} is per layer: give --ranks to say how many ranks to split it over")
    return schedules.generate(sched_spec.name, ranks, spec.num_microbatches, v)


def load_profile(spec: JobSpec) -> profile_mod.Profile:
    """The job's profile, with the gradient reduction of `spec.dp` replicas in its tails."""
    from tfplan.cost import dataparallel

    profile = profile_mod.load(spec.profile_path)
    link = dataparallel.parse_link(spec.dp_link, profile) if spec.dp_link else None
    profile = dataparallel.with_dp(profile, spec.dp, link)
    if spec.learning_model is not None and profile.noise is not None:
        profile = replace(profile, noise=goodput.with_learning_model(profile.noise, spec.learning_model))
    return profile


def build(spec: JobSpec) -> tuple[profile_mod.Profile, schedules.Schedule, dag_mod.Dag]:
    """Load the profile, resolve the schedule and build the DAG."""
    profile = load_profile(spec)
    schedule = resolve_schedule(spec, profile)
    return profile, schedule, dag_mod.build(schedule, profile, spec.layers_per_stage)


def target_makespan(dag: dag_mod.Dag, target_speedup: float) -> float:
    """The DAG makespan (ms) at which the predicted step time is no-freeze step time / target_speedup.

    Raises:
        TfplanError: a target below 1 or above what freezing everything allows.
    """
    from tfplan.step.simulate import simulate

    if not target_speedup >= 1.0:  # (NaN too)
        raise TfplanError(f"--target-speedup must be a number >= 1, got {target_speedup:g}")
    none = simulate(dag).batch_time_ms
    frozen = simulate(dag, dag.d_min).batch_time_ms
    if target_speedup > none / frozen * (1 + 1e-12):
        raise TfplanError(
            f"--target-speedup {target_speedup:g} is unreachable: even with everything frozen the predicted "
            f"speedup is {none / frozen:.4g}x"
        )
    return none / target_speedup - dag.step_overhead_ms


BACKENDS = ("auto", "glop", "fastlp")
AUTO_FASTLP_ACTIONS = 2500
"""`auto` solves DAGs with more actions than this with fastlp, smaller ones with GLOP on the full LP, the
reference. Measured on 2 cores, three phases, with issue 9's phase 3 (harder for GLOP than the earlier one)
on a machine shared with other jobs (load 2.8): GLOP 1.3 s at 2,048 actions (1F1B 8 x 128) and 8-18 s at
5,000 (1F1B 4 x 625, 8 x 312, 16 x 156), fastlp 0.05-1.3 s at 5,000 (before issue 9, on a quiet machine:
GLOP 0.5 s and 3.2-4.5 s)."""


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise TfplanError(f"--solver must be one of {', '.join(BACKENDS)}, got {backend!r}")


ANCHOR_TOL = 1e-6
"""A stage-0 action at or below this ratio counts as unfrozen (Note [stage-0 anchor])."""


def solve_dag(dag: dag_mod.Dag, caps: Sequence[float] | float, target_makespan_ms: float | None = None,
              backend: str = "auto", time_limit_s: float | None = DEFAULT_TIME_LIMIT_S, anchor: bool = True,
              makespan=None, handover=None):
    """The three-phase LP by the chosen backend: "glop" (tfplan.solve.solver, the full LP), "fastlp"
    (tfplan.solve.fastlp, periodic compression, same optima) or "auto" (by size, AUTO_FASTLP_ACTIONS); time_limit_s:
    seconds for the whole solve, the anchored one included (None: none); anchor: keep one stage-0 backward unfrozen
    (Note [stage-0 anchor]); makespan: phase 1 already certified at these caps (an lp.PhaseResult from the goodput
    search), which fastlp then does not solve again; handover: the bases that search hands phase 2 (fastlp.solve's
    `handover`). Returns an lp.Solution (status FEASIBLE when fastlp ran out of time)."""
    caps = check_caps(caps, dag.schedule.num_stages)
    start = time.perf_counter()
    solution = _solve_backend(dag, caps, target_makespan_ms, backend, time_limit_s, makespan, handover)
    pin = anchor_node(dag, solution.ratios) if anchor else None
    if pin is None:
        return solution
    pinned_dag, pinned_caps = pin_unfrozen(dag, caps, pin)
    left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - start)
    try:
        if left is not None and left < 0.1 * time_limit_s:
            raise TimeLimitReached("less than a tenth of --time-limit left")
        pinned = _solve_backend(pinned_dag, pinned_caps, target_makespan_ms, backend, left)
    except UnreachableTarget:  # the target needs every stage-0 backward frozen: keep the unanchored plan
        return solution
    except TimeLimitReached:
        log.warning("--time-limit: no time left to keep a stage-0 backward unfrozen; the plan freezes all of them")
        return solution
    assert pinned.ratios[pin] == 0.0  # its durations are the original DAG's too (fixed nodes keep d_max)
    cost = pinned.makespan_ms - solution.makespan_ms
    return replace(pinned, anchor_cost_ms=cost if cost > ANCHOR_TOL * solution.makespan_ms else 0.0)


def _solve_backend(dag, caps, target_makespan_ms, backend, time_limit_s, makespan=None, handover=None):
    from tfplan.solve import fastlp, solver

    check_backend(backend)
    if backend == "fastlp" or (backend == "auto" and dag.num_nodes > AUTO_FASTLP_ACTIONS):
        return fastlp.solve(dag, caps, target_makespan_ms, time_limit_s, makespan=makespan, handover=handover)
    return solver.solve(dag, caps, target_makespan_ms, time_limit_s)


def anchor_node(dag: dag_mod.Dag, ratios: Sequence[float]) -> int | None:
    """Note [stage-0 anchor]: the stage-0 action to keep unfrozen, or None when the plan already leaves one
    unfrozen (or stage 0 has fewer than two actions with a freeze ratio).

    Nothing needs an input gradient on stage 0, so tfrun freezes a prefix of its tensors there (embedding,
    block 0, ...): the backward is pruned below the first unfrozen tensor and its time falls linearly with the
    ratio, as the LP assumes. A prefix trains the front of the model only through an action left unfrozen,
    which then trains the whole stage in every step; when the plan freezes every stage-0 backward, tfrun's
    `auto` policy freezes rotating subsets instead (every tensor keeps learning), which prune little of the
    backward and run slower than planned (+18% on the tiny model's GPipe plan, docs/benchmarks.md). The
    planner therefore keeps one stage-0 backward unfrozen, the one with the smallest ratio, and solves again
    with the cap on the mean of the other n - 1 raised to min(1, cap n / (n - 1)): the mean over all n stays
    within the user's cap. With the anchor, the same plan runs 1.31x faster than unfrozen training instead of
    1.15x (docs/benchmarks.md, "The stage-0 anchor"). On GPipe, where every
    stage-0 backward lies on one chain, this gives up cap n - (n - 1) of one backward's saving when that is
    positive (0.2 of one at cap 0.9 and n = 8).

    >>> from tfplan import profile, schedules
    >>> dag = dag_mod.build(schedules.generate("gpipe", 2, 4), profile.uniform(2))
    >>> ratios = [0.0] * 4 + [0.9, 0.3, 0.9, 0.9] + [0.0] * 4 + [0.9] * 4
    >>> str(dag.actions[anchor_node(dag, ratios)])
    '0B1'
    >>> ratios[5] = 0.0
    >>> anchor_node(dag, ratios) is None
    True
    """
    group = dag.freeze_groups()[0]
    if len(group) < 2 or any(ratios[v] <= ANCHOR_TOL for v in group):
        return None
    return min(group, key=lambda v: (ratios[v], -v))


def pin_unfrozen(dag: dag_mod.Dag, caps: Sequence[float], node: int) -> tuple[dag_mod.Dag, list[float]]:
    """The DAG with `node` fixed at its unfrozen duration, and caps that keep its stage's mean over the original
    group within the original cap (Note [stage-0 anchor])."""
    stage = dag.actions[node].stage
    n = len(dag.freeze_groups()[stage])
    freezable = list(dag.freezable)
    freezable[node] = False
    caps = list(caps)
    caps[stage] = min(1.0, caps[stage] * n / (n - 1))
    return replace(dag, freezable=freezable), caps


OBJECTIVES = ("makespan", "goodput")


def solve_job(spec: JobSpec, caps: Sequence[float] | float, target_speedup: float | None = None,
              backend: str = "auto", time_limit_s: float | None = DEFAULT_TIME_LIMIT_S, anchor: bool = True,
              objective: str = "makespan"):
    """Profile + schedule -> solved Plan (the library call behind `tfplan solve`)."""
    check_time_limit(time_limit_s)
    profile, schedule, dag = build(spec)
    noise = profile.stage_noise(schedule.num_stages, spec.layers_per_stage)
    return solve_plan(dag, profile, caps, target_speedup, backend, time_limit_s, anchor, objective, noise)


def solve_schedule(schedule: schedules.Schedule, profile: profile_mod.Profile, caps: Sequence[float] | float,
                   backend: str = "auto", time_limit_s: float | None = DEFAULT_TIME_LIMIT_S, anchor: bool = True,
                   objective: str = "makespan"):
    """A schedule already resolved (tfrun's online mode: the run's own order) + profile -> solved Plan."""
    check_time_limit(time_limit_s)
    noise = profile.stage_noise(schedule.num_stages)
    return solve_plan(dag_mod.build(schedule, profile), profile, caps, None, backend, time_limit_s, anchor,
                      objective, noise)


def batch_tokens(profile: profile_mod.Profile, schedule: schedules.Schedule, noise) -> float:
    """A step's batch in tokens, all replicas: dp x M x the noise section's micro-batch tokens."""
    return float(profile.dp * schedule.num_microbatches * noise.microbatch_tokens)


def solve_plan(dag: dag_mod.Dag, profile: profile_mod.Profile, caps: Sequence[float] | float,
               target_speedup: float | None = None, backend: str = "auto",
               time_limit_s: float | None = DEFAULT_TIME_LIMIT_S, anchor: bool = True, objective: str = "makespan",
               noise=None):
    """The DAG's plan: caps checked and expanded to one per stage, the target turned into a makespan, the LP
    solved (solve_dag) and the plan made. Under `objective` goodput (tfplan.solve.fastlp.goodput Note [goodput LP]) the
    caps become the goodput optimum's stage means (all 0 when freezing does not pay), `noise` per stage."""
    from tfplan.plan import plan as plan_mod

    caps = check_caps(caps, dag.schedule.num_stages)
    if objective not in OBJECTIVES:
        raise TfplanError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    limits, record, known, handover = caps, None, None, None
    if objective == "goodput":
        from tfplan.solve.fastlp import solve_goodput

        if target_speedup is not None:
            raise TfplanError("--target-speedup asks for the least freezing at a speed, --objective goodput for the "
                              "most learning per second: give one")
        if noise is None:
            raise TfplanError(f"--objective goodput needs the gradient noise scale, and profile {profile.name!r} has "
                              "no noise section: measure it (tfplan profile, at your checkpoint with --init-from) or "
                              "give it (tfplan profile --analytic ... --noise-scale N)")
        batch = batch_tokens(profile, dag.schedule, noise)
        best = solve_goodput(dag, caps, noise, batch, time_limit_s)
        limits = [min(c, m) for c, m in zip(caps, best.means)] if best.pays else [0.0] * len(caps)
        known = best.makespan if best.pays else None  # phase 1 at exactly these caps
        handover = best.handover if best.pays else None
        record = ("goodput", noise, batch, {"lp_solves": best.lp_solves, "dinkelbach_steps": best.dinkelbach_steps,
                                            "wall_s": best.wall_s, "certified": best.certified, "means": best.means,
                                            "lp_columns": best.lp_columns, "compressions": best.compressions,
                                            "bound": best.bound / best.unfrozen_goodput if best.certified else None})
        if time_limit_s is not None:  # the whole solve keeps the limit: the plan's LP gets what is left
            time_limit_s = max(1.0, time_limit_s - best.wall_s)
    elif noise is not None:
        record = ("makespan", noise, batch_tokens(profile, dag.schedule, noise), None)
    target = None if target_speedup is None else target_makespan(dag, target_speedup)
    try:
        solution = solve_dag(dag, limits, target, backend, time_limit_s, anchor, known, handover)
    except UnreachableTarget as exc:
        none = plan_mod.predict(dag, [0.0] * dag.num_nodes)[0].no_freeze_ms
        raise TfplanError(
            f"--target-speedup {target_speedup:g} is unreachable under the caps; the best they allow is "
            f"{none / (exc.best_makespan_ms + dag.step_overhead_ms):.4g}x (raise --max-freeze-ratio)"
        ) from None
    return plan_mod.make_plan(dag, solution, caps, profile, target_speedup, record)
