"""The executor's own cost (issue 37): `tfrun train --freeze none` against the bare torch.distributed.pipelining
loop a user would write instead (the same model, 1F1B schedule, micro-batches, data and AdamW; no hooks, timers,
records or checks: benchmarks/real_speedup.py's plain worker), alternating, median of three; and the cost of the
global gradient norm and clipping (tfrun.optim.clipping: one all-reduce a step), measured on its own on 2 ranks
and end to end (--clip-grad-norm 1.0 against off, alternating).

    python benchmarks/executor_cost.py              # about 10 minutes on 2 CPU cores (tiny model, 8 x 4 x 128)
    python benchmarks/executor_cost.py --quick

Step time: between the barriers before and after a step (optimizer included), as tfrun's step_time_ms. Wall
time per step: from one step's end to the next's (tfrun's wall_ms: everything between steps, evaluation
excluded), where tfrun's metrics, freeze bookkeeping and gathers show.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_speedup import MB_SIZE, MODEL, RANKS, SEQ, M, plain_medians  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 5  # steps left out of each run's medians (first-touch allocations, gloo's first exchanges)


def tfrun_medians(root: Path, plan: Path, steps: int, tag: str, *extra: str) -> dict[str, float]:
    out = root / f"tfrun-{tag}"
    cmd = [sys.executable, "-m", "tfrun", "train", "--plan", str(plan), "--freeze", "none", "--steps", str(steps),
           "--out", str(out), "--quiet", "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ), "--force",
           "--checkpoint-every", "0", "--checkpoint-minutes", "0", *extra]
    subprocess.run(cmd, check=True, capture_output=True)
    rows = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r][WARMUP:]
    return {"step_ms": statistics.median(r["step_time_ms"] for r in rows),
            "wall_ms": statistics.median(r["wall_ms"] for r in rows)}


def norm_worker(out: str, calls: int) -> None:
    """One rank: the tiny model's stages built by tfrun (tfrun.distributed.rank), one real step for real
    gradients, then `calls` timed calls of the norm, its all-reduce and the clipping (tfrun.train's path)."""
    import torch
    import torch.distributed as dist

    from tfplan.schedule import schedules
    from tfrun.config.train_config import TrainConfig
    from tfrun.data import Batches, encode, load_corpus, split_tokens
    from tfrun.distributed.rank import build_rank
    from tfrun.optim.clipping import clip_, step_norm

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    sched = schedules.generate("1f1b", RANKS, M)
    config = TrainConfig(order=[[str(a) for a in row] for row in sched.order], num_stages=RANKS, num_microbatches=M,
                         stage_to_rank=list(sched.stage_to_rank), freeze="none", model=MODEL,
                         microbatch_size=MB_SIZE, seq_len=SEQ)
    r = build_rank(config, torch.device("cpu"))
    x, y = Batches(split_tokens(encode(load_corpus(None)))[0], global_batch=M * MB_SIZE, seq_len=SEQ,
                   seed=0).batch_at(0)
    last = RANKS - 1 in r.local
    r.state.begin(0)
    r.runtime.step(*((x,) if 0 in r.local else ()), **({"target": y, "losses": []} if last else {}))
    params = r.stage_params()
    flat = [p for ps in params.values() for p in ps]
    times = []
    for _ in range(calls):
        dist.barrier()
        t0 = time.perf_counter()
        check = step_norm(params, RANKS, losses_finite=True if last else None, counts=True,
                          device=torch.device("cpu"))
        clip_(flat, check.norm, 1e9)  # the factor is 1: the gradients stay as they are for the next call
        times.append((time.perf_counter() - t0) * 1e3)
    dist.barrier()
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def norm_cost(root: Path, calls: int) -> float:
    out = root / "norm.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}", __file__,
           "--norm-worker", str(out), str(calls)]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return statistics.median(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 15 steps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--norm-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.norm_worker:
        norm_worker(args.norm_worker[0], int(args.norm_worker[1]))
        return
    rounds, steps = (1, 15) if args.quick else (args.rounds, args.steps)
    root = Path(tempfile.mkdtemp(prefix="executor-cost-"))
    plan = root / "plan.json"
    subprocess.run([sys.executable, "-m", "tfplan", "solve", "-p", str(ROOT / "profiles" / "tiny-cpu-2stages.json"),
                    "-s", "1f1b", "-m", str(M), "-c", "0.9", "-o", str(plan), "--json"], check=True,
                   capture_output=True)
    print(f"executor cost: tiny model, {RANKS} gloo ranks, 1F1B, {M} x {MB_SIZE} x {SEQ} tokens, {steps} steps a run "
          f"(first {WARMUP} left out); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    runs = {"bare": [], "tfrun": [], "tfrun+clip": []}
    for i in range(rounds):  # alternating: the machine's drift falls on every method alike
        runs["bare"].append(plain_medians(root, steps, WARMUP))
        runs["tfrun"].append(tfrun_medians(root, plan, steps, f"{i}"))
        runs["tfrun+clip"].append(tfrun_medians(root, plan, steps, f"{i}-clip", "--clip-grad-norm", "1.0"))
        print(f"round {i}: " + ", ".join(f"{k} {v[-1]['step_ms']:.1f} / {v[-1]['wall_ms']:.1f} ms"
                                         for k, v in runs.items()) + " (step / wall)", flush=True)
    med = {k: {key: statistics.median(r[key] for r in v) for key in ("step_ms", "wall_ms")} for k, v in runs.items()}
    print(f"\n{'':28s}{'step ms':>10s}{'wall ms':>10s}   (medians of the rounds' medians; rounds: step ms)")
    for name, value in med.items():
        rounds_text = ", ".join(f"{r['step_ms']:.1f}" for r in runs[name])
        print(f"{name:28s}{value['step_ms']:10.1f}{value['wall_ms']:10.1f}   ({rounds_text})")
    bare, tf = med["bare"], med["tfrun"]
    print(f"\ntfrun --freeze none against the bare loop: step time {tf['step_ms'] / bare['step_ms'] - 1:+.1%}, "
          f"wall time per step {tf['wall_ms'] / bare['wall_ms'] - 1:+.1%}")
    clip = med["tfrun+clip"]
    print(f"--clip-grad-norm 1.0 against off, end to end: step time {clip['step_ms'] / tf['step_ms'] - 1:+.1%}")
    norm_ms = norm_cost(root, 200)
    print(f"the gradient norm, its all-reduce and the clipping, alone: {norm_ms:.3f} ms a step (median of 200 "
          f"calls), {norm_ms / tf['step_ms']:.2%} of tfrun's step")


if __name__ == "__main__":
    main()
