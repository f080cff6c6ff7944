"""What a `tfrun train` costs beyond its training (issue 48): the launch, the imports, the build, the evaluation
and the writes, for the tiny model's 1-step run on 2 CPU ranks.

    python benchmarks/launch_cost.py                          # 5 runs, the median
    python benchmarks/launch_cost.py --compare-with /tmp/old  # alternating with another checkout's tfrun

Each run is `tfrun train --plan PLAN --model tiny --steps 1 --out DIR --quiet` in a fresh process (PLAN: the shipped
tiny profile solved for 1F1B, M = 8, cap 0.9). Printed per run: the command's wall time, the training (the step's
`wall_ms`: tfrun.measure.wallclock Note [wall time]), the final evaluation (`eval_ms`) and the overhead, wall minus
training (the evaluation included: a user waits for it too). Then the median over the runs, and the parts of the
launcher's serial start measured apart in fresh processes: the CLI's import, and the imports every rank needs
(torch, torch.distributed.pipelining, tfrun's training loop: tfrun.distributed.launch Note [forked ranks]).

--compare-with DIR runs `python -m tfrun` from another checkout of this repository (its own tfrun and tfplan on
sys.path ahead of this one's, e.g. `git worktree add /tmp/old COMMIT`), alternating with this checkout's runs, so
that the two are measured side by side on the same machine state.
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

ROOT = Path(__file__).resolve().parent.parent


def _env(checkout: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(checkout))


def one_run(checkout: Path, plan: Path, out: Path) -> dict[str, float]:
    """One `tfrun train --steps 1` of `checkout`'s tfrun: wall, training, evaluation and overhead (s)."""
    cmd = [sys.executable, "-m", "tfrun", "train", "--plan", str(plan), "--model", "tiny", "--steps", "1",
           "--out", str(out), "--quiet", "--force"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=checkout, env=_env(checkout), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "event" not in r]
    training = sum(r.get("wall_ms") or r["step_time_ms"] for r in rows) / 1e3
    evaluation = sum(r.get("eval_ms") or 0.0 for r in rows) / 1e3
    return {"wall": wall, "training": training, "eval": evaluation, "overhead": wall - training}


def import_time(checkout: Path, modules: str) -> float:
    """Seconds to start Python and import `modules` in a fresh process."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {modules}"], cwd=checkout, env=_env(checkout), check=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--compare-with", default=None, help="another checkout of this repository (see above)")
    args = ap.parse_args()
    checkouts = [("this", ROOT)] + ([("other", Path(args.compare_with).resolve())] if args.compare_with else [])
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        subprocess.run([sys.executable, "-m", "tfplan", "solve", "-p", str(ROOT / "profiles" / "tiny-cpu-2stages.json"),
                        "-s", "1f1b", "-m", "8", "-c", "0.9", "-o", str(plan), "--json"], check=True,
                       capture_output=True)
        print(f"tfrun train --model tiny --steps 1 on 2 CPU ranks, {args.runs} runs"
              f"{' alternating with ' + args.compare_with if args.compare_with else ''}; load average "
              f"{os.getloadavg()[0]:.2f} at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
        results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in checkouts}
        for k in range(args.runs):
            for name, checkout in checkouts:
                r = one_run(checkout, plan, Path(tmp) / f"{name}{k}")
                results[name].append(r)
                print(f"  {name:5s} run {k}: wall {r['wall']:.2f} s, training {r['training']:.2f} s, evaluation "
                      f"{r['eval']:.2f} s, overhead {r['overhead']:.2f} s", flush=True)
        for name, checkout in checkouts:
            rows = results[name]
            med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            print(f"{name} ({checkout}): median wall {med['wall']:.2f} s, training {med['training']:.2f} s, "
                  f"evaluation {med['eval']:.2f} s, overhead {med['overhead']:.2f} s (runs "
                  + ", ".join(f"{r['overhead']:.2f}" for r in rows) + ")")
        cli = statistics.median(import_time(ROOT, "tfrun.cli.app") for _ in range(3))
        ranks = statistics.median(import_time(ROOT, "tfrun.cli.worker, tfrun.train, tfrun.retime") for _ in range(3))
        print(f"parts, fresh processes (median of 3): Python + the CLI's import {cli:.2f} s; Python + what every rank "
              f"imports (torch, its pipelining package, the training loop) {ranks:.2f} s")


if __name__ == "__main__":
    main()
