"""From the user's options and plan file to a validated TrainConfig, before any rank starts: the plan's
provenance (tfrun.records.provenance), the data, the checkpoint a resume starts from and the output folder are all
checked here, so that a mistake is one line and nothing is written."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tfrun.config.train_config import DEFAULT_OUT, PLANNED, WARMUP_STEPS, TrainConfig
from tfrun.errors import TfrunError

TOKEN_CACHE = "token-cache"
"""Default folder of tokenized data's cache, beside the run's --out (--token-cache DIR elsewhere)."""


def train_config(*, plan_path: str | None, global_batch: int | None, microbatch_size: int,
                 schedule: str | None = None, ranks: int | None = None, microbatches: int | None = None,
                 stages_per_rank: int | None = None, token_cache_dir: str | None = None, **options) -> TrainConfig:
    """Read the plan (or, for --freeze timely, generate the schedule) and combine it with the options; every
    user mistake raises one clear line.

    Raises:
        TfrunError / TfplanError: a missing or malformed plan, unknown model, a batch the plan's
            micro-batch count does not divide, a bad option or an unsupported torch.
    """
    from tfplan.cost import profile as profile_mod
    from tfplan.plan import plan as plan_mod
    from tfplan.schedule import schedules
    from tfrun.freeze import phases
    from tfrun.records import provenance

    freeze = options.get("freeze", "plan")
    if plan_path is None:
        if freeze != "timely":
            raise TfrunError("--plan is required (unless --freeze timely, which plans inside the run)")
        if schedule is None or ranks is None or microbatches is None:
            raise TfrunError("--freeze timely without --plan needs --schedule, --ranks and --microbatches")
        spec = schedules.get_spec(schedule)
        sched = schedules.generate(spec.name, ranks, microbatches, stages_per_rank or spec.default_stages_per_rank)
        order = [[str(a) for a in row] for row in sched.order]
        options["warmup_steps"] = warmup_steps(options.get("warmup_steps"), freeze, options.get("objective"), False)
        config = TrainConfig(order=order, num_stages=sched.num_stages,
                             num_microbatches=microbatches, stage_to_rank=list(sched.stage_to_rank),
                             schedule_name=sched.name, microbatch_size=_microbatch_size(
                                 global_batch, microbatches, microbatch_size, options.get("dp", 1)),
                             plan_hash=provenance.order_hash(order), **options)
        return _checked(config, token_cache_dir)
    if schedule is not None or ranks is not None or microbatches is not None or stages_per_rank is not None:
        raise TfrunError("--schedule, --ranks, --microbatches and --stages-per-rank come from the plan; "
                         "give them only with --freeze timely and no --plan")
    plan = plan_mod.load(plan_path)
    goodput_seed = phases.solved_for_goodput(plan)
    options["warmup_steps"] = warmup_steps(options.get("warmup_steps"), freeze, options.get("objective"), goodput_seed)
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
        plan_hash=provenance.sha256_bytes(Path(plan_path).read_bytes()),
        microbatch_size=microbatch_size,
        **options,
    )
    config.check()
    if freeze == "timely" and config.objective == "goodput" and (config.monitor_steps < 2 or config.probe_steps < 1) \
            and not goodput_seed:
        raise TfrunError(f"--freeze timely --objective goodput measures its own profile and noise unless the --plan is "
                         f"solved for goodput ({plan_path} is solved for makespan: tfrun.freeze.phases "
                         f"Note [goodput start]): it needs --monitor-steps >= 2 and --probe-steps >= 1")
    note = provenance.check_plan_profile(str(plan_path), plan.profile_source, config, config.force)
    return _checked(dataclasses.replace(config, prediction_note=note), token_cache_dir)


def warmup_steps(value: int | None, freeze: str, objective: str | None, goodput_seed: bool) -> int:
    """--warmup-steps, or its default: 0 where a seed plan solved for goodput is in force under --freeze timely
    --objective goodput (it then runs from the first step, as the fixed plan does: tfrun.freeze.phases Note [goodput
    start]), else WARMUP_STEPS.

    >>> warmup_steps(None, "timely", "goodput", True), warmup_steps(None, "timely", "goodput", False)
    (0, 5)
    >>> warmup_steps(3, "timely", "goodput", True), warmup_steps(None, "timely", "makespan", True)
    (3, 5)
    """
    if value is not None:
        return value
    return 0 if freeze == "timely" and objective == "goodput" and goodput_seed else WARMUP_STEPS


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


def _checked(config: TrainConfig, token_cache_dir: str | None = None) -> TrainConfig:
    """The checks that need more than the options: model, data, resume, output folder, torch's pipelining API (in
    that order); then, with nothing left to refuse, the token cache is written (tfrun.data.tokenized Note [token
    cache])."""
    from tfrun.records import checkpoint, provenance

    config = _model_checked(config)
    if config.init_from is not None and checkpoint.read_latest(Path(config.init_from)) is None:
        raise TfrunError(f"--init-from {config.init_from}: no checkpoint there (checkpoints/latest.json missing)")
    stream = _check_data(config, token_cache_dir or str(Path(config.out_dir).parent / TOKEN_CACHE))
    config = dataclasses.replace(config, data_hash=stream.identity, token_cache=stream.cache)
    out = Path(config.out_dir)
    warnings: list[str] = []
    if config.resume:
        if not (out / "checkpoints").is_dir():
            raise TfrunError(f"--resume {out}: no checkpoint there (no checkpoints folder)")
        step, identity, warnings = checkpoint.choose(out, config.num_ranks)
        change = provenance.identity_change(identity, config)
        if change is not None:
            raise TfrunError(f"--resume {out}: {change}; a resumed run must keep it (start a new --out to change it)")
        if step > config.steps:
            raise TfrunError(f"--resume {out}: the checkpoint has {step} steps, more than --steps {config.steps}")
        warnings += provenance.recipe_changes(identity, config)
        config = dataclasses.replace(config, resume_step=step)
    warnings += provenance.check_out(out, config)
    for line in warnings:
        warn(line)
    from tfrun.distributed.runtime import check_torch  # (last: its pipelining import costs seconds, which a
    #                                                    mistake found above need not pay)

    check_torch()
    if stream.save is not None:
        stream.save()
    return config


def _model_checked(config: TrainConfig) -> TrainConfig:
    """--model hf:DIR: the folder made absolute, its config's hash recorded, every tensor checked (headers)."""
    from tfrun import models

    config.check()
    if not models.is_hf(config.model):
        return config
    models.check(config.model)
    name = models.absolute(config.model)
    return dataclasses.replace(config, model=name, model_hash=models.model_hash(name))


