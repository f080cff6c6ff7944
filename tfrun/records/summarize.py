"""One summariser for every run (tfrun train's summary.json): plain and planned runs, baselines and the online
mode alike, from the run's metrics rows, its action records and its per-tensor statistics (docs/formats.md,
"summary.json"). Notes [steps in force] and [no timed step] below.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tfplan.report import summary as summary_format
from tfrun.config.train_config import TrainConfig
from tfrun.measure.timing import ActionTime, makespans

SUMMARY_VERSION = summary_format.SCHEMA_VERSION  # tfplan.report.summary validates summary.json


def step_rows(metrics: list[dict]) -> list[dict]:
    """The per-step records of metrics.jsonl (the others are events: phase starts, plans; tfrun.freeze.online)."""
    return [row for row in metrics if "event" not in row]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass(frozen=True, kw_only=True, slots=True)
class OnlineRecord:
    """What a summary needs of an online run (tfrun.freeze.online.OnlinePlanner.record)."""

    bounds: list[tuple[str, int, int | None]]
    """(phase, first step, end step or None)."""
    plans: list[dict]
    """Every plan put in force: {"step", "predicted_ms", "reason"}, in order."""
    solve_s: list[float]
    """Seconds of each in-run solve."""
    planned_freeze_ratio: list[float] | None
    """The plan in force at the end: mean ratio per stage (None: no plan yet)."""

    @property
    def stable_start(self) -> int:
        return next(lo for name, lo, _ in self.bounds if name == "stable")


def in_force_start(config: TrainConfig, online: OnlineRecord | None) -> int:
    """The first step of the steps a run's medians are over (Note [steps in force])."""
    return online.stable_start if online is not None else config.ramp_steps


