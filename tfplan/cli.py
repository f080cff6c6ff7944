"""`tfplan`: the planner's command line (typer + rich). Each command parses, calls the library, renders.

Examples:
    tfplan simulate --profile profiles/toy-uniform-4.json --schedule 1f1b --microbatches 8
    tfplan solve --profile profiles/toy-uniform-4.json --schedule 1f1b --microbatches 8 --output plan.json
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

from tfplan import schedules
from tfplan import simulate as simulate_mod
from tfplan.errors import TfplanError
from tfplan.fileio import write_json_atomic, write_text_atomic
from tfplan.job import JobSpec, build
from tfplan.render import gantt_panels, grid_table, headline, legend, summary_table, timeline
from tfplan.trace import chrome_trace

app = typer.Typer(
    name="tfplan",
    help="Plan schedule-aware parameter freezing for pipeline-parallel training (TimelyFreeze).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def out() -> Console:
    return Console(highlight=False, soft_wrap=False)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the package's own errors into one red line on stderr and exit code 1."""
    try:
        yield
    except TfplanError as exc:
        first, _, rest = str(exc).partition("\n")
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        err.print(f"[bold red]error:[/] {first}", markup=True)
        if rest:
            err.print(rest, markup=False)
        raise typer.Exit(1) from None


@app.callback()
def _setup(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_time=False, show_path=False)],
        force=True,
    )


# Options shared by the planning commands.
ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help="Profile JSON (per stage or per layer).")]
ScheduleOpt = Annotated[
    str | None, typer.Option("--schedule", "-s", help="Named schedule (see `tfplan schedules`).")
]
ScheduleCsvOpt = Annotated[
    str | None, typer.Option("--schedule-csv", help="Your own schedule as torch's compute-only CSV.")
]
MicrobatchesOpt = Annotated[int | None, typer.Option("--microbatches", "-m", help="Micro-batches per step.", min=1)]
StagesPerRankOpt = Annotated[
    int | None, typer.Option("--stages-per-rank", help="Stages per rank V for multi-stage schedules.", min=1)
]
RanksOpt = Annotated[
    int | None, typer.Option("--ranks", help="Pipeline ranks (needed for a per-layer profile).", min=1)
]
LayersPerStageOpt = Annotated[
    str | None,
    typer.Option("--layers-per-stage", help="Per-layer profile split, comma-separated (default: balanced by time)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")]


def parse_int_list(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TfplanError(f"{option}: expected comma-separated integers, got {text!r}") from None


def job_spec(profile, schedule, schedule_csv, microbatches, stages_per_rank, ranks, layers_per_stage) -> JobSpec:
    return JobSpec(
        profile_path=profile,
        schedule=schedule,
        schedule_csv=schedule_csv,
        num_microbatches=microbatches,
        stages_per_rank=stages_per_rank,
        num_ranks=ranks,
        layers_per_stage=parse_int_list(layers_per_stage, "--layers-per-stage"),
    )


@app.command("simulate")
def simulate_cmd(
    profile: ProfileOpt,
    schedule: ScheduleOpt = None,
    microbatches: MicrobatchesOpt = None,
    stages_per_rank: StagesPerRankOpt = None,
    schedule_csv: ScheduleCsvOpt = None,
    ranks: RanksOpt = None,
    layers_per_stage: LayersPerStageOpt = None,
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
        spec = job_spec(profile, schedule, schedule_csv, microbatches, stages_per_rank, ranks, layers_per_stage)
        prof, sched, dag = build(spec)
        sim = simulate_mod.simulate(dag, dag.durations(freeze_ratio))
        if trace:
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


def simulation_json(dag, sim: simulate_mod.Simulation, freeze_ratio: float, profile_name: str) -> dict:
    s = dag.schedule
    return {
        "profile": profile_name,
        "schedule": s.name,
        "num_ranks": s.num_ranks,
        "num_stages": s.num_stages,
        "num_microbatches": s.num_microbatches,
        "stages_per_rank": s.stages_per_rank,
        "num_actions": dag.num_nodes,
        "freeze_ratio": freeze_ratio,
        "batch_time_ms": sim.batch_time_ms,
        "makespan_ms": sim.makespan_ms,
        "step_overhead_ms": sim.step_overhead_ms,
        "bubble_fraction": sim.bubble_fraction,
        "busy_ms": sim.busy_ms,
        "idle_ms": sim.idle_ms,
        "critical_path": [str(dag.actions[v]) for v in sim.critical_path],
    }


@app.command("schedules")
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


@app.command("show-schedule")
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
            print(json.dumps({"schedule": sched.name, "num_ranks": sched.num_ranks, "num_stages": sched.num_stages,
                              "num_microbatches": sched.num_microbatches, "order": rows}))
            return
        title = f"{sched.name}: {sched.num_ranks} ranks, {sched.num_stages} stages, {sched.num_microbatches} micro-batches"
        out().print(grid_table(rows, title))
        if csv_path:
            out().print(f"CSV written to {csv_path}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
