"""Drift checks of the online mode (tfrun.freeze.online): are the plan's action times still the run's?

Note [drift]: every `replan_window` steps of the stable phase, each measured action is compared with the
plan's duration for the share it actually froze (d_max - share (d_max - d_min), dispatch aside); if the median
ratio measured / expected of some (stage, kind) end (its unfrozen or its fully frozen time) is off by more than
`replan_threshold`, that end is scaled by its ratio and the LP is solved again, from the next step, without a ramp.
Medians over a window of steps x micro-batches make a single slow step harmless.

Note [unmeasured end]: a heavily frozen stage runs almost no backward unfrozen (and the measured steps' unfrozen
blocks are not judged), so a window may measure only its frozen end. Scaling that end alone by a machine-wide
slow-down (a profile from a faster machine: x1.9 on every measured kind, 2026-12-07) met the clamp frozen <=
unfrozen and made freezing that stage save nothing: the re-plan dropped it from 0.89 to 0.0, and under the replan
bound it climbed back 0.25 a re-plan (0.75 at step 80 of 100; docs/results.md, "The registered rule, decided
alone"). Without evidence on the other end, the line keeps its shape: an end the window did not judge (fewer than
MIN_DRIFT_SAMPLES samples at its share, or a sub-millisecond expected time: `drift`) is scaled by its drifted
partner's ratio, recorded under the partner's key with INFERRED appended (a later window that judges it corrects
it).

The check costs a gather of the window's records on every rank and the judgement on rank 0; it runs between
steps, so a run's wall time (tfrun.measure.wallclock) carries it.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch.distributed as dist

from tfplan.cost import profile as profile_mod
from tfplan.plan import plan as plan_mod
from tfplan.schedule.actions import FREEZABLE, parse_action
from tfrun.measure.timing import ActionTimer

MIN_DRIFT_SAMPLES = 8
"""A (stage, kind) end with fewer samples in a drift window is not judged (one slow step is not a drift)."""
FIELDS = {"F": ("forward_ms",), "B": ("backward_ms", "backward_frozen_ms"), "I": ("backward_input_ms",),
          "W": ("backward_weight_ms", "backward_weight_frozen_ms")}
"""Kind -> the profile fields of its unfrozen time and (freezable kinds) its frozen time."""
INFERRED = "~"
"""Appended to a drifted end's key when it was not measured but scaled as its partner (Note [unmeasured end])."""


def _end(key: str) -> tuple[int, str, bool]:
    """A drift key ("1B", "0W-frozen", "1B~") as (stage, kind, whether it is the frozen end)."""
    base, _, frozen = key.removesuffix(INFERRED).partition("-")
    return int(base[:-1]), base[-1], bool(frozen)


class DriftMonitor:
    """The shares each local (stage, micro-batch) froze in recent steps, and the drift check over them."""

    def __init__(self, window: int, threshold: float) -> None:
        self.window, self.threshold = window, threshold
        self._shares: dict[int, dict[tuple[int, int], float]] = {}
        """Step -> (stage, micro-batch) -> the share it froze; the last two windows only."""
        self._unjudged: set[int] = set()
        """Steps of the last two windows whose times are left out (tfrun.freeze.controller Note [unfrozen
        measurement]: a measured step's hooks and unfrozen block)."""

    def record(self, step: int, shares: dict[tuple[int, int], float], judged: bool = True) -> None:
        """Remember what `step` froze on this rank, and whether its times count; forget steps older than two
        windows (O(1) per step)."""
        self._shares[step] = dict(shares)
        self._shares.pop(step - 2 * self.window, None)
        self._unjudged.discard(step - 2 * self.window)
        if not judged:
            self._unjudged.add(step)

    def due(self, step: int, stable_start: int) -> bool:
        """Whether a check follows `step`: the end of each full window of the stable phase."""
        return step >= stable_start + self.window - 1 and (step - stable_start + 1) % self.window == 0

    def measure(self, step: int, timer: ActionTimer, plan: plan_mod.Plan | None) -> dict[str, float] | None:
        """Collective: every rank's records of the window ending at `step` go to rank 0, which returns
        `drift(plan, rows)` (None on the other ranks)."""
        records, _ = timer.window(step - self.window + 1, step + 1)
        mine = []
        for r in (r for r in records if r.step not in self._unjudged):
            a = parse_action(r.action)
            share = self._shares.get(r.step, {}).get((a.stage, a.mb), 0.0) if a.kind in FREEZABLE else 0.0
            mine.append((r.action, r.end_ms - r.start_ms, share))
        parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, parts, dst=0)
        if parts is None:
            return None
        return drift(plan, [row for part in parts for row in part])

    def drifted(self, ratios: dict[str, float]) -> dict[str, float]:
        """The (stage, kind) ends off by more than the threshold, and each one's partner end that the window did not
        judge (absent from `ratios`), at the same ratio (Note [unmeasured end]; its key ends in INFERRED)."""
        found = {k: v for k, v in ratios.items() if abs(v - 1.0) > self.threshold}
        for key, ratio in list(found.items()):
            stage, kind, frozen = _end(key)
            partner = f"{stage}{kind}" + ("" if frozen else "-frozen")
            if kind in FREEZABLE and partner not in ratios:
                found[partner + INFERRED] = ratio
        return found


