"""The training loop of one rank: build its stages, run the planned schedule, measure, checkpoint, report.

The loop owns the data, optimizer, metrics and checkpoints; everything about pipelining (stages, schedule
runtime, per-action freezing and timing) comes from tfrun.runtime. Run through `tfrun train`, which
launches the ranks (or joins an external torchrun).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tfplan.actions import FREEZABLE, parse_action
from tfrun import checkpoint, measure
from tfrun.config import TrainConfig
from tfrun.data import Batches, encode, eval_batches, load_corpus, split_tokens
from tfrun.errors import TfrunError
from tfrun.freezing import Freezer, candidates
from tfrun.model import MODELS, build_stage, count_params, loss_fn
from tfrun.online import OnlinePlanner
from tfrun.provenance import run_identity
from tfrun.runtime import StepState, build_schedule, make_stage
from tfrun.signals import StepControl, StopRequest
from tfrun.timing import ActionTimer, gather_records

log = logging.getLogger(__name__)


def planned_ratios(config: TrainConfig, stages: list[int]) -> dict[tuple[int, int], float]:
    """(stage, mb) -> ratio of that micro-batch's freezable action (B or W) on `stages`."""
    out = {}
    for action in (parse_action(a) for row in config.order for a in row):
        if action.stage in stages and action.kind in FREEZABLE:
            ratio = config.ratio_of(str(action))
            if ratio > 0:
                out[(action.stage, action.mb)] = ratio
    return out


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def run(config: TrainConfig, fault_hook=None, stop: StopRequest | None = None) -> dict | None:
    """Train on this rank; returns the summary on rank 0 (None elsewhere, and when `stop` ended the run early:
    tfrun.signals Note [graceful stop]). The process group is set up."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != config.num_ranks:
        raise TfrunError(f"the plan needs {config.num_ranks} ranks but the job has {world}")
    torch.set_num_threads(config.threads)
    device = _device()
    cfg = MODELS[config.model]
    local = [s for s, r in enumerate(config.stage_to_rank) if r == rank]
    modules = {s: build_stage(cfg, s, config.num_stages, config.seed, device=device) for s in local}
    freezer = Freezer(
        {s: candidates(m) for s, m in modules.items()},
        planned_ratios(config, local),
        num_microbatches=config.num_microbatches,
        seed=config.seed,
        redraw_every=config.redraw_every,
        ramp_steps=config.ramp_steps if config.freeze in ("plan", "timely") else 0,
        policy=config.freeze_policy,
        max_stale_steps=config.max_stale_steps,
    )
    timer, state = ActionTimer(rank, device), StepState(freezing=config.freeze != "none")
    stages = [
        make_stage(modules[s], s, config.num_stages, device, group=None, freezer=freezer, timer=timer,
                   state=state, method=config.freeze_method)
        for s in local
    ]
    runtime = build_schedule(config.order, stages, config.num_microbatches, loss_fn, rank, timer)
    params = [p for m in modules.values() for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)

    tokens = encode(load_corpus(config.data_path))
    train_tokens, val_tokens = split_tokens(tokens)
    batches = Batches(train_tokens, global_batch=config.global_batch, seq_len=config.seq_len, seed=config.seed)
    evals = eval_batches(val_tokens, batch_size=config.global_batch, seq_len=config.seq_len,
                         num_batches=config.eval_batches)
    out = Path(config.out_dir)
    has_first, has_last = 0 in local, config.num_stages - 1 in local
    online = OnlinePlanner(config, freezer, timer, out, _stage_numel(config)) if config.freeze == "timely" else None
    metrics: list[dict] = []
    start = 0
    if config.resume:
        start, metrics = checkpoint.load(out, rank, modules, optimizer, batches, freezer, online,
                                         step=config.resume_step)
    if online is not None and rank == 0:
        print(online.describe(), flush=True)

    def evaluate() -> float:
        state.freezing, timer.enabled = False, False
        total = 0.0
        with torch.no_grad():
            for x, y in evals:
                losses: list = []
                runtime.eval(*((x.to(device),) if has_first else ()),
                             **({"target": y.to(device), "losses": losses} if has_last else {}))
                total += float(sum(v.item() for v in losses)) / config.num_microbatches if has_last else 0.0
        state.freezing = config.freeze != "none"
        return _from_last_stage(total / len(evals), has_last, device)

    progress = _Progress(rank == 0 and not config.quiet, config.steps, start)
    control = StepControl(config, stop, device)
    for step in range(start, config.steps):
        if fault_hook is not None:
            fault_hook(step)
        x, y = batches.batch_at(step)
        state.begin(step)
        if online is not None:
            metrics += online.before_step(step)
        losses: list = []
        dist.barrier()
        timer.enabled = step >= (config.timing_warmup_steps if online else max(config.ramp_steps,
                                                                               config.timing_warmup_steps))
        timer.begin_step(step)
        t0 = time.perf_counter()
        runtime.step(*((x.to(device),) if has_first else ()),
                     **({"target": y.to(device), "losses": losses} if has_last else {}))
        timer.span("optimizer", _optimizer_step, optimizer, modules, state, config)
        dist.barrier()
        step_ms = (time.perf_counter() - t0) * 1e3
        timer.end_step()
        freezer.end_step(step, state.frozen_counts)
        loss = _from_last_stage(sum(v.item() for v in losses) / config.num_microbatches if has_last else 0.0,
                                has_last, device)
        shares = _gather_shares(state, config.num_stages, config.num_microbatches)
        row = {"step": step, "time": time.time(), "loss": loss, "step_time_ms": step_ms,
               "tokens_per_s": config.global_batch * config.seq_len / (step_ms / 1e3),
               "freeze_ratio": shares, "timed": timer.enabled}
        last = step == config.steps - 1
        if (config.eval_every and (step + 1) % config.eval_every == 0) or last:
            row["eval_loss"] = evaluate()
        metrics.append(row)
        if online is not None:
            row["phase"] = online.phase(step)
            online.record_shares(step, state.shares)
            metrics += online.after_step(step, metrics)
        if rank == 0:
            measure.write_metrics(out, metrics)
        progress.update(row)
        if control.after_step(step, last):
            checkpoint.save(out, rank, step + 1, modules, optimizer, batches, freezer, metrics, online,
                            run=run_identity(config), keep=config.keep_checkpoints)
        if control.stopping:
            break
    progress.close()
    if control.stopping:
        control.report(step + 1)
        return None

    records, spans = gather_records(timer.records), gather_records(timer.spans)
    stats = _gather_stats(freezer)
    if rank != 0:
        return None
    summary = measure.summarize(config, metrics, records, stats)
    plan_profile = None
    if online is not None:
        summary |= online.summary(metrics)
        summary["predicted_step_ms"] = summary["stable_predicted_step_ms"]
        summary["prediction_error"] = summary["stable_prediction_error"]
        plan_profile = online.profile()
    summary |= measure.caveats(config, summary)
    (out / "summary.json").parent.mkdir(parents=True, exist_ok=True)
    measure.write_outputs(out, config, summary, records, stats, spans, plan_profile)
    return summary


def _stage_numel(config: TrainConfig) -> dict[int, int]:
    """Parameter elements of every stage (shapes only: meta tensors)."""
    cfg = MODELS[config.model]
    return {s: count_params(build_stage(cfg, s, config.num_stages, config.seed, device="meta"))
            for s in range(config.num_stages)}


def _gather_stats(freezer: Freezer) -> list[dict] | None:
    """Every rank's per-tensor update statistics on rank 0 (freeze_stats.json rows), None elsewhere."""
    rows = [{"stage": s, "name": c.name, "cost": c.cost, "numel": c.numel, **freezer.stats[s].row(i)}
            for s, cands in sorted(freezer.stage_candidates.items()) for i, c in enumerate(cands)]
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(rows, parts, dst=0)
    return None if parts is None else [row for part in parts for row in part]


def _from_last_stage(value: float, has_last: bool, device: torch.device) -> float:
    """Broadcast a float computed on the last stage's rank to every rank (float64)."""
    t = torch.tensor([value if has_last else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def _gather_shares(state: StepState, num_stages: int, m: int) -> list[float]:
    """Realised mean frozen share per stage this step (all ranks), for metrics."""
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, dict(state.shares))
    per_stage = [0.0] * num_stages
    for part in parts:
        for (stage, _), share in part.items():
            per_stage[stage] += share / m
    return per_stage


def _optimizer_step(optimizer, modules: dict, state: StepState, config: TrainConfig) -> None:
    """The step's tail on this rank: --grad-rescale, the optimizer step and zero_grad (timed as "optimizer")."""
    if config.grad_rescale:
        _rescale(modules, state, config.num_microbatches)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


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
            info = f"loss {row['loss']:.4f}  {row['tokens_per_s']:.0f} tok/s"
            if "eval_loss" in row:
                info += f"  eval {row['eval_loss']:.4f}"
            self.bar.update(self.task, advance=1, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
