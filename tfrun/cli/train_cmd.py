"""`tfrun train`: its options (declared once, in tfrun.cli.train_options) turned into a TrainConfig (tfrun.cli.setup)
and launched.

Registered on the app by tfrun.cli.app.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from tfplan.cli.options import user_errors
from tfplan.fileio import write_text_atomic
from tfrun.cli import config_file, train_options
from tfrun.errors import TfrunError
from tfrun.records.tensorboard import check_tensorboard


def train_cmd(ctx: typer.Context, **options) -> None:
    """Train with the plan's schedule, freezing each (stage, micro-batch) action's share of parameters; or, with
    --freeze timely, measure the pipeline, solve the plan and freeze inside this one run.

    Starts the plan's number of ranks on this host (forked from this process), or joins an external
    `torchrun` job. Writes metrics.jsonl, summary.json, profile.json and checkpoints to --out (and plan.json,
    plans/ for timely). SIGINT or SIGTERM stops after the current step with a checkpoint (a second one aborts);
    --resume DIR continues.

    Examples:
      tfrun train --plan plan.json --steps 30 --out runs/plan
      tfrun train --freeze timely --schedule 1f1b --ranks 2 --microbatches 8 --max-freeze-ratio 0.9 --steps 120
    """
    from tfrun.cli import setup

    with user_errors(TfrunError):
        config_file.raise_errors(ctx)
        ctx.params.update(config_file.resumed_data_settings(ctx))  # Note [resumed data]
        config = setup.train_config(**train_options.settings(ctx.params))
        if config.tensorboard:
            check_tensorboard()
        if os.environ.get("RANK", "0") == "0":  # every check passed: the run's folder starts with its settings
            resolved = config_file.resolved_text(ctx)  # (its own check first: nothing written on a mistake)
            setup.out_path(config).mkdir(parents=True, exist_ok=True)
            write_text_atomic(setup.out_path(config) / config_file.RESOLVED, resolved)
        from tfrun.distributed import launch  # (imports torch: after the checks, so that a mistake is quick)

        if launch.under_torchrun():
            from tfrun.cli.worker import run_worker

            sys.exit(run_worker(config))
        stopped = launch.launch(config)
        if stopped is not None:
            Console(highlight=False, soft_wrap=True).print(
                f"stopped after step {stopped.step} of {config.steps}, checkpoint written; resume with: "
                f"{stopped.resume}", markup=False)
            return
        from tfplan.report import summary as summary_format

        summary = summary_format.load(setup.out_path(config) / "summary.json")
        setup.print_summary(summary, Console(highlight=False))


train_cmd.__signature__ = train_options.signature()
train_cmd.__annotations__ = {p.name: p.annotation for p in train_cmd.__signature__.parameters.values()}
