"""What one training run does: the schedule to run, the freeze ratios, the model, data and loop settings.

`TrainConfig` is plain data. The launcher validates it before any rank starts and hands it to the workers
as JSON (the only thing that crosses into the worker processes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfplan.cost.goodput import DEFAULT_LEARNING_MODEL
from tfrun.errors import TfrunError
from tfrun.optim.lr_schedule import LrSchedule

FREEZE_POLICIES = ("auto", "skip", "random", "prefix", "weighted", "goodput")
"""`--freeze-policy`'s choices (tfrun.freeze.freezing Note [freeze policy])."""
KEPT_STEPS = 1000
"""Timed steps whose records an ActionTimer keeps (the newest): what the run's summary, timings.json and measured
profile take their medians over, and a bound on memory (8 ranks x M = 64 x F, I, W is 1,536 records a step)."""
FREEZE_MODES = ("plan", "none", "all", "timely", "uniform", "apf", "autofreeze", "timely+apf", "timely+autofreeze")
PLANNED = ("plan", "uniform", "timely+apf", "timely+autofreeze")  # modes that apply `ratios`
NOISE_EVERY = 5
"""Default period of the noise-scale measurement, in steps (its cost: docs/benchmarks.md, "Noise scale")."""
NOISE_ESTIMATORS = ("ema", "median", "winsor")
"""`--noise-estimator`'s choices (tfrun.freeze.noise_estimators Note [robust noise])."""
DEFAULT_NOISE_ESTIMATOR = "winsor"
"""Chosen by measurement: docs/cost-model.md, "Which noise estimator"."""
NOISE_MEASURES = ("microbatch", "sequence")
"""`--noise-measure`'s choices: what the two-batch estimator's small batch is (tfrun.freeze.noise Note [noise
measure])."""
DEFAULT_NOISE_MEASURE = "sequence"
"""Chosen by measurement: docs/cost-model.md, "Which noise estimator"."""
DEFAULT_NOISE_WINDOW = 8
"""Measured steps the window estimators keep by default (fewer when the run measures fewer)."""
MIN_JACKKNIFE = 3
"""Measured steps in a window below which a stage's noise spread is not estimated (--noise-replan-z needs a
window this long: tfrun.freeze.noise_estimators Note [noise gate])."""
GOODPUT_NOISE_EVERY = 10
"""--noise-every's default under --freeze timely --objective goodput: its measured steps also leave a block of whole
micro-batches unfrozen, and both costs stay under 3% of the run (tfrun.freeze.controller Note [unfrozen
measurement])."""
WARMUP_STEPS = 5
"""timely: steps without freezing or measuring at the start, by default (tfrun.cli.setup.warmup_steps)."""
GATE_Z = 2.0
"""--noise-replan-z's default under --freeze timely --objective goodput (tfrun.freeze.controller Note [learning
gate]): the learning model's inputs must move beyond two standard errors to re-plan."""
APF_STABLE_SHARE = 0.5
"""Default share of a tensor's scalars that must be stable for APF to freeze it (tfrun.freeze.baselines Note [apf
share]; measured in docs/results.md)."""


