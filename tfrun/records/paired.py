"""The paired time axis of `tfrun compare --paired RETIME.json` (tfrun.retime Note [paired time]): each run's exact
losses against the time its steps took when `tfrun retime` ran them again beside the other runs' steps.

A run's step n is taken to cost what the replayed step of its window (steps [w K, (w + 1) K), K =
`sample_every`; one step drawn at random in each, per repeat) cost in that repeat, plus what the run itself
measured between its steps (wall_ms -
step_time_ms: the online mode's solves, metrics, checkpoints; evaluation is outside wall time anyway). The gap
at equal time is then computed as compare's raw one is (tfrun.records.compare), once per repeat: its median is
`eval_gap_same_time_paired`, and max - min over the repeats its spread; None unless every repeat gives one (a run
slower than the baseline ends past the baseline's last evaluation in some repeats: a median of the others would
be biased). No torch.

Several launches (`tfrun compare --paired A/retime.json --paired B/retime.json`): a launch of ranks can run a
little faster or slower for one method than another launch does (measured: docs/results.md, third edition), which
alternating inside the launch cannot remove; `load_all` joins the launches' repeats, and the paired gap is then
the median over launches of each launch's median over its repeats (`..._launches`), the spread max - min over
every repeat.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tfrun.errors import TfrunError

SCHEMA_VERSION = 1


def load(path: str | Path) -> dict:
    """Read and check a retime.json; one TfrunError line naming what is wrong."""
    try:
        obj = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TfrunError(f"{path} does not exist (written by tfrun retime)") from None
    except (OSError, ValueError) as exc:
        raise TfrunError(f"{path} is unreadable: {exc}") from None
    if not isinstance(obj, dict) or obj.get("schema_version") != SCHEMA_VERSION:
        raise TfrunError(f"{path}: schema_version must be {SCHEMA_VERSION}, not a tfrun retime file")
    if not isinstance(obj.get("sample_every"), int) or obj["sample_every"] < 1:
        raise TfrunError(f"{path}: sample_every must be an integer >= 1")
    if obj.get("mismatched_actions"):
        raise TfrunError(f"{path}: mismatched_actions is {obj['mismatched_actions']}: the replay did not freeze what "
                         "the runs recorded, its times are not theirs")
    if not isinstance(obj.get("runs"), list) or not obj["runs"]:
        raise TfrunError(f"{path}: runs must be a non-empty list")
    for i, run in enumerate(obj["runs"]):
        steps, ms = run.get("steps") if isinstance(run, dict) else None, run.get("step_ms") if isinstance(
            run, dict) else None
        if not (isinstance(run, dict) and isinstance(run.get("dir"), str) and isinstance(steps, list) and steps
                and isinstance(ms, list) and len(ms) == len(steps)
                and all(isinstance(s, list) and s == sorted(s) and all(isinstance(n, int) and n >= 0 for n in s)
                        and isinstance(t, list) and len(t) == len(s) for s, t in zip(steps, ms))):
            raise TfrunError(f"{path}: runs[{i}] needs dir, steps (per repeat, ascending step numbers) and step_ms "
                             "(per repeat, a time per step)")
        if any(not isinstance(t, (int, float)) or t <= 0 for r in ms for t in r):
            raise TfrunError(f"{path}: runs[{i}].step_ms holds a time that is missing or not positive")
    return obj


def load_all(paths: list[str | Path]) -> dict:
    """`load` each file (one launch of `tfrun retime` each) and join them: every run's repeats, launch after launch,
    with `launch` (per repeat, the index of its file). The files must re-time the same runs, one step in the same
    `sample_every`, each file's runs as many repeats; one TfrunError line otherwise."""
    assert paths, "one file at least"
    if len({str(Path(p).resolve()) for p in paths}) < len(paths):
        raise TfrunError("--paired: a file is given twice; each launch of tfrun retime counts once")
    files = [load(p) for p in paths]
    first = files[0]
    dirs = sorted(str(Path(r["dir"]).resolve()) for r in first["runs"])
    for path, obj in zip(paths, files):
        if obj["sample_every"] != first["sample_every"]:
            raise TfrunError(f"{path}: sample_every {obj['sample_every']} differs from {paths[0]}'s "
                             f"{first['sample_every']}: join launches of one retime setting")
        if sorted(str(Path(r["dir"]).resolve()) for r in obj["runs"]) != dirs:
            raise TfrunError(f"{path}: re-times other runs than {paths[0]}: join launches over the same runs")
        if len({len(r["step_ms"]) for r in obj["runs"]}) > 1:  # repeats pair up by index within a launch
            raise TfrunError(f"{path}: its runs hold different numbers of repeats")
    merged = {"schema_version": SCHEMA_VERSION, "sample_every": first["sample_every"], "mismatched_actions": 0,
              "launches": len(files), "files": [str(p) for p in paths], "runs": []}
    for run in first["runs"]:
        parts = [timing_of(obj, run["dir"]) for obj in files]
        merged["runs"].append({"dir": run["dir"], "steps": [s for t in parts for s in t["steps"]],
                               "step_ms": [ms for t in parts for ms in t["step_ms"]],
                               "launch": [k for k, t in enumerate(parts) for _ in t["step_ms"]]})
    return merged


