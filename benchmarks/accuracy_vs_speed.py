"""The accuracy-vs-speed study (issue 12): pretrain once, fine-tune from the same weights with every method.

1. Pretrain the tiny model on the default corpus (CPython's pydoc topics) without freezing until its eval loss
   has flattened (less than --flat relative improvement over the last 200 steps), cached in OUT/base.
2. Fine-tune from those weights on a second domain (`--data stdlib`: Python source) with every method, same
   seed, data and batch: none; the TimelyFreeze plan (1F1B, 8 micro-batches, solved from the shipped
   measured profile) at cap 0.9 and at lower caps, with and without --grad-rescale; uniform freezing at the
   plan's mean ratio; APF; AutoFreeze; both hybrids.
3. `tfrun compare` over them: tokens/s, speedup, realised ratio, eval loss and gap, training time to reach
   the unfrozen run's final eval loss; the table (JSON and text) and the curves (PNG) in OUT.

    python benchmarks/accuracy_vs_speed.py --out runs/study                  # about 1.5 hours on 2 CPU cores
    python benchmarks/accuracy_vs_speed.py --out runs/study --seeds 0,1,2    # more seeds: spread
    python benchmarks/accuracy_vs_speed.py --out runs/study --methods none,plan-0.9 --steps 60   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "tiny-cpu-2stages.json"
MODEL, M, MB_SIZE, SEQ = "tiny", 8, 4, 128
METHODS = {  # name -> (freeze mode, cap, extra options)
    "none": ("none", 0.9, []),
    "plan-0.9": ("plan", 0.9, []),
    "plan-0.9-rescale": ("plan", 0.9, ["--grad-rescale"]),
    "plan-0.7": ("plan", 0.7, []),
    "plan-0.5": ("plan", 0.5, []),
    "plan-0.5-rescale": ("plan", 0.5, ["--grad-rescale"]),
    "plan-0.3": ("plan", 0.3, []),
    "uniform-0.9": ("uniform", 0.9, []),
    "apf": ("apf", 0.9, []),
    # APF's per-scalar statistic observed without acting on it (a tensor freezes only when every scalar is
    # stable): its trajectory under unfrozen training, from which apf_report reads when each share would freeze
    "apf-observe": ("apf", 0.9, ["--apf-stable-share", "1.0"]),
    "autofreeze": ("autofreeze", 0.9, []),
    "timely+apf-0.9": ("timely+apf", 0.9, []),
    "timely+autofreeze-0.9": ("timely+autofreeze", 0.9, []),
}


def run(cmd: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def train(out: Path, plan: Path, freeze: str, steps: int, seed: int, extra: list[str]) -> dict:
    if not (out / "summary.json").exists():
        run(["tfrun", "train", "--plan", str(plan), "--freeze", freeze, "--steps", str(steps), "--seed", str(seed),
             "--out", str(out), "--quiet", "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ), *extra])
    return json.loads((out / "summary.json").read_text())


def evals(folder: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r and "event" not in r]


def apf_report(folder: Path, shares=(0.1, 0.2, 0.3, 0.5, 0.7, 0.9)) -> str:
    """APF's per-scalar statistic over a run (freeze_stats.json): per check, the smallest, median and largest
    share of stable scalars over the tensors, and for each tensor-level share the first check at which some
    tensor reached it (what --apf-stable-share at that value would have frozen first)."""
    tensors = json.loads((folder / "freeze_stats.json").read_text())["tensors"]
    by_step: dict[int, list[float]] = {}
    for t in tensors:
        for step, share in t.get("apf_stable_share_history", []):
            by_step.setdefault(int(step), []).append(share)
    lines = ["APF per-scalar statistic (share of a tensor's scalars below the threshold), over the tensors:"]
    for step in sorted(by_step)[:: max(1, len(by_step) // 10)] + sorted(by_step)[-1:]:
        v = sorted(by_step[step])
        lines.append(f"  check after step {step + 1:4d}: min {v[0]:.3f}  median {statistics.median(v):.3f}  "
                     f"max {v[-1]:.3f}  ({len(v)} tensors)")
    for share in shares:
        first = next((step for step in sorted(by_step) if max(by_step[step]) >= share), None)
        reached = sum(1 for t in tensors if any(x >= share for _, x in t.get("apf_stable_share_history", [])))
        lines.append(f"  a tensor-level share of {share:.1f}: first reached after step "
                     f"{first + 1 if first is not None else '-'}, by {reached} of {len(tensors)} tensors in the run")
    return "\n".join(lines)


def pretrain(out: Path, plan: Path, flat: float, max_steps: int, chunk: int = 200) -> Path:
    """Train without freezing in chunks (resuming) until the eval loss improved by less than `flat` (relative)
    over the last chunk; the base checkpoint is made once and reused."""
    base = out / "base"
    done = base / "done.json"
    if done.exists():
        return base
    steps = chunk
    while True:
        extra = ["--eval-every", "50", "--checkpoint-every", str(chunk)]
        if (base / "checkpoints" / "latest.json").exists():
            extra += ["--resume", str(base)]
        run(["tfrun", "train", "--plan", str(plan), "--freeze", "none", "--steps", str(steps), "--out", str(base),
             "--quiet", "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ), "--lr", "1e-3", *extra])
        points = evals(base)
        if steps == chunk:
            steps += chunk
            continue
        last, before = points[-1][1], next(loss for step, loss in reversed(points) if step <= steps - chunk - 1)
        gain = (before - last) / before
        print(f"pretraining: {steps} steps, eval loss {last:.4f} ({gain:.2%} better than {chunk} steps before)",
              flush=True)
        if gain < flat or steps >= max_steps:
            done.write_text(json.dumps({"steps": steps, "eval_loss": last, "last_chunk_gain": gain}))
            return base
        steps += chunk


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300, help="fine-tuning steps per method")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--flat", type=float, default=0.01, help="pretraining stops below this gain per 200 steps")
    ap.add_argument("--max-pretrain", type=int, default=3000)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"accuracy vs speed, tiny model, 2 gloo ranks, 1F1B, M = {M}, {MB_SIZE} x {SEQ} tokens; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    plans = {}
    for cap in sorted({c for _, c, _ in METHODS.values()}):
        plans[cap] = out / f"plan-{cap}.json"
        if not plans[cap].exists():
            run(["tfplan", "solve", "-p", str(PROFILE), "-s", "1f1b", "-m", str(M), "-c", str(cap), "-o",
                 str(plans[cap]), "--json"])
    base = pretrain(out, plans[0.9], args.flat, args.max_pretrain)
    for seed in (int(s) for s in args.seeds.split(",")):
        folders = []
        for name in args.methods.split(","):
            freeze, cap, extra = METHODS[name]
            folder = out / f"seed{seed}" / name
            train(folder, plans[cap], freeze, args.steps, seed,
                  ["--data", "stdlib", "--init-from", str(base), "--eval-every", "25", *extra])
            folders.append(str(folder))
            print(f"seed {seed} {name} done", flush=True)
            if freeze == "apf":
                report = apf_report(folder)
                (out / f"seed{seed}-{name}-apf.txt").write_text(report + "\n")
                print(report, flush=True)
        table = run(["tfrun", "compare", *folders, "--plot", str(out / f"seed{seed}.png")])
        (out / f"seed{seed}.txt").write_text(table)
        (out / f"seed{seed}.json").write_text(run(["tfrun", "compare", *folders, "--json"]))
        print(table, flush=True)
    seeds = [json.loads((out / f"seed{s}.json").read_text()) for s in args.seeds.split(",")]
    if len(seeds) > 1:
        print("across seeds (median [min, max]):")
        for i, row in enumerate(seeds[0]["runs"]):
            gaps = [s["runs"][i]["eval_gap"] for s in seeds]
            speed = [s["runs"][i]["speedup"] for s in seeds]
            print(f"  {Path(row['dir']).name:24s} speedup {statistics.median(speed):.3f} [{min(speed):.3f}, "
                  f"{max(speed):.3f}]  eval gap {statistics.median(gaps):+.2%} [{min(gaps):+.2%}, {max(gaps):+.2%}]")


if __name__ == "__main__":
    main()
