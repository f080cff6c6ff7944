"""From the user's options and plan file to a validated TrainConfig, before any rank starts."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from tfrun.config import PLANNED, TrainConfig
from tfrun.errors import TfrunError


def train_config(*, plan_path: str | None, global_batch: int | None, microbatch_size: int,
                 schedule: str | None = None, ranks: int | None = None, microbatches: int | None = None,
                 stages_per_rank: int | None = None, **options) -> TrainConfig:
    """Read the plan (or, for --freeze timely, generate the schedule) and combine it with the options; every
    user mistake raises one clear line.

    Raises:
        TfrunError / TfplanError: a missing or malformed plan, unknown model, a batch the plan's
            micro-batch count does not divide, a bad option or an unsupported torch.
    """
    from tfplan import plan as plan_mod
    from tfplan import profile as profile_mod
    from tfplan import schedules
    from tfrun.runtime import check_torch

    check_torch()
    freeze = options.get("freeze", "plan")
    if plan_path is None:
        if freeze != "timely":
            raise TfrunError("--plan is required (unless --freeze timely, which plans inside the run)")
        if schedule is None or ranks is None or microbatches is None:
            raise TfrunError("--freeze timely without --plan needs --schedule, --ranks and --microbatches")
        spec = schedules.get_spec(schedule)
        sched = schedules.generate(spec.name, ranks, microbatches, stages_per_rank or spec.default_stages_per_rank)
        config = TrainConfig(order=[[str(a) for a in row] for row in sched.order], num_stages=sched.num_stages,
                             num_microbatches=microbatches, stage_to_rank=list(sched.stage_to_rank),
                             schedule_name=sched.name, microbatch_size=_microbatch_size(
                                 global_batch, microbatches, microbatch_size, options.get("dp", 1)), **options)
        return _checked(config)
    if schedule is not None or ranks is not None or microbatches is not None or stages_per_rank is not None:
        raise TfrunError("--schedule, --ranks, --microbatches and --stages-per-rank come from the plan; "
                         "give them only with --freeze timely and no --plan")
    plan = plan_mod.load(plan_path)
    sched = plan.schedule
    m = sched.num_microbatches
    microbatch_size = _microbatch_size(global_batch, m, microbatch_size, options.get("dp", 1))
    dag = plan.dag
    if freeze == "uniform":  # schedule-blind: every freezable action at the plan's overall mean ratio
        mean = plan.predicted.mean_freeze_ratio
        ratios = {str(dag.actions[v]): mean for v, ok in enumerate(dag.freeze_mask()) if ok and mean > 0}
    elif freeze in PLANNED:
        ratios = {str(a): r for a, r in zip(dag.actions, plan.ratios) if r > 0}
    else:
        ratios = {}
    # The baselines' freezing is decided during the run: no prediction for apf and autofreeze.
    predicted = {"plan": plan.predicted.planned_ms, "timely+apf": plan.predicted.planned_ms,
                 "timely+autofreeze": plan.predicted.planned_ms, "uniform": plan.predicted.uniform_ms,
                 "none": plan.predicted.no_freeze_ms, "all": plan.predicted.all_frozen_ms}.get(freeze)
    base = profile_mod.Profile(name=plan.profile_name, source={"kind": "plan"}, p2p_ms=dag.p2p_ms,
                               dispatch_ms=dag.dispatch_ms, step_overhead_ms=dag.step_overhead_ms,
                               stages=dag.stage_costs)
    config = TrainConfig(
        order=[[str(a) for a in row] for row in sched.order],
        num_stages=sched.num_stages,
        num_microbatches=m,
        stage_to_rank=list(sched.stage_to_rank),
        schedule_name=sched.name,
        ratios=ratios,
        predicted_step_ms=predicted,
        plan_path=str(plan_path),
        plan_profile=base.to_dict(),
        microbatch_size=microbatch_size,
        **options,
    )
    return _checked(config)


def _microbatch_size(global_batch: int | None, m: int, microbatch_size: int, dp: int = 1) -> int:
    """--global-batch G means dp x micro-batch size x M sequences per step."""
    if global_batch is None:
        return microbatch_size
    if global_batch % (m * dp):
        raise TfrunError(
            f"--global-batch {global_batch} is not divisible into the plan's {m} micro-batches x {dp} replicas; "
            f"use a multiple of {m * dp}"
        )
    return global_batch // (m * dp)


def _checked(config: TrainConfig) -> TrainConfig:
    from tfrun.data import load_corpus

    config.check()
    if config.init_from is not None and not (Path(config.init_from) / "checkpoints" / "latest.json").exists():
        raise TfrunError(f"--init-from {config.init_from}: no checkpoint there (checkpoints/latest.json missing)")
    load_corpus(config.data_path)  # fail before launching if --data is missing or too short
    if config.resume and not (Path(config.out_dir) / "checkpoints" / "latest.json").exists():
        raise TfrunError(f"--resume {config.out_dir}: no checkpoint there (checkpoints/latest.json missing)")
    return config


def out_path(config: TrainConfig) -> Path:
    return Path(config.out_dir)


def print_summary(summary: dict, console: Console) -> None:
    """The run's headline numbers for people."""
    table = Table(title=f"{summary['schedule']}, model {summary['model']}, freeze {summary['freeze']}",
                  title_justify="left", show_edge=False)
    table.add_column("measure")
    table.add_column("value", justify="right")
    pred = summary.get("predicted_step_ms")
    rows = [
        ("step time (median)", f"{summary['step_time_ms']:.1f} ms"),
        ("predicted step time", f"{pred:.1f} ms" if pred else "-"),
        ("prediction error", f"{summary['prediction_error']:+.1%}" if summary.get("prediction_error") is not None
         else "-"),
        ("tokens/s (median)", f"{summary['tokens_per_s']:.0f}"),
        ("final train loss", f"{summary['final_train_loss']:.4f}"),
        ("final eval loss", f"{summary['final_eval_loss']:.4f}" if summary.get("final_eval_loss") is not None
         else "-"),
        ("mean freeze ratio per stage", ", ".join(f"{r:.2f}" for r in summary["mean_freeze_ratio"])),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
