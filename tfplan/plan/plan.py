"""Freeze plans: what `tfplan solve` writes and `tfrun train --plan` runs (docs/formats.md).

A plan names its schedule (per-rank order in torch's grammar), the stage costs it was planned with (so it
can be re-simulated without the profile file), the per-stage caps, one freeze ratio per (stage, micro-batch)
and the predicted step times. The schedule is also written as torch's compute-only CSV next to the JSON.

Note [compact plan]: a plan file holds what cannot be recomputed, once. Version 3 stores the ratios as a
stage x micro-batch table (freeze_ratio[s][m]: the ratio of stage s's B or W action of micro-batch m, the
one action of that pair freezing can shorten) instead of one object per action repeating its name, rank,
planned start and duration and both costs (the order, the profile's stages and a re-simulation give those).
Measured on 1F1B 32 x 16384 (a million actions): 16.5 MB instead of 206 MB, and writing it is a few
json.dumps of flat lists instead of a million small ones. Versions 1-2 (the per-action list) still load
(tfplan.plan.plan_ratios).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tfplan import __version__
from tfplan.cost import profile as profile_mod
from tfplan.cost.goodput import NoiseModel, PlanGoodput, plan_goodput, record_from_dict
from tfplan.errors import TfplanError
from tfplan.fileio import json_text, read_json, write_files_atomic
from tfplan.plan.plan_profile import profile_section, source_provenance
from tfplan.plan.plan_ratios import ratio_table, ratios_v2, ratios_v3, require
from tfplan.schedule import schedules
from tfplan.schedule.actions import parse_action
from tfplan.solve.lp import CAP_TOL, Solution, SolverRecord
from tfplan.step.dag import Dag, build
from tfplan.step.simulate import Simulation, simulate

SCHEMA_VERSION = 3  # 2: solver.phases[i].gap, solver.time_limit_s, status FEASIBLE, the new even_spread,
# profile.source (optional: plans written before it still load, with an empty source); 3: freeze_ratio as a
# stage x micro-batch table instead of the per-action list `actions` (Note [compact plan])
READABLE_VERSIONS = (1, 2, 3)


@dataclass(frozen=True, kw_only=True, slots=True)
class Predicted:
    """Predicted step times (ms, DAG makespan plus the profile's per-step overhead)."""

    no_freeze_ms: float
    """Nothing frozen."""
    planned_ms: float
    """With the plan's ratios."""
    all_frozen_ms: float
    """Everything frozen (the cap = 1 optimum)."""
    uniform_ms: float
    """Naive baseline: every freezable action at the plan's overall mean ratio."""
    step_overhead_ms: float
    """The per-step overhead included in each of the above."""
    mean_freeze_ratio: float
    """The plan's mean ratio over every freezable action (the uniform baseline's ratio)."""
    no_freeze_bubble_fraction: float
    planned_bubble_fraction: float

    @property
    def speedup(self) -> float:
        return self.no_freeze_ms / self.planned_ms

    def to_dict(self) -> dict[str, float]:
        return {
            "no_freeze_ms": self.no_freeze_ms,
            "planned_ms": self.planned_ms,
            "all_frozen_ms": self.all_frozen_ms,
            "speedup": self.speedup,
            "uniform_same_mean_ms": self.uniform_ms,
            "uniform_same_mean_speedup": self.no_freeze_ms / self.uniform_ms,
            "step_overhead_ms": self.step_overhead_ms,
            "overall_mean_freeze_ratio": self.mean_freeze_ratio,
            "no_freeze_bubble_fraction": self.no_freeze_bubble_fraction,
            "planned_bubble_fraction": self.planned_bubble_fraction,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A validated freeze plan (in memory)."""

    dag: Dag
    """The planned DAG (schedule + stage costs + p2p lag)."""
    profile_name: str
    profile_hash: str
    """sha256 of the canonical profile JSON it was planned from."""
    profile_source: dict[str, Any] = field(default_factory=dict)
    """Provenance of that profile: the scalar fields of its `source` (kind; for measured profiles model,
    microbatch_size, seq_len, schedule, num_ranks, device, torch, date; for analytic ones model, gpu, batch
    shape); {} for plans that predate it. tfrun checks it against the run (tfrun.records.provenance)."""
    caps: tuple[float, ...]
    """Cap on the mean freeze ratio, per stage."""
    ratios: tuple[float, ...]
    """Freeze ratio per DAG node (0 for F, I and actions freezing cannot shorten)."""
    predicted: Predicted
    solver: SolverRecord | None
    """Backend, status, per-phase results and gaps, times (lp.SolverRecord); None for plans not made by the LP."""
    target_speedup: float | None = None
    goodput: PlanGoodput | None = None
    """The learning model's view of the plan (tfplan.cost.goodput), when its profile had a noise section."""
    anchor_cost_ms: float = 0.0
    """What keeping one stage-0 backward unfrozen cost the makespan (tfplan.plan.job Note [stage-0 anchor]), ms."""
    timelines: tuple[Simulation, Simulation] | None = field(default=None, compare=False, repr=False)
    """The (nothing frozen, planned) simulations its predictions came from, kept for rendering (not written)."""

    @property
    def schedule(self) -> schedules.Schedule:
        return self.dag.schedule

    def mean_ratio_per_stage(self) -> list[float]:
        """Mean freeze ratio over each stage's freezable actions (0 for a stage with none)."""
        return [sum(self.ratios[v] for v in g) / len(g) if g else 0.0 for g in self.dag.freeze_groups()]

    def ratio_of(self) -> dict[str, float]:
        """Action string -> freeze ratio, for every action."""
        return {str(a): r for a, r in zip(self.dag.actions, self.ratios)}

    def ratio_table(self) -> list[list[float]]:
        """freeze_ratio[s][m]: the ratio of stage s's B or W action of micro-batch m (Note [compact plan])."""
        return ratio_table(self.dag, self.ratios)


def predict(dag: Dag, ratios: Sequence[float]) -> tuple[Predicted, Simulation]:
    """Step-time predictions for a ratio vector, and the planned simulation."""
    predicted, _, planned = _predict(dag, ratios)
    return predicted, planned


def _predict(dag: Dag, ratios: Sequence[float]) -> tuple[Predicted, Simulation, Simulation]:
    """predict(), and the unfrozen simulation as well (Plan.timelines)."""
    planned = simulate(dag, dag.durations(ratios))
    none = simulate(dag)
    frozen = simulate(dag, dag.d_min)
    groups = [v for g in dag.freeze_groups() for v in g]
    mean = sum(ratios[v] for v in groups) / len(groups) if groups else 0.0
    uniform = simulate(dag, dag.durations(mean))
    return (
        Predicted(
            no_freeze_ms=none.batch_time_ms,
            planned_ms=planned.batch_time_ms,
            all_frozen_ms=frozen.batch_time_ms,
            uniform_ms=uniform.batch_time_ms,
            step_overhead_ms=dag.step_overhead_ms,
            mean_freeze_ratio=mean,
            no_freeze_bubble_fraction=none.bubble_fraction,
            planned_bubble_fraction=planned.bubble_fraction,
        ),
        none,
        planned,
    )


def make_plan(
    dag: Dag,
    solution: Solution,
    caps: Sequence[float],
    profile: profile_mod.Profile,
    target_speedup: float | None = None,
    goodput: tuple[str, NoiseModel, float, dict | None] | None = None,
) -> Plan:
    """Wrap a solver solution into a Plan with predictions; `goodput`: (objective, noise per stage, batch
    tokens, the goodput LP's statistics or None) when the profile has a noise section."""
    predicted, none, planned = _predict(dag, solution.ratios)
    means = [sum(solution.ratios[v] for v in g) / len(g) if g else 0.0 for g in dag.freeze_groups()]
    record = None if goodput is None else plan_goodput(*goodput[:3], means, predicted.planned_ms,
                                                        predicted.no_freeze_ms, goodput[3])
    return Plan(
        dag=dag,
        profile_name=profile.name,
        profile_hash=profile.content_hash(),
        profile_source=source_provenance(profile.source),
        caps=tuple(caps),
        ratios=tuple(solution.ratios),
        predicted=predicted,
        solver=solution.record(),
        target_speedup=target_speedup,
        goodput=record,
        anchor_cost_ms=solution.anchor_cost_ms,
        timelines=(none, planned),
    )


def with_uniform_ratio(plan: Plan, ratio: float) -> Plan:
    """The plan with every action of every freeze group at `ratio` (Note [freeze groups] in tfplan.step.dag), its
    predictions recomputed: the stress plans of tests and benchmarks (valid where `ratio` is within every cap)."""
    return with_stage_ratios(plan, [ratio] * plan.schedule.num_stages)


def with_stage_ratios(plan: Plan, per_stage: Sequence[float]) -> Plan:
    """The plan with every freezable action of stage s at `per_stage[s]`, its predictions recomputed: the
    one-stage-at-a-time cells of the learning-price calibration (benchmarks/calibration.py) and the stress
    plans (valid where each ratio is within its stage's cap; the goodput record is dropped, as it described
    the old ratios)."""
    assert len(per_stage) == plan.schedule.num_stages, (len(per_stage), plan.schedule.num_stages)
    ratios = [0.0] * len(plan.ratios)
    for s, group in enumerate(plan.dag.freeze_groups()):
        for v in group:
            ratios[v] = per_stage[s]
    predicted, none, planned = _predict(plan.dag, ratios)
    return replace(plan, ratios=tuple(ratios), predicted=predicted, timelines=(none, planned), goodput=None)


def to_dict(plan: Plan, names: list[list[str]] | None = None) -> dict[str, Any]:
    """The plan as its JSON object (docs/formats.md; Note [compact plan]); `names`: schedules.action_names of its
    schedule, when the caller has them."""
    dag, sched = plan.dag, plan.schedule
    return {
        "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tool": {"name": "tfplan", "version": __version__},
        "schedule": {
            "name": sched.name,
            "num_ranks": sched.num_ranks,
            "num_stages": sched.num_stages,
            "num_microbatches": sched.num_microbatches,
            "stages_per_rank": sched.stages_per_rank,
            "stage_to_rank": list(sched.stage_to_rank),
            "order": schedules.action_names(sched) if names is None else names,
        },
        "profile": {
            "name": plan.profile_name,
            "hash": plan.profile_hash,
            "source": plan.profile_source,
            "p2p_ms": dag.p2p_ms,
            "dispatch_ms": dag.dispatch_ms,
            "step_overhead_ms": dag.step_overhead_ms,
            "stages": [c.to_dict() for c in dag.stage_costs],
        },
        "max_freeze_ratio": list(plan.caps),
        "target_speedup": plan.target_speedup,
        "mean_freeze_ratio": plan.mean_ratio_per_stage(),
        "predicted": plan.predicted.to_dict(),
        "freeze_ratio": plan.ratio_table(),
        "solver": None if plan.solver is None else plan.solver.to_dict(),
        "anchor_cost_ms": plan.anchor_cost_ms,
        "goodput": None if plan.goodput is None else plan.goodput.to_dict(),
    }


def write(plan: Plan, path: str | Path) -> Path:
    """Write plan JSON and the schedule CSV next to it (same name, .csv); returns the CSV path."""
    csv_path, names = csv_path_of(path), schedules.action_names(plan.schedule)
    # Both or neither: a plan without its schedule CSV, or a new plan beside an old CSV, would not run as planned.
    write_files_atomic([(path, (json_text(to_dict(plan, names)) + "\n").encode()),
                        (csv_path, schedules.to_csv(plan.schedule, names).encode())])
    return csv_path


def csv_path_of(path: str | Path) -> Path:
    """Where write() puts a plan's schedule CSV: beside it, the same name ending in .csv (TfplanError when `path`
    ends in .csv itself or has no file name; a folder's name is refused by the write)."""
    path = Path(path)
    if not path.name:  # (".": with_suffix would raise ValueError)
        raise TfplanError(f"cannot write {path}: it is a folder; give the plan a file name")
    csv_path = path.with_suffix(".csv")
    if path.suffix.lower() == ".csv":  # (plan.CSV too: one file with its CSV on a case-insensitive file system)
        raise TfplanError(f"plan path {path} must not end in .csv (the schedule CSV goes beside it)")
    return csv_path


# ---------------------------------------------------------------------------------------------------------
# Reading


def from_dict(obj: Any) -> Plan:
    """Validate a plan JSON object and rebuild the Plan (re-simulating its predictions).

    Raises:
        TfplanError: naming the bad field.
    """
    if not isinstance(obj, dict):
        raise TfplanError("plan: must be a JSON object")
    version = obj.get("schema_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        readable = ", ".join(map(str, READABLE_VERSIONS[:-1])) + f" or {READABLE_VERSIONS[-1]}"
        raise TfplanError(f"schema_version: must be {readable}, got {json.dumps(version)}")
    sched_obj = require(obj, "schedule", dict, "")
    order_obj = require(sched_obj, "order", list, "schedule.")
    if not all(isinstance(rank, list) and all(isinstance(a, str) for a in rank) for rank in order_obj):
        raise TfplanError('schedule.order: must be a list of per-rank lists of action strings ("0F0", ...)')
    try:
        order = [[parse_action(a) for a in rank] for rank in order_obj]
    except TfplanError as exc:
        raise TfplanError(f"schedule.order: {exc}") from None
    m = require(sched_obj, "num_microbatches", int, "schedule.")
    sched = schedules.from_order(order, name=require(sched_obj, "name", str, "schedule."), num_microbatches=m)
    for key in ("num_ranks", "num_stages"):
        if require(sched_obj, key, int, "schedule.") != getattr(sched, key):
            raise TfplanError(f"schedule.{key}: says {sched_obj[key]} but the order has {getattr(sched, key)}")
    for key, has in (("stages_per_rank", sched.stages_per_rank), ("stage_to_rank", list(sched.stage_to_rank))):
        if key in sched_obj and (sched_obj[key] != has or isinstance(sched_obj[key], bool)):  # (optional: derived)
            raise TfplanError(f"schedule.{key}: says {json.dumps(sched_obj[key])} but the order has {json.dumps(has)}")

    prof, prof_hash, prof_source = profile_section(require(obj, "profile", dict, ""))
    dag = build(sched, prof)

    caps = require(obj, "max_freeze_ratio", list, "")
    if len(caps) != sched.num_stages or not all(type(c) in (int, float) and 0 <= c <= 1 for c in caps):  # (no bools)
        raise TfplanError(f"max_freeze_ratio: must list {sched.num_stages} caps in [0, 1]")
    ratios = ratios_v3(obj, dag) if version >= 3 else ratios_v2(obj, dag)
    predicted, none, planned = _predict(dag, ratios)
    target = obj.get("target_speedup")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not 1 <= target < math.inf):
        raise TfplanError(f"target_speedup: must be a finite number >= 1 or null, got {target!r}")
    means = [sum(ratios[v] for v in g) / len(g) if g else 0.0 for g in dag.freeze_groups()]
    record = None
    if obj.get("goodput") is not None:
        record = record_from_dict(obj["goodput"], sched.num_stages, means, predicted.planned_ms, predicted.no_freeze_ms)
    anchor = obj.get("anchor_cost_ms", 0.0)
    if isinstance(anchor, bool) or not isinstance(anchor, (int, float)) or not math.isfinite(anchor) or anchor < 0:
        raise TfplanError(f"anchor_cost_ms: must be a number >= 0, got {json.dumps(anchor)}")
    plan = Plan(
        dag=dag,
        profile_name=prof.name,
        profile_hash=prof_hash,
        profile_source=prof_source,
        caps=tuple(float(c) for c in caps),
        ratios=ratios,
        predicted=predicted,
        solver=_solver_record(obj, version),
        target_speedup=target,
        goodput=record,
        anchor_cost_ms=float(anchor),
        timelines=(none, planned),
    )
    for s, (mean, cap) in enumerate(zip(plan.mean_ratio_per_stage(), plan.caps)):
        if mean - cap > CAP_TOL:
            raise TfplanError(f"mean_freeze_ratio: stage {s} freezes {mean:.6g} on average, above its cap {cap:g} "
                              f"(tolerance {CAP_TOL:g})")
    return plan


def _solver_record(obj: dict[str, Any], version: int) -> SolverRecord | None:
    """The plan's solver section: null, absent or (version 1 only) {} for a plan not made by the LP."""
    section = obj.get("solver")
    if section is None or (version == 1 and section == {}):
        return None
    return SolverRecord.from_dict(section, "solver", version)


def load(path: str | Path) -> Plan:
    """Read and validate a plan file.

    Raises:
        TfplanError: missing file, invalid JSON or an invalid plan (naming the file and field).
    """
    path = Path(path)
    obj = read_json(path, "plan")
    try:
        return from_dict(obj)
    except TfplanError as exc:
        raise TfplanError(f"{path}: {exc}") from None
