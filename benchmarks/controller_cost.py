"""What the online goodput mode costs where it declines to freeze (issue 46: at most 1% of the training time beside
unfrozen training): its monitor (the noise measured every other step), probe, first solve and checks, in real runs.

Runs of the tiny model on 2 gloo ranks (1F1B, M = 8 micro-batches of 2 x 128 tokens: the crossing regime's shape
and profiles/tiny-cpu-2stages-mb2.json's), alternating, `--rounds` times:
  none        tfrun train --freeze none (the noise measured every 5 steps, as the studies' unfrozen runs do);
  declines    tfrun train --freeze timely --objective goodput --max-freeze-ratio 0: the whole controller (monitor,
              probe, solve, checks: tfrun/freeze/online.py Note [idle plan]) with plans that freeze nothing, at its
              own defaults (the noise every 10 steps: tfrun/freeze/controller.py Note [unfrozen measurement]);
  declines-5  the same with --noise-every 5, the unfrozen run's period: the controller's own cost alone;
  freezes     tfrun train --freeze timely --objective goodput (cap 0.9): where its plan freezes, a measured step
              also runs a block of whole micro-batches unfrozen (Note [unfrozen measurement]).
Each run's training time is the sum of its rows' wall_ms (its steps and everything between them, evaluation
excluded: tfrun/measure/wallclock.py Note [wall time]); from its rows, where a difference goes: the monitor's
steps, the probe's, the other steps, the time between steps at the checks and elsewhere, and the solves; and
what a measured step costs against the unmeasured ones after the first plan (median step times: the hooks, and
where the plan freezes, the unfrozen block). The cap-0
solve is trivial, so the cap-0.9 goodput solve on the same profile is timed in this process too (median of 10).
Medians over the rounds, every round shown. Timings need a quiet machine (docs/design.md): say what else ran.

    python benchmarks/controller_cost.py --steps 120 --rounds 3 --out runs/controller-cost
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "tiny-cpu-2stages-mb2.json"
SHAPE = ["--microbatch-size", "2", "--seq-len", "128", "--quiet", "--eval-batches", "1"]
RUNS = {"none": ["--freeze", "none"],
        "declines": ["--freeze", "timely", "--objective", "goodput", "--max-freeze-ratio", "0"],
        "declines-5": ["--freeze", "timely", "--objective", "goodput", "--max-freeze-ratio", "0", "--noise-every", "5"],
        "freezes": ["--freeze", "timely", "--objective", "goodput"]}


SHARES = ("measured step, extra share", "freeze ratio")


def tfrun(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "tfrun", *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: tfrun {' '.join(args)}\n{proc.stderr[-3000:]}")


def parts(folder: Path) -> dict[str, float]:
    """Seconds of a run's training time, split: monitor, probe and other steps (step_time_ms), between steps at
    checks (steps followed by a check or plan event) and elsewhere (wall_ms - step_time_ms), its solves, all."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    checked = {r["step"] - (0 if r.get("event") == "check" else 1) for r in rows
               if r.get("event") in ("check", "plan")}
    out = dict.fromkeys(("monitor", "probe", "other steps", "between, at checks", "between, elsewhere"), 0.0)
    for r in (r for r in rows if "event" not in r):
        phase = r.get("phase")
        out[phase if phase in ("monitor", "probe") else "other steps"] += r["step_time_ms"] / 1e3
        key = "between, at checks" if r["step"] in checked else "between, elsewhere"
        out[key] += (r["wall_ms"] - r["step_time_ms"]) / 1e3
    first = min((r["step"] for r in rows if r.get("event") == "plan"), default=2)
    later = [r for r in rows if "event" not in r and r["step"] >= max(2, first)]
    measured = [r["step_time_ms"] for r in later if "noise_scale_tokens" in r]
    other = [r["step_time_ms"] for r in later if "noise_scale_tokens" not in r]
    out["measured step, extra share"] = statistics.median(measured) / statistics.median(other) - 1
    out["freeze ratio"] = statistics.fmean(statistics.fmean(r["freeze_ratio"]) for r in later)
    summary = json.loads((folder / "summary.json").read_text())
    out["solves"] = sum(summary.get("solve_s") or [])
    out["training"] = summary["train_wall_s"]
    return out


def solve_s(repeats: int = 10) -> float:
    """Median seconds of the in-run goodput solve at cap 0.9 on the profile (tfplan's job path, warm)."""
    from tfplan.cost import profile
    from tfplan.plan import job
    from tfplan.schedule import schedules

    prof, sched = profile.load(PROFILE), schedules.generate("1f1b", 2, 8)
    job.solve_schedule(sched, prof, 0.9, objective="goodput")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        job.solve_schedule(sched, prof, 0.9, objective="goodput")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="runs/controller-cost")
    ap.add_argument("--runs", default=",".join(RUNS), help="which of " + ", ".join(RUNS))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = out / "plan.json"
    subprocess.run([sys.executable, "-m", "tfplan", "solve", "-p", str(PROFILE), "-s", "1f1b", "-m", "8", "-c", "0.9",
                    "-o", str(plan), "--json"], check=True, capture_output=True)
    names = args.runs.split(",")
    print(f"controller cost: tiny, 2 ranks, 1F1B, M = 8 of 2 x 128 tokens, {args.steps} steps, {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    got: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for k in range(args.rounds):
        for name in names[k % len(names):] + names[:k % len(names)]:  # alternating, rotated each round
            folder = out / f"round{k}" / name
            if not (folder / "summary.json").exists():
                tfrun(["train", "--plan", str(plan), "--steps", str(args.steps), "--out", str(folder), *SHAPE,
                       *RUNS[name]])
            got[name].append(parts(folder))
            print(f"round {k} {name}: {got[name][-1]['training']:.1f} s", flush=True)
    base = [r["training"] for r in got.get("none", [])]
    for name in names:
        rounds = got[name]
        line = f"{name}: training " + ", ".join(f"{r['training']:.1f}" for r in rounds) + " s"
        if base and name != "none":
            over = [r["training"] / b - 1 for r, b in zip(rounds, base)]
            line += (" (" + ", ".join(f"{x:+.2%}" for x in over)
                     + f" against none; median {statistics.median(over):+.2%})")
        print(line)
        print("  " + "; ".join(f"{key} {statistics.median(r[key] for r in rounds):.3f}" + (" s" if key not in SHARES
                                                                                         else "")
                               for key in rounds[0] if key != "training"))
    print(f"the goodput solve at cap 0.9 on {PROFILE.name}: {solve_s() * 1e3:.0f} ms (median of 10, warm)")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
