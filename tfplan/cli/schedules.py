"""`tfplan simulate`, `tfplan schedules`, `tfplan show-schedule`: one step of a schedule, simulated or listed.

Registered on the app by tfplan.cli.app.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tfplan.cli.options import (
    DpLinkOpt,
    DpOpt,
    JsonOpt,
    LayersPerStageOpt,
    MicrobatchesOpt,
    ProfileOpt,
    RanksOpt,
    ScheduleCsvOpt,
    ScheduleOpt,
    StagesPerRankOpt,
    job_spec,
    out,
    user_errors,
)
from tfplan.errors import TfplanError
from tfplan.fileio import check_output, write_json_atomic, write_text_atomic
from tfplan.plan.job import build
from tfplan.report.render import (
    gantt_panels,
    grid_tables,
    headline,
    legend,
    simulation_json,
    summary_table,
    timeline,
)
from tfplan.report.trace import chrome_trace
from tfplan.schedule import schedules
from tfplan.step import simulate as simulate_mod


def simulate_cmd(
    profile: ProfileOpt,
    schedule: ScheduleOpt = None,
    microbatches: MicrobatchesOpt = None,
    stages_per_rank: StagesPerRankOpt = None,
    schedule_csv: ScheduleCsvOpt = None,
    ranks: RanksOpt = None,
    layers_per_stage: LayersPerStageOpt = None,
    dp: DpOpt = 1,
    dp_link: DpLinkOpt = None,
    freeze_ratio: Annotated[
        float, typer.Option("--freeze-ratio", help="Freeze every B/W action at this ratio (naive uniform baseline).")
    ] = 0.0,
    as_json: JsonOpt = False,
    trace: Annotated[str | None, typer.Option("--trace", help="Write a Chrome trace (Perfetto) JSON here.")] = None,
    gantt: Annotated[
        bool, typer.Option("--gantt", help="Full-resolution timeline in windows, every action labelled.")
    ] = False,
) -> None:
    """Simulate one training step of a schedule: step time, bubbles, per-rank utilisation, timeline.

    Example: tfplan simulate -p profiles/toy-uniform-4.json -s 1f1b -m 8
    """
    with user_errors():
        if not 0.0 <= freeze_ratio <= 1.0:
            raise TfplanError(f"--freeze-ratio must be in [0, 1], got {freeze_ratio}")
        spec = job_spec(profile, schedule, schedule_csv, microbatches, stages_per_rank, ranks, layers_per_stage, dp,
                        dp_link)
        prof, sched, dag = build(spec)
        sim = simulate_mod.simulate(dag, dag.durations(freeze_ratio))
        if trace:
            check_output(trace, (profile, schedule_csv))
            write_json_atomic(trace, chrome_trace(dag, sim, name=f"{sched.name} (freeze ratio {freeze_ratio:g})"))
        if as_json:
            print(json.dumps(simulation_json(dag, sim, freeze_ratio, prof.name)))
            return
        console = out()
        console.print(headline(dag, sim))
        if freeze_ratio:
            console.print(f"every B/W action frozen at ratio {freeze_ratio:g} (uniform freezing)")
        console.print(summary_table(dag, sim, title=f"profile {prof.name}"))
        console.print(legend({a.kind for a in dag.actions}))
        panels = gantt_panels(dag, sim, console.width) if gantt else [timeline(dag, sim, console.width)]
        for panel in panels:
            console.print(panel, end="")
        if trace:
            console.print(f"trace written to {trace} (open in https://ui.perfetto.dev)")


def schedules_cmd(as_json: JsonOpt = False) -> None:
    """List the schedules tfplan generates (each equals torch 2.13's order for the same arguments)."""
    rows = [
        {
            "name": spec.name,
            "torch_class": spec.torch_class,
            "stages_per_rank": _stages_per_rank_text(spec),
            "description": spec.description,
        }
        for spec in schedules.SCHEDULES.values()
    ]
    if as_json:
        print(json.dumps(rows))
        return
    from rich.table import Table

    table = Table(show_edge=False)
    for col in ("name", "torch class", "stages/rank", "description"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["name"], row["torch_class"], row["stages_per_rank"], row["description"])
    out().print(table)


def _stages_per_rank_text(spec: schedules.ScheduleSpec) -> str:
    lo, hi = spec.min_stages_per_rank, spec.max_stages_per_rank
    if lo == hi:
        return str(lo)
    return f">= {lo} (default {spec.default_stages_per_rank})"


def show_schedule_cmd(
    schedule: Annotated[str, typer.Option("--schedule", "-s", help="Named schedule.")],
    ranks: Annotated[int, typer.Option("--ranks", help="Pipeline ranks P.", min=1)],
    microbatches: Annotated[int, typer.Option("--microbatches", "-m", help="Micro-batches per step.", min=1)],
    stages_per_rank: StagesPerRankOpt = None,
    csv_path: Annotated[
        str | None, typer.Option("--csv", help="Write the schedule as torch's compute-only CSV here.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a schedule's rank x step grid and optionally write it as CSV (loads in torch's runtime).

    Example: tfplan show-schedule -s interleaved-1f1b --ranks 4 -m 8 --csv sched.csv
    """
    with user_errors():
        sched = schedules.generate(schedule, ranks, microbatches, stages_per_rank)
        if csv_path:
            write_text_atomic(csv_path, schedules.to_csv(sched))
        rows = [[str(a) for a in r] for r in sched.order]
        if as_json:
            print(
                json.dumps(
                    {
                        "schedule": sched.name,
                        "num_ranks": sched.num_ranks,
                        "num_stages": sched.num_stages,
                        "num_microbatches": sched.num_microbatches,
                        "order": rows,
                    }
                )
            )
            return
        title = (
            f"{sched.name}: {sched.num_ranks} ranks, {sched.num_stages} stages, {sched.num_microbatches} micro-batches"
        )
        console = out()
        for table in grid_tables(rows, title, console.width):
            console.print(table)
        if csv_path:
            out().print(f"CSV written to {csv_path}")
