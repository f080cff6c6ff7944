"""Does the plan's prediction hold on every schedule? The closed loop, measured (issue 10).

For each schedule: `tfplan profile --schedule S` (measured inside the pipeline, the schedule itself and its
counterpart of the other backward style), `tfplan solve` at cap 0.9, then `tfrun train --plan` with the plan
and with `--freeze none`, alternately; the predicted step against the measured median step, repeated.
Also (--stability) how a profile's medians move with the number of profiling steps.

    python benchmarks/prediction_accuracy.py                     # 7 schedules x 3 rounds, about an hour
    python benchmarks/prediction_accuracy.py --schedules 1f1b,gpipe --rounds 1
    python benchmarks/prediction_accuracy.py --stability         # profile steps 6 / 10 / 20 / 40, 3 each
    python benchmarks/prediction_accuracy.py --drift             # one long unfrozen run, step time by window
    python benchmarks/prediction_accuracy.py --report DIR        # the table again from a previous --out DIR

--steps (training steps per run) and --profile-steps (steps per profiling run) set how long each measurement
is. This VM's speed wanders on a time scale of tens of seconds (--drift: medians of 15-step windows of one
run spread over 24% of its median, docs/benchmarks.md), so a 30-step median is about two samples of the
machine's state, and a longer measurement averages more of them.
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

MODEL, RANKS, M, MB_SIZE, SEQ, CAP = "tiny", 2, 8, 4, 128, 0.9
STEPS, PROFILE_STEPS = 30, 20  # --steps, --profile-steps
SCHEDULES = {  # name -> stages per rank
    "gpipe": 1, "1f1b": 1, "interleaved-1f1b": 2, "looped-bfs": 2, "interleaved-zb": 2, "zbv": 2, "dualpipev": 2,
}


def _run(cmd: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout


DP = 1  # --dp: replicas of the pipeline in every profile and run (4 processes at 2)
REPLAY_GAP_RETRY, PROFILE_RETRIES = 0.10, 2
"""A profile whose replayed step is off its measured step by more than this (tfplan profile's warning: it was
measured in a slow spell of this VM) is taken again, at most PROFILE_RETRIES times; the table says so."""


def profile(root: Path, schedule: str, v: int, steps: int, tag: str) -> Path:
    out = root / f"profile-{schedule}-{tag}.json"
    _run(["tfplan", "profile", "--model", MODEL, "--stages", str(RANKS), "--stages-per-rank", str(v),
          "--microbatches", str(M), "--schedule", schedule, "--steps", str(steps), "--microbatch-size",
          str(MB_SIZE), "--seq-len", str(SEQ), "--dp", str(DP), "-o", str(out), "--json"])
    return out


def train(root: Path, plan: Path, freeze: str, tag: str, steps: int | None = None) -> dict:
    out = root / f"{plan.stem}-{freeze}-{tag}"
    _run(["tfrun", "train", "--plan", str(plan), "--freeze", freeze, "--steps", str(steps or STEPS), "--out", str(out),
          "--quiet", "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ), "--dp", str(DP)])
    return json.loads((out / "summary.json").read_text()) | {"dir": str(out)}


def error_split(run_dir: str) -> tuple[str, float, float, dict[str, float], float]:
    """`tfplan explain`'s split of a run's prediction error (ms per step; waits split when the run has them),
    the forwards' measured / predicted time and the error at that speed, and the speed per kind (F, B, I, W, tail)
    and the error at those speeds (tfplan.report.explain Note [speed per kind])."""
    ex = json.loads(_run(["tfplan", "explain", run_dir, "--json"]))
    parts = dict(ex["error_parts_ms"])
    waits = ex.get("waits_split_ms")
    if waits:
        parts.pop("waits")
        parts = {"actions": parts.pop("actions"), "variability": waits["variability"], "idle": waits["idle"]} | parts
    split = "error split (ms): " + ", ".join(f"{k} {v:+.1f}" for k, v in parts.items())
    return split, ex["forward_speed"], ex["speed_adjusted_error"], ex["kind_speed"], ex["speed_error"]


HEADER = (f"{'schedule':18s} {'round':>5s} {'pred none':>9s} {'meas none':>9s} {'err':>7s} {'pred plan':>9s} "
          f"{'meas plan':>9s} {'err':>7s} {'speedup':>7s} {'pred':>6s}  profile quality")


def report_round(name: str, k: int, prof: Path, none: dict, frozen: dict, table: dict) -> None:
    """One row of the table, then each run's error split and speed-adjusted error (`tfplan explain`)."""
    q = json.loads(prof.read_text()).get("quality", {})
    speed, pred = none["step_time_ms"] / frozen["step_time_ms"], none["predicted_step_ms"] / frozen["predicted_step_ms"]
    print(f"{name:18s} {k:5d} {none['predicted_step_ms']:9.1f} {none['step_time_ms']:9.1f} "
          f"{none['prediction_error']:+7.1%} {frozen['predicted_step_ms']:9.1f} {frozen['step_time_ms']:9.1f} "
          f"{frozen['prediction_error']:+7.1%} {speed:7.3f} {pred:6.3f}  spread "
          f"{q.get('max_spread', 0):.0%}, replay gap {q.get('replay_gap', float('nan')):+.1%}", flush=True)
    adjusted, per_kind = {}, {}
    for label, run in (("none", none), ("plan", frozen)):
        split, fwd, adjusted[label], speeds, per_kind[label] = error_split(run["dir"])
        print(f"{'':8s} {label}: forwards x{fwd:.3f}, error at that speed {adjusted[label]:+.1%}; per kind "
              f"{' '.join(f'{k} x{v:.3f}' for k, v in speeds.items())}, error at those speeds {per_kind[label]:+.1%}; "
              f"{split}", flush=True)
    table.setdefault(name, []).append((frozen["prediction_error"], adjusted["plan"], per_kind["plan"]))


