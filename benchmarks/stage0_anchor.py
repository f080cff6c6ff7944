"""The stage-0 anchor (tfplan.plan.job Note [stage-0 anchor]) on a plan that would freeze every stage-0 backward:
speed against the prediction and training quality, side by side with the unanchored plan and `--freeze none`.

Tiny model, 2 gloo ranks, M = 8, 4 x 128 tokens, cap 0.9, `tfrun train` from scratch at one seed with the
default `auto` policy. The unanchored plan (`tfplan solve --no-stage0-anchor`) leaves no stage-0 backward
unfrozen, so `auto` freezes rotating subsets there; the anchored plan (the default) leaves one, so `auto`
freezes prefixes. Runs alternate none / anchored / unanchored for `--rounds` rounds (step times: medians
per run; loss: the final eval, deterministic for the seed).

    python benchmarks/stage0_anchor.py                          # GPipe on the shipped profile, about 8 minutes
    python benchmarks/stage0_anchor.py --profile P.json --schedule interleaved-1f1b --stages-per-rank 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tfplan.plan import plan as plan_mod
from tfplan.schedule.actions import FREEZABLE, parse_action

ROOT = Path(__file__).resolve().parent.parent
MODEL, M, MB_SIZE, SEQ, CAP = "tiny", 8, 4, 128, 0.9


def _run(cmd: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")


def solve(root: Path, profile: str, schedule: str, v: int, anchor: bool) -> Path:
    out = root / f"plan-{schedule}-{'anchored' if anchor else 'unanchored'}.json"
    _run(["tfplan", "solve", "-p", profile, "-s", schedule, "--stages-per-rank", str(v), "-m", str(M), "-c", str(CAP),
          "-o", str(out), "--json", *([] if anchor else ["--no-stage0-anchor"])])
    return out


def train(root: Path, plan: Path, freeze: str, steps: int, seed: int, tag: str) -> dict:
    out = root / f"{plan.stem}-{freeze}-{tag}"
    _run(["tfrun", "train", "--plan", str(plan), "--freeze", freeze, "--steps", str(steps), "--seed", str(seed),
          "--eval-every", "10", "--out", str(out), "--quiet", "--microbatch-size", str(MB_SIZE), "--seq-len",
          str(SEQ)])
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=str(ROOT / "profiles" / "tiny-cpu-2stages.json"))
    ap.add_argument("--schedule", default="gpipe")
    ap.add_argument("--stages-per-rank", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temp folder)")
    args = ap.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="anchor-"))
    root.mkdir(parents=True, exist_ok=True)
    plans = {name: solve(root, args.profile, args.schedule, args.stages_per_rank, name == "anchored")
             for name in ("anchored", "unanchored")}
    for name, path in plans.items():
        obj = json.loads(path.read_text())
        stage0 = [r for a, r in plan_mod.load(path).ratio_of().items() if (act := parse_action(a)).stage == 0
                  and act.kind in FREEZABLE]
        print(f"{name:10s} plan: predicted {obj['predicted']['planned_ms']:.1f} ms; stage 0 ratios "
              f"{' '.join(f'{r:.2f}' for r in stage0)}")
    print(f"{args.schedule}, {args.steps} steps from scratch, seed {args.seed}, cap {CAP}, auto policy; "
          f"load average {os.getloadavg()[0]:.2f}")
    runs: dict[str, list[dict]] = {}
    for k in range(args.rounds):
        for name, plan, freeze in (("none", plans["anchored"], "none"), ("anchored", plans["anchored"], "plan"),
                                   ("unanchored", plans["unanchored"], "plan")):
            runs.setdefault(name, []).append(train(root, plan, freeze, args.steps, args.seed, f"r{k}"))
    print(f"{'run':10s} {'step ms (per round)':>24s} {'pred ms':>8s} {'err':>7s} {'speedup':>7s} {'eval':>7s} "
          f"{'vs none':>8s}  realised / planned ratio per stage")
    none_ms = statistics.median(r["step_time_ms"] for r in runs["none"])
    none_eval = runs["none"][0]["final_eval_loss"]
    for name, rs in runs.items():
        ms = statistics.median(r["step_time_ms"] for r in rs)
        pred = rs[0]["predicted_step_ms"]
        ratios = " ".join(f"{a:.3f}/{p:.3f}" for a, p in zip(rs[0].get("realised_freeze_ratio", []),
                                                             rs[0].get("planned_freeze_ratio", [])))
        times = " ".join(f"{r['step_time_ms']:.1f}" for r in rs)
        print(f"{name:10s} {times:>24s} {pred:8.1f} {ms / pred - 1:+7.1%} "
              f"{none_ms / ms:7.3f} {rs[0]['final_eval_loss']:7.4f} {rs[0]['final_eval_loss'] / none_eval - 1:+8.2%}  "
              f"{ratios}")
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
