"""Every option of `tfrun train`, declared once: its flag (the TOML key of --config is the flag without dashes),
its help panel and text, its default, and the setting it makes: a TrainConfig field, or one of
tfrun.cli.setup.train_config's own arguments. tfrun.cli.train_cmd builds the typer command from this table, so a
new option is one row here (tests/tfrun/cli/test_train_options.py checks flags, keys and fields agree).

Panels follow what a user sets, in the order they set it (torchtitan's config sections do the same).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from tfplan.cost.goodput import DEFAULT_LEARNING_MODEL, LEARNING_MODELS
from tfrun.config.train_config import (
    APF_STABLE_SHARE,
    DEFAULT_NOISE_ESTIMATOR,
    DEFAULT_NOISE_MEASURE,
    GATE_Z,
    GOODPUT_NOISE_EVERY,
    NOISE_EVERY,
)
from tfrun.errors import TfrunError

MODEL, RECIPE, PIPELINE, ONLINE, BASELINES, RUN = (
    "Model and data", "Recipe", "Pipeline and freezing", "Online TimelyFreeze and noise", "Baselines",
    "Run and records")
PANELS = (MODEL, RECIPE, PIPELINE, ONLINE, BASELINES, RUN)


@dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    """One option of `tfrun train`."""

    name: str
    """The parameter's name: the flag is --name with dashes for underscores, and so is its TOML key."""
    type: Any
    """Its annotation: int, float, str, bool, or one of them | None."""
    default: Any
    help: str
    panel: str
    to: str | None = ""
    """The setting it makes: "" a TrainConfig field of its name, another name a TrainConfig field or a keyword of
    tfrun.cli.setup.train_config, None one the command itself reads (--config, --resume's folder)."""
    short: str | None = None
    convert: Callable[[Any, dict[str, Any]], Any] | None = None
    """From the option's value (and every option's, for defaults that depend on another) to the setting's."""
    callback: str | None = None
    """An eager callback of tfrun.cli.config_file (on_config, on_resume): read before the other options."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def setting(self) -> str | None:
        return self.name if self.to == "" else self.to


O = Option
OPTIONS: tuple[Option, ...] = (
    # -- model and data --
    O(name="model", type=str, default="tiny", panel=MODEL, help="Model size: tiny, small, llama3.2-1b, llama3.1-8b; "
      "or hf:DIR, a Hugging Face checkpoint folder of the LLaMA, Qwen2, Qwen3 or Mistral family (fine-tuning)."),
    O(name="data", type=str | None, default=None, panel=MODEL, to="data_path", help="Training data: a text file, a "
      ".jsonl file (its 'text' fields, or chat rows: --chat-template) or a folder of them, a .bin file of token ids, "
      "or 'stdlib' (Python source; default: CPython's pydoc topics)."),
    O(name="tokenizer", type=str | None, default=None, panel=MODEL, to="tokenizer_path", help="A tokenizer.json "
      "(Hugging Face tokenizers) for text --data; tokenized once and cached. Default: bytes (vocabulary 256)."),
    O(name="chat_template", type=str | None, default=None, panel=MODEL, help="Chat data (jsonl rows of messages, or "
      "prompt/completion): the chat template, a .jinja file or a tokenizer_config.json (default: the one beside "
      "--tokenizer)."),
    O(name="chat_loss", type=str, default="assistant", panel=MODEL, help="Chat data: the tokens the loss counts: "
      "assistant (the answers and their end-of-turn tokens) or all."),
    O(name="token_dtype", type=str, default="uint16", panel=MODEL,
      help="Ids of a --data FILE.bin: uint16 (nanoGPT's layout) or uint32."),
    O(name="token_cache", type=str | None, default=None, panel=MODEL, to="token_cache_dir",
      help="Folder of the tokenized-data cache (default: token-cache beside --out)."),
    O(name="init_from", type=str | None, default=None, panel=MODEL,
      help="Start from this run's latest weights (fresh optimizer)."),
    O(name="seq_len", type=int, default=128, panel=MODEL, help="Tokens per sequence."),
    # -- recipe --
    O(name="lr", type=float, default=3e-4, panel=RECIPE, help="AdamW's peak learning rate."),
    O(name="lr_schedule", type=str, default="constant", panel=RECIPE, help="constant, cosine, linear or wsd "
      "(warmup, stable, decay): transformers' schedules, step by step."),
    O(name="lr_warmup_steps", type=int, default=0, panel=RECIPE, help="Linear warmup from 0 over N steps."),
    O(name="lr_min_ratio", type=float, default=0.0, panel=RECIPE,
      help="Floor of the decay, a fraction of --lr (cosine, linear, wsd)."),
    O(name="lr_decay_fraction", type=float, default=0.1, panel=RECIPE,
      help="wsd: the last share of the steps, over which it decays."),
    O(name="weight_decay", type=float, default=0.0, panel=RECIPE,
      help="AdamW weight decay, on matrices and embeddings only (not on norms or biases)."),
    O(name="adam_betas", type=str, default="0.9,0.999", panel=RECIPE, help="AdamW's B1,B2.",
      convert=lambda text, _: _betas(text)),
    O(name="adam_eps", type=float, default=1e-8, panel=RECIPE, help="AdamW's epsilon."),
    O(name="clip_grad_norm", type=float, default=0.0, panel=RECIPE,
      help="Clip the gradient's L2 norm over every stage and replica to this (0: off)."),
    O(name="on_nonfinite", type=str, default="stop", panel=RECIPE, help="A step whose loss or gradient norm is not "
      "finite: stop (exit 1, the last good checkpoint kept) or skip its optimizer step."),
    O(name="max_skipped_steps", type=int, default=10, panel=RECIPE,
      help="skip: this many skipped steps in a row end the run."),
    O(name="precision", type=str, default="auto", panel=RECIPE, help="auto (bf16 on CUDA, fp32 on CPU), fp32, or "
      "bf16: autocast compute with float32 master weights and optimizer state."),
    # -- pipeline and freezing --
    O(name="plan", type=str | None, default=None, panel=PIPELINE, to="plan_path", help="Plan JSON from `tfplan "
      "solve` (with --freeze timely: optional, seeds the first plan)."),
    O(name="freeze", type=str, default="plan", panel=PIPELINE, help="plan: apply the plan; none: the unfrozen "
      "baseline; all: freeze everything; timely: measure, plan and freeze inside the run; uniform: every backward "
      "at the plan's mean ratio; apf, autofreeze: the baselines; timely+apf, timely+autofreeze: the plan's ratios, "
      "the baseline's choice of tensors."),
    O(name="freeze_policy", type=str | None, default=None, panel=PIPELINE, help=(
      "Which tensors an action freezes. auto (default): stage 0 freezes its front layers (a prefix, linear in time "
      "as planned) whenever the plan leaves one of its micro-batches unfrozen, rotating random subsets otherwise; "
      "other stages freeze rotating random subsets; every tensor keeps learning. random: rotating random subsets "
      "everywhere (stage 0 then saves little until r = 1). prefix: stage 0 always freezes its front layers: planned "
      "speed, but the front stops learning while the ratios stay high (costs eval loss: docs/benchmarks.md). skip: "
      "whole backwards skipped in a share r of steps (steps vary: slower than planned, trains worst). weighted: "
      "stage 0 draws front-weighted random subsets (the paper's code). goodput: as auto on stage 0; elsewhere one "
      "rotating turn per window, then the tensors with the least learning per ms frozen first (from the measured "
      "noise scale); the default under --objective goodput."),
      convert=lambda value, v: value or ("goodput" if v["objective"] == "goodput" else "auto")),
    O(name="freeze_method", type=str, default="detach", panel=PIPELINE,
      help="detach (forward with frozen weights detached) or grad."),
    O(name="freeze_seed", type=int | None, default=None, panel=PIPELINE, help="Another draw of which micro-batches "
      "and tensors freeze, with --seed's data and weights (default: --seed)."),
    O(name="ramp_steps", type=int | None, default=None, panel=PIPELINE,
      help="Ramp ratios from 0 over K steps (default 0; timely 15, timely --objective goodput 0).",
      convert=lambda value, v: value if value is not None else (15 if v["freeze"] == "timely"
                                                                and v["objective"] != "goodput" else 0)),
    O(name="redraw_every", type=int, default=10, panel=PIPELINE, help="Window of K steps: frozen sets are re-drawn "
      "per window, and each stage's realised mean ratio over a window is at most the plan's."),
    O(name="max_stale_steps", type=int, default=0, panel=PIPELINE,
      help="Unfreeze any tensor that got no gradient for K steps (0: off)."),
    O(name="grad_rescale", type=bool, default=False, panel=PIPELINE,
      help="Gradient = mean over contributing micro-batches."),
    O(name="microbatch_size", type=int, default=4, panel=PIPELINE, help="Sequences per micro-batch."),
    O(name="global_batch", type=int | None, default=None, panel=PIPELINE,
      help="Sequences per step (= dp x micro-batch size x plan's M)."),
    O(name="dp", type=int, default=1, panel=PIPELINE,
      help="Data-parallel replicas of the pipeline (world = dp x the plan's ranks)."),
    O(name="force", type=bool, default=False, panel=PIPELINE, help="Run a plan whose profile was measured for "
      "another model, batch shape or device (summary.json then reports no prediction error)."),
    # -- the online mode and the noise scale --
    O(name="schedule", type=str | None, default=None, panel=ONLINE, help="timely without --plan: the schedule."),
    O(name="ranks", type=int | None, default=None, panel=ONLINE, help="timely without --plan: pipeline ranks."),
    O(name="microbatches", type=int | None, default=None, panel=ONLINE, short="-m",
      help="timely without --plan: micro-batches per step."),
    O(name="stages_per_rank", type=int | None, default=None, panel=ONLINE,
      help="timely without --plan: stages per rank V."),
    O(name="max_freeze_ratio", type=str, default="0.9", panel=ONLINE, short="-c", help="timely: cap on each stage's "
      "mean ratio (one value, or comma-separated per stage).", convert=lambda text, _: _caps(text)),
    O(name="objective", type=str, default="makespan", panel=ONLINE, help="timely: makespan (the fastest plan within "
      "the caps) or goodput (the most predicted learning per second, from the noise scale measured in the monitor "
      "phase; freezing nothing when it does not pay)."),
    O(name="learning_model", type=str, default=DEFAULT_LEARNING_MODEL, panel=ONLINE, help="timely, goodput: the "
      "learning model of the in-run solves: " + ", ".join(LEARNING_MODELS) + " (docs/cost-model.md, 'Which "
      "learning model')."),
    O(name="warmup_steps", type=int | None, default=None, panel=ONLINE, help="timely: steps before monitoring "
      "(default 5; 0 under --objective goodput with a --plan solved for goodput, in force from the first step)."),
    O(name="monitor_steps", type=int, default=15, panel=ONLINE, help="timely: steps timing every action unfrozen."),
    O(name="probe_steps", type=int, default=5, panel=ONLINE, help="timely: steps timing frozen backwards (a quarter "
      "of the micro-batches frozen per step)."),
    O(name="replan_threshold", type=float, default=0.10, panel=ONLINE, help="timely: re-plan when an action kind's "
      "time drifts by more than this share."),
    O(name="replan_window", type=int, default=20, panel=ONLINE, help="timely: steps per drift check."),
    O(name="noise_replan_z", type=float | None, default=None, panel=ONLINE, help="timely, goodput: re-plan on a move "
      "of the learning model's inputs only beyond this many standard errors of the estimates (default "
      f"{GATE_Z:g}; 0: off, a 25% move of a noise scale re-plans; with --noise-estimator ema, 0).",
      convert=lambda value, v: value if value is not None else (
          GATE_Z if v["freeze"] == "timely" and v["objective"] == "goodput" and v["noise_estimator"] != "ema"
          else 0.0)),
    O(name="noise_every", type=int | None, default=None, panel=ONLINE, help="Measure each stage's gradient noise "
      f"scale every K steps (0: off; default {NOISE_EVERY}, timely --objective goodput {GOODPUT_NOISE_EVERY}); "
      "summary.json and metrics.jsonl report it.",
      convert=lambda value, v: value if value is not None else (
          GOODPUT_NOISE_EVERY if v["freeze"] == "timely" and v["objective"] == "goodput" else NOISE_EVERY)),
    O(name="noise_estimator", type=str, default=DEFAULT_NOISE_ESTIMATOR, panel=ONLINE, help="How measured steps "
      "combine into each stage's noise scale: winsor (default: robust to one outlier step), median, or ema (the "
      "published moving averages)."),
    O(name="noise_measure", type=str, default=DEFAULT_NOISE_MEASURE, panel=ONLINE, help="The noise estimator's "
      "small batch: sequence (default: per-sequence gradient norms, the same whatever micro-batches and replicas "
      "split the step) or microbatch (one replica's micro-batch)."),
    O(name="noise_window", type=int, default=0, panel=ONLINE,
      help="median, winsor: measured steps in the window (0: 8, or the run's measured steps if fewer)."),
    # -- baselines --
    O(name="apf_threshold", type=float, default=0.05, panel=BASELINES, help="apf: stability threshold."),
    O(name="apf_ema", type=float, default=0.99, panel=BASELINES, help="apf: moving-average factor."),
    O(name="apf_check_every", type=int, default=10, panel=BASELINES, help="apf: steps between checks."),
    O(name="apf_stable_share", type=float, default=APF_STABLE_SHARE, panel=BASELINES,
      help="apf: a tensor freezes when this share of its scalars is stable."),
    O(name="autofreeze_percentile", type=float, default=50.0, panel=BASELINES,
      help="autofreeze: rate percentile that freezes."),
    O(name="autofreeze_check_every", type=int, default=20, panel=BASELINES, help="autofreeze: steps between checks."),
    # -- the run and its records --
    O(name="config", type=str | None, default=None, panel=RUN, to=None, callback="on_config", help="A TOML file of "
      "these options by long name (lr-schedule = \"cosine\"); flags on the command line override it."),
    O(name="steps", type=int, default=30, panel=RUN, help="Optimizer steps."),
    O(name="seed", type=int, default=0, panel=RUN, help="Initialisation, data and freeze-selection seed."),
    O(name="out", type=str | None, default=None, panel=RUN, to="out_dir", help="Output folder (default runs/latest).",
      convert=lambda value, v: _out_dir(value, v["resume"])),
    O(name="resume", type=str | None, default=None, panel=RUN, callback="on_resume", convert=lambda v, _: v is not None,
      help="Continue the run in this folder from its newest complete checkpoint, with its settings (OUT/config.toml; "
      "flags override; --steps may grow)."),
    O(name="eval_every", type=int, default=0, panel=RUN, help="Validation loss every K steps (0: end)."),
    O(name="eval_batches", type=int, default=4, panel=RUN,
      help="Validation batches (of the step's sequences) per evaluation."),
    O(name="checkpoint_every", type=int, default=100, panel=RUN,
      help="Checkpoint every K steps (0: only by time and at the end)."),
    O(name="checkpoint_minutes", type=float, default=10.0, panel=RUN,
      help="Also checkpoint when this many minutes passed since the last one (0: off)."),
    O(name="keep_checkpoints", type=int, default=2, panel=RUN,
      help="Keep the newest K complete checkpoints (0: all; else >= 2)."),
    O(name="tensorboard", type=bool, default=False, panel=RUN,
      help="Also write TensorBoard event files to OUT/tensorboard/ (needs the tensorboard package)."),
    O(name="timing_warmup_steps", type=int, default=1, panel=RUN,
      help="Steps (after the ramp) left out of the timing medians (the first step infers shapes)."),
    O(name="threads", type=int, default=1, panel=RUN, help="Compute threads per rank (CPU)."),
    O(name="quiet", type=bool, default=False, panel=RUN, help="No progress bar."),
)
del O


def by_name() -> dict[str, Option]:
    return {o.name: o for o in OPTIONS}


def signature():
    """The typer command's signature: `ctx`, then every option (Annotated with its typer.Option)."""
    import typer

    from tfrun.cli import config_file

    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    for o in OPTIONS:
        names = [o.flag, *((o.short,) if o.short else ())]
        extra = {"is_eager": True, "callback": getattr(config_file, o.callback)} if o.callback else {}
        info = typer.Option(*names, help=o.help, rich_help_panel=o.panel, **extra)
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                                        annotation=Annotated[o.type, info]))
    return inspect.Signature(params)


def settings(values: dict[str, Any]) -> dict[str, Any]:
    """tfrun.cli.setup.train_config's keyword arguments from the options' values (by parameter name)."""
    out = {}
    for o in OPTIONS:
        if o.setting is not None:
            value = values[o.name]
            out[o.setting] = o.convert(value, values) if o.convert is not None else value
    return out


def _betas(text: str) -> list[float]:
    try:
        betas = [float(x) for x in str(text).split(",")]
    except ValueError:
        betas = []
    if len(betas) != 2:
        raise TfrunError(f"--adam-betas must be two numbers B1,B2 in [0, 1), got {text!r}")
    return betas


def _caps(text: str) -> list[float]:
    try:
        return [float(x) for x in str(text).split(",")]
    except ValueError:
        raise TfrunError(f"--max-freeze-ratio: numbers, comma-separated, got {text!r}") from None


def _out_dir(out: str | None, resume: str | None) -> str:
    from tfrun.cli import setup

    return setup.out_dir(out, resume)