def summarize(table: dict) -> None:
    for i, what in enumerate(("plan prediction error", "plan prediction error at the run's forward speed",
                              "plan prediction error at the run's speed per kind")):
        print(f"\n{what} per schedule (all rounds): " + "; ".join(
            f"{n} {' '.join(f'{e[i]:+.1%}' for e in errs)} (worst {max((e[i] for e in errs), key=abs):+.1%})"
            for n, errs in table.items()))


def closed_loop(root: Path, schedules: list[str], rounds: int) -> None:
    print(f"closed loop, tiny model, {RANKS} gloo ranks x {DP} replicas, M = {M}, {MB_SIZE} x {SEQ} tokens, cap {CAP}, "
          f"{STEPS} training steps per run, {PROFILE_STEPS} per profiling run; load average {os.getloadavg()[0]:.2f}")
    print(HEADER)
    table: dict[str, list[tuple[float, float, float]]] = {}
    for k in range(rounds):
        for name in schedules:
            v = SCHEDULES[name]
            prof = profile(root, name, v, PROFILE_STEPS, f"r{k}")
            for retry in range(1, PROFILE_RETRIES + 1):  # what tfplan profile's replay-gap warning tells a user
                gap = json.loads(prof.read_text()).get("quality", {}).get("replay_gap", 0.0)
                if abs(gap) <= REPLAY_GAP_RETRY:
                    break
                print(f"{name:18s} {k:5d} profile replay gap {gap:+.1%} (over {REPLAY_GAP_RETRY:.0%}): profiled again",
                      flush=True)
                prof = profile(root, name, v, PROFILE_STEPS, f"r{k}-retry{retry}")
            plan = root / f"plan-{name}-r{k}.json"
            _run(["tfplan", "solve", "-p", str(prof), "-s", name, "--stages-per-rank", str(v), "-m", str(M),
                  "-c", str(CAP), "--dp", str(DP), "-o", str(plan), "--json"])
            none = train(root, plan, "none", f"r{k}")
            frozen = train(root, plan, "plan", f"r{k}")
            report_round(name, k, prof, none, frozen, table)
    summarize(table)
    print(f"runs kept in {root}; `tfplan explain DIR` on any run shows where its step went")


