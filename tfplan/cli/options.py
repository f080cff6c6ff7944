"""What the commands share: options (typer Annotated types), the parsers of their values, the output console
and `user_errors`, which turns a user's mistake (TfplanError) into one red line and exit code 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from tfplan.errors import TfplanError
from tfplan.plan.job import AUTO_FASTLP_ACTIONS, BACKENDS, OBJECTIVES, JobSpec

ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help="Profile JSON (per stage or per layer).")]
ScheduleOpt = Annotated[str | None, typer.Option("--schedule", "-s", help="Named schedule (see `tfplan schedules`).")]
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


Backend = StrEnum("Backend", {name: name for name in BACKENDS})
"""--solver choices: tfplan.plan.job.BACKENDS."""
Objective = StrEnum("Objective", {name: name for name in OBJECTIVES})
"""--objective choices: tfplan.plan.job.OBJECTIVES."""


SolverOpt = Annotated[
    Backend,
    typer.Option(
        "--solver",
        help="LP backend: glop (full LP, the reference), fastlp (periodic compression, same optima, for large "
        f"plans) or auto (fastlp above {AUTO_FASTLP_ACTIONS:,} actions).",
    ),
]


TimeLimitOpt = Annotated[
    float,
    typer.Option(
        "--time-limit",
        help="Seconds for each LP solve. fastlp then returns its best plan so far as FEASIBLE with its optimality "
        "gap (a warning; the plan says so), or fails if it has none; glop fails.",
    ),
]


def parse_int_list(text: str | None, option: str) -> list[int] | None:
    """An optional comma-separated list of integers (None when the option is not given)."""
    return None if text is None else split_list(text, option, int)


DpOpt = Annotated[
    int, typer.Option("--dp", help="Data-parallel replicas of the pipeline: each rank's gradient reduction joins "
                                   "its tail (tfplan.cost.dataparallel).", min=1)
]
DpLinkOpt = Annotated[
    str | None, typer.Option("--dp-link", help="Link between replicas for --dp: ib, nvlink, pcie (the profile's "
                                               "GPU), a generation (ib-ndr, ...) or GBPS:LATENCY_US.")
]


def job_spec(profile, schedule, schedule_csv, microbatches, stages_per_rank, ranks, layers_per_stage, dp=1,
             dp_link=None, learning_model=None) -> JobSpec:
    if dp_link is not None and dp == 1:
        raise TfplanError("--dp-link is the link of the replicas' gradient reduction: it needs --dp D > 1")
    return JobSpec(
        profile_path=profile,
        schedule=schedule,
        schedule_csv=schedule_csv,
        num_microbatches=microbatches,
        stages_per_rank=stages_per_rank,
        num_ranks=ranks,
        layers_per_stage=parse_int_list(layers_per_stage, "--layers-per-stage"),
        dp=dp,
        dp_link=dp_link,
        learning_model=learning_model,
    )


def _learning_model_name(value: str | None) -> str | None:
    """--learning-model checked when given, whether or not the profile has a noise section to read with it."""
    from tfplan.cost.goodput import LEARNING_MODELS

    if value is not None and value not in LEARNING_MODELS:
        raise typer.BadParameter(f"must be one of {', '.join(LEARNING_MODELS)}, got {value!r}")
    return value


LearningModelOpt = Annotated[
    str | None,
    typer.Option("--learning-model", callback=_learning_model_name,
                 help="Read the profile's noise section under this learning model: mccandlish, momentum or adam "
                      "(tfplan.cost.goodput Note \\[learning models]; default: the one the section names; "
                      "docs/cost-model.md, 'Which learning model')."),
]


CapsOpt = Annotated[
    str,
    typer.Option(
        "--max-freeze-ratio",
        "-c",
        help="Cap on each stage's mean freeze ratio: one value, or one per stage comma-separated.",
    ),
]


def parse_caps(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TfplanError(f"--max-freeze-ratio: expected numbers (e.g. 0.9 or 0.9,0.8,0.7,0.6), got {text!r}") from None


def split_list(text: str, option: str, kind: type) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TfplanError(f"{option}: expected a comma-separated list, got {text!r}") from None
    if not values:
        raise TfplanError(f"{option}: empty list")
    return values


def out() -> Console:
    """The console commands render to (stdout)."""
    return Console(highlight=False, soft_wrap=False)


@contextlib.contextmanager
def user_errors(*extra: type[Exception]) -> Iterator[None]:
    """Turn the package's own errors (and `extra` user-error classes) into one red line on stderr, exit 1."""
    try:
        yield
    except (TfplanError, *extra) as exc:
        first, _, rest = str(exc).partition("\n")
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        err.print(Text.assemble(("error:", "bold red"), " ", first))  # Text: brackets in messages are literal
        if rest:
            err.print(rest, markup=False)
        raise typer.Exit(1) from None
