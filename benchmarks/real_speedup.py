"""Measured speedup of a TimelyFreeze plan on this machine, against its prediction and plain torch.

1. measure a profile inside the pipeline (tfrun profile: tiny model, 2 gloo ranks, 1F1B, 8 micro-batches);
2. solve at cap 0.9 (tfplan);
3. run `--freeze none` and `--freeze plan` alternately (and plain torch pipelining of the same model and
   schedule: torch's Schedule1F1B with plain PipelineStages) and print median tokens/s, the measured
   speedup, the predicted speedup, the prediction errors and the executor's own overhead.

    python benchmarks/real_speedup.py            # about 8 minutes on 2 CPU cores
    python benchmarks/real_speedup.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL, RANKS, M, MB_SIZE, SEQ = "tiny", 2, 8, 4, 128


def plain_torch_worker(out: str, steps: int) -> None:
    """One rank of plain torch pipelining: Schedule1F1B + PipelineStage, same model, data and loop shape. Writes
    {"step_ms": between the step's barriers, optimizer included, as tfrun's step_time_ms; "wall_ms": from one
    step's end to the next's, as tfrun's wall_ms} per step (also benchmarks/executor_cost.py's bare loop)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from tfrun.data import Batches, encode, load_corpus, split_tokens
    from tfrun.models import MODELS, build_stage, loss_fn

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    module = build_stage(MODELS[MODEL], rank, RANKS, 0)
    stage = PipelineStage(module, rank, RANKS, torch.device("cpu"))
    schedule = Schedule1F1B(stage, M, loss_fn=loss_fn, scale_grads=True)
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-4)
    train, _ = split_tokens(encode(load_corpus(None)))
    batches = Batches(train, global_batch=M * MB_SIZE, seq_len=SEQ, seed=0)
    times, walls, last = [], [], time.perf_counter()
    for step in range(steps):
        x, y = batches.batch_at(step)
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()
        now = time.perf_counter()
        times.append((now - t0) * 1e3)
        walls.append((now - last) * 1e3)
        last = now
    if rank == 0:
        Path(out).write_text(json.dumps({"step_ms": times, "wall_ms": walls}))
    dist.destroy_process_group()


def plain_medians(root: Path, steps: int, warmup: int) -> dict[str, float]:
    """One run of the bare loop: its median step_ms and wall_ms over the steps after `warmup`."""
    out = root / f"plain-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
           __file__, "--plain-worker", str(out), str(steps)]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    times = json.loads(out.read_text())
    return {key: statistics.median(values[warmup:]) for key, values in times.items()}


def run_plain(root: Path, steps: int, warmup: int) -> float:
    return plain_medians(root, steps, warmup)["step_ms"]


def run_tfrun(root: Path, plan: Path, freeze: str, steps: int, tag: str) -> dict:
    out = root / f"{freeze}-{tag}"
    cmd = [sys.executable, "-m", "tfrun", "train", "--plan", str(plan), "--freeze", freeze, "--steps", str(steps),
           "--out", str(out), "--quiet", "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ)]
    subprocess.run(cmd, check=True, capture_output=True)
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pairs", type=int, default=3, help="alternating none/plan/plain rounds")
    parser.add_argument("--plain-worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--cap", type=float, default=0.9)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.plain_worker:
        plain_torch_worker(args.plain_worker[0], int(args.plain_worker[1]))
        return
    steps = 8 if args.quick else 20
    pairs = 1 if args.quick else args.pairs
    root = Path(args.out or tempfile.mkdtemp(prefix="speedup-"))
    from tfplan.fileio import write_json_atomic
    from tfplan.plan import job
    from tfplan.plan import plan as plan_mod
    from tfrun.cli import profiling

    t = time.monotonic()
    prof = profiling.measure(model=MODEL, num_ranks=RANKS, num_microbatches=M, schedule="1f1b",
                             stages_per_rank=1, steps=profiling.DEFAULT_STEPS, microbatch_size=MB_SIZE, seq_len=SEQ,
                             threads=1, seed=0,
                             work_dir=str(root / "profile"))
    write_json_atomic(root / "profile.json", prof.to_dict())
    print(f"profile measured in {time.monotonic() - t:.0f} s: " + "; ".join(
        f"stage {s}: F {c.forward_ms:.1f} B {c.backward_ms:.1f} frozen B {c.backward_frozen_ms:.1f}"
        for s, c in enumerate(prof.stages)) + f"; p2p {prof.p2p_ms:.2f}, overhead {prof.step_overhead_ms:.1f} ms")
    spec = job.JobSpec(profile_path=str(root / "profile.json"), schedule="1f1b", num_microbatches=M)
    plan = job.solve_job(spec, args.cap)
    plan_path = root / "plan.json"
    plan_mod.write(plan, plan_path)
    p = plan.predicted
    print(f"plan at cap {args.cap}: predicted {p.no_freeze_ms:.1f} -> {p.planned_ms:.1f} ms, speedup "
          f"{p.speedup:.3f}x, mean ratio per stage {[round(r, 3) for r in plan.mean_ratio_per_stage()]}")

    none, planned, plain = [], [], []
    for i in range(pairs):
        none.append(run_tfrun(root, plan_path, "none", steps, str(i)))
        planned.append(run_tfrun(root, plan_path, "plan", steps, str(i)))
        plain.append(run_plain(root, steps, warmup=2))
        print(f"round {i}: none {none[-1]['step_time_ms']:.1f} ms, plan {planned[-1]['step_time_ms']:.1f} ms, "
              f"plain torch {plain[-1]:.1f} ms", flush=True)

    med = statistics.median
    none_ms, plan_ms, plain_ms = (med([r["step_time_ms"] for r in none]), med([r["step_time_ms"] for r in planned]),
                                  med(plain))
    print(f"\n{'':34s}{'step ms':>10s}{'tokens/s':>10s}")
    print(f"{'plain torch Schedule1F1B':34s}{plain_ms:10.1f}{M * MB_SIZE * SEQ / plain_ms * 1e3:10.0f}")
    print(f"{'tfrun --freeze none':34s}{none_ms:10.1f}{med([r['tokens_per_s'] for r in none]):10.0f}")
    print(f"{'tfrun --freeze plan (cap ' + str(args.cap) + ')':34s}{plan_ms:10.1f}"
          f"{med([r['tokens_per_s'] for r in planned]):10.0f}")
    print(f"\nmeasured speedup (median step times): {none_ms / plan_ms:.3f}x   predicted: {p.speedup:.3f}x")
    print(f"prediction error, plan run:  {(plan_ms - p.planned_ms) / p.planned_ms:+.1%} "
          f"(measured {plan_ms:.1f} ms vs predicted {p.planned_ms:.1f} ms)")
    print(f"prediction error, none run:  {(none_ms - p.no_freeze_ms) / p.no_freeze_ms:+.1%} "
          f"(measured {none_ms:.1f} ms vs predicted {p.no_freeze_ms:.1f} ms)")
    print(f"executor overhead with freezing off vs plain torch: {(none_ms - plain_ms) / plain_ms:+.1%}")
    print(f"final train loss: none {med([r['final_train_loss'] for r in none]):.4f}, "
          f"plan {med([r['final_train_loss'] for r in planned]):.4f}")


if __name__ == "__main__":
    main()
