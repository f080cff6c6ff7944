"""`tfrun train`: every option of a training run, turned into a TrainConfig (tfrun.cli.setup) and launched.

Registered on the app by tfrun.cli.app.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from tfplan.cli.options import user_errors
from tfplan.fileio import write_text_atomic
from tfrun.cli import config_file
from tfrun.config.train_config import APF_STABLE_SHARE, DEFAULT_NOISE_ESTIMATOR, DEFAULT_NOISE_MEASURE, NOISE_EVERY
from tfrun.errors import TfrunError
from tfrun.records.tensorboard import check_tensorboard


def train_cmd(
    ctx: typer.Context,
    config_path: Annotated[
        str | None, typer.Option("--config", is_eager=True, callback=config_file.on_config,
                                 help="A TOML file of these options by long name (lr-schedule = \"cosine\"); "
                                      "flags on the command line override it.")
    ] = None,
    plan: Annotated[
        str | None, typer.Option("--plan", help="Plan JSON from `tfplan solve` (with --freeze timely: optional, "
                                                "seeds the first plan).")
    ] = None,
    model: Annotated[
        str, typer.Option("--model", help="Model size: tiny, small, llama3.2-1b, llama3.1-8b; or hf:DIR, a Hugging "
                                          "Face LLaMA checkpoint folder (fine-tuning).")
    ] = "tiny",
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = 30,
    seed: Annotated[int, typer.Option("--seed", help="Initialisation, data and freeze-selection seed.")] = 0,
    freeze_seed: Annotated[
        int | None, typer.Option("--freeze-seed", help="Another draw of which micro-batches and tensors freeze, "
                                                       "with --seed's data and weights (default: --seed).")
    ] = None,
    out: Annotated[str | None, typer.Option("--out", help="Output folder (default runs/latest).")] = None,
    freeze: Annotated[
        str, typer.Option("--freeze", help="plan: apply the plan; none: the unfrozen baseline; all: freeze "
                                           "everything; timely: measure, plan and freeze inside the run; "
                                           "uniform: every backward at the plan's mean ratio; apf, autofreeze: "
                                           "the baselines; timely+apf, timely+autofreeze: the plan's ratios, "
                                           "the baseline's choice of tensors.")
    ] = "plan",
    freeze_method: Annotated[
        str, typer.Option("--freeze-method", help="detach (forward with frozen weights detached) or grad.")
    ] = "detach",
    freeze_policy: Annotated[
        str | None, typer.Option("--freeze-policy", help=(
            "Which tensors an action freezes. auto (default): stage 0 freezes its front layers (a prefix, "
            "linear in time as planned) whenever the plan leaves one of its micro-batches unfrozen, rotating "
            "random subsets otherwise; other stages freeze rotating random subsets; every tensor keeps "
            "learning. random: rotating random subsets everywhere (stage 0 then saves little until r = 1). "
            "prefix: stage 0 always freezes its front layers: planned speed, but the front stops learning "
            "while the ratios stay high (costs eval loss: docs/benchmarks.md). skip: whole backwards skipped "
            "in a share r of steps (steps vary: slower than planned, trains worst). weighted: stage 0 draws "
            "front-weighted random subsets (the paper's code). goodput: as auto on stage 0; elsewhere one "
            "rotating turn per window, then the tensors with the least learning per ms frozen first (from the "
            "measured noise scale); the default under --objective goodput."))
    ] = None,
    ramp_steps: Annotated[
        int | None, typer.Option("--ramp-steps", help="Ramp ratios from 0 over K steps (default 0; timely 15).")
    ] = None,
    redraw_every: Annotated[
        int, typer.Option("--redraw-every", help="Window of K steps: frozen sets are re-drawn per window, and "
                                                 "each stage's realised mean ratio over a window is at most the "
                                                 "plan's.")
    ] = 10,
    max_stale_steps: Annotated[
        int, typer.Option("--max-stale-steps", help="Unfreeze any tensor that got no gradient for K steps "
                                                    "(0: off).")
    ] = 0,
    grad_rescale: Annotated[
        bool, typer.Option("--grad-rescale", help="Gradient = mean over contributing micro-batches.")
    ] = False,
    microbatch_size: Annotated[int, typer.Option("--microbatch-size", help="Sequences per micro-batch.")] = 4,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="Sequences per step (= dp x micro-batch size x plan's M).")
    ] = None,
    dp: Annotated[
        int, typer.Option("--dp", help="Data-parallel replicas of the pipeline (world = dp x the plan's ranks).")
    ] = 1,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.")] = 128,
    lr: Annotated[float, typer.Option("--lr", help="AdamW's peak learning rate.")] = 3e-4,
    lr_schedule: Annotated[
        str, typer.Option("--lr-schedule", help="constant, cosine, linear or wsd (warmup, stable, decay): "
                                                "transformers' schedules, step by step.")
    ] = "constant",
    lr_warmup_steps: Annotated[
        int, typer.Option("--lr-warmup-steps", help="Linear warmup from 0 over N steps.")
    ] = 0,
    lr_min_ratio: Annotated[
        float, typer.Option("--lr-min-ratio", help="Floor of the decay, a fraction of --lr (cosine, linear, wsd).")
    ] = 0.0,
    lr_decay_fraction: Annotated[
        float, typer.Option("--lr-decay-fraction", help="wsd: the last share of the steps, over which it decays.")
    ] = 0.1,
    weight_decay: Annotated[
        float, typer.Option("--weight-decay", help="AdamW weight decay, on matrices and embeddings only (not on "
                                                   "norms or biases).")
    ] = 0.0,
    adam_betas: Annotated[str, typer.Option("--adam-betas", help="AdamW's B1,B2.")] = "0.9,0.999",
    adam_eps: Annotated[float, typer.Option("--adam-eps", help="AdamW's epsilon.")] = 1e-8,
    clip_grad_norm: Annotated[
        float, typer.Option("--clip-grad-norm", help="Clip the gradient's L2 norm over every stage and replica to "
                                                     "this (0: off).")
    ] = 0.0,
    on_nonfinite: Annotated[
        str, typer.Option("--on-nonfinite", help="A step whose loss or gradient norm is not finite: stop (exit 1, "
                                                 "the last good checkpoint kept) or skip its optimizer step.")
    ] = "stop",
    max_skipped_steps: Annotated[
        int, typer.Option("--max-skipped-steps", help="skip: this many skipped steps in a row end the run.")
    ] = 10,
    tensorboard: Annotated[
        bool, typer.Option("--tensorboard", help="Also write TensorBoard event files to OUT/tensorboard/ (needs "
                                                 "the tensorboard package).")
    ] = False,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Validation loss every K steps (0: end).")] = 0,
    eval_batches: Annotated[
        int, typer.Option("--eval-batches", help="Validation batches (of the step's sequences) per evaluation.")
    ] = 4,
    checkpoint_every: Annotated[
        int, typer.Option("--checkpoint-every", help="Checkpoint every K steps (0: only by time and at the end).")
    ] = 100,
    checkpoint_minutes: Annotated[
        float, typer.Option("--checkpoint-minutes", help="Also checkpoint when this many minutes passed since the "
                                                         "last one (0: off).")
    ] = 10.0,
    keep_checkpoints: Annotated[
        int, typer.Option("--keep-checkpoints", help="Keep the newest K complete checkpoints (0: all; else >= 2).")
    ] = 2,
    resume: Annotated[
        str | None, typer.Option("--resume", is_eager=True, callback=config_file.on_resume,
                                 help="Continue the run in this folder from its newest complete checkpoint, with "
                                      "its settings (OUT/config.toml; flags override; --steps may grow).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Run a plan whose profile was measured for another model, batch shape "
                                           "or device (summary.json then reports no prediction error).")
    ] = False,
    data: Annotated[
        str | None, typer.Option("--data", help="Training data: a text file, a .jsonl file (its 'text' fields) or a "
                                                "folder of them, a .bin file of token ids, or 'stdlib' (Python "
                                                "source; default: CPython's pydoc topics).")
    ] = None,
    # -- real data and models (issue 22) --
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="A tokenizer.json (Hugging Face tokenizers) for text --data; "
                                                     "tokenized once and cached. Default: bytes (vocabulary 256).")
    ] = None,
    token_dtype: Annotated[
        str, typer.Option("--token-dtype", help="Ids of a --data FILE.bin: uint16 (nanoGPT's layout) or uint32.")
    ] = "uint16",
    token_cache: Annotated[
        str | None, typer.Option("--token-cache", help="Folder of the tokenized-data cache (default: token-cache "
                                                       "beside --out).")
    ] = None,
    precision: Annotated[
        str, typer.Option("--precision", help="auto (bf16 on CUDA, fp32 on CPU), fp32, or bf16: autocast compute "
                                              "with float32 master weights and optimizer state.")
    ] = "auto",
    init_from: Annotated[
        str | None, typer.Option("--init-from", help="Start from this run's latest weights (fresh optimizer).")
    ] = None,
    threads: Annotated[int, typer.Option("--threads", help="Compute threads per rank (CPU).")] = 1,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    noise_every: Annotated[
        int, typer.Option("--noise-every", help="Measure each stage's gradient noise scale every K steps (0: off); "
                                                "summary.json and metrics.jsonl report it.")
    ] = NOISE_EVERY,
    noise_estimator: Annotated[
        str, typer.Option("--noise-estimator", help="How measured steps combine into each stage's noise scale: "
                                                    "winsor (default: robust to one outlier step), median, or ema "
                                                    "(the published moving averages).")
    ] = DEFAULT_NOISE_ESTIMATOR,
    noise_measure: Annotated[
        str, typer.Option("--noise-measure", help="The noise estimator's small batch: sequence (default: "
                                                  "per-sequence gradient norms, the same whatever micro-batches and "
                                                  "replicas split the step) or microbatch (one replica's "
                                                  "micro-batch).")
    ] = DEFAULT_NOISE_MEASURE,
    noise_window: Annotated[
        int, typer.Option("--noise-window", help="median, winsor: measured steps in the window (0: 8, or the "
                                                 "run's measured steps if fewer).")
    ] = 0,
    schedule: Annotated[str | None, typer.Option("--schedule", help="timely without --plan: the schedule.")] = None,
    ranks: Annotated[int | None, typer.Option("--ranks", help="timely without --plan: pipeline ranks.")] = None,
    microbatches: Annotated[
        int | None, typer.Option("--microbatches", "-m", help="timely without --plan: micro-batches per step.")
    ] = None,
    stages_per_rank: Annotated[
        int | None, typer.Option("--stages-per-rank", help="timely without --plan: stages per rank V.")
    ] = None,
    max_freeze_ratio: Annotated[
        str, typer.Option("--max-freeze-ratio", "-c", help="timely: cap on each stage's mean ratio (one value, or "
                                                          "comma-separated per stage).")
    ] = "0.9",
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="timely: steps before monitoring.")] = 5,
    monitor_steps: Annotated[
        int, typer.Option("--monitor-steps", help="timely: steps timing every action unfrozen.")
    ] = 15,
    probe_steps: Annotated[
        int, typer.Option("--probe-steps", help="timely: steps timing frozen backwards (a quarter of the "
                                               "micro-batches frozen per step).")
    ] = 5,
    replan_threshold: Annotated[
        float, typer.Option("--replan-threshold", help="timely: re-plan when an action kind's time drifts by more "
                                                      "than this share.")
    ] = 0.10,
    replan_window: Annotated[
        int, typer.Option("--replan-window", help="timely: steps per drift check.")
    ] = 20,
    noise_replan_z: Annotated[
        float, typer.Option("--noise-replan-z", help="timely, goodput: re-plan on a noise-scale move only beyond "
                                                    "this many standard errors of the estimates (0: off).")
    ] = 0.0,
    objective: Annotated[
        str, typer.Option("--objective", help="timely: makespan (the fastest plan within the caps) or goodput (the "
                                              "most predicted learning per second, from the noise scale measured "
                                              "in the monitor phase; freezing nothing when it does not pay).")
    ] = "makespan",
    apf_threshold: Annotated[float, typer.Option("--apf-threshold", help="apf: stability threshold.")] = 0.05,
    apf_ema: Annotated[float, typer.Option("--apf-ema", help="apf: moving-average factor.")] = 0.99,
    apf_check_every: Annotated[int, typer.Option("--apf-check-every", help="apf: steps between checks.")] = 10,
    apf_stable_share: Annotated[
        float, typer.Option("--apf-stable-share", help="apf: a tensor freezes when this share of its scalars is "
                                                       "stable.")
    ] = APF_STABLE_SHARE,
    autofreeze_percentile: Annotated[
        float, typer.Option("--autofreeze-percentile", help="autofreeze: rate percentile that freezes.")
    ] = 50.0,
    autofreeze_check_every: Annotated[
        int, typer.Option("--autofreeze-check-every", help="autofreeze: steps between checks.")
    ] = 20,
) -> None:
    """Train with the plan's schedule, freezing each (stage, micro-batch) action's share of parameters; or, with
    --freeze timely, measure the pipeline, solve the plan and freeze inside this one run.

    Starts the plan's number of ranks on this host through torch.distributed.run, or joins an external
    `torchrun` job. Writes metrics.jsonl, summary.json, profile.json and checkpoints to --out (and plan.json,
    plans/ for timely). SIGINT or SIGTERM stops after the current step with a checkpoint (a second one aborts);
    --resume DIR continues.

    Examples:
      tfrun train --plan plan.json --steps 30 --out runs/plan
      tfrun train --freeze timely --schedule 1f1b --ranks 2 --microbatches 8 --max-freeze-ratio 0.9 --steps 120
    """
    from tfrun.cli import setup
    from tfrun.distributed import launch

    with user_errors(TfrunError):
        config_file.raise_errors(ctx)
        ctx.params.update(config_file.resumed_data_settings(ctx))  # Note [resumed data]
        tokenizer, token_dtype = ctx.params["tokenizer"], ctx.params["token_dtype"]
        config = setup.train_config(
            plan_path=plan, model=model, steps=steps, seed=seed, freeze_seed=freeze_seed,
            out_dir=setup.out_dir(out, resume), freeze=freeze,
            freeze_method=freeze_method, redraw_every=redraw_every,
            freeze_policy=freeze_policy or ("goodput" if objective == "goodput" else "auto"), objective=objective,
            ramp_steps=ramp_steps if ramp_steps is not None else (15 if freeze == "timely" else 0),
            max_stale_steps=max_stale_steps, schedule=schedule, ranks=ranks, microbatches=microbatches,
            stages_per_rank=stages_per_rank, max_freeze_ratio=_caps(max_freeze_ratio), warmup_steps=warmup_steps,
            monitor_steps=monitor_steps, probe_steps=probe_steps, replan_threshold=replan_threshold,
            replan_window=replan_window, noise_replan_z=noise_replan_z, apf_threshold=apf_threshold, apf_ema=apf_ema,
            apf_check_every=apf_check_every, apf_stable_share=apf_stable_share,
            autofreeze_percentile=autofreeze_percentile, autofreeze_check_every=autofreeze_check_every,
            init_from=init_from, dp=dp,
            grad_rescale=grad_rescale, microbatch_size=microbatch_size, global_batch=global_batch,
            seq_len=seq_len, lr=lr, eval_every=eval_every, eval_batches=eval_batches, checkpoint_every=checkpoint_every,
            checkpoint_minutes=checkpoint_minutes, keep_checkpoints=keep_checkpoints, force=force,
            resume=resume is not None, data_path=data, threads=threads, quiet=quiet, noise_every=noise_every,
            noise_estimator=noise_estimator, noise_measure=noise_measure, noise_window=noise_window,
            tokenizer_path=tokenizer, token_dtype=token_dtype, token_cache_dir=token_cache, precision=precision,
            lr_schedule=lr_schedule, lr_warmup_steps=lr_warmup_steps, lr_min_ratio=lr_min_ratio,
            lr_decay_fraction=lr_decay_fraction, weight_decay=weight_decay, adam_betas=_betas(adam_betas),
            adam_eps=adam_eps, clip_grad_norm=clip_grad_norm, on_nonfinite=on_nonfinite,
            max_skipped_steps=max_skipped_steps, tensorboard=tensorboard,
        )
        if tensorboard:
            check_tensorboard()
        if os.environ.get("RANK", "0") == "0":  # every check passed: the run's folder starts with its settings
            setup.out_path(config).mkdir(parents=True, exist_ok=True)
            write_text_atomic(setup.out_path(config) / config_file.RESOLVED, config_file.resolved_text(ctx))
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


def _betas(text: str) -> list[float]:
    try:
        betas = [float(x) for x in text.split(",")]
    except ValueError:
        betas = []
    if len(betas) != 2:
        raise TfrunError(f"--adam-betas must be two numbers B1,B2 in [0, 1), got {text!r}")
    return betas


def _caps(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise TfrunError(f"--max-freeze-ratio: numbers, comma-separated, got {text!r}") from None
