"""Turn what a run measured into its outputs: metrics.jsonl, summary.json, timings.json and a profile in
tfplan's format (profile.json), so the next planning round starts from real measurements.

Note [step overhead]: a measured step also spends time outside the DAG's actions (optimizer step, loss
bookkeeping, Python and communication between actions). We simulate the run's own schedule with the
measured per-action medians and measured p2p latency, and carry (measured step time - simulated makespan)
as the profile's step_overhead_ms, which tfplan adds to every prediction.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tfplan import profile as profile_mod
from tfplan.fileio import write_json_atomic, write_text_atomic
from tfrun.config import TrainConfig
from tfrun.timing import ActionTime, makespans, medians_by_action, medians_by_stage_kind, p2p_latency_ms

FREEZE_STATS_VERSION = 1


def write_metrics(out: Path, metrics: list[dict]) -> None:
    """metrics.jsonl, one JSON object per step (rewritten atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in metrics))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(config: TrainConfig, metrics: list[dict], records: list[ActionTime], stats: list[dict]) -> dict:
    """summary.json: medians over the timed steps (after the ramp and the timing warm-up), the realised freeze
    ratios (means over the steps after the ramp) and the per-tensor update extremes of freeze_stats.json."""
    timed = [row for row in metrics if row.get("timed")] or metrics
    full = [row for row in metrics if row["step"] >= config.ramp_steps] or metrics
    step_ms = _median([row["step_time_ms"] for row in timed])
    predicted = config.predicted_step_ms
    evals = [row["eval_loss"] for row in metrics if "eval_loss" in row]
    spans = makespans(records)
    return {
        "schedule": config.schedule_name,
        "model": config.model,
        "freeze": config.freeze,
        "freeze_method": config.freeze_method,
        "num_ranks": config.num_ranks,
        "num_stages": config.num_stages,
        "num_microbatches": config.num_microbatches,
        "steps": len(metrics),
        "timed_steps": len(timed),
        "step_time_ms": step_ms,
        "tokens_per_s": _median([row["tokens_per_s"] for row in timed]),
        "measured_makespan_ms": _median(list(spans.values())),
        "predicted_step_ms": predicted,
        "prediction_error": (step_ms - predicted) / predicted if predicted else None,
        "mean_freeze_ratio": [
            _median([row["freeze_ratio"][s] for row in timed]) for s in range(config.num_stages)
        ],
        "planned_freeze_ratio": planned_stage_means(config),
        "realised_freeze_ratio": [
            statistics.fmean(row["freeze_ratio"][s] for row in full) if full else 0.0 for s in range(config.num_stages)
        ],
        "min_update_share": min((r["steps_updated"] / r["steps"] for r in stats if r["steps"]), default=None),
        "min_contribution_share": min(
            (r["contributions"] / (r["steps"] * config.num_microbatches) for r in stats if r["steps"]), default=None
        ),
        "longest_update_gap": max((r["longest_gap"] for r in stats), default=None),
        "final_train_loss": metrics[-1]["loss"] if metrics else None,
        "final_eval_loss": evals[-1] if evals else None,
    }


def planned_stage_means(config: TrainConfig) -> list[float]:
    """The run's planned mean freeze ratio per stage, over each stage's freezable actions (B and W)."""
    from tfplan.actions import FREEZABLE, parse_action

    sums, counts = [0.0] * config.num_stages, [0] * config.num_stages
    for a in (parse_action(x) for row in config.order for x in row):
        if a.kind in FREEZABLE:
            sums[a.stage] += {"plan": config.ratios.get(str(a), 0.0), "none": 0.0, "all": 1.0}[config.freeze]
            counts[a.stage] += 1
    return [x / k if k else 0.0 for x, k in zip(sums, counts)]