def timing_of(retime: dict, run_dir: str) -> dict | None:
    """The retime entry of `run_dir` (matched by resolved path), or None."""
    want = Path(run_dir).resolve()
    return next((t for t in retime["runs"] if Path(t["dir"]).resolve() == want), None)


def paired_points(steps: list[dict], timing: dict, repeat: int, every: int
                  ) -> tuple[list[tuple[int, float, float]], float]:
    """(step, paired training seconds so far, eval loss) at every evaluation of a run's metrics rows `steps`, and
    its paired training time (s), in repeat `repeat` of its retime entry sampled one step in `every`."""
    by_window = {n // every: ms for n, ms in zip(timing["steps"][repeat], timing["step_ms"][repeat])}
    out, seconds = [], 0.0
    for row in steps:
        window = row["step"] // every
        if window not in by_window:  # (a run longer than the one replayed: its last window stands for the rest)
            window = max(w for w in by_window if w <= window) if min(by_window) <= window else min(by_window)
        between = max(0.0, row.get("wall_ms", row["step_time_ms"]) - row["step_time_ms"])
        seconds += (by_window[window] + between) / 1e3
        if row.get("eval_loss") is not None:
            out.append((row["step"], seconds, row["eval_loss"]))
    return out, seconds


def paired_axis(steps: list[dict], timing: dict, every: int) -> list[tuple[list[tuple[int, float, float]], float]]:
    """paired_points of a run in every repeat of its retime entry."""
    return [paired_points(steps, timing, repeat, every) for repeat in range(len(timing["step_ms"]))]


def paired_fields(run_steps: list[dict], run_timing: dict | None, base_axis: list, tokens: int, base_tokens: int,
                  loss_at, every: int) -> dict:
    """compare's paired columns for one run: `eval_gap_same_time_paired` (the median over launches of each
    launch's median over its repeats; one launch: the median over repeats), per launch (`..._launches`), its
    `..._spread` (max - min over every repeat) and per repeat, `paired_training_s` and `paired_speedup` (medians
    over every repeat); None where the run was not re-timed. `base_axis`: the baseline's paired_axis (computed
    once for all runs); `loss_at`: compare.loss_at."""
    none = {"eval_gap_same_time_paired": None, "eval_gap_same_time_paired_spread": None,
            "eval_gap_same_time_paired_repeats": None, "eval_gap_same_time_paired_launches": None,
            "paired_training_s": None, "paired_speedup": None}
    if run_timing is None:
        return none
    gaps, times, speedups = [], [], []
    for repeat, (base_points, base_seconds) in enumerate(base_axis[:len(run_timing["step_ms"])]):
        points, seconds = paired_points(run_steps, run_timing, repeat, every)
        times.append(seconds)
        speedups.append(tokens / seconds / (base_tokens / base_seconds))
        then = loss_at(base_points, points[-1][1]) if points else None
        gaps.append((points[-1][2] - then) / then if then else None)
    if None in gaps:
        gaps = []
    launch = run_timing.get("launch", [0] * len(gaps))
    per_launch = [statistics.median(g for g, k in zip(gaps, launch) if k == i) for i in sorted(set(launch))
                  ] if gaps else []
    return {"eval_gap_same_time_paired": statistics.median(per_launch) if gaps else None,
            "eval_gap_same_time_paired_spread": max(gaps) - min(gaps) if gaps else None,
            "eval_gap_same_time_paired_repeats": gaps or None,
            "eval_gap_same_time_paired_launches": per_launch or None,
            "paired_training_s": statistics.median(times), "paired_speedup": statistics.median(speedups)}
