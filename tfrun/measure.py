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
from dataclasses import dataclass
from pathlib import Path

from tfplan import profile as profile_mod
from tfplan import summary as summary_format
from tfplan.fileio import write_json_atomic, write_text_atomic
from tfrun.config import TrainConfig
from tfrun.timing import (
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
SUMMARY_VERSION = summary_format.SCHEMA_VERSION  # tfplan.summary validates summary.json


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


def step_rows(metrics: list[dict]) -> list[dict]:
    """The per-step records of metrics.jsonl (the others are events: phase starts, plans; tfrun.online)."""
    return [row for row in metrics if "event" not in row]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass(frozen=True, kw_only=True, slots=True)
class OnlineRecord:
    """What a summary needs of an online run (tfrun.online.OnlinePlanner.record)."""

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
    evaluation time: tfrun.wallclock Note [wall time]) are over every step. An online run also reports each
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
    evals = [row["eval_loss"] for row in metrics if "eval_loss" in row]
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
        "final_train_loss": metrics[-1]["loss"] if metrics else None,
        "final_eval_loss": evals[-1] if evals else None,
    }
    summary |= _noise_fields(config, metrics)
    if online is not None:
        summary |= _online_fields(config, online, metrics, timed if note is None else [], plans, wall_s)
    return summary


def _noise_fields(config: TrainConfig, metrics: list[dict]) -> dict:
    """`noise_scale_tokens` (per stage, the median over the measured steps of the smoothed estimate; null when
    none was positive) and `grad_sq_share` (per stage, the median share of |G|^2; they sum to about 1), and
    `noise_steps` (steps measured); {} when the run measured none (tfrun.noise Note [noise scale])."""
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
    share = [statistics.median(col) for col in zip(*shares)] if shares else None
    if share:
        share = [x / sum(share) for x in share]  # medians of shares need not sum to 1: renormalised
    return {"noise_scale_tokens": scales, "grad_sq_share": share, "noise_steps": len(rows)}


def _wall_ms(row: dict) -> float:
    """A step row's wall time (tfrun.wallclock); a row written before wall_ms existed counts its step time."""
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
    mismatch, tfrun.provenance) or no step was timed (Note [no timed step]); {} when neither applies."""
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
    from tfplan.actions import FREEZABLE, parse_action

    sums, counts = [0.0] * config.num_stages, [0] * config.num_stages
    for a in (parse_action(x) for row in config.order for x in row):
        if a.kind in FREEZABLE:
            sums[a.stage] += config.ratio_of(str(a))
            counts[a.stage] += 1
    return [x / k if k else 0.0 for x, k in zip(sums, counts)]


SPREAD_WARN = 0.25  # a (stage, kind) whose (p75 - p25) / median exceeds this makes the profile suspect
# (the tiny model's actions spread 15-20% across micro-batches and steps on a quiet 2-core VM; 25% means more)
GAP_WARN = 0.10  # so does a replayed step more than this far (relative) from the measured one


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
        for hi, lo in (("backward_ms", "backward_frozen_ms"), ("backward_weight_ms", "backward_weight_frozen_ms")):
            if lo in got and hi not in got and b is None:
                row[hi] = row[lo]  # keep the file valid (frozen <= unfrozen); source says what was measured
            row[lo] = min(row[lo], row[hi])
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
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
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
    I = frozen B and W = B - frozen B (frozen W = 0); from a split one, B = I + W and frozen B = I + frozen W."""
    if "backward_ms" in measured:
        row["backward_input_ms"] = row["backward_frozen_ms"]
        row["backward_weight_ms"] = row["backward_ms"] - row["backward_frozen_ms"]
        row["backward_weight_frozen_ms"] = 0.0
    elif "backward_input_ms" in measured or "backward_weight_ms" in measured:
        row["backward_ms"] = row["backward_input_ms"] + row["backward_weight_ms"]
        row["backward_frozen_ms"] = row["backward_input_ms"] + row["backward_weight_frozen_ms"]


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
    from tfplan import dag as dag_mod
    from tfplan.simulate import simulate

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
