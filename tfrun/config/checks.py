"""TrainConfig's checks: every setting a user chooses, validated before any rank starts (one clear line naming the
option per problem)."""

from __future__ import annotations

from tfrun.config.train_config import (
    FREEZE_MODES,
    FREEZE_POLICIES,
    KEPT_STEPS,
    MIN_JACKKNIFE,
    NOISE_ESTIMATORS,
    NOISE_MEASURES,
    TrainConfig,
)
from tfrun.errors import TfrunError


def check(config: TrainConfig) -> None:
    """Validate the settings a user chooses (one clear line per problem)."""
    from tfrun.models import model_config

    if config.freeze not in FREEZE_MODES:
        raise TfrunError(f"--freeze must be one of {', '.join(FREEZE_MODES)}, got {config.freeze!r}")
    if config.freeze_policy not in FREEZE_POLICIES:
        raise TfrunError(f"--freeze-policy must be one of {', '.join(FREEZE_POLICIES)}, "
                         f"got {config.freeze_policy!r}")
    if config.precision not in ("auto", "fp32", "bf16"):
        raise TfrunError(f"--precision must be auto, fp32 or bf16, got {config.precision!r}")
    from tfplan.cost.goodput import LEARNING_MODELS

    if config.learning_model not in LEARNING_MODELS:
        raise TfrunError(f"--learning-model must be one of {', '.join(LEARNING_MODELS)}, got {config.learning_model!r}")
    from tfplan.plan.job import OBJECTIVES

    if config.objective not in OBJECTIVES:  # (the first in-run solve found it, at step 25, among the ranks)
        raise TfrunError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {config.objective!r}")
    if config.chat_loss not in ("assistant", "all"):
        raise TfrunError(f"--chat-loss must be assistant or all, got {config.chat_loss!r}")
    if config.freeze_method not in ("detach", "grad"):
        raise TfrunError(f"--freeze-method must be detach or grad, got {config.freeze_method!r}")
    cfg = model_config(config.model)
    if cfg.n_layers < config.num_stages:
        raise TfrunError(
            f"model {config.model} has {cfg.n_layers} layers, fewer than the plan's {config.num_stages} stages"
        )
    if config.seq_len > cfg.max_seq_len:
        raise TfrunError(f"--seq-len {config.seq_len} exceeds model {config.model}'s max_seq_len {cfg.max_seq_len}")
    if cfg.sliding_window is not None and config.seq_len > cfg.sliding_window:
        raise TfrunError(f"--seq-len {config.seq_len} exceeds model {config.model}'s sliding_window "
                         f"{cfg.sliding_window} (tfrun attends to whole sequences: a window's equal up to it)")
    for name in ("steps", "microbatch_size", "seq_len", "redraw_every", "eval_batches", "threads",
                 "apf_check_every", "autofreeze_check_every", "dp"):
        if getattr(config, name) < 1:
            raise TfrunError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(config, name)}")
    for name in ("ramp_steps", "eval_every", "checkpoint_every", "timing_warmup_steps", "max_stale_steps",
                 "warmup_steps", "monitor_steps", "probe_steps", "noise_every"):
        if getattr(config, name) < 0:
            raise TfrunError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(config, name)}")
    if not config.lr > 0:
        raise TfrunError(f"--lr must be > 0, got {config.lr}")
    _check_recipe(config)
    if not 0 < config.apf_threshold < 1 or not 0 <= config.apf_ema < 1 or not 0 < config.autofreeze_percentile < 100:
        raise TfrunError("--apf-threshold must be in (0, 1), --apf-ema in [0, 1), --autofreeze-percentile in "
                         "(0, 100)")
    if not 0 < config.apf_stable_share <= 1:
        raise TfrunError(f"--apf-stable-share must be in (0, 1], got {config.apf_stable_share:g}")
    if config.init_from is not None and config.resume:
        raise TfrunError("--init-from starts a new run from another run's weights; --resume continues a run: "
                         "give one")
    if not 0 <= config.checkpoint_minutes < float("inf"):
        raise TfrunError(f"--checkpoint-minutes must be >= 0, got {config.checkpoint_minutes:g}")
    if config.keep_checkpoints == 1 or config.keep_checkpoints < 0:
        raise TfrunError(f"--keep-checkpoints must be 0 (keep all) or >= 2 (so that a damaged newest checkpoint "
                         f"has a predecessor), got {config.keep_checkpoints}")
    if config.freeze == "timely":
        if config.plan_path is None and (config.monitor_steps < 2 or config.probe_steps < 1):
            raise TfrunError("--freeze timely needs --monitor-steps >= 2 and --probe-steps >= 1 (or a --plan)")
        if config.monitor_steps + config.probe_steps > KEPT_STEPS or config.replan_window > KEPT_STEPS:
            raise TfrunError(f"--monitor-steps + --probe-steps and --replan-window must each be at most "
                             f"{KEPT_STEPS} (the steps whose timings a rank keeps)")
        if config.replan_window < 2 or not 0 < config.replan_threshold:
            raise TfrunError(f"--replan-window must be >= 2 and --replan-threshold > 0, got "
                             f"{config.replan_window} and {config.replan_threshold:g}")
        if not 0 <= config.noise_replan_z < float("inf"):
            raise TfrunError(f"--noise-replan-z must be a finite number >= 0, got {config.noise_replan_z:g}")
        if config.noise_replan_z > 0 and (config.objective != "goodput" or config.noise_estimator == "ema"
                                        or config.noise_window_steps() < MIN_JACKKNIFE):
            raise TfrunError(f"--noise-replan-z gates re-plans on learning: it needs --objective goodput and "
                             f"--noise-estimator median or winsor over a window of at least {MIN_JACKKNIFE} "
                             f"measured steps, got --objective {config.objective}, {config.noise_estimator}, "
                             f"window {config.noise_window_steps()} (--noise-replan-z 0: no gate)")
        if len(config.max_freeze_ratio) not in (1, config.num_stages) or not all(
                0 <= c <= 1 for c in config.max_freeze_ratio):
            raise TfrunError(f"--max-freeze-ratio: one cap or one per stage ({config.num_stages}), each in [0, 1]")


