"""Learning efficiency read from loss curves alone: how much of a step's progress a frozen run kept.

Note [efficiency from curves]: a run's eval losses are exact for its seed, so the learning price of freezing
needs no clock. For a frozen run F and the unfrozen run U of the same data seed, at each of F's evaluations
(after s_F steps, eval loss L) the efficiency is
    e = s_U(L) / s_F,
s_U(L) the steps U needs to first reach L: linear between U's evaluations on U's running minimum (so that a
noisy uptick of U's curve does not make it reach L twice). e = 1: F kept every step's progress; e = 0.6: it
needs 1 / 0.6 steps for one of U's. e is None where L lies outside U's reach: below U's best (F learnt more than
U did in all its steps) or above U's first evaluation (U got there before anyone looked). The run's summary
`efficiency` is the median of e over its evaluations in the second half of the run (the first half holds the
steep early fall, where one evaluation's few steps decide e), None without any.

Its noise from the eval set (Note [eval losses] in tfrun.train): the eval set is fixed, so F and U are
compared on the same micro-batches, and the standard error of their mean loss difference at one step (the
spread of the per-micro-batch differences over sqrt(count)) is what a larger eval set would still move. Through
the slope of U's curve at the crossing that is an error in steps, and over s_F one in e: `efficiency_eval_se`,
the median over the same second-half evaluations. Below the scatter between freeze seeds (the same data, another
draw of which micro-batches freeze), the eval set is large enough.

Note [trajectory floor]: a run's losses are exact for its seed, but any change to what it computes moves it onto
another trajectory: from scratch at 8,192 tokens a step, a control that freezes 5% of one stage's micro-batches
(too little to cost learning by any model) ended 100 steps 0.03-0.09 nats above the unfrozen run, an efficiency
of 0.90-0.97 against it (docs/results.md, fourth edition). One unfrozen run is one draw of the unfrozen
trajectory, not its typical curve, and a run's efficiency against it carries that draw's luck. So a price is
measured against several unfrozen-equivalent runs (the unfrozen one and such controls: their pointwise median
curve, benchmarks/calibration_report.py), and the controls' own scatter around it is the floor below which a
price cannot be told from the trajectory's.

Reads runs as tfrun.records.compare loads them; no torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def curve_of(steps: list[dict]) -> list[tuple[int, float, list[float] | None]]:
    """(steps completed, eval loss, per-micro-batch eval losses or None) at every evaluation of a run's rows."""
    return [(row["step"] + 1, row["eval_loss"], row.get("eval_microbatch_losses")) for row in steps
            if row.get("eval_loss") is not None]


def steps_to_reach(curve: Sequence[tuple[int, float]], loss: float) -> float | None:
    """Steps the run of `curve` ((steps, eval loss), in order) needs to first reach `loss`, linear between its
    evaluations on its running minimum; None outside its reach (Note [efficiency from curves]).

    >>> steps_to_reach([(10, 3.0), (20, 2.0), (30, 2.2), (40, 1.5)], 2.5)
    15.0
    >>> steps_to_reach([(10, 3.0), (20, 2.0), (30, 2.2), (40, 1.5)], 1.75)
    30.0
    >>> steps_to_reach([(10, 3.0), (20, 2.0)], 1.9), steps_to_reach([(10, 3.0), (20, 2.0)], 3.1)
    (None, None)
    """
    if not curve or loss > curve[0][1]:
        return None
    best_steps, best = curve[0]
    if loss == best:
        return float(best_steps)
    for steps, value in curve[1:]:
        if value <= loss:
            return best_steps + (steps - best_steps) * (best - loss) / (best - value)
        if value < best:
            best_steps, best = steps, value
    return None


def pointwise(run_steps: list[dict], base_steps: list[dict]) -> list[tuple[int, float | None, float | None]]:
    """(steps, efficiency, its eval-set standard error) at each evaluation of a run against the unfrozen run
    (Note [efficiency from curves]); the error is None where the two were not evaluated at the same step."""
    base = curve_of(base_steps)
    plain = [(s, loss) for s, loss, _ in base]
    by_step = {s: each for s, _, each in base}
    out = []
    for steps, loss, each in curve_of(run_steps):
        reached = steps_to_reach(plain, loss)
        eff = None if reached is None else reached / steps
        se = None
        if eff is not None and each is not None and by_step.get(steps) is not None:
            se = _eval_se(each, by_step[steps], plain, reached, steps)
        out.append((steps, eff, se))
    return out


def _eval_se(each: list[float], base_each: list[float], plain: list[tuple[int, float]], reached: float,
             steps: int) -> float | None:
    """The eval set's standard error on one efficiency: the paired standard error of the two runs' mean eval loss
    over the slope (loss per step) of the unfrozen curve's segment at the crossing, over the run's steps."""
    pairs = [a - b for a, b in zip(each, base_each) if a is not None and b is not None]
    if len(pairs) < 2 or len(each) != len(base_each):
        return None
    se_loss = statistics.stdev(pairs) / math.sqrt(len(pairs))
    for (s0, l0), (s1, l1) in zip(plain, plain[1:]):
        if s0 <= reached <= s1 and l1 != l0:
            return se_loss / abs((l1 - l0) / (s1 - s0)) / steps
    return None


def summarise(points: list[tuple[int, float | None, float | None]], total_steps: int) -> dict:
    """A run's `efficiency` (median over the second half: Note [efficiency from curves]), `efficiency_eval_se` and
    `efficiency_points` (how many evaluations the median is over)."""
    late = [(e, se) for steps, e, se in points if steps > total_steps / 2 and e is not None]
    errors = [se for _, se in late if se is not None]
    return {"efficiency": statistics.median(e for e, _ in late) if late else None,
            "efficiency_eval_se": statistics.median(errors) if errors else None,
            "efficiency_points": len(late)}


CELL_FIELDS_IGNORED = ("out_dir", "freeze_seed", "quiet", "threads", "tensorboard", "checkpoint_every",
                       "checkpoint_minutes", "keep_checkpoints", "resume", "resume_step", "token_cache", "retime",
                       "force", "prediction_note", "plan_path")
"""Run settings that do not change what a method does: runs that differ only in these (and in --freeze-seed) are
one calibration cell, seen through several draws of which micro-batches freeze."""


def cell_key(config: dict) -> str:
    """The identity of a run's cell (CELL_FIELDS_IGNORED left out)."""
    import json

    return json.dumps({k: v for k, v in sorted(config.items()) if k not in CELL_FIELDS_IGNORED}, sort_keys=True)


def seed_spread(rows: list[dict], keys: list[str]) -> None:
    """Per cell (runs of one `keys` value), the efficiency's scatter over freeze seeds, written into each row:
    `efficiency_cell` (the median over the cell's runs), `efficiency_seed_spread` (max - min) and
    `efficiency_seeds` (runs with a value)."""
    groups: dict[str, list[dict]] = {}
    for row, key in zip(rows, keys):
        groups.setdefault(key, []).append(row)
    for group in groups.values():
        values = [r["efficiency"] for r in group if r.get("efficiency") is not None]
        for r in group:
            r["efficiency_cell"] = statistics.median(values) if values else None
            r["efficiency_seed_spread"] = max(values) - min(values) if len(values) > 1 else None
            r["efficiency_seeds"] = len(values)
