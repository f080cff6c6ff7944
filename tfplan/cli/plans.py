"""`tfplan solve`, `tfplan show`, `tfplan whatif`: plans solved, shown again, and swept over settings.

Registered on the app by tfplan.cli.app.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tfplan.cli.options import (
    Backend,
    CapsOpt,
    DpLinkOpt,
    DpOpt,
    JsonOpt,
    LayersPerStageOpt,
    LearningModelOpt,
    MicrobatchesOpt,
    Objective,
    ProfileOpt,
    RanksOpt,
    ScheduleCsvOpt,
    ScheduleOpt,
    SolverOpt,
    StagesPerRankOpt,
    TimeLimitOpt,
    job_spec,
    out,
    parse_caps,
    parse_int_list,
    split_list,
    user_errors,
)
from tfplan.errors import TfplanError
from tfplan.fileio import check_output, write_json_atomic, write_text_atomic
from tfplan.report.plan_view import (
    plan_json,
    plan_title,
    render_plan,
)
from tfplan.report.trace import chrome_trace
from tfplan.schedule import schedules
from tfplan.solve.lp import DEFAULT_TIME_LIMIT_S, check_time_limit
from tfplan.step import simulate as simulate_mod


def solve_cmd(
    profile: ProfileOpt,
    schedule: ScheduleOpt = None,
    microbatches: MicrobatchesOpt = None,
    stages_per_rank: StagesPerRankOpt = None,
    schedule_csv: ScheduleCsvOpt = None,
    ranks: RanksOpt = None,
    layers_per_stage: LayersPerStageOpt = None,
    max_freeze_ratio: CapsOpt = "0.9",
    dp: DpOpt = 1,
    dp_link: DpLinkOpt = None,
    target_speedup: Annotated[
        float | None,
        typer.Option("--target-speedup", help="Instead of the fastest plan: the least freezing reaching this speedup."),
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Write plan JSON here (and the schedule CSV beside it).")
    ] = None,
    as_json: JsonOpt = False,
    solver_backend: SolverOpt = Backend.auto,
    time_limit: TimeLimitOpt = DEFAULT_TIME_LIMIT_S,
    stage0_anchor: Annotated[
        bool,
        typer.Option("--stage0-anchor/--no-stage0-anchor",
                     help="Keep one stage-0 backward unfrozen, so that tfrun can freeze prefixes there (time "
                          "linear in the ratio) while the whole stage still trains (tfplan.plan.job Note "
                          "\\[stage-0 anchor])."),
    ] = True,
    objective: Annotated[
        Objective,
        typer.Option("--objective", help="makespan: the fastest plan within the caps. goodput: the most predicted "
                                         "learning per second (needs the profile's noise section; freezes nothing "
                                         "when freezing does not pay at this batch)."),
    ] = Objective.makespan,
    learning_model: LearningModelOpt = None,
) -> None:
    """Solve the TimelyFreeze LP: a freeze ratio per (stage, micro-batch) action that minimises the step time
    under the per-stage cap on the mean freeze ratio; or, with --objective goodput, that maximises predicted
    learning per second (tfplan.cost.goodput).

    Examples:
      tfplan solve -p profiles/toy-uniform-4.json -s 1f1b -m 8 -c 0.9 -o plan.json
      tfplan solve -p measured.json -s 1f1b -m 8 -c 0.9 --objective goodput -o plan.json
    """
    from tfplan.plan import plan as plan_mod
    from tfplan.plan.job import solve_job

    with user_errors():
        spec = job_spec(profile, schedule, schedule_csv, microbatches, stages_per_rank, ranks, layers_per_stage, dp,
                        dp_link, learning_model)
        plan_obj = solve_job(spec, parse_caps(max_freeze_ratio), target_speedup, solver_backend.value, time_limit,
                             stage0_anchor, objective.value)
        if output:  # (after the inputs' own errors, which come first; plan_mod.write then writes both or neither)
            check_output(output, (profile, schedule_csv))
            check_output(plan_mod.csv_path_of(output), (profile, schedule_csv))
        csv_path = plan_mod.write(plan_obj, output) if output else None
        if as_json:
            print(json.dumps(plan_json(plan_obj) | {"output": output, "schedule_csv": str(csv_path or "") or None}))
            return
        console = out()
        render_plan(plan_obj, console, title=plan_title(plan_obj))
        if output:
            console.print(f"plan written to {output}, schedule CSV to {csv_path}")


def show_cmd(
    plan_path: Annotated[str, typer.Argument(help="A plan JSON written by `tfplan solve`.")],
    trace: Annotated[str | None, typer.Option("--trace", help="Write the planned timeline as a Chrome trace.")] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", "-p", help="Evaluate the plan's predicted goodput with this profile's "
                                                        "noise section (any plan, whatever it was solved for).")
    ] = None,
    as_json: JsonOpt = False,
    learning_model: LearningModelOpt = None,
) -> None:
    """Show a saved plan: predicted speedup (and goodput), per-stage ratios, heat map and timelines.

    Examples:
      tfplan show plan.json --trace plan-trace.json
      tfplan show plan.json --profile measured.json --json
    """
    from tfplan.plan import plan as plan_mod

    with user_errors():
        plan_obj = plan_mod.load(plan_path)
        if profile is not None:
            plan_obj = with_goodput(plan_obj, profile, learning_model)
        if trace:
            check_output(trace, (plan_path, profile))
            dag = plan_obj.dag
            sim = simulate_mod.simulate(dag, dag.durations(list(plan_obj.ratios)))
            write_json_atomic(trace, chrome_trace(dag, sim, list(plan_obj.ratios), name=f"plan {plan_path}"))
        if as_json:
            print(json.dumps(plan_json(plan_obj)))
            return
        render_plan(plan_obj, out(), title=f"{plan_path}: {plan_title(plan_obj)}")
        if trace:
            out().print(f"trace written to {trace} (open in https://ui.perfetto.dev)")


def with_goodput(plan_obj, profile_path: str, learning_model: str | None = None):
    """The plan with its goodput evaluated on `profile_path`'s noise section (tfplan.cost.goodput), under
    `learning_model` (None: the one the section names)."""
    import dataclasses

    from tfplan.cost import goodput
    from tfplan.cost import profile as profile_mod

    prof = profile_mod.load(profile_path)
    sched = plan_obj.schedule
    noise = prof.stage_noise(sched.num_stages)
    if noise is None:
        raise TfplanError(f"{profile_path}: no noise section to evaluate goodput with: measure it (tfplan profile) "
                          "or give it (tfplan profile --analytic ... --noise-scale N)")
    if learning_model is not None:
        noise = goodput.with_learning_model(noise, learning_model)
    batch = float(prof.dp * sched.num_microbatches * noise.microbatch_tokens)
    objective = plan_obj.goodput.objective if plan_obj.goodput is not None else "makespan"
    p = plan_obj.predicted
    record = goodput.plan_goodput(objective, noise, batch, plan_obj.mean_ratio_per_stage(), p.planned_ms,
                                  p.no_freeze_ms)
    return dataclasses.replace(plan_obj, goodput=record)


def whatif_cmd(
    profile: ProfileOpt,
    schedules_list: Annotated[
        str, typer.Option("--schedules", help="Comma-separated schedule names.")
    ] = "gpipe,1f1b,interleaved-1f1b",
    microbatches: Annotated[str, typer.Option("--microbatches", "-m", help="Comma-separated counts.")] = "4,8,16",
    caps: Annotated[str, typer.Option("--caps", help="Comma-separated caps in [0, 1].")] = "0.3,0.6,0.9",
    stages_per_rank: StagesPerRankOpt = None,
    ranks: RanksOpt = None,
    layers_per_stage: LayersPerStageOpt = None,
    dp: Annotated[
        str, typer.Option("--dp", help="Comma-separated data-parallel degrees (gradient reduction in the tails).")
    ] = "1",
    dp_link: DpLinkOpt = None,
    csv_out: Annotated[str | None, typer.Option("--csv", help="Write the table as CSV here.")] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="Write a PNG of speedup against cap per schedule.")] = None,
    noise_scale: Annotated[
        str | None, typer.Option("--noise-scale", help="The gradient noise scale in tokens (one value, or one per "
                                                       "stage or layer of the profile), instead of the profile's "
                                                       "noise section: adds predicted goodput to every row.")
    ] = None,
    as_json: JsonOpt = False,
    solver_backend: SolverOpt = Backend.auto,
    time_limit: TimeLimitOpt = DEFAULT_TIME_LIMIT_S,
    learning_model: LearningModelOpt = None,
) -> None:
    """What-if sweep on a laptop: every schedule x micro-batch count x cap, with the naive uniform-freezing
    baseline at the same mean ratio; with a noise scale (the profile's, or --noise-scale), each row's
    predicted goodput and the best goodput at that cap and batch: does freezing pay at my batch?

    Examples:
      tfplan whatif -p profiles/toy-hetero-4.json --schedules 1f1b,gpipe -m 4,8,16 --caps 0.3,0.6,0.9
      tfplan whatif -p profiles/llama3.1-8b-h200-4stages.json --schedules 1f1b -m 8,32 --dp 1,8 \\
          --dp-link ib --noise-scale 100000 --plot goodput.png
    """
    from rich.progress import Progress

    from tfplan.report import sweep as sweep_mod
    from tfplan.report.plan_view import sweep_table

    with user_errors():
        names = split_list(schedules_list, "--schedules", str)
        for name in names:
            schedules.get_spec(name)
        counts = split_list(microbatches, "--microbatches", int)
        if any(c < 1 for c in counts):  # (every row was "skipped" before)
            raise TfplanError(f"--microbatches: every count must be >= 1, got {microbatches}")
        cap_values = split_list(caps, "--caps", float)
        dps = split_list(dp, "--dp", int)
        sweep_mod.check_caps_list(cap_values)
        check_time_limit(time_limit)
        from tfplan.cost.profile import load

        load(profile)  # fail on a bad profile before the progress bar appears
        total = len(names) * len(counts) * len(cap_values) * len(dps)
        live = not as_json and sys.stderr.isatty()
        with Progress(console=Console(stderr=True), transient=True, disable=not live) as progress:
            task = progress.add_task("solving", total=total)
            rows = sweep_mod.sweep(
                profile,
                names,
                counts,
                cap_values,
                stages_per_rank,
                ranks,
                parse_int_list(layers_per_stage, "--layers-per-stage"),
                on_row=lambda row: progress.advance(task),
                backend=solver_backend.value,
                time_limit_s=time_limit,
                dps=dps,
                dp_link=dp_link,
                noise_scale=split_list(noise_scale, "--noise-scale", float) if noise_scale else None,
                learning_model=learning_model,
            )
        for path in (csv_out, plot):  # both writable before either is written
            if path:
                check_output(path, (profile,))
        if csv_out and plot and Path(csv_out).resolve() == Path(plot).resolve():
            raise TfplanError(f"--csv and --plot: both name {csv_out}; give two files")
        if csv_out:
            write_text_atomic(csv_out, sweep_mod.to_csv(rows))
        if plot:
            sweep_mod.plot(rows, plot)
        if as_json:
            print(json.dumps([r.to_dict() for r in rows]))
            return
        console = out()
        console.print(sweep_table(rows, title=f"what-if on profile {profile}"))
        for path, what in ((csv_out, "CSV"), (plot, "plot")):
            if path:
                console.print(f"{what} written to {path}")
