"""The training loop of one rank: build its stages, run the planned schedule, measure, checkpoint, report.

The loop owns the data, optimizer, metrics and checkpoints; everything about pipelining (stages, schedule
runtime, per-action freezing and timing) comes from tfrun.distributed.runtime. Run through `tfrun train`, which
launches the ranks (or joins an external torchrun).

Note [non-finite steps]: before its optimizer step, every step's loss and gradient norm are checked on every
rank alike (the one all-reduce of Note [global clipping] in tfrun.optim.clipping). A step that is not finite
never reaches the optimizer, so no weight or optimizer state ever holds a NaN, and a checkpoint refuses one
anyway (tfrun.records.checkpoint). Under --on-nonfinite stop (the default) its row is logged (loss and
grad_norm null, `nonfinite` saying what) and every rank raises NonFiniteStep: the run exits 1 with one line
naming the step, the stage and what was not finite, the last good checkpoint stays, and --resume (with a
saner setting) continues from it. Under skip the step's gradients are dropped (the row says `skipped`: true)
and the run goes on; --max-skipped-steps in a row end it as stop does. The count is in the checkpoint.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tfrun.config.train_config import TrainConfig
from tfrun.data import IGNORE, Batches, MaskedTokens, eval_batches, rank_tokens, split_tokens
from tfrun.distributed.rank import Rank, build_rank, replica_rows
from tfrun.distributed.runtime import StepState, evaluate_forward
from tfrun.distributed.signals import StepControl, StopRequest
from tfrun.errors import TfrunError
from tfrun.freeze import baselines
from tfrun.freeze.noise import NoiseMeter, noise_scale
from tfrun.freeze.online import OnlinePlanner
from tfrun.measure import profile as measure
from tfrun.measure.timing import gather_records
from tfrun.measure.wallclock import WallClock
from tfrun.models import stage_numel
from tfrun.optim.clipping import StepNorm, clip_, step_norm
from tfrun.optim.optimizer import set_lr
from tfrun.records import checkpoint, frozen_sets, summarize
from tfrun.records.provenance import run_identity
from tfrun.records.tensorboard import TensorBoardLog

log = logging.getLogger(__name__)


class NonFiniteStep(TfrunError):
    """A step whose loss or gradient norm was not finite ended the run (Note [non-finite steps])."""


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def run(config: TrainConfig, fault_hook=None, stop: StopRequest | None = None) -> dict | None:
    """Train on this rank; returns the summary on rank 0 (None elsewhere, and when `stop` ended the run early:
    tfrun.distributed.signals Note [graceful stop]). The process group is set up."""
    rank = dist.get_rank()
    torch.set_num_threads(config.threads)
    device = pick_device()
    r = build_rank(config, device, signal=baselines.signal_factory(config))
    modules, freezer, timer, state, runtime, optimizer = r.modules, r.freezer, r.timer, r.state, r.runtime, r.optimizer
    local = r.local

    tokens = rank_tokens(config.data_path, token_cache=config.token_cache, token_dtype=config.token_dtype)
    train_tokens, val_tokens = split_tokens(tokens)
    batches = Batches(train_tokens, global_batch=config.global_batch, seq_len=config.seq_len, seed=config.seed)
    m = config.num_microbatches
    masked = isinstance(tokens, MaskedTokens)  # chat data: the loss counts the answers only (tfrun.data.chat)
    evals = [(replica_rows(x, m, r.dp, r.dp_rank), replica_rows(y, m, r.dp, r.dp_rank), _counted(y, m, r.dp, masked))
             for x, y in eval_batches(val_tokens, batch_size=config.global_batch, seq_len=config.seq_len,
                                      num_batches=config.eval_batches)]
    out = Path(config.out_dir)
    has_first, has_last = 0 in local, config.num_stages - 1 in local
    noise = r.noise
    online = OnlinePlanner(config, freezer, timer, out, _stage_numel(config), noise) if config.freeze == "timely" \
        else None
    metrics: list[dict] = []
    start = 0
    loop = {"skipped_in_a_row": 0}  # Note [non-finite steps]; in the checkpoint
    if config.resume:
        start, metrics = checkpoint.load(out, r.pp_rank, modules, optimizer, batches, freezer, online, noise=noise,
                                         step=config.resume_step, loop=loop, tie=r.tie)
    elif config.init_from is not None:
        checkpoint.load_weights(Path(config.init_from), r.pp_rank, modules, config.num_ranks, tie=r.tie)
    if online is not None and rank == 0:
        print(online.describe(), flush=True)

    def evaluate() -> tuple[float | None, list[float]]:
        """The eval loss (mean over the eval set) and every replica's per-micro-batch eval losses (Note [eval
        losses])."""
        state.freezing, timer.enabled, state.evaluating = False, False, True
        mine: list[float] = []
        with torch.no_grad():
            for x, y, counted in evals:
                state.loss_tokens = counted
                losses: list = []
                evaluate_forward(runtime, *((x.to(device),) if has_first else ()),
                                 **({"target": y.to(device), "losses": losses} if has_last else {}))
                mine += [float(v.item()) for v in losses]
        state.freezing, state.evaluating = config.freeze != "none", False
        each = _eval_losses(mine, has_last, device, r.dp, r.dp_rank, len(evals) * config.num_microbatches)
        value = math.fsum(each) / len(each)
        return (value if math.isfinite(value) else None), each  # (JSON has no NaN: the next step's check stops it)

    progress = _Progress(rank == 0 and not config.quiet, config.steps, start)
    control = StepControl(config, stop, device)
    log_file = measure.MetricsLog(out, metrics) if rank == 0 else None
    names = _gather_names(r, config.num_stages)  # (collective: every rank)
    sets_file = frozen_sets.FrozenSetsLog(out, names, start) if rank == 0 else None
    index = {s: {c.name: i for i, c in enumerate(cands)} for s, cands in freezer.stage_candidates.items()}
    board = TensorBoardLog(out) if rank == 0 and config.tensorboard else None
    clock = WallClock()  # Note [wall time]
    step_tokens = config.global_batch * config.seq_len
    schedule = config.lr_at()
    for step in range(start, config.steps):
        if fault_hook is not None:
            fault_hook(step)
        batch = batches.batch_at(step)
        x, y = (replica_rows(t, m, r.dp, r.dp_rank) for t in batch)
        state.begin(step)
        state.loss_tokens = _counted(batch[1], m, r.dp, masked)
        noise.begin_step(step, force=online is not None and online.measures_noise(step))
        events = online.before_step(step) if online is not None else []
        losses: list = []
        dist.barrier()
        timer.enabled = step >= (config.timing_warmup_steps if online else max(config.ramp_steps,
                                                                               config.timing_warmup_steps)) \
            and (config.time_noise_steps or not noise.measured_this_step)
        timer.begin_step(step)
        t0 = time.perf_counter()
        runtime.step(*((x.to(device),) if has_first else ()),
                     **({"target": y.to(device), "losses": losses} if has_last else {}))
        lr = 0.0 if config.fixed_weights else schedule.lr(config.lr, step)
        losses_finite = all(math.isfinite(v.item()) for v in losses) if has_last else None
        check = timer.span("optimizer", optimizer_step, r, config, step, noise, lr, losses_finite)
        dist.barrier()
        step_ms = (time.perf_counter() - t0) * 1e3
        timer.end_step()
        freezer.end_step(step, state.frozen_counts)
        r.record_frozen(step)
        loss = _from_last_stage(sum(v.item() for v in losses) / config.num_microbatches if has_last else 0.0,
                                has_last, device, r.dp)
        shares, frozen = _gather_shares(r, config.num_stages, config.num_microbatches, index)
        if sets_file is not None:
            sets_file.append(step, frozen, config.num_microbatches)
        row = {"step": step, "time": time.time(), "loss": loss if math.isfinite(loss) else None,
               "step_time_ms": step_ms, "tokens": step_tokens, "tokens_per_s": step_tokens / (step_ms / 1e3),
               "freeze_ratio": shares, "timed": timer.enabled, "lr": lr,
               "grad_norm": check.norm if math.isfinite(check.norm) else None}
        failure = _nonfinite(check, step, config, loop, row)
        if noise.measured_this_step:
            row |= _gather_noise(noise, config.num_stages)
        last = step == config.steps - 1
        if (config.eval_every and (step + 1) % config.eval_every == 0) or last:
            (row["eval_loss"], each), row["eval_ms"] = clock.excluded(evaluate)
            row["eval_microbatch_losses"] = [round(v, 7) if math.isfinite(v) else None for v in each]
        after: list[dict] = []
        if online is not None:
            row["phase"] = online.phase(step)
            after = online.after_step(step, metrics, state.shares)
        row["wall_ms"] = clock.close()
        new_rows = [*events, row, *after]
        metrics += new_rows
        if log_file is not None:
            log_file.append(new_rows)
        if board is not None:
            board.append(new_rows)
        progress.update(row)
        if failure is not None:
            progress.close()
            if board is not None:
                board.close()
            raise NonFiniteStep(failure)
        if control.after_step(step, last):
            checkpoint.save(out, r.pp_rank, step + 1, modules, optimizer, batches, freezer, metrics, online,
                            noise=noise, run=run_identity(config), keep=config.keep_checkpoints, dp=config.dp,
                            loop=loop, tie=r.tie)
        if control.stopping:
            break
    progress.close()
    if board is not None:
        board.close()
    if control.stopping:
        control.report(step + 1)
        return None

    records, spans = gather_records(timer.records), gather_records(timer.spans)
    stats = _gather_stats(r)
    tensor_noise = _gather_tensor_noise(r)
    agree = r.replicas_agree()
    tied = _tied_copies_agree(r)
    if rank != 0:
        return None
    summary = summarize.summarize(config, metrics, records, stats, online.record() if online is not None else None)
    if config.dp > 1:
        summary["replicas_froze_alike"] = agree
    if tied is not None:
        summary["tied_copies_agree"] = tied
    summary |= summarize.caveats(config, summary)
    (out / "summary.json").parent.mkdir(parents=True, exist_ok=True)
    measure.write_outputs(out, config, summary, records, stats, spans, online.profile() if online else None)
    if noise.measured:
        measure.write_noise_tensors(out, config, tensor_noise)
    return summary


def _tied_copies_agree(r: Rank) -> bool | None:
    """A tied model split over stages: whether its two copies ended bit-identical on every replica, on every rank
    (None for other models). Collective."""
    if r.tie is None:
        return None
    flag = torch.tensor([float(r.tie.agree())], dtype=torch.float64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return flag.item() == 1.0


def _stage_numel(config: TrainConfig) -> dict[int, int]:
    """Parameter elements of every stage (shapes only: meta tensors)."""
    return stage_numel(config.model, config.num_stages)


def _gather_stats(r: Rank) -> list[dict] | None:
    """Every pipeline rank's per-tensor update statistics on rank 0 (freeze_stats.json rows), None elsewhere;
    replicas agree, so replica 0's."""
    freezer = r.freezer
    signal = freezer.signal
    rows = [{"stage": s, "name": c.name, "cost": c.cost, "numel": c.numel, **freezer.stats[s].row(i),
             **(signal.row(s, c.name) if signal is not None and hasattr(signal, "row") else {})}
            for s, cands in sorted(freezer.stage_candidates.items()) for i, c in enumerate(cands)] \
        if r.dp_rank == 0 else []
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(rows, parts, dst=0)
    return None if parts is None else [row for part in parts for row in part]


