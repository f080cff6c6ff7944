"""Turn what a run measured into its outputs: metrics.jsonl, summary.json, timings.json and a profile in
tfplan's format (profile.json), so the next planning round starts from real measurements.

Note [step overhead]: a measured step also spends time outside the DAG's actions (optimizer step, loss
bookkeeping, Python and communication between actions). We simulate the run's own schedule with the
measured per-action medians and measured p2p latency, and carry (measured step time - simulated makespan)
as the profile's step_overhead_ms, which tfplan adds to every prediction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

from tfplan.cost import profile as profile_mod
from tfplan.fileio import write_json_atomic, write_text_atomic
from tfrun.config.train_config import TrainConfig
from tfrun.measure.timing import (
    ActionTime,
    action_table,
    dispatch_ms,
    makespans,
    p2p_latency_ms,
    rank_tails,
    spread,
    stats_by_stage_kind,
    step_durations,
)

FREEZE_STATS_VERSION = 1


def run_device() -> str:
    """This process's device as profiles record it: "cpu", or the CUDA device's name."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


class MetricsLog:
    """metrics.jsonl: started afresh (atomically) with the rows a run starts from (a resume's, from its
    checkpoint), then appended one line per record, so that a step costs O(1) whatever the run's length."""

    def __init__(self, out: Path, rows: list[dict]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "metrics.jsonl"
        write_text_atomic(self.path, "".join(json.dumps(row) + "\n" for row in rows))

    def append(self, rows: list[dict]) -> None:
        with self.path.open("a") as f:
            f.write("".join(json.dumps(row) + "\n" for row in rows))


SPREAD_WARN = 0.25  # a (stage, kind) whose (p75 - p25) / median exceeds this makes the profile suspect
# (the tiny model's actions spread 15-20% across micro-batches and steps on a quiet 2-core VM; 25% means more)
GAP_WARN = 0.10  # so does a replayed step more than this far (relative) from the measured one

BACKWARD_PAIRS = (("backward_ms", "backward_frozen_ms"), ("backward_weight_ms", "backward_weight_frozen_ms"))
"""(unfrozen, frozen) fields of a stage's backward kinds."""


def measured_profile(config: TrainConfig, records: list[ActionTime], spans: list[ActionTime], step_time_ms: float,
                     name: str, stage_numel: dict[int, int], base: profile_mod.Profile | None = None,
                     share_of: Callable[[ActionTime], float] | None = None,
                     replay_records: list[ActionTime] | None = None) -> profile_mod.Profile:
    """A profile from one run: measured medians where the run measured them, else `base` (the plan's).

    Unfrozen times come from actions that froze nothing (every action under --freeze none, ratio-0 actions
    of a plan), frozen times from actions that froze everything (--freeze all, ratio-1 actions of a plan);
    `share_of` overrides which is which (the online mode's probe). F and I are not affected by freezing.
    Actions at other ratios inform only the step overhead. Per-action dispatch, p2p latency, each rank's tail
    (split over its stages by parameter count) and the step overhead (Note [step overhead]) come from
    `replay_records` (default: all records) of the steps `step_time_ms` measured, and `quality` says how
    stable the measurements were.
    """
    if share_of is None:
        def share_of(r: ActionTime) -> float:
            return config.ratio_of(r.action)

    unfrozen = stats_by_stage_kind(r for r in records if share_of(r) == 0.0)
    frozen = stats_by_stage_kind(r for r in records if share_of(r) == 1.0)
    replay_records = records if replay_records is None else replay_records
    tails = rank_tails(replay_records, spans)
    rows, measured, spreads = [], {}, {}
    for s in range(config.num_stages):
        b = base.stages[s] if base is not None and base.stages is not None else None
        fields = profile_mod.COST_FIELDS + profile_mod.OPTIONAL_COST_FIELDS
        row = {f: (getattr(b, f) if b is not None else 0.0) for f in fields}
        got = []
        for kind, hi, lo in (("F", "forward_ms", None), ("I", "backward_input_ms", None),
                             ("B", "backward_ms", "backward_frozen_ms"),
                             ("W", "backward_weight_ms", "backward_weight_frozen_ms")):
            if (s, kind) in unfrozen:
                row[hi], spreads[f"{s}{kind}"] = unfrozen[(s, kind)]
                got.append(hi)
            if lo is not None and (s, kind) in frozen:
                row[lo], spreads[f"{s}{kind}-frozen"] = frozen[(s, kind)]
                got.append(lo)
            elif kind in "FI" and (s, kind) in frozen and (s, kind) not in unfrozen:
                row[hi], spreads[f"{s}{kind}"] = frozen[(s, kind)]
                got.append(hi)
        for hi, lo in BACKWARD_PAIRS:
            if lo in got and hi not in got and b is None:
                row[hi] = row[lo]  # keep the file valid (frozen <= unfrozen); source says what was measured
        _frozen_at_most_unfrozen(row)  # before the derivation: its W = B - frozen B must not go negative
        if b is None:
            _derive_other_backward_style(row, got)
        row["grad_bytes"] = 4.0 * stage_numel.get(s, 0)  # fp32 gradients: what data parallelism reduces
        rank = config.stage_to_rank[s]
        if rank in tails:
            on_rank = [t for t, r in enumerate(config.stage_to_rank) if r == rank]
            total = sum(stage_numel.get(t, 0) for t in on_rank)
            row["tail_ms"] = tails[rank] * (stage_numel.get(s, 0) / total if total else 1 / len(on_rank))
            got.append("tail_ms")
        rows.append(profile_mod.StageCost(**row))
        measured[str(s)] = got
    dispatch = dispatch_ms(replay_records, config.stage_to_rank)
    p2p = p2p_latency_ms(replay_records, config.stage_to_rank, dispatch)
    prof = profile_mod.Profile(name=name, source={}, p2p_ms=p2p, dispatch_ms=dispatch, stages=tuple(rows),
                               dp=config.dp)
    replay = replay_step(config, replay_records, prof)
    if math.isnan(replay):  # some action was never timed (too few steps): no replay, no overhead
        replay = None
    gap = (step_time_ms - replay) / step_time_ms if replay is not None and step_time_ms > 0 else None
    import torch

    source = {
        "kind": "measured",
        "tool": "tfrun",
        "model": config.model,
        "model_hash": config.model_hash,
        "dtype": config.compute_dtype(torch.cuda.is_available()),
        "schedule": config.schedule_name,
        "freeze": config.freeze,
        "num_ranks": config.num_ranks,
        "microbatch_size": config.microbatch_size,
        "seq_len": config.seq_len,
        "num_microbatches": config.num_microbatches,
        "dp": config.dp,
        "torch": torch.__version__,
        "device": run_device(),
        "threads_per_rank": config.threads,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "measured_fields": measured,
        "other_fields": "from the plan's profile" if base is not None else
        "the other backward style derived from this run's (I = frozen B, W = B - frozen B; or B = I + W); else 0",
        "step_time_ms": step_time_ms,
        "replayed_step_ms": replay,
    }
    steps = len({r.step for r in replay_records})
    return dataclasses.replace(prof, source=source, quality=profile_quality(steps, spreads, gap),
                               step_overhead_ms=max(0.0, step_time_ms - replay) if replay is not None else 0.0)


def _derive_other_backward_style(row: dict[str, float], measured: list[str]) -> None:
    """With no base profile, a run measures only its own schedule's backward kinds; the others are derived so
    the profile stays consistent (they do not enter a plan for this schedule): from a full backward,
    I = frozen B and W = B - frozen B (frozen W = 0); from a split one, B = I + W and frozen B = I + frozen W.
    A field the run measured is never replaced: DualPipeV runs B and I / W both, and deriving its I and W from
    its B (frozen B = 0 in an unfrozen run) had put I at 0 and all of B in W (stage 1: I 0.0 and W 20.3 ms where
    the run measured 14.8 and 10.0)."""
    derived: dict[str, float] = {}
    if "backward_ms" in measured:
        derived = {"backward_input_ms": row["backward_frozen_ms"],
                   "backward_weight_ms": row["backward_ms"] - row["backward_frozen_ms"],
                   "backward_weight_frozen_ms": 0.0}
    elif "backward_input_ms" in measured or "backward_weight_ms" in measured:
        derived = {"backward_ms": row["backward_input_ms"] + row["backward_weight_ms"],
                   "backward_frozen_ms": row["backward_input_ms"] + row["backward_weight_frozen_ms"]}
    row.update({field: value for field, value in derived.items() if field not in measured})
    _frozen_at_most_unfrozen(row)  # a derived B beside a measured frozen B (DualPipeV's `all` run)


def _frozen_at_most_unfrozen(row: dict[str, float]) -> None:
    """Keep the file valid: a frozen time above its unfrozen one (measurement noise) is cut to it."""
    for hi, lo in BACKWARD_PAIRS:
        row[lo] = min(row[lo], row[hi])


def profile_quality(steps: int, spreads: dict[str, float], replay_gap: float | None) -> dict:
    """The profile's quality section, with a warning per unstable measurement (SPREAD_WARN, GAP_WARN)."""
    warnings = [f"{_describe(key)}: spread {value:.0%} of the median (more than {SPREAD_WARN:.0%})"
                for key, value in sorted(spreads.items()) if value > SPREAD_WARN]
    if replay_gap is None:
        warnings.append("some action was never timed: no replay, no step overhead")
    elif abs(replay_gap) > GAP_WARN:
        warnings.append(f"the replayed step is {-replay_gap:+.0%} off the measured one (more than {GAP_WARN:.0%}): "
                        "time outside the modelled actions and tails (see tfplan explain)")
    if steps < 8:
        warnings.append(f"only {steps} timed steps")
    out = {"steps": steps, "spread": spreads, "max_spread": max(spreads.values(), default=0.0), "warnings": warnings}
    if replay_gap is not None:
        out["replay_gap"] = replay_gap
    return out


def _describe(key: str) -> str:
    """A spread key ("1B", "0W-frozen") in words: "stage 1 B", "stage 0 W frozen"."""
    base, _, frozen = key.partition("-")
    return f"stage {base[:-1]} {base[-1]}{' ' + frozen if frozen else ''}"


def replay_step(config: TrainConfig, records: list[ActionTime], prof: profile_mod.Profile) -> float:
    """The step the DAG model predicts for this run (Note [step overhead]): the run's own schedule with every
    action at its measured median duration plus the dispatch cost, the measured p2p lag, and each rank's
    tail after its last action; NaN if some action was never timed."""
    from tfplan.step import dag as dag_mod
    from tfplan.step.simulate import simulate

    sched = config.schedule()
    dag = dag_mod.build(sched, profile_mod.uniform(config.num_stages, p2p_ms=prof.p2p_ms))
    med = {a: row["duration_ms"] for a, row in action_table(records).items()}
    if len(med) < dag.num_nodes:
        return float("nan")
    sim = simulate(dag, [med[str(a)] + prof.dispatch_ms for a in dag.actions])
    tail = [0.0] * sched.num_ranks
    for s, cost in enumerate(prof.stages):
        tail[sched.stage_to_rank[s]] += cost.tail_ms
    last = {}
    for v, r in enumerate(dag.rank):
        last[r] = v  # nodes are listed rank by rank, in order
    return max(sim.end_ms[last[r]] + tail[r] for r in last)


TIMINGS_VERSION = 2


def write_outputs(out: Path, config: TrainConfig, summary: dict, records: list[ActionTime],
                  stats: list[dict], spans: list[ActionTime], prof: profile_mod.Profile | None = None) -> None:
    """summary.json, timings.json, freeze_stats.json and profile.json (rank 0, atomically); `prof` (the online
    mode's, which knows what each step froze) replaces the profile measured from the whole run."""
    base = None
    if config.plan_profile is not None:
        base = profile_mod.from_dict(config.plan_profile)
    numel: dict[int, int] = {}
    for row in stats:
        numel[row["stage"]] = numel.get(row["stage"], 0) + row.get("numel", 0)
    if prof is None:
        prof = measured_profile(config, records, spans, summary["step_time_ms"], name=f"measured-{config.model}",
                                stage_numel=numel, base=base)
    write_json_atomic(out / "profile.json", prof.to_dict())
    optimizer: dict[int, list[float]] = {}
    for sp in spans:
        optimizer.setdefault(sp.rank, []).append(sp.duration_ms)
    tails = rank_tails(records, spans)
    write_json_atomic(out / "timings.json", {
        "schema_version": TIMINGS_VERSION,
        "timed_steps": sorted({r.step for r in records}),
        "actions": action_table(records),
        "by_stage_kind_ms": {f"{s}{k}": v[0] for (s, k), v in sorted(stats_by_stage_kind(records).items())},
        "ranks": [{"rank": r, "optimizer_ms": statistics.median(v), "optimizer_spread": spread(v),
                   "tail_ms": tails.get(r)} for r, v in sorted(optimizer.items())],
        "makespan_ms": makespans(records),
        "step_durations": step_durations(records),
        "dispatch_ms": prof.dispatch_ms,
        "p2p_ms": prof.p2p_ms,
        "replayed_step_ms": prof.source.get("replayed_step_ms"),
        "step_overhead_ms": prof.step_overhead_ms,
    })
    write_json_atomic(out / "freeze_stats.json", {
        "schema_version": FREEZE_STATS_VERSION, "policy": config.freeze_policy, "freeze": config.freeze,
        "num_microbatches": config.num_microbatches, "redraw_every": config.redraw_every, "tensors": stats,
    })
    write_json_atomic(out / "summary.json", summary)


NOISE_TENSORS_VERSION = 1


def write_noise_tensors(out: Path, config: TrainConfig, rows: list[dict]) -> None:
    """noise_tensors.json (rank 0): per stage, every tensor's smoothed |G|^2 and tr(Sigma) at the run's end and
    its noise scale, the tensors that carry most of the stage's tr(Sigma) first: which tensor drives a stage's
    estimate (tfrun.freeze.noise_estimators Note [robust noise])."""
    stages = []
    for s in sorted({row["stage"] for row in rows}):
        mine = [row for row in rows if row["stage"] == s]
        gsq, trace = math.fsum(r["grad_sq"] for r in mine), math.fsum(r["trace"] for r in mine)
        tensors = [{"name": r["name"], "grad_sq": r["grad_sq"], "trace": r["trace"],
                    "noise_scale_tokens": r["trace"] / r["grad_sq"] if r["grad_sq"] > 0 else None,
                    "trace_share": r["trace"] / trace if trace > 0 else None,
                    "grad_sq_share": r["grad_sq"] / gsq if gsq > 0 else None} for r in mine]
        tensors.sort(key=lambda t: -(t["trace_share"] or 0.0))
        stages.append({"stage": s, "grad_sq": gsq, "trace": trace,
                       "noise_scale_tokens": trace / gsq if gsq > 0 else None, "tensors": tensors})
    write_json_atomic(out / "noise_tensors.json", {"schema_version": NOISE_TENSORS_VERSION,
                                                   "estimator": config.noise_estimator,
                                                   "measure": config.noise_measure, "stages": stages})