def _check_data(config: TrainConfig, cache_dir: str):
    """The training data (tfrun.data.open_stream: every source's checks and the vocabulary agreement with the
    model), refused before launching when too short for one training and one validation sequence."""
    from tfrun.data import Batches, eval_batches, open_stream, split_tokens
    from tfrun.models import model_config

    stream = open_stream(config.data_path, tokenizer_path=config.tokenizer_path, token_dtype=config.token_dtype,
                         model_vocab=model_config(config.model).vocab_size, cache_dir=cache_dir,
                         chat_template=config.chat_template, chat_loss=config.chat_loss)
    where = stream.where
    train, val = split_tokens(stream.tokens)  # views: no copy
    try:
        Batches(train, global_batch=config.global_batch, seq_len=config.seq_len, seed=config.seed)
        eval_batches(val, batch_size=config.global_batch, seq_len=config.seq_len, num_batches=config.eval_batches)
    except TfrunError as exc:
        raise TfrunError(f"{where}: {exc} (--seq-len {config.seq_len}; validation is the last 5%)") from None
    return stream


def warn(line: str) -> None:
    """A warning on stderr, from the launcher or rank 0 only."""
    if os.environ.get("RANK", "0") == "0":
        Console(stderr=True, highlight=False, soft_wrap=True).print(Text.assemble(("warning:", "yellow"), " ", line))
        sys.stderr.flush()


def out_dir(out: str | None, resume: str | None) -> str:
    """--out and --resume: a resumed run writes where it was checkpointed; both naming different folders is
    a mistake (one line)."""
    for flag, value in (("--out", out), ("--resume", resume)):
        if value is not None and not value.strip():  # (an empty $OUT in a script wrote into runs/latest)
            raise TfrunError(f"{flag}: empty; give a folder")
    if resume is not None and out is not None and Path(out).resolve() != Path(resume).resolve():
        raise TfrunError(f"--out {out} and --resume {resume} name different folders; a resumed run continues in "
                         f"its own folder: give --resume {resume} alone")
    return resume or out or DEFAULT_OUT


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
