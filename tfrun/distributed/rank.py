"""One place builds a rank: its place in the ("dp", "pp") mesh, its stages, the freezer, the schedule runtime,
the optimizer, and the data-parallel gradient reduction. Training (tfrun.train, and so profiling) and the
tests (tests/pipeline_harness.py) all build ranks here, so the reference tests exercise the production path.

Layout: world = dp x pp ranks; global rank g holds pipeline rank g % pp of replica g // pp (a torch
DeviceMesh of shape (dp, pp), row-major). With dp = 1 everything runs on the default group, as before.

Note [data-parallel reduction]: every replica runs the same plan on its share of each micro-batch and, once
per step, after its pipeline's last action and before the optimizer, its stage gradients are summed over the
"dp" group and divided by dp (one flattened all-reduce per stage). We do not wrap stages in DDP or FSDP:
their hooks fire per backward call, while a pipeline step runs a stage's backward once per micro-batch (torch
has them wait for the last one) and our freezing leaves parameters out of whole micro-batches, or of every
micro-batch of a step, whose gradient must then stay None; DDP's reducer would reduce a zero in their place
(or stall without find_unused_parameters), and zero-bubble schedules bypass its hooks (pytorch#144530).
Freezing decisions are functions of (seed, step, stage, micro-batch) and of state every replica shares, so
every replica leaves out the same parameters, and the reduction covers exactly the gradients that exist.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from tfrun.config.train_config import PLANNED, TrainConfig
from tfrun.distributed.runtime import StepState, backward_microbatch, build_schedule, forward_microbatch, make_stage
from tfrun.distributed.tied import TiedEmbedding
from tfrun.errors import TfrunError
from tfrun.freeze.candidates import candidates
from tfrun.freeze.freezing import Freezer
from tfrun.freeze.noise import NoiseMeter
from tfrun.measure.timing import ActionTimer
from tfrun.models import build, loss_fn, masked_loss, model_config
from tfrun.optim.optimizer import adamw


@dataclass(slots=True)
class Rank:
    """What one process runs."""

    pp_rank: int
    """Pipeline rank (which stages)."""
    dp_rank: int
    """Replica."""
    dp: int
    """Replicas in all."""
    pp_group: object
    """Process group of this replica's pipeline (None: the default group, dp = 1)."""
    dp_group: object
    """Process group of this pipeline rank's replicas (None when dp = 1)."""
    modules: dict[int, nn.Module]
    """Stage index -> its module."""
    freezer: Freezer
    timer: ActionTimer
    state: StepState
    runtime: object
    """torch's _PipelineScheduleRuntime fed with the plan's order."""
    optimizer: torch.optim.Optimizer
    noise: NoiseMeter
    """The gradient noise-scale meter of this rank's stages (tfrun.freeze.noise)."""
    tie: TiedEmbedding | None = None
    """A tied model split over stages: the tie of its two copies (tfrun.distributed.tied); None otherwise."""
    frozen_digest: object = field(default_factory=hashlib.sha256)
    """Running hash of what every step froze on this rank (record_frozen), to prove replicas agree."""

    @property
    def local(self) -> list[int]:
        return sorted(self.modules)

    def record_frozen(self, step: int) -> None:
        """Fold this step's realised frozen sets ((stage, name) -> micro-batches frozen) into the digest."""
        self.frozen_digest.update(repr((step, sorted(self.state.frozen_counts.items()))).encode())

    def replicas_agree(self) -> bool | None:
        """On rank 0: whether every replica of each pipeline rank froze exactly the same sets at every step
        (tfrun.distributed.rank Note [data-parallel reduction]); None elsewhere."""
        mine = (self.pp_rank, self.frozen_digest.hexdigest())
        parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, parts, dst=0)
        if parts is None:
            return None
        by_rank: dict[int, set[str]] = {}
        for pp, digest in parts:
            by_rank.setdefault(pp, set()).add(digest)
        return all(len(d) == 1 for d in by_rank.values())

    def stage_params(self) -> dict[int, list[torch.nn.Parameter]]:
        """This rank's stages -> their trainable parameters (what the optimizer steps)."""
        return {s: [p for p in m.parameters() if p.requires_grad] for s, m in self.modules.items()}

    def norm_params(self) -> dict[int, list[torch.nn.Parameter]]:
        """stage_params as the global gradient norm counts them: a tied parameter once (tfrun.distributed.tied)."""
        params = self.stage_params()
        return self.tie.norm_params(params) if self.tie is not None else params

    def tie_gradients(self) -> None:
        """A tied model's two copies get the sum of their gradients (Note [tied embeddings across stages])."""
        if self.tie is not None:
            self.tie.reduce()

    def reduce_gradients(self) -> None:
        """The step's gradients averaged over the replicas, once (Note [data-parallel reduction])."""
        if self.dp == 1:
            return
        for module in self.modules.values():
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            if not grads:
                continue
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.dp_group)
            flat /= self.dp
            offset = 0
            for g in grads:
                g.copy_(flat[offset: offset + g.numel()].view_as(g))
                offset += g.numel()


