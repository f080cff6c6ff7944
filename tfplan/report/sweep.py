"""What-if sweeps: schedules x micro-batch counts x caps, each solved and compared with no freezing and
with naive uniform freezing at the same mean ratio (what schedule awareness buys). With a noise scale (the
profile's noise section, or given), each row also says what the plan is worth in learning: its predicted
goodput, and the best goodput any plan reaches at that cap and batch (tfplan.cost.goodput), so that a sweep over
micro-batch counts and data-parallel degrees answers "does freezing pay at my batch?"."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tfplan.cost.profile import load
from tfplan.errors import TfplanError
from tfplan.plan import plan as plan_mod
from tfplan.plan.job import JobSpec, check_backend, resolve_schedule, solve_dag
from tfplan.schedule.schedules import get_spec
from tfplan.solve.lp import DEFAULT_TIME_LIMIT_S, TimeLimitReached, check_time_limit
from tfplan.step.dag import build


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepRow:
    """One (schedule, micro-batches, cap) combination. Times in ms per step."""

    schedule: str
    num_microbatches: int
    cap: float
    dp: int = 1
    """Data-parallel replicas (their gradient reduction in the ranks' tails: tfplan.cost.dataparallel)."""
    num_ranks: int | None = None
    num_stages: int | None = None
    skipped: str = ""
    """Why the combination cannot run (empty when it ran; then every field below is None)."""
    no_freeze_ms: float | None = None
    planned_ms: float | None = None
    speedup: float | None = None
    bubble_before: float | None = None
    bubble_after: float | None = None
    mean_freeze_ratio: float | None = None
    """Mean planned ratio over all freezable actions."""
    uniform_ms: float | None = None
    """Every freezable action at `mean_freeze_ratio` (naive baseline)."""
    uniform_speedup: float | None = None
    all_frozen_ms: float | None = None
    solve_s: float | None = None
    status: str | None = None
    """The solve's status: OPTIMAL, or FEASIBLE when the time limit stopped it (lp.SolverRecord)."""
    batch_tokens: float | None = None
    """The step's batch (dp x M x micro-batch tokens) when a noise scale is known."""
    goodput: float | None = None
    """The (makespan) plan's predicted goodput relative to no freezing (tfplan.cost.goodput)."""
    best_goodput: float | None = None
    """The goodput-objective plan's at the same cap (1.0: freezing does not pay at this batch)."""
    best_goodput_ratio: float | None = None
    """That plan's mean freeze ratio."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def sweep(
    profile_path: str,
    schedule_names: Sequence[str],
    microbatches: Sequence[int],
    caps: Sequence[float],
    stages_per_rank: int | None = None,
    num_ranks: int | None = None,
    layers_per_stage: Sequence[int] | None = None,
    on_row: Callable[[SweepRow], None] | None = None,
    backend: str = "auto",
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
    dps: Sequence[int] = (1,),
    dp_link: str | None = None,
    noise_scale: Sequence[float] | None = None,
    learning_model: str | None = None,
) -> list[SweepRow]:
    """Solve every combination (x data-parallel degree); combinations a schedule cannot run, or without a
    feasible plan within the time limit (per solve), are returned with `skipped` set.

    `noise_scale` (tokens, one value or one per stage or layer of the profile) replaces the profile's noise
    section (shares of |G|^2 equal); `learning_model` reads the noise section under that model.

    Raises:
        TfplanError: a bad profile, unknown schedule name, cap outside [0, 1], time limit, or a data-parallel
            degree the profile cannot model (before any solving).
    """
    from tfplan.cost import dataparallel

    base = load(profile_path)
    if noise_scale is not None:
        base = _given_noise(base, noise_scale)
    if learning_model is not None and base.noise is not None:
        from tfplan.cost import goodput

        base = dataclasses.replace(base, noise=goodput.with_learning_model(base.noise, learning_model))
    check_caps_list(caps)
    check_backend(backend)
    check_time_limit(time_limit_s)
    for name in schedule_names:
        get_spec(name)  # an unknown name is the user's mistake, not a combination to skip
    link = dataparallel.parse_link(dp_link, base) if dp_link else None
    profiles = {dp: dataparallel.with_dp(base, dp, link) for dp in dps}
    rows = []
    for dp, profile in profiles.items():
        rows += _sweep_one(profile_path, profile, dp, schedule_names, microbatches, caps, stages_per_rank,
                           num_ranks, layers_per_stage, on_row, backend, time_limit_s)
    return rows


def _sweep_one(profile_path, profile, dp, schedule_names, microbatches, caps, stages_per_rank, num_ranks,
               layers_per_stage, on_row, backend, time_limit_s) -> list[SweepRow]:
    rows = []
    for name in schedule_names:
        for m in microbatches:
            spec = JobSpec(
                profile_path=profile_path,
                schedule=name,
                num_microbatches=m,
                stages_per_rank=stages_per_rank,
                num_ranks=num_ranks,
                layers_per_stage=layers_per_stage,
            )
            try:
                schedule = resolve_schedule(spec, profile)
                dag = build(schedule, profile, layers_per_stage)
            except TfplanError as exc:  # this schedule cannot run these arguments: skip, saying why
                for c in caps:
                    row = SweepRow(schedule=name, num_microbatches=m, cap=c, dp=dp, skipped=str(exc).split("\n")[0])
                    rows.append(row)
                    if on_row:
                        on_row(row)
                continue
            for c in caps:
                try:
                    solution = solve_dag(dag, c, backend=backend, time_limit_s=time_limit_s)
                except TimeLimitReached as exc:
                    row = SweepRow(schedule=schedule.name, num_microbatches=m, cap=c, dp=dp, skipped=str(exc))
                    rows.append(row)
                    if on_row:
                        on_row(row)
                    continue
                plan = plan_mod.make_plan(dag, solution, [c] * schedule.num_stages, profile)
                p = plan.predicted
                learning = _learning(dag, profile, plan, c, layers_per_stage, backend, time_limit_s)
                row = SweepRow(
                    schedule=schedule.name,
                    num_microbatches=m,
                    cap=c,
                    dp=dp,
                    num_ranks=schedule.num_ranks,
                    num_stages=schedule.num_stages,
                    no_freeze_ms=p.no_freeze_ms,
                    planned_ms=p.planned_ms,
                    speedup=p.speedup,
                    bubble_before=p.no_freeze_bubble_fraction,
                    bubble_after=p.planned_bubble_fraction,
                    mean_freeze_ratio=p.mean_freeze_ratio,
                    uniform_ms=p.uniform_ms,
                    uniform_speedup=p.no_freeze_ms / p.uniform_ms,
                    all_frozen_ms=p.all_frozen_ms,
                    solve_s=solution.wall_s,
                    status=solution.status,
                    **learning,
                )
                rows.append(row)
                if on_row:
                    on_row(row)
    return rows


def _learning(dag, profile, plan, cap, layers_per_stage, backend, time_limit_s) -> dict:
    """A row's goodput fields: the plan's predicted goodput and the best any plan reaches at this cap."""
    from tfplan.cost import goodput
    from tfplan.plan import job

    noise = profile.stage_noise(dag.schedule.num_stages, layers_per_stage)
    if noise is None:
        return {}
    batch = job.batch_tokens(profile, dag.schedule, noise)
    p = plan.predicted
    value = goodput.evaluate(plan.mean_ratio_per_stage(), p.planned_ms, p.no_freeze_ms, batch, noise)
    best = job.solve_plan(dag, profile, cap, backend=backend, time_limit_s=time_limit_s, objective="goodput",
                          noise=noise)
    return {"batch_tokens": batch, "goodput": value.goodput, "best_goodput": best.goodput.value.goodput,
            "best_goodput_ratio": best.predicted.mean_freeze_ratio}


def _given_noise(profile, scales: Sequence[float]):
    """The profile with a noise section of the given scales (equal shares), at its own micro-batch shape."""
    from tfplan.cost import goodput
    from tfplan.cost.profile import microbatch_tokens

    tokens = microbatch_tokens(profile.source)
    if tokens is None:
        raise TfplanError(f"--noise-scale: profile {profile.name!r} does not say its micro-batch shape "
                          "(source.microbatch_size, source.seq_len), so no batch in tokens to compare it with")
    count = len(profile.stages if profile.stages is not None else profile.layers)
    scales = list(scales) * count if len(scales) == 1 else list(scales)
    obj = {"noise_scale_tokens": scales, "grad_sq_share": [1.0 / count] * count, "microbatch_tokens": tokens,
           "source": "given", **goodput.given_model(count)}
    try:
        return dataclasses.replace(profile, noise=goodput.from_dict(obj, count, tokens))
    except TfplanError as exc:
        raise TfplanError(f"--noise-scale: {str(exc).split(': ', 1)[1]}") from None


def check_caps_list(caps: Sequence[float]) -> None:
    """Raises TfplanError naming --caps for a cap outside [0, 1]."""
    for c in caps:
        if not 0.0 <= c <= 1.0:
            raise TfplanError(f"--caps: every cap must be in [0, 1], got {c:g}")


def to_csv(rows: Sequence[SweepRow]) -> str:
    """The sweep as CSV text (one row per combination)."""
    import csv
    import io

    buf = io.StringIO()
    fields = [f.name for f in dataclasses.fields(SweepRow)]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row.to_dict())
    return buf.getvalue()


def plot(rows: Sequence[SweepRow], path: str) -> None:
    """PNG of predicted speedup against cap, one line per (schedule, micro-batches); dashed: uniform baseline.

    Raises:
        TfplanError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TfplanError("--plot needs matplotlib: pip install 'timelyfreeze[plot]'") from None
    from tfplan.fileio import write_bytes_atomic

    learning = any(r.goodput is not None for r in rows)
    fig, axes = plt.subplots(1, 2 if learning else 1, figsize=(13 if learning else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    series: dict[tuple[str, int], list[SweepRow]] = {}
    for row in rows:
        if not row.skipped:
            series.setdefault((row.schedule, row.num_microbatches, row.dp), []).append(row)
    for (name, m, dp), items in series.items():
        items.sort(key=lambda r: r.cap)
        label = f"{name}, M={m}" + (f", DP {dp}" if dp > 1 else "")
        (line,) = ax.plot([r.cap for r in items], [r.speedup for r in items], marker="o", label=label)
        ax.plot(
            [r.cap for r in items],
            [r.uniform_speedup for r in items],
            linestyle="--",
            color=line.get_color(),
            alpha=0.6,
        )
        if learning:
            g = axes[0][1]
            g.plot([r.cap for r in items], [r.goodput for r in items], marker="o", color=line.get_color(),
                   label=f"{label}, batch {items[0].batch_tokens:,.0f} tokens")
            g.plot([r.cap for r in items], [r.best_goodput for r in items], linestyle=":", color=line.get_color())
    ax.set_xlabel("cap on mean freeze ratio per stage")
    ax.set_ylabel("predicted speedup over no freezing")
    ax.set_title("TimelyFreeze plan (solid) vs uniform freezing at the same mean (dashed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if learning:
        g = axes[0][1]
        g.axhline(1.0, color="gray", linewidth=0.8)
        g.set_xlabel("cap on mean freeze ratio per stage")
        g.set_ylabel("predicted goodput over no freezing")
        g.set_title("goodput: makespan plan (solid), goodput plan (dotted); below 1 freezing costs", fontsize=9)
        g.grid(alpha=0.3)
        g.legend(fontsize=8)
    import io

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
