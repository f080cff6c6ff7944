"""Freeze policies side by side on this machine: speed, training quality and fairness (issue 9).

Tiny model, 2 gloo ranks, 1F1B, 8 micro-batches of 4 x 128 tokens, the shipped measured profile
(profiles/tiny-cpu-2stages.json) solved at cap 0.9, and the issue's stress plan (every backward at 0.9).

  (a) offline, no training: the cost of step-to-step variation. Each policy's actual frozen sets over 100 steps
      give each action's duration per step (linear between its measured endpoints; exact for whole skips);
      each step is simulated on the plan's DAG, and the mean step is compared with the LP's prediction (the
      makespan of the mean durations, which the mean of makespans can only exceed).
  (b) real runs from scratch at the same seed: `--freeze none` and the plan under every policy; median step
      time, speedup, final eval loss, realised vs planned mean ratio per stage, smallest per-tensor update
      share, longest gap without an update.

    python benchmarks/freeze_policies.py                # about 25 minutes on 2 CPU cores
    python benchmarks/freeze_policies.py --steps 40 --plans stress --policies auto,random   # the issue's check
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

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "tiny-cpu-2stages.json"
MODEL, M, MB_SIZE, SEQ, CAP = "tiny", 8, 4, 128, 0.9
POLICIES = ("auto", "skip", "random", "prefix", "weighted")


def make_plans(root: Path) -> dict[str, Path]:
    """lp: the LP's plan at cap 0.9; stress: every freezable action at 0.9 (valid at cap 0.9)."""
    from tfplan.plan import job, plan

    spec = job.JobSpec(profile_path=str(PROFILE), schedule="1f1b", num_microbatches=M)
    lp = job.solve_job(spec, CAP)
    paths = {"lp": root / "plan-lp.json", "stress": root / "plan-stress.json"}
    plan.write(lp, paths["lp"])
    plan.write(plan.with_uniform_ratio(lp, CAP), paths["stress"])
    plan.load(paths["stress"])  # still a valid plan
    return paths


def offline_variation(plan_path: Path, policies: list[str], steps: int = 100) -> list[str]:
    """(a): mean simulated step under each policy's realised frozen sets vs the LP's makespan."""
    from tfplan.plan import plan as plan_mod
    from tfplan.step.simulate import simulate
    from tfrun.freeze.candidates import candidates
    from tfrun.freeze.freezing import Freezer
    from tfrun.models import MODELS, build_stage

    p = plan_mod.load(plan_path)
    dag = p.dag
    mods = {s: build_stage(MODELS[MODEL], s, dag.schedule.num_stages, 0, device="meta")
            for s in range(dag.schedule.num_stages)}
    ratios = {(a.stage, a.mb): r for a, r in zip(dag.actions, p.ratios) if r > 0}
    planned = simulate(dag, dag.durations(p.ratios)).makespan_ms
    lines = [f"LP makespan (mean durations) {planned:.1f} ms; no freezing {simulate(dag).makespan_ms:.1f} ms"]
    for policy in policies:
        f = Freezer({s: candidates(m) for s, m in mods.items()}, ratios, num_microbatches=dag.schedule.num_microbatches,
                    seed=0, policy=policy)
        spans = []
        for step in range(steps):
            shares = [f.selection(step, a.stage, a.mb).share if dag.freezable[v] else 0.0
                      for v, a in enumerate(dag.actions)]
            spans.append(simulate(dag, dag.durations(shares)).makespan_ms)
        mean = statistics.fmean(spans)
        lines.append(f"  {policy:9s} mean {mean:7.1f} ms ({mean / planned - 1:+.1%} vs LP), min {min(spans):.1f}, "
                     f"max {max(spans):.1f}")
    return lines


def train(root: Path, plan: Path, freeze: str, policy: str, steps: int, seed: int, extra: list[str]) -> dict:
    out = root / f"{plan.stem}-{freeze}-{policy}-s{seed}"
    cmd = [sys.executable, "-m", "tfrun", "train", "--plan", str(plan), "--freeze", freeze, "--freeze-policy",
           policy, "--steps", str(steps), "--seed", str(seed), "--out", str(out), "--quiet", "--microbatch-size",
           str(MB_SIZE), "--seq-len", str(SEQ), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"run failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plans", default="lp,stress", help="lp and/or stress")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--offline-only", action="store_true")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temp folder)")
    args = ap.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="freeze-policies-"))
    root.mkdir(parents=True, exist_ok=True)
    policies = args.policies.split(",")
    plans = make_plans(root)
    print(f"freeze policies, tiny model, 2 gloo ranks, 1F1B, M = {M}, {MB_SIZE} x {SEQ} tokens; "
          f"load average {os.getloadavg()[0]:.2f}")
    for name in args.plans.split(","):
        print(f"\n(a) step-to-step variation, plan {name}")
        print("\n".join(offline_variation(plans[name], policies)))
    if args.offline_only:
        return
    for name in args.plans.split(","):
        print(f"\n(b) {args.steps} steps from scratch, plan {name}, seed {args.seed}, eval every 10 steps")
        base = train(root, plans[name], "none", "auto", args.steps, args.seed, ["--eval-every", "10"])
        print(f"{'policy':10s} {'step ms':>8s} {'speedup':>8s} {'pred ms':>8s} {'eval':>7s} {'vs none':>8s} "
              f"{'realised / planned ratio per stage':>36s} {'min upd':>8s} {'gap':>4s}")
        print(f"{'none':10s} {base['step_time_ms']:8.1f} {1:8.3f} {base['predicted_step_ms']:8.1f} "
              f"{base['final_eval_loss']:7.4f} {'':>8s}")
        for policy in policies:
            s = train(root, plans[name], "plan", policy, args.steps, args.seed, ["--eval-every", "10"])
            ratios = " ".join(f"{r:.3f}/{p:.3f}" for r, p in zip(s["realised_freeze_ratio"], s["planned_freeze_ratio"]))
            print(f"{policy:10s} {s['step_time_ms']:8.1f} {base['step_time_ms'] / s['step_time_ms']:8.3f} "
                  f"{s['predicted_step_ms']:8.1f} {s['final_eval_loss']:7.4f} "
                  f"{s['final_eval_loss'] / base['final_eval_loss'] - 1:+8.2%} {ratios:>36s} "
                  f"{s['min_update_share']:8.2f} {s['longest_update_gap']:4d}")
    print(f"\nruns kept in {root}")


if __name__ == "__main__":
    main()