def layout(config: TrainConfig) -> tuple[int, int, object, object]:
    """(pp rank, dp rank, pp group, dp group) of this process; the job must have dp x pp ranks."""
    world, pp = dist.get_world_size(), config.num_ranks
    if world != pp * config.dp:
        raise TfrunError(f"the plan needs {pp} pipeline ranks x {config.dp} replicas = {pp * config.dp} ranks but "
                         f"the job has {world}")
    rank = dist.get_rank()
    if config.dp == 1:
        return rank, 0, None, None
    from torch.distributed.device_mesh import init_device_mesh

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    mesh = init_device_mesh(device_type, (config.dp, pp), mesh_dim_names=("dp", "pp"))
    return mesh.get_local_rank("pp"), mesh.get_local_rank("dp"), mesh.get_group("pp"), mesh.get_group("dp")


def build_rank(config: TrainConfig, device: torch.device, *, signal=None, freezer_class: type = Freezer) -> Rank:
    """Build this process's rank for `config` (the process group is set up). `signal`: a baseline's, for the
    freezer (tfrun.freeze.baselines; the training loop passes tfrun.train.baseline_signal); `freezer_class`:
    Freezer or a subclass (tfrun retime's ReplayFreezer)."""
    pp_rank, dp_rank, pp_group, dp_group = layout(config)
    local = [s for s, r in enumerate(config.stage_to_rank) if r == pp_rank]
    modules = {s: build(config.model, s, config.num_stages, config.seed, device=device) for s in local}
    tie = TiedEmbedding(modules, config.num_stages, config.stage_to_rank, pp_rank, dp_rank, config.dp) \
        if model_config(config.model).tie_embeddings and config.num_stages > 1 else None
    stage_candidates = {s: candidates(m) for s, m in modules.items()}
    noise = NoiseMeter(modules, stage_candidates, num_microbatches=config.num_microbatches,
                       microbatch_tokens=config.microbatch_size * config.seq_len, every=config.noise_every,
                       dp=config.dp, dp_group=dp_group, dp_rank=dp_rank, estimator=config.noise_estimator,
                       window=config.noise_window_steps(), measure=config.noise_measure)
    freezer = freezer_class(
        stage_candidates,
        planned_ratios(config, local),
        num_microbatches=config.num_microbatches,
        seed=config.selection_seed,
        redraw_every=config.redraw_every,
        ramp_steps=config.ramp_steps if config.freeze in PLANNED + ("timely",) else 0,
        policy=config.freeze_policy,
        max_stale_steps=config.max_stale_steps,
        signal=signal(stage_candidates) if signal is not None else None,
        hybrid=config.freeze.startswith("timely+"),
        noise=noise,
        batch_tokens=config.global_batch * config.seq_len,
    )
    # Records carry the pipeline rank: replicas time the same actions (tfrun.measure.timing medians over them).
    timer, state = ActionTimer(pp_rank, device, measured=dp_rank == 0), StepState(freezing=config.freeze != "none")
    dtype = config.compute_dtype(device.type == "cuda")
    stages = [
        make_stage(modules[s], s, config.num_stages, device, group=pp_group, freezer=freezer, timer=timer,
                   state=state, method=config.freeze_method,
                   autocast=getattr(torch, dtype) if dtype != "float32" else None)
        for s in local
    ]
    noise.shadow = freezer.shadowed  # Note [shadow gradients] in tfrun.freeze.noise
    for s, stage in zip(local, stages):
        noise.microbatch_of[s] = functools.partial(backward_microbatch, stage)
        if noise.sequences is not None:  # per-sequence values wait for their micro-batch's gradient (noise_perseq)
            noise.sequences.microbatch_of[s] = noise.microbatch_of[s]
            noise.sequences.forward_of[s] = functools.partial(forward_microbatch, stage)
    runtime = build_schedule(config.order, stages, config.num_microbatches, _loss(state, stages), pp_rank, timer)
    params = [p for m in modules.values() for p in m.parameters() if p.requires_grad]
    optimizer = adamw(params, lr=config.lr, weight_decay=config.weight_decay, betas=tuple(config.adam_betas),
                      eps=config.adam_eps)
    return Rank(pp_rank=pp_rank, dp_rank=dp_rank, dp=config.dp, pp_group=pp_group, dp_group=dp_group,
                modules=modules, freezer=freezer, timer=timer, state=state, runtime=runtime, optimizer=optimizer,
                noise=noise, tie=tie)