def summarize(config: TrainConfig, metrics: list[dict], records: list[ActionTime], stats: list[dict],
              online: OnlineRecord | None = None) -> dict:
    """summary.json, for every kind of run (Note [steps in force]).

    Note [steps in force]: the medians (step time, tokens/s) and the realised ratios are over the steps in
    which the run's freezing is what it reports: after the ramp (a plan's ramp; an online run's stable phase),
    and for the medians only timed steps (after the timing warm-up). The totals (tokens, training wall time,
    evaluation time: tfrun.measure.wallclock Note [wall time]) are over every step. An online run also reports each
    plan it put in force against the stable steps it was in force for; its headline prediction is its first
    plan's, measured against that plan's steps (the later plans were fitted to this run's own times).

    Note [no timed step]: when the run is too short to time any step in force, the medians are over every
    step, warm-up included; summary.json then says so (timed_steps 0, timing_note) and reports no prediction
    error (`caveats`)."""
    metrics = step_rows(metrics)
    first = in_force_start(config, online)
    in_force = [row for row in metrics if row["step"] >= first]
    timed = [row for row in in_force if row.get("timed")]
    note = None
    if not timed:
        why = (f"no timed step in the stable phase (from step {first})" if online is not None else
               f"no timed step (steps {len(metrics)} <= ramp {config.ramp_steps} + timing warm-up "
               f"{config.timing_warmup_steps})")
        timed, note = metrics, (f"{why}: step_time_ms and tokens_per_s are medians over all {len(metrics)} steps, "
                                "warm-up included")
    step_ms = _median([row["step_time_ms"] for row in timed])
    evals = [row["eval_loss"] for row in metrics if row.get("eval_loss") is not None]
    spans = makespans(records)
    wall_s = sum(_wall_ms(row) for row in metrics) / 1e3
    tokens = sum(_tokens(config, row) for row in metrics)
    plans = _plan_segments(online, timed, metrics[-1]["step"] + 1 if metrics else 0) if online is not None else []
    if online is not None:  # the first plan against its own steps (Note [steps in force])
        predicted, measured = (plans[0]["predicted_ms"], plans[0]["measured_ms"]) if plans else (None, None)
    else:
        predicted, measured = config.predicted_step_ms, step_ms
    summary = {
        "schema_version": SUMMARY_VERSION,
        "schedule": config.schedule_name,
        "model": config.model,
        "freeze": config.freeze,
        "freeze_method": config.freeze_method,
        "num_ranks": config.num_ranks,
        "dp": config.dp,
        "num_stages": config.num_stages,
        "num_microbatches": config.num_microbatches,
        "steps": len(metrics),
        "timed_steps": len(timed) if note is None else 0,
        "timing_note": note,
        "step_time_ms": step_ms,
        "tokens_per_s": _median([row["tokens_per_s"] for row in timed]),
        "tokens": tokens,
        "train_wall_s": wall_s,
        "eval_s": sum(row.get("eval_ms", 0.0) for row in metrics) / 1e3,
        "wall_tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "measured_makespan_ms": _median(list(spans.values())),
        "predicted_step_ms": predicted,
        "prediction_error": (measured - predicted) / predicted if predicted and measured else None,
        "prediction_note": None,
        "mean_freeze_ratio": [
            _median([row["freeze_ratio"][s] for row in timed]) for s in range(config.num_stages)
        ],
        "planned_freeze_ratio": (online.planned_freeze_ratio or [0.0] * config.num_stages) if online is not None
        else planned_stage_means(config),
        "realised_freeze_ratio": [
            statistics.fmean(row["freeze_ratio"][s] for row in in_force) if in_force else 0.0
            for s in range(config.num_stages)
        ],
        "min_update_share": min((r["steps_updated"] / r["steps"] for r in stats if r["steps"]), default=None),
        "min_contribution_share": min(
            (r["contributions"] / (r["steps"] * config.num_microbatches) for r in stats if r["steps"]), default=None
        ),
        "longest_update_gap": max((r["longest_gap"] for r in stats), default=None),
        "final_train_loss": next((r["loss"] for r in reversed(metrics) if r.get("loss") is not None), None),
        "final_eval_loss": evals[-1] if evals else None,
    }
    summary |= _noise_fields(config, metrics)
    if online is not None:
        summary |= _online_fields(config, online, metrics, timed if note is None else [], plans, wall_s)
    return summary


def _noise_fields(config: TrainConfig, metrics: list[dict]) -> dict:
    """`noise_scale_tokens` (per stage, the median over the measured steps of the smoothed estimate; null when
    none was positive), `grad_sq_share` (per stage, the median share of |G|^2), `update_share` (the same of the
    adam learning model's weight, sqrt(n |G|^2) summed over a stage's tensors: tfplan.cost.goodput Note [learning
    models]), and `noise_steps` (steps measured); {} when the run measured none (tfrun.freeze.noise Note [noise
    scale])."""
    rows = [row for row in metrics if "noise_scale_tokens" in row]
    if not rows:
        return {}
    scales, shares = [], []
    for s in range(config.num_stages):
        values = [row["noise_scale_tokens"][s] for row in rows if row["noise_scale_tokens"][s] is not None]
        scales.append(statistics.median(values) if values else None)
    for row in rows:  # shares only from steps that estimated every stage
        total = sum(g for g in row["grad_sq"] if g is not None and g > 0)
        if total > 0 and all(g is not None for g in row["grad_sq"]):
            shares.append([max(g, 0.0) / total for g in row["grad_sq"]])
    return {"noise_scale_tokens": scales, "grad_sq_share": _median_share(rows, "grad_sq"),
            "update_share": _median_share(rows, "update_norm"), "noise_steps": len(rows),
            "noise_estimator": config.noise_estimator, "noise_measure": config.noise_measure}


