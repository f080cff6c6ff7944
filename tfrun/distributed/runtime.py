"""The one module that touches torch.distributed.pipelining, including its private runtime API.

We run every schedule (GPipe and 1F1B too) as the plan's per-rank action lists on torch's own
`_PipelineScheduleRuntime`, which lowers them with its send/recv passes; no torch code is vendored or patched.
Per-action behaviour goes through a thin `PipelineStage` subclass:
  * timing: `forward_one_chunk`, `backward_one_chunk` (B or I) and `backward_weight_one_chunk` (W) are timed;
    the runtime has already waited for the action's inputs when it calls them, so spans are compute only;
  * freezing: Note [freeze methods].

Note [freeze methods]: never toggle requires_grad per micro-batch (with torch 2.13 pipelining that silently
loses gradients or crashes zero-bubble schedules). Two exact ways, selectable for measurement:
  detach  the micro-batch's forward runs with its frozen parameters replaced by detached tensors
          (torch.func.functional_call), so they are not in that micro-batch's autograd graph at all: the
          backward (B, or I then W) computes no gradient for them, activations needed only for their weight
          gradients are not saved, and on stage 0 a frozen prefix prunes the backward below it entirely;
  grad    the forward is unchanged; the backward asks autograd only for the stage inputs and the unfrozen
          parameters (a full B via autograd.grad, a split I via stage_backward_input with the unfrozen
          weights), which is what the paper's code does.
The decision is keyed by parameter name, never by position.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from tfrun.errors import TfrunError
from tfrun.freeze.freezing import Freezer
from tfrun.measure.timing import ActionTimer

SUPPORTED_TORCH = ((2, 12), (2, 15))  # [lower, upper): private runtime API checked against these versions
DETACH, GRAD = "detach", "grad"


def check_torch() -> None:
    """Refuse an unsupported torch before any rank starts (private API: `_PipelineScheduleRuntime`,
    `_Action`, `_prepare_schedule_with_comms`, `_backward.stage_backward_input`)."""
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    lo, hi = SUPPORTED_TORCH
    if not lo <= version < hi:
        raise TfrunError(
            f"torch {torch.__version__} is not supported: tfrun uses torch.distributed.pipelining's private "
            f"runtime, tested on 2.13 and supported for {lo[0]}.{lo[1]} <= version < {hi[0]}.{hi[1]}"
        )
    try:
        from torch.distributed.pipelining import _backward, schedules

        for obj, name in ((schedules, "_PipelineScheduleRuntime"), (schedules, "_Action"),
                          (_backward, "stage_backward_input"), (_backward, "stage_backward_weight")):
            getattr(obj, name)
        schedules._PipelineScheduleRuntime._prepare_schedule_with_comms  # noqa: B018
    except (ImportError, AttributeError) as exc:
        raise TfrunError(f"torch {torch.__version__} lacks the pipelining runtime API tfrun needs: {exc}") from None


@dataclass(slots=True)
class StepState:
    """Mutable per-step state shared (explicitly) by a rank's stages and its training loop."""

    step: int = 0
    freezing: bool = True
    """False during evaluation and in `--freeze none` runs."""
    evaluating: bool = False
    """True while the training loop evaluates (forwards only)."""
    shares: dict[tuple[int, int], float] = field(default_factory=dict)
    """(stage, mb) -> realised frozen share this step."""
    frozen_counts: dict[tuple[int, str], int] = field(default_factory=dict)
    """(stage, parameter name) -> micro-batches in which it was frozen this step (--grad-rescale, stats)."""
    frozen: dict[tuple[int, int], frozenset[str]] = field(default_factory=dict)
    """(stage, mb) -> the names it froze this step (frozen_sets.jsonl, tfrun retime)."""
    loss_tokens: float | None = None
    """Chat data: the targets the loss counts this step (or evaluation batch), over all replicas, per micro-batch
    of one replica (tfrun.models.llama.masked_loss); None: every target counts (the mean per micro-batch)."""

    def begin(self, step: int) -> None:
        self.step = step
        self.shares.clear()
        self.frozen_counts.clear()
        self.frozen.clear()


@dataclass(slots=True)
class _Hooks:
    """What a hooked stage needs to time and freeze its actions."""

    freezer: Freezer
    timer: ActionTimer
    state: StepState
    method: str
    params: dict[str, torch.nn.Parameter]
    autocast: torch.dtype | None
    slow: tuple | None
    base: type
    """The stage's own class, whose methods the overrides call."""