def drift(plan: plan_mod.Plan, rows: list[tuple[str, float, float]]) -> dict[str, float]:
    """Per Note [drift], key -> median over the window of measured / planned duration, from rows (action, measured
    ms, share it froze), where the key names a (stage, kind) and which end of its linear model the samples
    measured: "1F" (F and I: fixed), "0B" (B or W that froze nothing: its unfrozen time), "0B-frozen" (that
    froze everything: its frozen time). Samples at partial shares are left out: how a partial share saves time
    depends on the policy (on stage 0 a random subset saves little until everything is frozen), and the
    model's line must not be refitted to it."""
    dag = plan.dag
    node = {str(a): v for v, a in enumerate(dag.actions)}
    ratios: dict[str, list[float]] = {}
    for action, measured_ms, share in rows:
        v, a = node[action], parse_action(action)
        if a.kind in FREEZABLE and 1e-6 < share < 1 - 1e-6:
            continue
        frozen = a.kind in FREEZABLE and share >= 1 - 1e-6
        expected = (dag.d_min[v] if frozen else dag.d_max[v]) - dag.dispatch_ms
        if expected > 0.5:  # sub-millisecond actions (a frozen stage-0 backward) are all noise
            ratios.setdefault(f"{a.stage}{a.kind}{'-frozen' if frozen else ''}", []).append(measured_ms / expected)
    return {k: statistics.median(v) for k, v in ratios.items() if len(v) >= MIN_DRIFT_SAMPLES}


def plan_profile(plan: plan_mod.Plan, name: str | None = None, source: dict | None = None) -> profile_mod.Profile:
    """The profile a plan was solved with (its stage costs, lags and overhead)."""
    dag = plan.dag
    return profile_mod.Profile(name=name or plan.profile_name, source=source or dict(plan.profile_source),
                               p2p_ms=dag.p2p_ms, dispatch_ms=dag.dispatch_ms, step_overhead_ms=dag.step_overhead_ms,
                               stages=tuple(dag.stage_costs))


def scaled_profile(plan: plan_mod.Plan, drifted: dict[str, float]) -> profile_mod.Profile:
    """The plan's profile with each drifted end of each (stage, kind) scaled by its measured ratio (frozen
    times kept at or below unfrozen ones)."""
    costs = list(plan.dag.stage_costs)
    for key, ratio in drifted.items():
        s, kind, frozen = _end(key)
        fields = FIELDS[kind][1:] if frozen else FIELDS[kind][:1]
        costs[s] = replace(costs[s], **{f: getattr(costs[s], f) * ratio for f in fields})
    for s, c in enumerate(costs):
        costs[s] = replace(c, backward_frozen_ms=min(c.backward_frozen_ms, c.backward_ms),
                           backward_weight_frozen_ms=min(c.backward_weight_frozen_ms, c.backward_weight_ms))
    return replace(plan_profile(plan, f"{plan.profile_name}-rescaled", {"kind": "measured", "rescaled": drifted}),
                   stages=tuple(costs))


def describe(drifted: dict[str, float]) -> str:
    """The re-plan's reason: "drift: stage 1 F x1.30, stage 0 B frozen x0.80"."""
    def words(key: str) -> str:
        stage, kind, frozen = _end(key)
        return f"stage {stage} {kind}" + (" frozen" if frozen else "")

    return "drift: " + ", ".join(f"{words(k)} x{v:.2f}" + (" (not measured: as its other end)" if
                                                           k.endswith(INFERRED) else "")
                                 for k, v in sorted(drifted.items()))