def _counted(targets: torch.Tensor, m: int, dp: int, masked: bool) -> float | None:
    """StepState.loss_tokens of a global batch's targets: its counted targets over its micro-batches and replicas
    (at least one target's worth, for a window without an answer); None for data where every target counts."""
    return max(1, int((targets != IGNORE).sum())) / (m * dp) if masked else None


# Note [eval losses]: an evaluation records, beside its mean, the loss of every eval micro-batch of every
# replica (replica-major, then batch, then micro-batch): the eval set is fixed, so two runs' losses pair up
# micro-batch by micro-batch, and the spread of their differences is the eval set's own sampling error on a
# comparison (tfrun.records.efficiency). Every micro-batch holds as many sequences, so the mean of the list is
# the eval loss.
def _eval_losses(mine: list[float], has_last: bool, device: torch.device, dp: int, dp_rank: int,
                 per_replica: int) -> list[float]:
    """Every replica's per-micro-batch eval losses on every rank (Note [eval losses]); `mine`: this rank's
    (empty off the last stage). Collective."""
    t = torch.zeros(dp * per_replica, dtype=torch.float64, device=device)
    if has_last:
        assert len(mine) == per_replica, (len(mine), per_replica)
        t[dp_rank * per_replica:(dp_rank + 1) * per_replica] = torch.tensor(mine, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def _from_last_stage(value: float, has_last: bool, device: torch.device, dp: int = 1) -> float:
    """A float computed on the last stage's ranks (one per replica: their mean) on every rank (float64)."""
    t = torch.tensor([value if has_last else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dp


def _gather_noise(noise: NoiseMeter, num_stages: int) -> dict:
    """A measured step's metrics fields, every stage's on rank 0: `noise_scale_tokens` (smoothed, per stage;
    null while |G|^2 is not positive), `grad_sq` (smoothed |G|^2 per stage), `update_norm` (per stage, the adam
    learning model's weight: tfrun.freeze.noise.NoiseMeter.update_norms), and `noise_skipped`, the stages this
    step left out (tfrun.freeze.noise), when there are any. Collective."""
    both, skipped = noise.gathered()
    updates = noise.gathered_update_norms()
    return {"noise_scale_tokens": [noise_scale(*both[s]) if s in both else None for s in range(num_stages)],
            "grad_sq": [both[s][0] if s in both else None for s in range(num_stages)],
            "update_norm": [updates.get(s) for s in range(num_stages)],
            **({"noise_skipped": skipped} if skipped else {})}


def _gather_tensor_noise(r: Rank) -> list[dict] | None:
    """Every stage's per-tensor noise estimates on rank 0 (noise_tensors.json), None elsewhere; replica 0's."""
    rows = [{"stage": s, "name": name, "grad_sq": gsq, "trace": trace}
            for s in r.local for name, (gsq, trace) in r.noise.tensor_estimates(s).items()] if r.dp_rank == 0 else []
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(rows, parts, dst=0)
    return None if parts is None else [row for part in parts for row in part]


def _gather_shares(r: Rank, num_stages: int, m: int, index: dict[int, dict[str, int]]
                   ) -> tuple[list[float], dict[tuple[int, int], list[int]]]:
    """Realised mean frozen share per stage this step, for metrics, and every action's frozen tensors (indices
    into its stage's candidates, `index`: a few bytes where names would be kilobytes), for frozen_sets.jsonl
    (every pipeline rank's; replicas agree): one gather."""
    mine = {key: sorted(index[key[0]][name] for name in names) for key, names in r.state.frozen.items()}
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (dict(r.state.shares), mine) if r.dp_rank == 0 else ({}, {}))
    per_stage = [0.0] * num_stages
    frozen: dict[tuple[int, int], list[int]] = {}
    for shares, sets in parts:
        for (stage, _), share in shares.items():
            per_stage[stage] += share / m
        frozen |= sets
    return per_stage, frozen


def _gather_names(r: Rank, num_stages: int) -> list[list[str]]:
    """Every stage's tensor names, in the freezer's order (frozen_sets.jsonl's header). Collective."""
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, {s: [c.name for c in cands] for s, cands in r.freezer.stage_candidates.items()})
    names = {s: got for part in parts for s, got in part.items()}
    return [names[s] for s in range(num_stages)]


def optimizer_step(r: Rank, config: TrainConfig, step: int, noise: NoiseMeter, lr: float,
                    losses_finite: bool | None) -> StepNorm:
    """The step's tail on this rank (timed as "optimizer"): the gradients averaged over the replicas
    (tfrun.distributed.rank Note [data-parallel reduction]), the noise scale's step gradient (tfrun.freeze.noise),
    --grad-rescale, a tied model's two copies summed (tfrun.distributed.tied), the global gradient norm and the
    step's finiteness (tfrun.optim.clipping Note [global clipping]), and for a finite step --clip-grad-norm, a
    baseline's look at the gradients, the optimizer step at `lr`, the baseline's look at the update; then
    zero_grad. Returns what the norm's all-reduce told every rank."""
    r.reduce_gradients()
    noise.after_reduce(r.modules)
    if config.grad_rescale:
        _rescale(r.modules, r.state, config.num_microbatches)
    r.tie_gradients()
    params = r.stage_params()
    check = step_norm(r.norm_params(), config.num_stages, losses_finite=losses_finite, counts=r.dp_rank == 0,
                      device=next(iter(params.values()))[0].device if params else torch.device("cpu"))
    if check.finite:  # Note [non-finite steps]: nothing non-finite reaches the optimizer
        if config.clip_grad_norm > 0:
            clip_([p for ps in params.values() for p in ps], check.norm, config.clip_grad_norm)
        r.freezer.before_optimizer(step, r.modules, r.state.frozen_counts, config.grad_rescale)
        set_lr(r.optimizer, lr)
        r.optimizer.step()
        r.freezer.after_optimizer(step, r.modules)
    r.optimizer.zero_grad(set_to_none=True)
    return check


def _nonfinite(check: StepNorm, step: int, config: TrainConfig, loop: dict, row: dict) -> str | None:
    """Mark a non-finite step's row (Note [non-finite steps]); returns the line that ends the run, or None."""
    if check.finite:
        loop["skipped_in_a_row"] = 0
        return None
    what = [f"the loss (stage {s})" for s in check.bad_loss_stages]
    bad = check.bad_grad_stages
    if bad:
        what.append(f"the gradient of stage {bad[0]}" if len(bad) == 1
                    else f"the gradients of stages {', '.join(map(str, bad))}")
    if not what:  # every stage's sum was finite but their sum overflowed
        what = [f"the gradient norm ({check.norm})"]
    row["nonfinite"] = " and ".join(what)
    line = f"step {step}: {row['nonfinite']} {'is' if len(what) == 1 and len(bad) < 2 else 'are'} not finite"
    if config.on_nonfinite == "stop":
        return line + " (--on-nonfinite stop; lower --lr or set --clip-grad-norm, or --on-nonfinite skip)"
    row["skipped"] = True
    loop["skipped_in_a_row"] += 1
    if loop["skipped_in_a_row"] >= config.max_skipped_steps:
        return line + f": {loop['skipped_in_a_row']} skipped steps in a row (--max-skipped-steps)"
    return None


def _rescale(modules: dict, state: StepState, m: int) -> None:
    """--grad-rescale: gradient of a parameter = mean over the micro-batches that contributed to it."""
    for s, module in modules.items():
        for name, p in module.named_parameters():
            frozen = state.frozen_counts.get((s, name), 0)
            if p.grad is not None and 0 < frozen < m:
                p.grad.mul_(m / (m - frozen))


class _Progress:
    """Rank 0's rich progress bar with loss and tokens/s; other ranks stay quiet."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self.bar.start()
            self.task = self.bar.add_task("train", total=total, completed=start, info="")

    def update(self, row: dict) -> None:
        if self.bar is not None:
            loss = "skipped" if row.get("skipped") else "-" if row["loss"] is None else f"{row['loss']:.4f}"
            info = f"loss {loss}  {row['tokens_per_s']:.0f} tok/s"
            if row.get("eval_loss") is not None:
                info += f"  eval {row['eval_loss']:.4f}"
            self.bar.update(self.task, advance=1, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