class _TimedFreezingStage:
    """Overrides of PipelineStage's per-chunk methods: timing and freezing (Note [freeze methods]) and autocast
    (Note [autocast]). `install_hooks` copies them into a subclass of the stage's own class (PipelineStage, or
    any subclass a user's training loop builds); they reach that class's methods through `_tf.base`, not
    super(), because they are defined here."""

    _tf: _Hooks

    def _frozen(self, mb: int) -> frozenset[str]:
        tf = self._tf
        if not (tf.state.freezing and self.has_backward):
            return frozenset()
        sel = tf.freezer.selection(tf.state.step, self.stage_index, mb)
        if (self.stage_index, mb) not in tf.state.shares:
            tf.state.shares[(self.stage_index, mb)] = sel.share
            tf.state.frozen[(self.stage_index, mb)] = sel.names
            # what the update learns from: a measured step's shadows count as frozen (tfrun.freeze.noise Note
            # [shadow gradients]), what the action computes (shares, frozen) does not
            for name in sel.names | tf.freezer.shadowed(tf.state.step, self.stage_index, mb):
                key = (self.stage_index, name)
                tf.state.frozen_counts[key] = tf.state.frozen_counts.get(key, 0) + 1
        return sel.names

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        self._fwd_mb = fwd_chunk_id
        self._in_forward = True  # (torch's metadata inference runs the module outside any micro-batch)
        try:
            return self._tf.timer.time(f"{self.stage_index}F{fwd_chunk_id}", self._forward, fwd_chunk_id, args,
                                       kwargs, save_forward_output)
        finally:
            self._in_forward = False

    def _forward(self, *args):
        slow, step = self._tf.slow, self._tf.state.step
        if slow is not None and self.stage_index == slow[0] and step >= slow[1]:
            time.sleep(slow[2] / 1e3)  # test hook: a stage that became slower mid-run (TFRUN_SLOW)
        return self._tf.base.forward_one_chunk(self, *args)

    def forward_maybe_with_nosync(self, *args, **kwargs):
        tf = self._tf
        frozen = self._frozen(self._fwd_mb)
        with torch.autocast(self.device.type, dtype=tf.autocast, enabled=tf.autocast is not None):
            if tf.method != DETACH or not frozen:
                return tf.base.forward_maybe_with_nosync(self, *args, **kwargs)
            detached = {name: tf.params[name].detach() for name in frozen}
            return torch.func.functional_call(self.submod, detached, args, kwargs)

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        self._bwd_mb = bwd_chunk_id
        kind = "B" if full_backward else "I"
        return self._tf.timer.time(f"{self.stage_index}{kind}{bwd_chunk_id}", self._tf.base.backward_one_chunk, self,
                                   bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward)

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        self._bwd_mb = bwd_chunk_id
        return self._tf.timer.time(f"{self.stage_index}W{bwd_chunk_id}", self._tf.base.backward_weight_one_chunk,
                                   self, bwd_chunk_id, last_backward=last_backward)

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
        from torch.distributed.pipelining._backward import stage_backward_input

        tf = self._tf
        frozen = self._frozen(self._bwd_mb) if tf.method == GRAD else frozenset()
        if not frozen or backward_type == "weight":
            return tf.base.backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward)
        unfrozen = [p for name, p in tf.params.items() if name not in frozen and p.requires_grad]
        if backward_type == "input":
            return stage_backward_input(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                                        bwd_kwargs["input_values"], iter(unfrozen))
        return _restricted_backward(bwd_kwargs, unfrozen), None


@functools.cache
def _hooked_class(cls: type) -> type:
    methods = {k: v for k, v in vars(_TimedFreezingStage).items() if callable(v)}
    return type(f"Timely{cls.__name__}", (cls,), methods)


# Note [autocast]: with a compute dtype (bf16 on CUDA by default, --precision), a stage's forward runs under
# torch.autocast: matmuls in bf16, parameters, their gradients and the optimizer state stay float32 (the master
# weights), and autograd runs the backward in the forward's dtypes. The residual stream stays float32 (a bf16
# block output is added to it), so what crosses between stages, and the logits the loss reads, are float32.
def install_hooks(stage, *, freezer: Freezer, timer: ActionTimer, state: StepState, method: str = DETACH,
                  autocast: torch.dtype | None = None):
    """Give an existing PipelineStage (or an instance of any subclass) per-action timing, per-(stage,
    micro-batch) freezing (Note [freeze methods]) and autocast (Note [autocast]): its class becomes a subclass
    of its own with these overrides. Returns the stage."""
    assert method in (DETACH, GRAD)
    # Test hook: TFRUN_SLOW=stage:step:ms makes that stage's forward take ms longer from that step on.
    slow = tuple(float(x) if i == 2 else int(x) for i, x in enumerate(os.environ["TFRUN_SLOW"].split(":"))) \
        if os.environ.get("TFRUN_SLOW") else None
    base = type(stage)
    stage.__class__ = _hooked_class(base)
    stage._tf = _Hooks(freezer=freezer, timer=timer, state=state, method=method,
                       params=dict(stage.submod.named_parameters()), autocast=autocast, slow=slow, base=base)
    return stage


