"""The freezer as a library, measured: examples/own_pipeline.py (an nn.Sequential MLP under torch's ScheduleGPipe,
2 gloo ranks) profiled with its hooks, planned by `tfplan solve`, then trained without hooks and with the plan,
alternately, three times each; prints the medians and the plan's predicted speedup.

    python benchmarks/library_speedup.py --dir /tmp/lib-speedup        # a few minutes on 2 CPU cores
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
EXAMPLE = ROOT / "examples" / "own_pipeline.py"


def torchrun(*args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp/tfrun-lib-speedup")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--cap", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    profile, plan = work / "mlp-profile.json", work / "mlp-plan.json"
    torchrun("profile", "-o", str(profile), "--steps", "20")
    subprocess.run([sys.executable, "-m", "tfplan", "solve", "-p", str(profile), "-s", "gpipe", "-m", "8", "-c",
                    str(args.cap), "-o", str(plan)], check=True, capture_output=True)
    predicted = json.loads(plan.read_text())["predicted"]
    runs: dict[str, list[float]] = {"no hooks": [], "plan": []}
    for k in range(args.repeats):
        for name, extra in (("no hooks", ["--no-hooks"]), ("plan", ["--plan", str(plan)])):
            out = work / f"{name.replace(' ', '-')}-{k}.json"
            torchrun("train", "--steps", str(args.steps), "-o", str(out), *extra)
            runs[name].append(json.loads(out.read_text())["median_step_ms"])
    base, planned = statistics.median(runs["no hooks"]), statistics.median(runs["plan"])
    print(f"load average at the end (1, 5, 15 min): {os.getloadavg()}")
    for name, values in runs.items():
        print(f"{name:9s} median step ms per run: {', '.join(f'{v:.1f}' for v in values)}")
    print(f"measured speedup {base / planned:.3f} (median {base:.1f} ms -> {planned:.1f} ms); predicted "
          f"{predicted['speedup']:.3f} ({predicted['no_freeze_ms']:.1f} ms -> {predicted['planned_ms']:.1f} ms)")


if __name__ == "__main__":
    main()
