"""TimelyFreeze in your own pipeline loop: a plain nn.Sequential MLP (not a tfrun model) split over 2 ranks,
stages and a torch ScheduleGPipe built the usual way, and tfrun.library.FreezeHooks wrapped around them.

Run on this machine (gloo, 2 CPU processes; docs/library.md):
    torchrun --nproc-per-node 2 examples/own_pipeline.py selftest              # hooks vs none: same gradients
    torchrun --nproc-per-node 2 examples/own_pipeline.py profile -o mlp.json   # time F, B and frozen B per stage
    tfplan solve -p mlp.json -s gpipe -m 8 -c 0.9 -o mlp-plan.json            # the plan for this loop
    torchrun --nproc-per-node 2 examples/own_pipeline.py train --plan mlp-plan.json --steps 40
    torchrun --nproc-per-node 2 examples/own_pipeline.py train --no-hooks --steps 40   # the loop without us

`train` prints its median step time (rank 0); compare the two with the plan's predicted speedup.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def stage_module(rank: int, width: int, depth: int, classes: int, seed: int) -> nn.Sequential:
    """This rank's half of an MLP of 2 * depth hidden blocks; the last stage ends in a classifier head."""
    torch.manual_seed(seed + rank)  # each rank initialises its own half, reproducibly
    blocks: list[nn.Module] = []
    for _ in range(depth):
        blocks += [nn.Linear(width, width), nn.GELU()]
    if rank == 1:
        blocks += [nn.LayerNorm(width), nn.Linear(width, classes)]
    return nn.Sequential(*blocks)


def batch(step: int, size: int, width: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic classification data: inputs (size, width), labels from a fixed random projection."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, width, generator=g)
    w = torch.randn(width, classes, generator=torch.Generator().manual_seed(7))
    return x, (x @ w).argmax(-1)


def build(args, rank: int, hooks: str | None):
    """(stage, schedule, optimizer, hooks) for this rank: everything the usual way, hooks optional."""
    from tfrun.library import FreezeHooks

    module = stage_module(rank, args.width, args.depth, args.classes, args.seed)
    stage = PipelineStage(module, rank, 2, torch.device("cpu"))
    fh = None
    if hooks == "plan":
        fh = FreezeHooks.from_plan(args.plan, [stage], num_microbatches=args.microbatches,
                                   schedule_class="ScheduleGPipe")
    elif hooks == "none":  # hooks that freeze nothing: timing only
        fh = FreezeHooks([stage], num_microbatches=args.microbatches)
    loss_fn = fh.timed_loss(F.cross_entropy) if fh is not None else F.cross_entropy
    schedule = ScheduleGPipe(stage, args.microbatches, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    return module, schedule, optimizer, fh


def one_step(args, rank: int, schedule, step: int) -> None:
    x, y = batch(step, args.microbatches * args.microbatch_size, args.width, args.classes)
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y)


def run_steps(args, rank: int, built, steps: range) -> list[float]:
    """Train `steps`; returns each step's wall time in ms (schedule and optimizer, between barriers)."""
    module, schedule, optimizer, hooks = built
    times = []
    for step in steps:
        dist.barrier()
        t0 = time.perf_counter()
        if hooks is not None:
            with hooks.step(step):
                one_step(args, rank, schedule, step)
        else:
            one_step(args, rank, schedule, step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def grads_after_one_step(args, rank: int, hooks: str | None) -> dict[str, torch.Tensor | None]:
    module, schedule, _, fh = build(args, rank, hooks)
    if fh is not None:
        with fh.step(0):
            one_step(args, rank, schedule, 0)
    else:
        one_step(args, rank, schedule, 0)
    return {n: None if p.grad is None else p.grad.clone() for n, p in module.named_parameters()}


def selftest(args, rank: int) -> bool:
    """Same gradients with and without hooks when nothing is frozen; with everything on stage 1 frozen, its
    gradients are None and stage 0's are unchanged (its input gradients still flow)."""
    plain = grads_after_one_step(args, rank, None)
    hooked = grads_after_one_step(args, rank, "none")
    equal = all(torch.equal(plain[n], hooked[n]) for n in plain)
    from tfrun.library import FreezeHooks

    module = stage_module(rank, args.width, args.depth, args.classes, args.seed)
    stage = PipelineStage(module, rank, 2, torch.device("cpu"))
    FreezeHooks([stage], num_microbatches=args.microbatches,
                ratios={(1, mb): 1.0 for mb in range(args.microbatches)})
    one_step(args, rank, ScheduleGPipe(stage, args.microbatches, loss_fn=F.cross_entropy), 0)
    grads = {n: p.grad for n, p in module.named_parameters()}
    frozen_ok = all(g is None for g in grads.values()) if rank == 1 else \
        all(torch.equal(grads[n], plain[n]) for n in plain)
    # one write per report: two ranks share torchrun's stdout, and print() writes the newline apart
    sys.stdout.write(json.dumps({"rank": rank, "gradients_equal_without_hooks": equal, "plan_applied": frozen_ok})
                     + "\n")
    sys.stdout.flush()
    return equal and frozen_ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("selftest", "profile", "train"))
    parser.add_argument("--plan", help="train: a `tfplan solve` plan for GPipe on 2 ranks")
    parser.add_argument("--no-hooks", action="store_true", help="train: the plain loop")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    parser.add_argument("-o", "--output", help="profile: the profile JSON; train: a summary JSON")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4, help="hidden blocks per stage")
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--microbatch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    assert dist.get_world_size() == 2, "run with torchrun --nproc-per-node 2"
    ok = True
    try:
        if args.mode == "selftest":
            ok = selftest(args, rank)
        elif args.mode == "profile":
            from tfplan.fileio import write_json_atomic
            from tfrun.library import measured_profile

            built = build(args, rank, "none")
            hooks, n, w = built[3], args.steps, args.warmup
            unfrozen = run_steps(args, rank, built, range(n))
            hooks.set_ratios({(s, mb): 1.0 for s in range(2) for mb in range(args.microbatches)}, n)
            run_steps(args, rank, built, range(n, 2 * n))
            prof = measured_profile(hooks, unfrozen_steps=range(w, n), frozen_steps=range(n + w, 2 * n),
                                    step_ms=dict(enumerate(unfrozen)), schedule="gpipe",
                                    name=f"mlp-{args.width}x{args.depth}", source={
                                        "model": "examples/own_pipeline.py MLP", "width": args.width,
                                        "depth": args.depth, "microbatch_size": args.microbatch_size})
            if rank == 0:
                write_json_atomic(args.output or "mlp-profile.json", prof.to_dict())
                print(f"profile written to {args.output or 'mlp-profile.json'}")
        else:
            built = build(args, rank, None if args.no_hooks else ("plan" if args.plan else "none"))
            times = run_steps(args, rank, built, range(args.steps))[args.warmup:]
            if rank == 0:
                summary = {"hooks": not args.no_hooks, "plan": args.plan, "steps": args.steps,
                           "median_step_ms": statistics.median(times), "step_ms": times}
                print(f"median step {summary['median_step_ms']:.1f} ms over {len(times)} steps "
                      f"({'no hooks' if args.no_hooks else args.plan or 'hooks, nothing frozen'})", flush=True)
                if args.output:
                    with open(args.output, "w") as f:
                        json.dump(summary, f)
    finally:
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