def _check_recipe(config: TrainConfig) -> None:
    """The optimizer's settings, the schedule and the non-finite guard (one line naming the option)."""
    problem = config.lr_at().problem()
    if problem is not None:
        raise TfrunError(problem)
    for name in ("clip_grad_norm", "weight_decay"):
        value = getattr(config, name)
        if not 0 <= value < float("inf"):  # (NaN fails too)
            raise TfrunError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}")
    if not 0 < config.adam_eps < float("inf"):
        raise TfrunError(f"--adam-eps must be a finite number > 0, got {config.adam_eps}")
    if len(config.adam_betas) != 2 or not all(0 <= b < 1 for b in config.adam_betas):
        raise TfrunError(f"--adam-betas must be two numbers B1,B2 in [0, 1), got {list(config.adam_betas)}")
    if config.noise_estimator not in NOISE_ESTIMATORS:
        raise TfrunError(f"--noise-estimator must be one of {', '.join(NOISE_ESTIMATORS)}, got "
                         f"{config.noise_estimator!r}")
    if config.noise_measure not in NOISE_MEASURES:
        raise TfrunError(f"--noise-measure must be one of {', '.join(NOISE_MEASURES)}, got "
                         f"{config.noise_measure!r}")
    measured = config._measured_steps()
    if config.noise_window < 0 or (measured is not None and config.noise_window > measured):
        raise TfrunError(f"--noise-window must be in [0, the run's measured steps] ({measured}: --steps "
                         f"{config.steps}, --noise-every {config.noise_every}), got {config.noise_window}")
    if config.on_nonfinite not in ("stop", "skip"):
        raise TfrunError(f"--on-nonfinite must be stop or skip, got {config.on_nonfinite!r}")
    if config.max_skipped_steps < 1:
        raise TfrunError(f"--max-skipped-steps must be >= 1, got {config.max_skipped_steps}")