DEFAULT_OUT = "runs/latest"
"""--out when not given: by its name the one folder a new run writes over (any other that holds a run is refused)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """One training (or profiling) run."""

    order: list[list[str]]
    """Per-rank compute actions in torch's grammar (the plan's schedule)."""
    num_stages: int
    """Pipeline stages S."""
    num_microbatches: int
    """Micro-batches M per step."""
    stage_to_rank: list[int]
    """stage_to_rank[s] = rank holding stage s."""
    schedule_name: str = "custom"
    """For reports."""
    ratios: dict[str, float] = field(default_factory=dict)
    """Action (e.g. "1B3") -> planned freeze ratio; absent = 0."""
    predicted_step_ms: float | None = None
    """The plan's predicted step time for this freeze mode (planned_ms, or no_freeze_ms under none)."""
    plan_path: str | None = None
    plan_profile: dict | None = None
    """The plan's profile section (per-stage costs it was planned with), JSON form."""
    plan_hash: str | None = None
    """sha256 of the plan file's bytes (or of the generated schedule without one); a resume refuses another.
    Set by tfrun.cli.setup."""
    force: bool = False
    """Run a plan whose profile does not match this run (tfrun.records.provenance); prediction_error is then null."""
    prediction_note: str | None = None
    """Why the plan's prediction does not apply to this run (the mismatch --force overrode); set by tfrun.cli.setup."""
    freeze: str = "plan"
    """plan: apply the ratios; none: freeze nothing (the baseline); all: freeze everything (profiling);
    timely: measure, plan and freeze inside the run (tfrun.freeze.online); uniform: every B/W action at the plan's
    overall mean ratio (schedule-blind); apf, autofreeze: the baselines (tfrun.freeze.baselines); timely+apf,
    timely+autofreeze: the plan's ratios, the baseline's choice of tensors."""
    freeze_method: str = "detach"
    """detach or grad (tfrun.distributed.runtime Note [freeze methods])."""
    freeze_policy: str = "auto"
    """Which tensors an action freezes: auto, skip, random, prefix or weighted (tfrun.freeze.freezing Note [freeze
    policy])."""
    max_stale_steps: int = 0
    """Unfreeze a tensor that got no gradient for this many steps (0 = off; tfrun.freeze.freezing Note [stale
    guard])."""
    model: str = "tiny"
    """Named model size (tfrun.models.MODELS) or `hf:DIR`, a Hugging Face checkpoint folder (made absolute)."""
    model_hash: str | None = None
    """hf: models: sha256 of the checkpoint's config.json (provenance compares it like a model name); set by
    tfrun.cli.setup and tfrun.cli.profiling."""
    steps: int = 30
    """Optimizer steps to run (in all, counting resumed ones)."""
    seed: int = 0
    """Initialisation, data order and freeze selection seed."""
    freeze_seed: int | None = None
    """Which micro-batches and tensors freeze (the freezer's draws); None: `seed`. Runs of one `seed` with other
    freeze seeds see the same data from the same weights: the scatter of "which micro-batches" alone."""
    out_dir: str = DEFAULT_OUT
    """Where metrics.jsonl, summary.json, profile.json and checkpoints go."""
    microbatch_size: int = 4
    """Sequences per micro-batch."""
    seq_len: int = 128
    """Tokens per sequence."""
    lr: float = 3e-4
    """AdamW's peak learning rate (the schedule's factor 1)."""
    lr_schedule: str = "constant"
    """constant, cosine, linear or wsd (tfrun.optim.lr_schedule; transformers' schedules step by step)."""
    lr_warmup_steps: int = 0
    """Steps of linear warmup from 0 (step 0 of a warmup has learning rate 0)."""
    lr_min_ratio: float = 0.0
    """cosine, linear, wsd: the decay's floor, a fraction of lr."""
    lr_decay_fraction: float = 0.1
    """wsd: the share of the run's last steps over which the learning rate decays."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay, on tensors of two or more dimensions only (tfrun.optim.optimizer)."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW's (beta1, beta2)."""
    adam_eps: float = 1e-8
    """AdamW's epsilon."""
    clip_grad_norm: float = 0.0
    """Clip the gradient's L2 norm over every stage and replica to this (0 = off; tfrun.optim.clipping Note
    [global clipping])."""
    on_nonfinite: str = "stop"
    """A step whose loss or gradient norm is not finite: stop (end the run, exit 1, the last good checkpoint
    kept) or skip (no optimizer step; tfrun.train Note [non-finite steps])."""
    max_skipped_steps: int = 10
    """on_nonfinite skip: this many skipped steps in a row end the run as stop does."""
    tensorboard: bool = False
    """Also write TensorBoard event files under out_dir/tensorboard/ (the tensorboard package)."""
    ramp_steps: int = 0
    """Ratios ramp linearly from 0 to the plan over this many steps (0 = plan from the first step)."""
    redraw_every: int = 10
    """Steps between random re-draws of the frozen subsets."""
    grad_rescale: bool = False
    """Rescale each gradient by M / (micro-batches that contributed) instead of summing only unfrozen ones."""
    eval_every: int = 0
    """Evaluate validation loss every this many steps (0 = only at the end)."""
    eval_batches: int = 4
    """Validation batches per evaluation."""
    checkpoint_every: int = 100
    """Checkpoint every this many steps (0 = by time and at the end only)."""
    checkpoint_minutes: float = 10.0
    """Also checkpoint when this many minutes passed since the last one (rank 0's clock, agreed by every rank;
    0 = off)."""
    keep_checkpoints: int = 2
    """Keep the newest this many complete checkpoints (0 = all; otherwise at least 2, so a damaged newest one
    has a predecessor)."""
    resume: bool = False
    """Continue from out_dir's latest checkpoint."""
    resume_step: int | None = None
    """The checkpoint (completed steps) a resume starts from: the newest that verifies; set by tfrun.cli.setup."""
    data_path: str | None = None
    """Training text; None = CPython's pydoc topics."""
    data_hash: str | None = None
    """sha256 of the training text, or of the token stream (tokenized or .bin data); a resume refuses other data.
    Set by tfrun.cli.setup."""
    tokenizer_path: str | None = None
    """--tokenizer: a tokenizer.json the text data is tokenized with (tfrun.data.tokenized); None: bytes."""
    chat_template: str | None = None
    """Chat data: the template file (a .jinja or a tokenizer_config.json); None: the one beside --tokenizer."""
    chat_loss: str = "assistant"
    """Chat data: which tokens the loss counts: assistant (the answers: tfrun.data.chat) or all."""
    token_dtype: str = "uint16"
    """--token-dtype of a --data FILE.bin: uint16 or uint32 little-endian ids (tfrun.data.tokenfile)."""
    precision: str = "auto"
    """Compute dtype: fp32, bf16 (autocast; float32 master weights and optimizer state: tfrun.distributed.runtime Note
    [autocast]) or auto (bf16 on CUDA, fp32 on CPU)."""
    token_cache: str | None = None
    """Tokenized data: the cache entry's token file every rank reads (tfrun.data.tokenized Note [token cache]).
    Set by tfrun.cli.setup."""
    timing_warmup_steps: int = 1
    """Steps (after the ramp) left out of timing medians (the first step infers shapes)."""
    fixed_weights: bool = False
    """The optimizer steps at learning rate 0: its time is measured and the weights stay where they started, so
    that the noise scale is measured at those weights (tfrun profile's runs: tfrun.cli.profiling Note [profile at
    fixed weights]). Set by tfrun.cli.profiling."""
    time_noise_steps: bool = True
    """Time the steps that measure the noise scale; False leaves them out of the timings and the step time (tfrun
    profile's noise run: tfrun.cli.profiling Note [hook-free timings]). Set by tfrun.cli.profiling."""
    threads: int = 1
    """Compute threads per rank (CPU)."""
    quiet: bool = False
    """No progress bar (benchmarks, tests)."""
    max_freeze_ratio: list[float] = field(default_factory=lambda: [0.9])
    """timely: the cap on each stage's mean ratio (one value for all stages, or one per stage)."""
    warmup_steps: int = WARMUP_STEPS
    """timely: steps without freezing or measuring at the start (tfrun.freeze.online); the CLI's default is 0 under
    goodput with a seed plan solved for goodput (tfrun.freeze.phases Note [goodput start])."""
    monitor_steps: int = 15
    """timely: steps timing every action with nothing frozen."""
    probe_steps: int = 5
    """timely: steps measuring frozen backward times (Note [probe])."""
    replan_threshold: float = 0.10
    """timely: re-plan when a (stage, kind)'s median measured / planned time is off by more (Note [drift])."""
    replan_window: int = 20
    """timely: steps per drift check in the stable phase."""
    noise_replan_z: float = 0.0
    """timely --objective goodput: a learning input (a stage's noise scale or weight share) calls for a new plan
    only when its log moved by more than this many standard errors of the reference's and the current estimate
    (jackknife over the window; tfrun.freeze.controller Note [learning gate]); 0 = the relative rule on the noise
    scales alone (controller.NOISE_REPLAN). The CLI's default under goodput is GATE_Z."""
    learning_model: str = DEFAULT_LEARNING_MODEL
    """timely --objective goodput: the learning model the in-run solves use (tfplan.cost.goodput Note [learning
    models])."""
    objective: str = "makespan"
    """timely: what the in-run solve optimises: makespan (the fastest plan within the caps) or goodput (the
    most predicted learning per second, from the noise scale measured in the monitor phase)."""
    apf_threshold: float = 0.05
    """apf: effective perturbation below which a tensor is stable (tfrun.freeze.baselines)."""
    apf_ema: float = 0.99
    """apf: factor of its moving averages."""
    apf_check_every: int = 10
    """apf: steps between stability checks."""
    apf_stable_share: float = APF_STABLE_SHARE
    """apf: a tensor freezes when this share of its scalars is stable (tfrun.freeze.baselines Note [apf share])."""
    autofreeze_percentile: float = 50.0
    """autofreeze: percentile of the layers' gradient-norm change rates below which a layer freezes."""
    autofreeze_check_every: int = 20
    """autofreeze: steps between checks."""
    noise_every: int = NOISE_EVERY
    """Measure the gradient noise scale every this many steps (0 = off; tfrun.freeze.noise Note [noise scale])."""
    noise_estimator: str = DEFAULT_NOISE_ESTIMATOR
    """How measured steps combine: ema (the published form), median or winsor (tfrun.freeze.noise_estimators)."""
    noise_measure: str = DEFAULT_NOISE_MEASURE
    """The estimator's small batch: microbatch (one replica's micro-batch) or sequence (per-sequence gradient
    norms; tfrun.freeze.noise Note [noise measure])."""
    noise_window: int = 0
    """median, winsor: measured steps in the window (0 = DEFAULT_NOISE_WINDOW, or the run's measured steps if
    fewer)."""
    dp: int = 1
    """Data-parallel replicas of the pipeline (world = dp x pipeline ranks; tfrun.distributed.rank)."""
    init_from: str | None = None
    """Start from this run's latest checkpoint (its weights; a fresh optimizer and data position)."""
    retime: str | None = None
    """A `tfrun retime` spec (JSON): the ranks replay the recorded runs it names instead of training (tfrun.retime
    Note [paired time])."""

    @property
    def num_ranks(self) -> int:
        return len(self.order)

    @property
    def global_batch(self) -> int:
        """Sequences per step over every replica: dp x micro-batch size x M."""
        return self.dp * self.microbatch_size * self.num_microbatches

    def schedule(self):
        """The run's schedule as tfplan's IR (tfplan.schedule.schedules.Schedule)."""
        from tfplan.schedule import schedules
        from tfplan.schedule.actions import parse_action

        return schedules.from_order([[parse_action(a) for a in row] for row in self.order], name=self.schedule_name,
                                    num_microbatches=self.num_microbatches)

    def compute_dtype(self, cuda: bool) -> str:
        """The torch dtype name a forward computes in ("float32" or "bfloat16") on a CUDA device or not."""
        bf16 = self.precision == "bf16" or self.precision == "auto" and cuda
        return "bfloat16" if bf16 else "float32"

    @property
    def selection_seed(self) -> int:
        """The freezer's seed: `freeze_seed`, or `seed` without one."""
        return self.seed if self.freeze_seed is None else self.freeze_seed

    def ratio_of(self, action: str) -> float:
        """The fixed ratio this run freezes `action` at: the plan's (plan), 0 (none), 1 (all); 0 under timely,
        whose ratios change during the run (tfrun.freeze.online)."""
        if self.freeze in PLANNED:
            return self.ratios.get(action, 0.0)
        return 1.0 if self.freeze == "all" else 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, obj: Any) -> TrainConfig:
        """A TrainConfig from its JSON object; every field's type is checked (tfrun.config.jsonfields).

        Raises:
            TfrunError: not an object, an unknown or missing field, or a value of the wrong type.
        """
        from tfrun.config.jsonfields import check_fields

        return cls(**check_fields(obj, cls, "run config"))

    def save(self, path: str | Path) -> None:
        from tfplan.fileio import write_json_atomic

        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        """Read run_config.json. Raises TfrunError (one line) for any unreadable or invalid file."""
        from tfplan.errors import TfplanError
        from tfplan.fileio import read_json

        try:
            obj = read_json(path, "run config")
        except TfplanError as exc:
            raise TfrunError(str(exc)) from None
        try:
            return cls.from_dict(obj)
        except TfrunError as exc:
            raise TfrunError(f"{path}: {exc}") from None

    def check(self) -> None:
        """Validate the settings a user chooses (one clear line per problem: tfrun.config.checks)."""
        from tfrun.config.checks import check

        check(self)

    def lr_at(self) -> LrSchedule:
        """The run's learning-rate schedule (tfrun.optim.lr_schedule)."""
        return LrSchedule(name=self.lr_schedule, total_steps=self.steps, warmup_steps=self.lr_warmup_steps,
                          min_ratio=self.lr_min_ratio, decay_fraction=self.lr_decay_fraction)

    def noise_window_steps(self) -> int:
        """The window estimators' length in measured steps (--noise-window, or its default)."""
        if self.noise_window:
            return self.noise_window
        measured = self._measured_steps()
        return max(1, min(DEFAULT_NOISE_WINDOW, DEFAULT_NOISE_WINDOW if measured is None else measured))

    def _measured_steps(self) -> int | None:
        """Steps the run measures the noise scale on (steps 0, K, 2K, ... below --steps, and under --freeze timely
        --objective goodput every other monitor step, counted apart: at most a few too many); None with it off."""
        if not self.noise_every:
            return None
        forced = -(-self.monitor_steps // 2) if self.freeze == "timely" and self.objective == "goodput" else 0
        return -(-self.steps // self.noise_every) + forced
