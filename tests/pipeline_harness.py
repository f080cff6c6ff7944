"""Run one pipeline step on several gloo ranks (spawned processes) and compare with a single process.

Used by tests/tfrun/distributed/test_runtime.py. Each case is (schedule name, ranks, stages per rank, micro-batches,
ratios, freeze method, flags...); every rank runs all cases in one process group to pay process start-up once.
Flags: "rescale" (--grad-rescale), "clip" (--clip-grad-norm CLIP through tfrun's own path, against
torch.nn.utils.clip_grad_norm_ on the whole model).
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from tfplan.schedule import schedules
from tfrun.config.train_config import TrainConfig
from tfrun.distributed.rank import build_rank
from tfrun.freeze.candidates import candidates
from tfrun.freeze.freezing import Freezer
from tfrun.models import MODELS, build_stage, loss_fn
from tfrun.optim.clipping import clip_, step_norm
from tfrun.train import _rescale

MODEL, SEED, MB_SIZE, SEQ = "tiny", 3, 2, 16
CLIP = 0.5  # the tiny model's gradient norm is 4.4-6.9 at its initialisation in these cases: this clips


def batch(num_microbatches: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, 256, (num_microbatches * MB_SIZE, SEQ + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def case_ratios(sched: schedules.Schedule, pattern: str) -> dict[tuple[int, int], float]:
    """(stage, mb) -> ratio: none, all, or a deterministic mix (0, 0.3, 0.6, 1.0 cycling)."""
    if pattern == "none":
        return {}
    levels = [0.0, 0.3, 0.6, 1.0]
    return {
        (s, m): 1.0 if pattern == "all" else levels[(s + m) % 4]
        for s in range(sched.num_stages) for m in range(sched.num_microbatches)
    }


def case_config(sched: schedules.Schedule, pattern: str, method: str) -> TrainConfig:
    """The run configuration of a case, its ratios keyed by the freezable action of each (stage, mb)."""
    action = {(a.stage, a.mb): str(a) for row in sched.order for a in row if a.kind in "BW"}
    ratios = {action[k]: r for k, r in case_ratios(sched, pattern).items() if r > 0}
    return TrainConfig(order=[[str(a) for a in row] for row in sched.order], num_stages=sched.num_stages,
                       num_microbatches=sched.num_microbatches, stage_to_rank=list(sched.stage_to_rank),
                       ratios=ratios, freeze="none" if pattern == "none" else "plan", freeze_method=method,
                       model=MODEL, seed=SEED, microbatch_size=MB_SIZE, seq_len=SEQ)


def worker(rank: int, world: int, port: int, cases: list[tuple], out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for i, (name, p, v, m, pattern, method, *flags) in enumerate(cases):
            rescale = "rescale" in flags
            sched = schedules.generate(name, p, m, v)
            r = build_rank(case_config(sched, pattern, method), torch.device("cpu"))  # the production path
            modules, state, runtime, local = r.modules, r.state, r.runtime, r.local
            x, y = batch(m)
            losses: list = []
            state.begin(0)
            has_first, has_last = 0 in local, sched.num_stages - 1 in local
            runtime.step(*((x,) if has_first else ()), **({"target": y, "losses": losses} if has_last else {}))
            if rescale:
                _rescale(modules, state, m)
            if "clip" in flags:  # the production path: tfrun.train._optimizer_step's norm and clipping
                params = r.stage_params()
                check = step_norm(params, sched.num_stages, losses_finite=True, counts=True,
                                  device=torch.device("cpu"))
                clip_([p_ for ps in params.values() for p_ in ps], check.norm, CLIP)
            grads = {n: p_.grad.clone() if p_.grad is not None else None
                     for mod in modules.values() for n, p_ in mod.named_parameters()}
            torch.save({"grads": grads, "losses": [float(v_.detach()) for v_ in losses], "shares": dict(state.shares)},
                       Path(out_dir) / f"case{i}-rank{rank}.pt")
            dist.barrier()
    except Exception:
        Path(out_dir, f"error-rank{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def reference(name: str, p: int, v: int, m: int, pattern: str, rescale: bool = False,
              clip: bool = False) -> tuple[dict, list[float]]:
    """Single process: per micro-batch loss/M, each parameter's gradient summed over the micro-batches in
    which its stage did not freeze it (the paper's semantics); with `rescale`, times M / (micro-batches that
    contributed) (--grad-rescale); with `clip`, then torch.nn.utils.clip_grad_norm_ to CLIP over the whole
    model. Returns (grads by name, per-mb losses)."""
    sched = schedules.generate(name, p, m, v)
    cfg = MODELS[MODEL]
    full = build_stage(cfg, 0, 1, SEED)
    stage_mods = {s: build_stage(cfg, s, sched.num_stages, SEED, device="meta")
                  for s in range(sched.num_stages)}
    freezer = Freezer({s: candidates(mod) for s, mod in stage_mods.items()}, case_ratios(sched, pattern),
                      num_microbatches=m, seed=SEED)
    owner = {n: s for s, mod in stage_mods.items() for n, _ in mod.named_parameters()}
    x, y = batch(m)
    xs, ys = x.chunk(m), y.chunk(m)
    total = {n: torch.zeros_like(t) for n, t in full.named_parameters()}
    count = {n: 0 for n in total}
    losses = []
    for mb in range(m):
        full.zero_grad(set_to_none=True)
        loss = loss_fn(full(xs[mb]), ys[mb])
        losses.append(float(loss.detach()))
        (loss / m).backward()
        for n, t in full.named_parameters():
            frozen = pattern != "none" and n in freezer.selection(0, owner[n], mb).names
            if not frozen:
                total[n] += t.grad
                count[n] += 1
    if rescale:
        total = {n: g * (m / count[n]) if count[n] else g for n, g in total.items()}
    if clip:
        for n, t in full.named_parameters():
            t.grad = total[n].clone()
        torch.nn.utils.clip_grad_norm_(full.parameters(), CLIP)
        total = {n: t.grad for n, t in full.named_parameters()}
    return total, losses