def make_stage(module: nn.Module, stage_index: int, num_stages: int, device: torch.device, *, group,
               freezer: Freezer, timer: ActionTimer, state: StepState, method: str = DETACH,
               autocast: torch.dtype | None = None):
    """A PipelineStage of `module` with tfrun's hooks (install_hooks)."""
    from torch.distributed.pipelining import PipelineStage

    return install_hooks(PipelineStage(module, stage_index, num_stages, device, group=group), freezer=freezer,
                         timer=timer, state=state, method=method, autocast=autocast)


def forward_microbatch(stage) -> int | None:
    """The micro-batch whose forward a hooked `stage` runs now; None outside one (torch's first-step metadata
    inference runs the module, and a backward, on placeholder tensors). tfrun.freeze.noise_perseq picks its rows
    by it."""
    return getattr(stage, "_fwd_mb", None) if getattr(stage, "_in_forward", False) else None


def backward_microbatch(stage) -> int | None:
    """The micro-batch whose backward (B, I or W) a hooked `stage` runs now, or ran last; None before any
    (tfrun.freeze.noise_perseq keys its per-sequence values by it)."""
    return getattr(stage, "_bwd_mb", None)


def _restricted_backward(bwd_kwargs: dict, params: Sequence[torch.Tensor]) -> tuple:
    """A full backward that computes gradients only for the stage inputs and `params` (accumulated into
    .grad); returns the input gradients like torch's stage_backward."""
    out = bwd_kwargs["stage_output"]
    outputs = list(out) if isinstance(out, (tuple, list)) else [out]
    grads = bwd_kwargs["output_grads"]
    grads = [None] * len(outputs) if grads is None else list(grads)
    pairs = [(o, g) for o, g in zip(outputs, grads) if isinstance(o, torch.Tensor) and o.requires_grad]
    inputs = [v for v in bwd_kwargs["input_values"] if isinstance(v, torch.Tensor) and v.requires_grad]
    targets = inputs + list(params)
    if not pairs or not targets:
        return tuple(None for _ in bwd_kwargs["input_values"])
    result = torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True)
    for p, g in zip(params, result[len(inputs):]):
        if g is not None:
            if p.grad is None:
                p.grad = g
            else:
                p.grad += g
    it = iter(result[: len(inputs)])
    return tuple(next(it) if isinstance(v, torch.Tensor) and v.requires_grad else None
                 for v in bwd_kwargs["input_values"])


def build_schedule(
    order: Sequence[Sequence[str]],
    stages: list,
    num_microbatches: int,
    loss_fn: Callable,
    rank: int,
    timer: ActionTimer | None = None,
):
    """torch's `_PipelineScheduleRuntime` fed with the plan's per-rank order; refuses a lowered schedule
    whose compute actions on this rank differ from the plan's. With a timer, the last stage's loss is timed
    as part of its F action (ActionTimer.extend_last)."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType, _PipelineScheduleRuntime

    if timer is not None:
        plain_loss = loss_fn

        def loss_fn(output, target):
            return timer.extend_last(plain_loss, output, target)

    runtime = _PipelineScheduleRuntime(stages, num_microbatches, loss_fn=loss_fn, scale_grads=True)
    actions = {r: [_Action.from_str(a) for a in row] for r, row in enumerate(order)}
    runtime.pipeline_order = actions
    runtime._prepare_schedule_with_comms(actions)
    # Note [forward-only evaluation]: torch's `eval()` runs the whole training order with has_backward off,
    # and on V placements (ZBV, DualPipeV) its I/B actions still hand input gradients to the stage below on
    # the same rank, which asserts ("can't steal_bwd_input if this stage doesn't have backward"). Evaluation
    # therefore runs the lowered order's forward part alone: F with its sends and receives, in the plan's
    # order (a subsequence of a deadlock-free order whose F actions depend only on F actions is deadlock-free).
    kinds = _ComputationType
    keep = (kinds.FORWARD, kinds.SEND_F, kinds.RECV_F, kinds.UNSHARD, kinds.RESHARD)
    runtime._tfrun_eval_order = {r: [a for a in row if a.computation_type in keep]
                                 for r, row in runtime.pipeline_order_with_comms.items()}
    compute = ("F", "B", "I", "W")
    lowered = [str(a) for a in runtime.pipeline_order_with_comms[rank] if a.computation_type.value in compute]
    if lowered != list(order[rank]):
        raise TfrunError(
            f"rank {rank}: torch's runtime would run {lowered[:6]}... but the plan says {list(order[rank])[:6]}...; "
            "refusing to run a schedule other than the planned one"
        )
    return runtime


def evaluate_forward(runtime, *args, **kwargs) -> None:
    """One forward-only pass of the pipeline (Note [forward-only evaluation]): like `runtime.eval`, on the
    plan's F actions alone; the training order is restored afterwards, whatever happens."""
    train_order = runtime.pipeline_order_with_comms
    runtime.pipeline_order_with_comms = runtime._tfrun_eval_order
    try:
        runtime.eval(*args, **kwargs)
    finally:
        runtime.pipeline_order_with_comms = train_order
