"""The paired time axis of `tfrun compare --paired RETIME.json` (tfrun.retime Note [paired time]): each run's exact
losses against the time its steps took when `tfrun retime` ran them again beside the other runs' steps.

A run's step n is taken to cost what its latest replayed step at or before n cost in that repeat (the replay
samples every `sample_every`-th step), plus what the run itself measured between its steps (wall_ms -
step_time_ms: the online mode's solves, metrics, checkpoints; evaluation is outside wall time anyway). The gap
at equal time is then computed as compare's raw one is (tfrun.records.compare), once per repeat: its median is
`eval_gap_same_time_paired`, and max - min over the repeats its spread. No torch.
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
    for i, run in enumerate(obj.get("runs") or []):
        steps, ms = run.get("steps"), run.get("step_ms")
        if not (isinstance(steps, list) and steps and isinstance(ms, list) and ms
                and all(isinstance(r, list) and len(r) == len(steps) for r in ms)):
            raise TfrunError(f"{path}: runs[{i}] needs steps and step_ms (one list per repeat, a time per step)")
        if any(t is None or t <= 0 for r in ms for t in r):
            raise TfrunError(f"{path}: runs[{i}].step_ms holds a time that is missing or not positive")
    if not obj.get("runs"):
        raise TfrunError(f"{path}: runs is empty")
    return obj


def timing_of(retime: dict, run_dir: str) -> dict | None:
    """The retime entry of `run_dir` (matched by resolved path), or None."""
    want = Path(run_dir).resolve()
    return next((t for t in retime["runs"] if Path(t["dir"]).resolve() == want), None)


def paired_points(steps: list[dict], timing: dict, repeat: int) -> tuple[list[tuple[int, float, float]], float]:
    """(step, paired training seconds so far, eval loss) at every evaluation of a run's metrics rows `steps`, and
    its paired training time (s), in repeat `repeat` of its retime entry."""
    sampled, ms = timing["steps"], timing["step_ms"][repeat]
    out, seconds, j = [], 0.0, 0
    for row in steps:
        while j + 1 < len(sampled) and sampled[j + 1] <= row["step"]:
            j += 1
        between = max(0.0, row.get("wall_ms", row["step_time_ms"]) - row["step_time_ms"])
        seconds += (ms[j] + between) / 1e3
        if row.get("eval_loss") is not None:
            out.append((row["step"], seconds, row["eval_loss"]))
    return out, seconds


def paired_fields(run_steps: list[dict], run_timing: dict | None, base_steps: list[dict], base_timing: dict,
                  tokens: int, base_tokens: int, loss_at) -> dict:
    """compare's paired columns for one run: `eval_gap_same_time_paired` (median over repeats), its
    `..._spread` (max - min) and per repeat, `paired_training_s` and `paired_speedup` (medians); None where the
    run was not re-timed. `loss_at`: compare.loss_at."""
    none = {"eval_gap_same_time_paired": None, "eval_gap_same_time_paired_spread": None,
            "eval_gap_same_time_paired_repeats": None, "paired_training_s": None, "paired_speedup": None}
    if run_timing is None:
        return none
    gaps, times, speedups = [], [], []
    for repeat in range(min(len(run_timing["step_ms"]), len(base_timing["step_ms"]))):
        points, seconds = paired_points(run_steps, run_timing, repeat)
        base_points, base_seconds = paired_points(base_steps, base_timing, repeat)
        times.append(seconds)
        speedups.append(tokens / seconds / (base_tokens / base_seconds))
        then = loss_at(base_points, points[-1][1]) if points else None
        if then:
            gaps.append((points[-1][2] - then) / then)
    return {"eval_gap_same_time_paired": statistics.median(gaps) if gaps else None,
            "eval_gap_same_time_paired_spread": max(gaps) - min(gaps) if gaps else None,
            "eval_gap_same_time_paired_repeats": gaps or None,
            "paired_training_s": statistics.median(times), "paired_speedup": statistics.median(speedups)}
