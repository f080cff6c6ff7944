"""Online TimelyFreeze against the offline loop and no freezing, measured in one session (issue 11).

Tiny model, 2 gloo ranks, 1F1B, 8 micro-batches of 4 x 128 tokens, cap 0.9, same seed:
  none     `tfrun train --freeze none`
  offline  `tfplan profile` + `tfplan solve` + `tfrun train --plan`
  online   `tfrun train --freeze timely` (its own warm-up, monitor, probe, solve, ramp, stable phases)
The step times of the three training runs are compared over the same steps (the online run's stable phase),
in `--rounds` alternating rounds; also each run's eval loss (the probe's cost to training) and the share of
the online run's time spent outside its stable phase.

    python benchmarks/online_vs_offline.py                         # about 15 minutes on 2 CPU cores
    python benchmarks/online_vs_offline.py --steps 300 --rounds 1  # the 300-step overhead figure
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

M, MB_SIZE, SEQ, CAP = 8, 4, 128, 0.9
PHASES = ["--warmup-steps", "10", "--monitor-steps", "10", "--probe-steps", "5", "--ramp-steps", "10"]


def run(cmd: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def steps_ms(folder: Path, first: int) -> float:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["step_time_ms"] for r in rows if "loss" in r and r["step"] >= first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="online-"))
    root.mkdir(parents=True, exist_ok=True)
    common = ["--steps", str(args.steps), "--quiet", "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ),
              "--eval-every", str(args.steps // 4)]
    print(f"online vs offline TimelyFreeze, tiny model, 2 gloo ranks, 1F1B, M = {M}, cap {CAP}, {args.steps} steps; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for k in range(args.rounds):
        prof, plan = root / f"profile-{k}.json", root / f"plan-{k}.json"
        run(["tfplan", "profile", "--model", "tiny", "--stages", "2", "--microbatches", str(M), "-o", str(prof),
             "--json"])
        run(["tfplan", "solve", "-p", str(prof), "-s", "1f1b", "-m", str(M), "-c", str(CAP), "-o", str(plan), "--json"])
        online = root / f"online-{k}"
        run(["tfrun", "train", "--freeze", "timely", "--schedule", "1f1b", "--ranks", "2", "--microbatches", str(M),
             "--max-freeze-ratio", str(CAP), "--out", str(online), *PHASES, *common])
        offline, none = root / f"offline-{k}", root / f"none-{k}"
        run(["tfrun", "train", "--plan", str(plan), "--out", str(offline), *common])
        run(["tfrun", "train", "--plan", str(plan), "--freeze", "none", "--out", str(none), *common])
        s = json.loads((online / "summary.json").read_text())
        stable = next(p["start_step"] for p in s["phases"] if p["name"] == "stable")
        row = {"online": steps_ms(online, stable), "offline": steps_ms(offline, stable),
               "none": steps_ms(none, stable), "online_pred": s["stable_predicted_step_ms"],
               "offline_pred": json.loads((offline / "summary.json").read_text())["predicted_step_ms"],
               "outside": s["outside_stable_share"], "solve_s": s["solve_s"], "replans": s["replans"],
               "eval": {n: json.loads((root / f"{n}-{k}" / "summary.json").read_text())["final_eval_loss"]
                        for n in ("online", "offline", "none")}}
        rows.append(row)
        print(f"round {k}: stable steps {stable}..{args.steps - 1}: online {row['online']:.1f} ms (predicted "
              f"{row['online_pred']:.1f}), offline {row['offline']:.1f} ms (predicted {row['offline_pred']:.1f}), "
              f"none {row['none']:.1f} ms; online/offline {row['online'] / row['offline']:.3f}, none/online "
              f"{row['none'] / row['online']:.3f}; outside stable {row['outside']:.1%}, solve "
              f"{row['solve_s'][0]:.2f} s, re-plans {row['replans']}; eval loss online {row['eval']['online']:.4f}, "
              f"offline {row['eval']['offline']:.4f}, none {row['eval']['none']:.4f}", flush=True)
    med = {key: statistics.median(r[key] for r in rows) for key in ("online", "offline", "none")}
    print(f"\nmedians over {len(rows)} rounds: online {med['online']:.1f} ms, offline {med['offline']:.1f} ms, none "
          f"{med['none']:.1f} ms; online vs offline {med['online'] / med['offline'] - 1:+.1%}; speedup over none "
          f"{med['none'] / med['online']:.3f}x (online), {med['none'] / med['offline']:.3f}x (offline)")
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
