"""Online TimelyFreeze (`tfrun train --freeze timely`): a run measures its own pipeline, solves the LP and
freezes, re-planning when its action times drift (METHOD.md section 5, and beyond it).

Phases, in optimizer steps (lengths from the run's config; `--plan` seeds the first plan and skips monitor
and probe):
  warmup   no freezing; nothing measured (shapes, allocator and caches settle);
  monitor  no freezing; every action timed: F, B (or I and W), dispatch, p2p, the ranks' tails, the step;
  probe    Note [probe]: whole micro-batches frozen on every stage, the rest not: frozen B / W times;
  (solve)  on rank 0 with tfplan's job path (tfplan.plan.job.solve_schedule, the solver and defaults of
           `tfplan solve`) from the profile of the monitor and probe steps (tfrun.measure.profile.measured_profile,
           the one profile builder); the plan is broadcast, so every rank applies the identical plan, and
           written to DIR/plan.json and DIR/plans/stepNNNNNNN.json;
  ramp     ratios rise linearly to the plan;
  stable   the plan in force; drift checks (tfrun.freeze.drift Note [drift]).

Note [online goodput]: under `--objective goodput` every monitor step also measures each stage's gradient
noise scale (tfrun.freeze.noise), the first plan maximises predicted goodput (tfplan.solve.fastlp.goodput) on the
profile of the monitor and probe steps with that noise section, and each drift check also compares the stages' noise
scales with the plan's: one off by more than NOISE_REPLAN (relative; the noise scale grows as the loss falls)
is a reason to solve again with the current estimates, like a drifted action time. Under --noise-replan-z Z the
move must also exceed Z standard errors of the two estimates (tfrun.freeze.noise_estimators Note [noise gate]):
the estimate's own scatter is not a reason to re-plan. A seeded run (--plan) starts from a plan solved without
its noise: its first drift check solves for goodput with the run's first estimates, drift or not.

Note [probe]: the reference freezes everything for about 110 steps to measure the lower bound, while little
is learned. We freeze a block of max(1, M / 4) whole micro-batches per probe step, moving each step, so a few
steps give every stage's frozen time several samples while three quarters of each step still trains.

Every phase start, the probe, each solve and re-plan are records of metrics.jsonl with an "event" field. The
solves and drift checks run between steps: a run's wall time carries them (tfrun.measure.wallclock Note [wall time]),
and the run's summary (tfrun.records.summarize.summarize) reports each plan against the steps it was in force for.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch.distributed as dist

from tfplan.cost import goodput
from tfplan.cost.goodput import NoiseModel
from tfplan.fileio import write_json_atomic
from tfplan.plan import job
from tfplan.plan import plan as plan_mod
from tfplan.schedule.actions import FREEZABLE, parse_action
from tfplan.solve.lp import DEFAULT_TIME_LIMIT_S
from tfrun.config.train_config import TrainConfig
from tfrun.errors import TfrunError
from tfrun.freeze import drift
from tfrun.freeze.freezing import Freezer
from tfrun.freeze.noise import NoiseMeter, noise_scale
from tfrun.measure import profile as measure
from tfrun.measure.timing import ActionTime, ActionTimer, gather_records
from tfrun.records import summarize

SOLVE_LIMIT_S = DEFAULT_TIME_LIMIT_S
"""The in-run solve's time limit (tfplan solve's default); Note [solve timeout]."""
NOISE_REPLAN = 0.25
"""Re-plan when a stage's noise scale moved by more than this share since the plan (Note [online goodput])."""


def phase_bounds(config: TrainConfig) -> list[tuple[str, int, int | None]]:
    """(name, first step, end step exclusive or None) of each phase, in order."""
    seeded = config.plan_path is not None
    lengths = [("warmup", config.warmup_steps), ("monitor", 0 if seeded else config.monitor_steps),
               ("probe", 0 if seeded else config.probe_steps), ("ramp", config.ramp_steps)]
    out, step = [], 0
    for name, n in lengths:
        if n:
            out.append((name, step, step + n))
            step += n
    out.append(("stable", step, None))
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanInForce:
    """One plan put in force during a run."""

    step: int
    """The first step it froze (ramped from there for the first plan)."""
    predicted_ms: float
    """Its predicted step time."""
    reason: str
    """"first plan", "seed plan" or the drift that caused it."""

    def to_dict(self) -> dict:
        return {"step": self.step, "predicted_ms": self.predicted_ms, "reason": self.reason}