def planned_ratios(config: TrainConfig, stages: list[int]) -> dict[tuple[int, int], float]:
    """(stage, mb) -> ratio of that micro-batch's freezable action (B or W) on `stages`."""
    from tfplan.schedule.actions import FREEZABLE, parse_action

    out = {}
    for action in (parse_action(a) for row in config.order for a in row):
        if action.stage in stages and action.kind in FREEZABLE:
            ratio = config.ratio_of(str(action))
            if ratio > 0:
                out[(action.stage, action.mb)] = ratio
    return out


def replica_rows(x: torch.Tensor, num_microbatches: int, dp: int, dp_rank: int) -> torch.Tensor:
    """This replica's share of a global batch: micro-batch i of the step is the same sequences whatever the
    data-parallel degree (rows [i G/M, (i+1) G/M) of the G rows), split in dp equal parts, one per replica.

    >>> replica_rows(torch.arange(8), 2, 2, 1).tolist()  # micro-batches [0..3], [4..7]; replica 1's halves
    [2, 3, 6, 7]
    """
    if dp == 1:
        return x
    per_mb = x.shape[0] // num_microbatches
    assert per_mb * num_microbatches == x.shape[0] and per_mb % dp == 0, "batch not divisible"
    part = per_mb // dp
    return x.view(num_microbatches, dp, part, *x.shape[1:])[:, dp_rank].reshape(-1, *x.shape[1:])


def _loss(state: StepState, stages: list):
    """The loss function the last stage's runtime calls after each micro-batch's forward. Test hook:
    TFRUN_FAULT_INF_LOSS=STEP:MB makes micro-batch MB's loss at step STEP infinite (tfrun.train Note [non-finite
    steps]; tests/tfrun/test_recipe.py), as TFRUN_FAULT kills a rank in tfrun.cli.worker. The micro-batch is the
    one whose forward the last stage ran last (torch calls the loss right after it)."""
    def counted(output, target):  # chat data: the mean over the step's counted targets (StepState.loss_tokens)
        tokens = state.loss_tokens
        return loss_fn(output, target) if tokens is None else masked_loss(output, target, tokens)

    spec = os.environ.get("TFRUN_FAULT_INF_LOSS")
    last = next((st for st in stages if st.is_last), None)
    if not spec or last is None:
        return counted
    step, mb = (int(x) for x in spec.split(":"))

    def planted(output, target):
        loss = counted(output, target)
        hit = state.step == step and not state.evaluating and getattr(last, "_fwd_mb", None) == mb
        return loss * float("inf") if hit else loss

    return planted