def report(root: Path) -> None:
    """The closed loop's table again, from the profiles, plans and runs a previous call left in `root`."""
    print(f"closed loop kept in {root}")
    print(HEADER)
    table: dict[str, list[tuple[float, float, float]]] = {}
    plans = sorted(root.glob("plan-*-r*.json"), key=lambda p: (int(p.stem.rsplit("-r", 1)[1]), p.stat().st_mtime))
    for plan in plans:
        name, k = plan.stem[len("plan-"):].rsplit("-r", 1)
        runs = [root / f"{plan.stem}-{freeze}-r{k}" for freeze in ("none", "plan")]
        if not all((run / "timings.json").exists() for run in runs):
            continue  # a round cut short
        profs = sorted(root.glob(f"profile-{name}-r{k}*.json"), key=lambda p: p.stat().st_mtime)
        none, frozen = (json.loads((run / "summary.json").read_text()) | {"dir": str(run)} for run in runs)
        report_round(name, int(k), profs[-1], none, frozen, table)
    summarize(table)


def stability(root: Path, repeats: int = 3) -> None:
    """How far a profile's medians move between repeated profiles, by profiling steps (1F1B)."""
    print(f"profile stability, 1F1B, tiny, {RANKS} ranks, M = {M}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'steps':>5s} {'field':>22s} {'values (ms) of repeated profiles':>40s} {'spread':>7s}")
    for steps in (6, 10, 20, 40):
        profs = [json.loads(profile(root, "1f1b", 1, steps, f"s{steps}-{k}").read_text()) for k in range(repeats)]
        rows = {"step (primary run)": [p["source"]["step_time_ms"] for p in profs]}
        for s in range(2):
            for field in ("forward_ms", "backward_ms", "backward_frozen_ms"):
                rows[f"stage {s} {field}"] = [p["stages"][s][field] for p in profs]
        worst = 0.0
        for key, values in rows.items():
            rel = (max(values) - min(values)) / statistics.median(values) if statistics.median(values) else 0.0
            worst = max(worst, rel) if key != "stage 0 backward_frozen_ms" else worst  # ~0.2 ms: noise only
            print(f"{steps:5d} {key:>22s} {' '.join(f'{x:8.2f}' for x in values):>40s} {rel:7.1%}")
        print(f"{steps:5d} {'largest (max-min)/median':>22s} {worst:48.1%}", flush=True)


def drift(root: Path, steps: int = 150, window: int = 15) -> None:
    """How the machine's speed wanders within one run: medians of consecutive windows of an unfrozen 1F1B run."""
    prof = profile(root, "1f1b", 1, PROFILE_STEPS, "drift")
    plan = root / "plan-drift.json"
    _run(["tfplan", "solve", "-p", str(prof), "-s", "1f1b", "-m", str(M), "-c", str(CAP), "-o", str(plan), "--json"])
    run = train(root, plan, "none", "drift", steps)
    times = [row["step_time_ms"] for row in map(json.loads, Path(run["dir"], "metrics.jsonl").read_text().splitlines())
             if row.get("timed")]
    meds = [statistics.median(times[i:i + window]) for i in range(0, len(times) - window + 1, window)]
    whole = statistics.median(times)
    print(f"one unfrozen 1F1B run, {len(times)} timed steps; load average {os.getloadavg()[0]:.2f}")
    print(f"median step {whole:.1f} ms; medians of {window}-step windows: " + " ".join(f"{m:.0f}" for m in meds))
    half = len(times) // 2
    first, second = statistics.median(times[:half]), statistics.median(times[half:])
    print(f"windows' range {(max(meds) - min(meds)) / whole:.1%} of the median; first half {first:.1f} ms, "
          f"second half {second:.1f} ms")


def main() -> None:
    global DP, STEPS, PROFILE_STEPS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stability", action="store_true")
    ap.add_argument("--drift", action="store_true", help="one long unfrozen run: its step time by window")
    ap.add_argument("--report", metavar="DIR", help="print the closed loop's table from a previous --out DIR")
    ap.add_argument("--steps", type=int, default=STEPS, help="training steps per run")
    ap.add_argument("--profile-steps", type=int, default=PROFILE_STEPS, help="steps per profiling run")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel replicas (the profile measures them too)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    DP, STEPS, PROFILE_STEPS = args.dp, args.steps, args.profile_steps
    if args.report:
        report(Path(args.report))
        return
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="prediction-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.stability:
        stability(root)
    elif args.drift:
        drift(root)
    else:
        closed_loop(root, args.schedules.split(","), args.rounds)


if __name__ == "__main__":
    main()