def _median_share(rows: list[dict], key: str) -> list[float] | None:
    """Per stage, the median over the measured steps that estimated every stage of its share of the rows' `key`
    (grad_sq, update_norm), renormalised (medians of shares need not sum to 1); None without such a step."""
    shares = []
    for row in rows:
        values = row.get(key)
        if values is None or any(g is None for g in values):
            continue
        total = sum(g for g in values if g > 0)
        if total > 0:
            shares.append([max(g, 0.0) / total for g in values])
    if not shares:
        return None
    share = [statistics.median(col) for col in zip(*shares)]
    return [x / sum(share) for x in share]


def _wall_ms(row: dict) -> float:
    """A step row's wall time (tfrun.measure.wallclock); a row written before wall_ms existed counts its step time."""
    return row.get("wall_ms", row["step_time_ms"])


def _tokens(config: TrainConfig, row: dict) -> int:
    return row.get("tokens", config.global_batch * config.seq_len)


def _plan_segments(online: OnlineRecord, timed: list[dict], end_step: int) -> list[dict]:
    """Each plan's prediction against the timed stable steps it was in force for (a re-plan starts a segment)."""
    stable = [row for row in timed if row["step"] >= online.stable_start]
    out = []
    for k, p in enumerate(online.plans):
        end = online.plans[k + 1]["step"] if k + 1 < len(online.plans) else end_step
        segment = [row["step_time_ms"] for row in stable if p["step"] <= row["step"] < end]
        measured = statistics.median(segment) if segment else None
        out.append(p | {"measured_ms": measured, "steps": len(segment),
                        "error": (measured - p["predicted_ms"]) / p["predicted_ms"] if measured else None})
    return out


def _online_fields(config: TrainConfig, online: OnlineRecord, metrics: list[dict], stable: list[dict],
                   plans: list[dict], wall_s: float) -> dict:
    """summary.json's online fields: phases, the stable phase's median step, each plan against its steps, the
    share of wall time outside the stable phase, solves and re-plans."""
    last = metrics[-1]["step"] if metrics else -1
    phases = [{"name": n, "start_step": lo, "end_step": min(hi, last + 1) if hi is not None else last + 1}
              for n, lo, hi in online.bounds if lo <= last]
    outside = sum(_wall_ms(row) for row in metrics if row["step"] < online.stable_start) / 1e3
    last_plan = next((p for p in reversed(plans) if p["measured_ms"] is not None), None)
    return {
        "phases": phases,
        "stable_step_time_ms": _median([row["step_time_ms"] for row in stable]) if stable else None,
        "stable_predicted_step_ms": last_plan["predicted_ms"] if last_plan else None,
        "stable_prediction_error": last_plan["error"] if last_plan else None,
        "outside_stable_share": outside / wall_s if wall_s > 0 else None,
        "solve_s": online.solve_s,
        "plans": plans,
        "replans": sum(1 for p in online.plans if p["reason"].startswith("drift")),
    }


def caveats(config: TrainConfig, summary: dict) -> dict:
    """What overrides the prediction error: the plan's profile does not match the run (a --force'd
    mismatch, tfrun.records.provenance) or no step was timed (Note [no timed step]); {} when neither applies."""
    notes = []
    if config.prediction_note:
        notes.append(f"the plan's profile does not match this run (--force): {config.prediction_note}")
    if summary.get("timing_note") and summary.get("predicted_step_ms") is not None:
        notes.append("no timed step to compare with the prediction")
    if not notes:
        return {}
    return {"prediction_error": None, "prediction_note": "; ".join(notes)}


def planned_stage_means(config: TrainConfig) -> list[float]:
    """The run's planned mean freeze ratio per stage, over each stage's freezable actions (B and W)."""
    from tfplan.schedule.actions import FREEZABLE, parse_action

    sums, counts = [0.0] * config.num_stages, [0] * config.num_stages
    for a in (parse_action(x) for row in config.order for x in row):
        if a.kind in FREEZABLE:
            sums[a.stage] += config.ratio_of(str(a))
            counts[a.stage] += 1
    return [x / k if k else 0.0 for x, k in zip(sums, counts)]