def measured_profile(config: TrainConfig, records: list[ActionTime], step_time_ms: float,
                     name: str, base: profile_mod.Profile | None = None) -> profile_mod.Profile:
    """A profile from one run: measured medians where the run measured them, else `base` (the plan's).

    Unfrozen times come from actions that froze nothing (every action under --freeze none, ratio-0 actions
    of a plan), frozen times from actions that froze everything (--freeze all, ratio-1 actions of a plan);
    F and I are not affected by freezing. Actions at other ratios inform only the step overhead.
    """
    ratio = {a: {"plan": config.ratios.get(a, 0.0), "none": 0.0, "all": 1.0}[config.freeze]
             for row in config.order for a in row}
    unfrozen = medians_by_stage_kind(r for r in records if ratio[r.action] == 0.0)
    frozen = medians_by_stage_kind(r for r in records if ratio[r.action] == 1.0)
    rows, measured = [], {}
    for s in range(config.num_stages):
        b = base.stages[s] if base is not None and base.stages is not None else None
        row = {f: (getattr(b, f) if b is not None else 0.0) for f in profile_mod.COST_FIELDS}
        got = []
        for kind, hi, lo in (("F", "forward_ms", None), ("I", "backward_input_ms", None),
                             ("B", "backward_ms", "backward_frozen_ms"),
                             ("W", "backward_weight_ms", "backward_weight_frozen_ms")):
            if (s, kind) in unfrozen:
                row[hi] = unfrozen[(s, kind)]
                got.append(hi)
            if lo is not None and (s, kind) in frozen:
                row[lo] = frozen[(s, kind)]
                got.append(lo)
            elif kind in "FI" and (s, kind) in frozen and (s, kind) not in unfrozen:
                row[hi] = frozen[(s, kind)]
                got.append(hi)
        for hi, lo in (("backward_ms", "backward_frozen_ms"), ("backward_weight_ms", "backward_weight_frozen_ms")):
            if lo in got and hi not in got and b is None:
                row[hi] = row[lo]  # keep the file valid (frozen <= unfrozen); source says what was measured
            row[lo] = min(row[lo], row[hi])
        rows.append(profile_mod.StageCost(**row))
        measured[str(s)] = got
    p2p = p2p_latency_ms(records, config.stage_to_rank)
    makespan = replay_makespan(config, records, p2p)
    import torch

    source = {
        "kind": "measured",
        "tool": "tfrun",
        "model": config.model,
        "schedule": config.schedule_name,
        "freeze": config.freeze,
        "microbatch_size": config.microbatch_size,
        "seq_len": config.seq_len,
        "num_microbatches": config.num_microbatches,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "threads_per_rank": config.threads,
        "measured_fields": measured,
        "other_fields": "from the plan's profile" if base is not None else "0 (not measured by this run)",
        "step_time_ms": step_time_ms,
        "replayed_makespan_ms": makespan,
    }
    return profile_mod.Profile(name=name, source=source, p2p_ms=p2p,
                               step_overhead_ms=max(0.0, step_time_ms - makespan), stages=tuple(rows))


def replay_makespan(config: TrainConfig, records: list[ActionTime], p2p_ms: float) -> float:
    """Simulated makespan of the run's own schedule with every action at its measured median duration and
    the measured p2p latency: what the DAG model says this run should take (Note [step overhead])."""
    from tfplan import dag as dag_mod
    from tfplan import schedules
    from tfplan.actions import parse_action
    from tfplan.simulate import simulate

    sched = schedules.from_order([[parse_action(a) for a in row] for row in config.order],
                                 name=config.schedule_name, num_microbatches=config.num_microbatches)
    dag = dag_mod.build(sched, profile_mod.uniform(config.num_stages, p2p_ms=p2p_ms))
    med = medians_by_action(records)
    if len(med) < dag.num_nodes:
        return float("nan")
    return simulate(dag, [med[str(a)] for a in dag.actions]).makespan_ms


def write_outputs(out: Path, config: TrainConfig, summary: dict, records: list[ActionTime],
                  stats: list[dict]) -> None:
    """summary.json, timings.json, freeze_stats.json and profile.json (rank 0, atomically)."""
    base = None
    if config.plan_profile is not None:
        base = profile_mod.from_dict(config.plan_profile)
    prof = measured_profile(config, records, summary["step_time_ms"], name=f"measured-{config.model}", base=base)
    write_json_atomic(out / "profile.json", prof.to_dict())
    write_json_atomic(out / "timings.json", {
        "by_stage_kind_ms": {f"{s}{k}": v for (s, k), v in sorted(medians_by_stage_kind(records).items())},
        "by_action_ms": medians_by_action(records),
        "makespan_ms": makespans(records),
        "p2p_ms": prof.p2p_ms,
        "step_overhead_ms": prof.step_overhead_ms,
    })
    write_json_atomic(out / "freeze_stats.json", {
        "schema_version": FREEZE_STATS_VERSION, "policy": config.freeze_policy, "freeze": config.freeze,
        "num_microbatches": config.num_microbatches, "redraw_every": config.redraw_every, "tensors": stats,
    })
    write_json_atomic(out / "summary.json", summary)