class OnlinePlanner:
    """The online mode's state on one rank; decisions are made on rank 0 and broadcast."""

    def __init__(self, config: TrainConfig, freezer: Freezer, timer: ActionTimer, out: Path,
                 stage_numel: dict[int, int], noise: NoiseMeter | None = None) -> None:
        self.config, self.freezer, self.timer, self.out = config, freezer, timer, out
        self.bounds = phase_bounds(config)
        self.stage_numel = stage_numel
        self.plan: plan_mod.Plan | None = None
        """The plan in force, identical on every rank."""
        self.plan_json: dict | None = None
        """Its JSON as solved (what plan.json, plans/ and the checkpoint hold)."""
        self.plans: list[PlanInForce] = []
        self.solve_s: list[float] = []
        self.drift = drift.DriftMonitor(config.replan_window, config.replan_threshold)
        self.noise = noise
        """The rank's noise meter (tfrun.freeze.noise), read under --objective goodput (Note [online goodput])."""
        self.noise_model: NoiseModel | None = None
        """The noise section the plan in force was solved with (goodput), else None."""
        self.noise_spread: dict[int, float] = {}
        """Stage -> the standard error of the log of noise_model's noise scale (under --noise-replan-z)."""
        # Note [solve timeout]: rank 0 solves while the others wait in a broadcast. The default group's
        # collective timeout is short (a dead rank must be noticed quickly), so the plan travels in a group of
        # its own whose timeout outlasts the solve's time limit.
        self.group = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=SOLVE_LIMIT_S + 180))
        if config.plan_path is not None:  # a seed plan: in force (ramped) from the end of the warm-up
            self.plan_json = plan_mod.to_dict(plan_mod.load(config.plan_path))
            self.plan = plan_mod.from_dict(self.plan_json)

    def phase(self, step: int) -> str:
        return next(name for name, lo, hi in self.bounds if step >= lo and (hi is None or step < hi))

    def start(self, name: str) -> int:
        return next(lo for n, lo, _ in self.bounds if n == name)

    def measures_noise(self, step: int) -> bool:
        """Whether `step` must measure the noise scale whatever --noise-every says (Note [online goodput])."""
        return self.config.objective == "goodput" and self.phase(step) == "monitor"

    def before_step(self, step: int) -> list[dict]:
        """Set the freezer for `step`; returns the event records of phases starting at `step`."""
        events = []
        for name, lo, _ in self.bounds:
            if lo == step:
                events.append({"event": "phase", "phase": name, "step": step, "time": time.time()})
                if name == "probe":
                    self.freezer.set_probe(step, max(1, self.config.num_microbatches // 4))
                if name != "warmup" and self.plan is not None and not self.plans:  # the seed plan, ramped
                    self._apply(self.plan_json, step, self.config.ramp_steps, "seed plan", events)
        return events

    def after_step(self, step: int, metrics: list[dict], shares: dict[tuple[int, int], float]) -> list[dict]:
        """After `step` (all ranks call it, with what this rank's stages froze): solve at the end of the probe,
        check drift in the stable phase. O(1) in the run's length but at those steps (O(window))."""
        self.drift.record(step, shares)
        probe_end = next((hi for n, _, hi in self.bounds if n == "probe"), None)
        if probe_end is not None and step == probe_end - 1 and self.plan is None:
            return self._solve_from_probe(step, metrics)
        if self.plan is not None and self.drift.due(step, self.start("stable")):
            return self._check_drift(step)
        return []

    # -- the first plan -------------------------------------------------------------------------------------

    def _solve_from_probe(self, step: int, metrics: list[dict]) -> list[dict]:
        monitor, probe = (self.start("monitor"), self.start("probe")), (self.start("probe"), step + 1)
        records, spans = self.timer.window(monitor[0], probe[1])
        all_records = gather_records(records)
        all_spans = gather_records([s for s in spans if s.step < monitor[1]])
        noise = self._noise_model()
        spread = self._noise_spread()
        plan = solve_s = None
        if dist.get_rank() == 0:
            in_probe = {(s, m) for s in range(*probe) for m in self.freezer.probe_microbatches(s)}

            def share_of(r: ActionTime) -> float:
                return 1.0 if (r.step, parse_action(r.action).mb) in in_probe else 0.0

            step_ms = statistics.median(row["step_time_ms"] for row in summarize.step_rows(metrics)
                                        if monitor[0] <= row["step"] < monitor[1])
            prof = measure.measured_profile(
                self.config, all_records, all_spans, step_ms, f"online-{self.config.model}", self.stage_numel,
                share_of=share_of, replay_records=[r for r in all_records if r.step < monitor[1]])
            plan, solve_s = self._solve(replace(prof, noise=noise))
        plan, solve_s = _broadcast((plan, solve_s), self.group)
        self.noise_model, self.noise_spread = noise, spread
        events = [{"event": "probe", "step": step, "probe_steps": probe[1] - probe[0], "time": time.time(),
                   "microbatches_per_step": self.freezer.probe[1]}]
        self._apply(plan, step + 1, self.config.ramp_steps, "first plan", events, solve_s)
        return events

    def _solve(self, prof) -> tuple[dict, float]:
        """Rank 0: the LP for this run's schedule on `prof` (tfplan's job path); the plan JSON, solve seconds."""
        start = time.perf_counter()
        plan = job.solve_schedule(self.config.schedule(), prof, self.config.max_freeze_ratio,
                                  time_limit_s=SOLVE_LIMIT_S, objective=self.config.objective)
        return plan_mod.to_dict(plan), time.perf_counter() - start

    def _noise_model(self, required: bool = True) -> NoiseModel | None:
        """Under --objective goodput, the stages' current noise estimates as a profile's noise section (every
        rank takes part: a gather), else None; when some stage has none yet, an error if `required`, else the
        noise the plan in force was solved with."""
        if self.config.objective != "goodput" or self.noise is None:
            return None
        both, _ = self.noise.gathered()
        scales = [noise_scale(*both[s]) if s in both else None for s in range(self.config.num_stages)]
        if any(x is None for x in scales):
            if not required:
                return self.noise_model
            raise TfrunError(f"--objective goodput: the monitor phase measured no positive |G|^2 on some stage "
                             f"(noise scales {scales}): lengthen --monitor-steps")
        total = sum(both[s][0] for s in range(self.config.num_stages))
        updates = self.noise.gathered_update_norms()
        norms = [updates.get(s, 0.0) for s in range(self.config.num_stages)]
        return goodput.measured(scales, [both[s][0] / total for s in range(self.config.num_stages)],
                                self.config.microbatch_size * self.config.seq_len,
                                [x / sum(norms) for x in norms] if sum(norms) > 0 else None,
                                learning_model=self.config.learning_model, adam_beta1=self.config.adam_betas[0],
                                note="tfrun --freeze timely --objective goodput, the monitor phase")

    def _noise_spread(self) -> dict[int, float]:
        """Under --noise-replan-z, the stages' jackknife standard errors of their log noise scales (every rank
        takes part: a gather), else {}."""
        if self.config.objective != "goodput" or self.noise is None or not self.config.noise_replan_z:
            return {}
        return self.noise.gathered_log_spread()

    def _apply(self, plan_json: dict, step: int, ramp: int, reason: str, events: list[dict],
               solve_s: float | None = None) -> None:
        """Put the plan `plan_json` in force from `step` on every rank; rank 0 writes it."""
        old = self.plans[-1].predicted_ms if self.plans else None
        plan = self.plan = plan_mod.from_dict(plan_json)
        self.plan_json = plan_json
        local = set(self.freezer.stage_candidates)
        ratios = {(a.stage, a.mb): r for a, r in ((parse_action(x), r) for x, r in plan.ratio_of().items())
                  if a.kind in FREEZABLE and r > 0 and a.stage in local}
        self.freezer.set_plan(ratios, step, ramp)
        predicted = plan.predicted.planned_ms
        self.plans.append(PlanInForce(step=step, predicted_ms=predicted, reason=reason))
        if solve_s is not None:
            self.solve_s.append(solve_s)
        if dist.get_rank() == 0:
            (self.out / "plans").mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.out / "plans" / f"step{step:07d}.json", plan_json)
            write_json_atomic(self.out / "plan.json", plan_json)
        events.append({"event": "plan", "step": step, "reason": reason, "time": time.time(),
                       "old_predicted_ms": old, "new_predicted_ms": predicted, "solve_s": solve_s,
                       "mean_freeze_ratio": plan.mean_ratio_per_stage()})
        if self.noise_spread:  # (--noise-replan-z) the spreads it was solved with; null: not resolved
            events[-1]["noise_log_se"] = [None if not math.isfinite(v := self.noise_spread.get(s, math.inf)) else v
                                          for s in range(self.config.num_stages)]

    # -- drift ----------------------------------------------------------------------------------------------

    def _check_drift(self, step: int) -> list[dict]:
        measured = self.drift.measure(step, self.timer, self.plan)
        noise = self._noise_model(required=self.noise_model is None)  # goodput: the current estimates
        spread = self._noise_spread()
        if noise is self.noise_model:  # (some stage has no estimate now: the plan's noise, and its spreads)
            spread = self.noise_spread
        decision = None
        if measured is not None:
            drifted = self.drift.drifted(measured)
            moved = _noise_moved(self.noise_model, noise, self.noise_spread, spread, self.config.noise_replan_z)
            if drifted or moved:
                prof = drift.scaled_profile(self.plan, drifted)
                plan, solve_s = self._solve(replace(prof, noise=noise))
                reasons = ([drift.describe(drifted)] if drifted else []) + ([moved] if moved else [])
                decision = (plan, solve_s, "; ".join(reasons), noise, spread)
        decision = _broadcast(decision, self.group)
        if decision is None:
            return []
        plan, solve_s, reason, noise, spread = decision
        if noise is not None:
            self.noise_model, self.noise_spread = noise, spread
        events: list[dict] = []
        self._apply(plan, step + 1, 0, reason, events, solve_s)
        return events

    # -- reports --------------------------------------------------------------------------------------------

    def describe(self) -> str:
        """The phases as one line (printed at the start of a run)."""
        parts = [f"{n} {lo}-{hi - 1}" if hi is not None else f"{n} from {lo}" for n, lo, hi in self.bounds]
        c = self.config
        seed = f", seeded by {c.plan_path}" if c.plan_path else ""
        noise = ""
        if c.objective == "goodput":
            gate = f" and by more than {c.noise_replan_z:g} standard errors" if c.noise_replan_z else ""
            noise = f" or a stage's noise scale moves by more than {NOISE_REPLAN:.0%}{gate}"
        return (f"online TimelyFreeze{seed}: {', '.join(parts)}; caps {c.max_freeze_ratio}; re-plan when an "
                f"action kind drifts by more than {c.replan_threshold:.0%}{noise} (checked every "
                f"{c.replan_window} steps)")

    def record(self) -> summarize.OnlineRecord:
        """What the run's summary needs of the online mode (tfrun.records.summarize.summarize)."""
        return summarize.OnlineRecord(
            bounds=self.bounds, plans=[p.to_dict() for p in self.plans], solve_s=list(self.solve_s),
            planned_freeze_ratio=self.plan.mean_ratio_per_stage() if self.plan is not None else None)

    def profile(self):
        """The profile of the plan in force (measured in this run, rescaled at each re-plan), or None."""
        if self.plan is None:
            return None
        return drift.plan_profile(self.plan, source={"kind": "measured", "tool": "tfrun --freeze timely"})

    # -- state ----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The plans, and until the first is solved the monitor and probe measurements so far (so that a run
        resumed in either phase continues it)."""
        measuring: tuple[list, list] = ([], [])
        if self.plan is None and any(n == "monitor" for n, _, _ in self.bounds):
            probe_end = next(hi for n, _, hi in self.bounds if n == "probe")
            measuring = tuple([(r.step, r.action, r.rank, r.start_ms, r.end_ms) for r in rows]
                              for rows in self.timer.window(self.start("monitor"), probe_end))
        return {"plan": self.plan_json, "plans": [p.to_dict() for p in self.plans], "solve_s": self.solve_s,
                "measuring": measuring, "noise": self.noise_model.to_dict() if self.noise_model else None,
                "noise_spread": self.noise_spread}

    def load_state_dict(self, state: dict) -> None:
        self.plan_json = state["plan"]
        self.plan = plan_mod.from_dict(self.plan_json) if self.plan_json is not None else None
        self.plans = [PlanInForce(**p) for p in state["plans"]]
        self.solve_s = list(state["solve_s"])
        noise = state.get("noise")
        self.noise_model = None if noise is None else goodput.from_dict(noise, len(noise["noise_scale_tokens"]), None)
        # (a checkpoint from before --noise-replan-z has none)
        self.noise_spread = {int(s): float(v) for s, v in state.get("noise_spread", {}).items()}
        self.timer.restore(*([ActionTime(*row) for row in rows] for rows in state["measuring"]))


def _noise_moved(planned: NoiseModel | None, now: NoiseModel | None, planned_spread: dict[int, float],
                 now_spread: dict[int, float], z: float) -> str | None:
    """Why the noise scales call for a new plan (Note [online goodput]), or None. With z > 0 a stage's move
    counts only beyond z standard errors of its two log estimates (`*_spread`, stage -> standard error; a
    stage missing from either has no resolved spread and does not count: Note [noise gate])."""
    if now is None:
        return None
    if planned is None:  # a seeded run's first check: its plan was solved without noise
        return "noise: the first estimates (the seed plan had none)"
    moved = []
    for s, (a, b) in enumerate(zip(planned.noise_scale_tokens, now.noise_scale_tokens)):
        if not (a > 0 and abs(b / a - 1.0) > NOISE_REPLAN):
            continue
        text = f"stage {s} x{b / a:.2f}"
        if z > 0:  # (b <= 0 is no resolved estimate: no log to compare)
            se = math.hypot(planned_spread.get(s, math.inf), now_spread.get(s, math.inf))
            if b <= 0 or not abs(math.log(b / a)) > z * se:
                continue
            text += f" ({abs(math.log(b / a)) / se:.1f} SE)" if se > 0 else ""
        moved.append(text)
    return "noise: " + ", ".join(moved) if moved else None


def _broadcast(obj, group):
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]
