"""Does freezing slow the forwards? (issue 20, item 4)

In 16 of 18 paired closed-loop rounds (docs/benchmarks.md) the plan run's forwards were slower than the
unfrozen run's, by 3.7% on average. `tfplan explain`'s forward speed takes the forwards' drift for the
machine's, which is wrong if freezing itself slows them. Two measurements separate the causes:

1. `--micro`: one process, the tiny model's two stages, each micro-batch forward timed plain and as the
   executor runs it when the micro-batch freezes a share r of the stage's tensors (tfrun.distributed.runtime Note
   [freeze methods], `detach`: torch.func.functional_call with the frozen weights detached). The variants are taken
   interleaved in a shuffled order, many times, so the machine's drift hits them alike.
2. `--runs`: whole 2-rank runs, unfrozen (A) and the cap-0.9 plan (B), in the order A B B A A B (so neither
   always runs first); each run's median forward per stage from timings.json.

    python benchmarks/forward_speed.py --micro --repeats 200
    python benchmarks/forward_speed.py --runs --steps 40 --out runs/forward-speed
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "tiny-cpu-2stages.json"


def micro(repeats: int, shares: list[float], seed: int = 0) -> None:
    import torch

    from tfrun.freeze.candidates import candidates
    from tfrun.models import MODELS, build_stage

    torch.set_num_threads(1)
    cfg = MODELS["tiny"]
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (4, 128), generator=gen)
    rng = random.Random(seed)
    print(f"forward of one 4 x 128 micro-batch, tiny model, 1 thread, {repeats} interleaved repeats; median ms "
          "(ratio to plain)")
    for s in range(2):
        stage = build_stage(cfg, s, 2, seed=0)
        params = dict(stage.named_parameters())
        x = tokens if s == 0 else torch.randn(4, 128, cfg.dim, requires_grad=True, generator=gen)
        cands = candidates(stage)
        total = sum(c.cost for c in cands)
        variants = {"plain": None, "detach, nothing frozen": []}
        for r in shares:  # the cheapest prefix of a random order reaching share r of the cost (rotating subsets)
            order = rng.sample(cands, len(cands))
            names, acc = [], 0.0
            for c in order:
                if acc >= r * total - 1e-9:
                    break
                names.append(c.name)
                acc += c.cost
            variants[f"detach, share {r:g} ({len(names)} of {len(cands)} tensors)"] = names

        def forward(names, stage=stage, params=params, x=x):
            if names is None:
                return stage(x)
            return torch.func.functional_call(stage, {n: params[n].detach() for n in names}, (x,))

        times: dict[str, list[float]] = {k: [] for k in variants}
        for rep in range(repeats + 5):
            keys = list(variants)
            rng.shuffle(keys)
            for key in keys:
                t0 = time.perf_counter()
                y = forward(variants[key])
                ms = (time.perf_counter() - t0) * 1e3
                del y
                if rep >= 5:  # warm-up
                    times[key].append(ms)
        plain = statistics.median(times["plain"])
        for key, values in times.items():
            med = statistics.median(values)
            q1, _, q3 = statistics.quantiles(values, n=4)
            print(f"  stage {s}  {key:42s} {med:7.2f} ms  x{med / plain:.3f}  (p25 {q1:.2f}, p75 {q3:.2f})")


def runs(steps: int, out: Path, order: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plan = out / "plan-0.9.json"
    if not plan.exists():
        subprocess.run([sys.executable, "-m", "tfplan", "solve", "-p", str(PROFILE), "-s", "1f1b", "-m", "8", "-c",
                        "0.9", "-o", str(plan), "--json"], check=True, capture_output=True)
    rows = []
    for i, kind in enumerate(order):
        freeze = "none" if kind == "A" else "plan"
        folder = out / f"{i}-{freeze}"
        if not (folder / "timings.json").exists():
            subprocess.run([sys.executable, "-m", "tfrun", "train", "--plan", str(plan), "--freeze", freeze,
                            "--steps", str(steps), "--out", str(folder), "--quiet"], check=True, capture_output=True)
        timings = json.loads((folder / "timings.json").read_text())
        summary = json.loads((folder / "summary.json").read_text())
        by = timings["by_stage_kind_ms"]
        rows.append((i, freeze, by["0F"], by["1F"], summary["step_time_ms"]))
        print(f"  run {i} {freeze:5s}: forward stage 0 {by['0F']:.2f} ms, stage 1 {by['1F']:.2f} ms; step "
              f"{summary['step_time_ms']:.1f} ms", flush=True)
    for s, col in ((0, 2), (1, 3)):
        a = [r[col] for r in rows if r[1] == "none"]
        b = [r[col] for r in rows if r[1] == "plan"]
        print(f"stage {s} forward: unfrozen median {statistics.median(a):.2f} ms {a}, plan median "
              f"{statistics.median(b):.2f} ms {b}: plan / unfrozen x{statistics.median(b) / statistics.median(a):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--micro", action="store_true")
    ap.add_argument("--runs", action="store_true")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--shares", default="0.3,0.6,0.9,1.0")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--order", default="ABBAAB")
    ap.add_argument("--out", default="runs/forward-speed")
    args = ap.parse_args()
    if args.micro:
        micro(args.repeats, [float(x) for x in args.shares.split(",")])
    if args.runs:
        runs(args.steps, Path(args.out), args.order)


if __name__ == "__main__":
    main()
