"""What measuring the gradient noise scale costs a step (tfrun.freeze.noise; issue 21: at most 3% at the default
period).

Runs of the tiny model on 2 gloo ranks (1F1B, 8 micro-batches of 4 x 128 tokens, unfrozen), alternating
--noise-every 0 (off: the hooks only return), the default period and 1 (every step), three rounds in the
order off, default, every, then reversed, so that no setting always runs first. Each run's median step time
(its timed steps' mean step_time_ms, from metrics.jsonl: a median would hide a cost paid on one step in five)
is one sample; the figure is the median over the rounds of each setting's difference to the round's `off`
run, in ms and in % of the step.

    python benchmarks/noise_cost.py --steps 40 --rounds 3 --out runs/noise-cost
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


def main() -> None:
    from tfrun.config.train_config import NOISE_EVERY

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="runs/noise-cost")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = out / "plan.json"
    if not plan.exists():
        subprocess.run([sys.executable, "-m", "tfplan", "solve", "-p", str(PROFILE), "-s", "1f1b", "-m", "8", "-o",
                        str(plan), "--json"], check=True, capture_output=True)
    settings = {"off": 0, "default": NOISE_EVERY, "every step": 1}
    print(f"noise-scale cost, tiny model, 2 ranks, 1F1B M=8, {args.steps} steps a run, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    samples: dict[str, list[float]] = {k: [] for k in settings}
    for r in range(args.rounds):
        order = list(settings) if r % 2 == 0 else list(reversed(settings))
        for name in order:
            folder = out / f"round{r}-{name.replace(' ', '-')}"
            if not (folder / "summary.json").exists():
                subprocess.run([sys.executable, "-m", "tfrun", "train", "--plan", str(plan), "--freeze", "none",
                                "--steps", str(args.steps), "--noise-every", str(settings[name]), "--out",
                                str(folder), "--quiet"], check=True, capture_output=True)
            summary = json.loads((folder / "summary.json").read_text())
            rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            mean = statistics.fmean(r["step_time_ms"] for r in rows if r.get("timed"))
            samples[name].append(mean)
            print(f"  round {r} {name:10s} step mean {mean:.1f} ms, median {summary['step_time_ms']:.1f} ms "
                  f"(noise measured on {summary.get('noise_steps', 0)} steps)", flush=True)
    for name in ("default", "every step"):
        diffs = [b - a for a, b in zip(samples["off"], samples[name])]
        rel = [d / a for d, a in zip(diffs, samples["off"])]
        print(f"{name} (--noise-every {settings[name]}): +{statistics.median(diffs):.1f} ms a step "
              f"({statistics.median(rel):+.1%}; rounds {', '.join(f'{x:+.1%}' for x in rel)})")
    off = samples["off"]
    print(f"off: mean step {statistics.median(off):.1f} ms (rounds {', '.join(f'{x:.1f}' for x in off)})")


if __name__ == "__main__":
    main()
