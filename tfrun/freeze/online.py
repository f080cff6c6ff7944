"""Online TimelyFreeze (`tfrun train --freeze timely`): a run measures its own pipeline, solves the LP and
freezes, re-planning when its action times drift (METHOD.md section 5, and beyond it).

Phases, in optimizer steps (lengths from the run's config; `--plan` seeds the first plan and skips monitor
and probe, under --objective goodput only a plan solved for goodput; tfrun.freeze.phases says which step does what):
  warmup   no freezing; nothing measured (shapes, allocator and caches settle);
  monitor  no freezing; every action timed: F, B (or I and W), dispatch, p2p, the ranks' tails, the step;
  probe    Note [probe]: whole micro-batches frozen on every stage, the rest not: frozen B / W times;
  (solve)  on rank 0 with tfplan's job path (tfplan.plan.job.solve_schedule, the solver and defaults of
           `tfplan solve`) from the profile of the monitor and probe steps (tfrun.measure.profile.measured_profile,
           the one profile builder); the plan is broadcast, so every rank applies the identical plan, and
           written to DIR/plan.json and DIR/plans/stepNNNNNNN.json;
  ramp     ratios rise linearly to the plan;
  stable   the plan in force; drift checks (tfrun.freeze.drift Note [drift]).

Note [online goodput]: under `--objective goodput` every other monitor step also measures each stage's gradient
noise scale (tfrun.freeze.noise; tfrun.freeze.phases Note [hook-free profile]), the first plan maximises predicted
goodput (tfplan.solve.fastlp.goodput) on the profile of the monitor and probe steps with that noise section, and
every check of the stable phase goes to the goodput controller (tfrun.freeze.controller Note [goodput controller]):
a new plan only when the learning model's inputs moved beyond their standard errors (--noise-replan-z, 2 by default
under goodput; 0: the third study's relative rule) or an action time drifted, with hysteresis and a bound on each
move; measured steps leave whole micro-batches unfrozen (Note [unfrozen measurement] there).

Note [idle plan]: while the plan in force freezes nothing, a check gathers the learning inputs (a few numbers per
stage) and solves only when they moved; the action times, whose gather is most of a check's cost, are judged at
every IDLE_DRIFT_EVERY-th check only, and a measured step has nothing to unfreeze. What the mode then costs beside
unfrozen training is its monitor (every other step measured), its probe and first solve, and these checks
(benchmarks/controller_cost.py measures them).

Note [probe]: the reference freezes everything for about 110 steps to measure the lower bound, while little
is learned. We freeze a block of max(1, M / 4) whole micro-batches per probe step, moving each step, so a few
steps give every stage's frozen time several samples while three quarters of each step still trains.

Every phase start, the probe, each solve and re-plan are records of metrics.jsonl with an "event" field. The
solves and drift checks run between steps: a run's wall time carries them (tfrun.measure.wallclock Note [wall time]),
and the run's summary (tfrun.records.summarize.summarize) reports each plan against the steps it was in force for.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch.distributed as dist

from tfplan.cost import goodput
from tfplan.fileio import write_json_atomic
from tfplan.plan import job
from tfplan.plan import plan as plan_mod
from tfplan.schedule.actions import FREEZABLE, parse_action
from tfplan.solve.lp import DEFAULT_TIME_LIMIT_S
from tfrun.config.train_config import TrainConfig
from tfrun.errors import TfrunError
from tfrun.freeze import controller, drift
from tfrun.freeze.controller import IDLE_DRIFT_EVERY, Inputs
from tfrun.freeze.freezing import Freezer
from tfrun.freeze.noise import NoiseMeter
from tfrun.freeze.phases import forces_noise, phase_bounds, profiled_steps, seed_starts
from tfrun.measure import profile as measure
from tfrun.measure.timing import ActionTime, ActionTimer, gather_records
from tfrun.records import summarize

SOLVE_LIMIT_S = DEFAULT_TIME_LIMIT_S
"""The in-run solve's time limit (tfplan solve's default); Note [solve timeout]."""


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
        self.goodput = config.objective == "goodput"
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
        self.reference: Inputs | None = None
        """goodput: the learning inputs the plan in force was last judged with (tfrun.freeze.controller)."""
        self.pending = False
        """goodput: the last re-plan's move was cut short by the bound (Note [replan bound])."""
        self.checks = 0
        """Checks of the stable phase so far (Note [idle plan])."""
        # Note [solve timeout]: rank 0 solves while the others wait in a broadcast. The default group's
        # collective timeout is short (a dead rank must be noticed quickly), so the plan travels in a group of
        # its own whose timeout outlasts the solve's time limit.
        self.group = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=SOLVE_LIMIT_S + 180))
        seeded = False
        if config.plan_path is not None:  # a seed plan: in force (ramped) from the end of the warm-up
            seed_json = plan_mod.to_dict(plan_mod.load(config.plan_path))
            seed = plan_mod.from_dict(seed_json)
            if seeded := seed_starts(seed, config):
                self.plan_json, self.plan = seed_json, seed
                if self.goodput:  # its noise section, without a measured error (Note [learning gate])
                    n, noise = config.num_stages, seed.goodput.noise
                    if noise.update_share is not None or config.learning_model != "adam":
                        noise = goodput.with_learning_model(noise, config.learning_model)
                    self.reference = Inputs(noise=noise, noise_log_se=(None,) * n, weight_log_se=(None,) * n,
                                            measured_se=False)
        self.bounds = phase_bounds(config, seeded)

    def phase(self, step: int) -> str:
        return next(name for name, lo, hi in self.bounds if step >= lo and (hi is None or step < hi))

    def start(self, name: str) -> int:
        return next(lo for n, lo, _ in self.bounds if n == name)

    def measures_noise(self, step: int) -> bool:
        """Whether `step` must measure the noise scale whatever --noise-every says (Note [online goodput])."""
        return forces_noise(self.config, self.bounds, step)

    def before_step(self, step: int) -> list[dict]:
        """Set the freezer for `step`; returns the event records of phases starting at `step`."""
        events = []
        for name, lo, _ in self.bounds:
            if lo == step:
                events.append({"event": "phase", "phase": name, "step": step, "time": time.time()})
                if name == "probe":
                    self.freezer.set_probe(step, max(1, self.config.num_microbatches // 4))
                if name != "warmup" and self.plan is not None and not self.plans:  # the seed plan, ramped
                    self._apply(self.plan_json, step, self.config.ramp_steps, "seed plan", events,
                                explain=self._seed_explain())
        if self.goodput and self.noise is not None and self.noise.measured_this_step and self.plan is not None \
                and self.phase(step) in ("ramp", "stable"):  # Note [unfrozen measurement]
            self.freezer.set_measured(step, controller.measured_block(self.noise.measured,
                                                                      self.config.num_microbatches))
        return events

    def after_step(self, step: int, metrics: list[dict], shares: dict[tuple[int, int], float]) -> list[dict]:
        """After `step` (all ranks call it, with what this rank's stages froze): solve at the end of the probe,
        check drift in the stable phase. O(1) in the run's length but at those steps (O(window))."""
        self.drift.record(step, shares, judged=not (self.goodput and self.noise is not None
                                                    and self.noise.measured_this_step))
        probe_end = next((hi for n, _, hi in self.bounds if n == "probe"), None)
        if probe_end is not None and step == probe_end - 1 and self.plan is None:
            return self._solve_from_probe(step, metrics)
        if self.plan is not None and self.drift.due(step, self.start("stable")):
            return self._check_goodput(step) if self.goodput else self._check_drift(step)
        return []

    # -- the first plan -------------------------------------------------------------------------------------

    def _solve_from_probe(self, step: int, metrics: list[dict]) -> list[dict]:
        monitor, probe = (self.start("monitor"), self.start("probe")), (self.start("probe"), step + 1)
        # (under goodput the steps that measured the noise are left out: tfrun.freeze.phases Note [hook-free profile])
        c, bounds = self.config, self.bounds
        timed = profiled_steps(c, bounds, *monitor, 2) | profiled_steps(c, bounds, *probe, 1)
        records, spans = self.timer.window(monitor[0], probe[1])
        all_records = gather_records([r for r in records if r.step in timed])
        all_spans = gather_records([s for s in spans if s.step < monitor[1] and s.step in timed])
        inputs = self._inputs(required=True)
        plan = solve_s = None
        if dist.get_rank() == 0:
            in_probe = {(s, m) for s in range(*probe) for m in self.freezer.probe_microbatches(s)}

            def share_of(r: ActionTime) -> float:
                return 1.0 if (r.step, parse_action(r.action).mb) in in_probe else 0.0

            step_ms = statistics.median(row["step_time_ms"] for row in summarize.step_rows(metrics)
                                        if monitor[0] <= row["step"] < monitor[1] and row["step"] in timed)
            prof = measure.measured_profile(
                self.config, all_records, all_spans, step_ms, f"online-{self.config.model}", self.stage_numel,
                share_of=share_of, replay_records=[r for r in all_records if r.step < monitor[1]])
            plan, solve_s = self._solve(replace(prof, noise=inputs.noise if inputs is not None else None))
        plan, solve_s = _broadcast((plan, solve_s), self.group)
        self.reference = inputs
        events = [{"event": "probe", "step": step, "probe_steps": probe[1] - probe[0], "time": time.time(),
                   "microbatches_per_step": self.freezer.probe[1]}]
        explain = None
        if self.goodput:  # the unfrozen run is the plan before it (goodput 1.0 by definition)
            after = plan["goodput"]["goodput"]
            explain = {"moves": [], "goodput_before": 1.0, "goodput_after": after, "goodput_target": after}
        self._apply(plan, step + 1, self.config.ramp_steps, "first plan", events, solve_s, explain)
        return events

    def _solve(self, prof) -> tuple[dict, float]:
        """Rank 0: the LP for this run's schedule on `prof` (tfplan's job path); the plan JSON, solve seconds."""
        start = time.perf_counter()
        plan = self._solved(prof, None, self.config.objective)
        return plan_mod.to_dict(plan), time.perf_counter() - start

    def _solved(self, prof, caps: list[float] | None, objective: str) -> plan_mod.Plan:
        """Rank 0: the run's LP on `prof` at `caps` (None: the run's --max-freeze-ratio) for `objective`."""
        return job.solve_schedule(self.config.schedule(), prof, self.config.max_freeze_ratio if caps is None else caps,
                                  time_limit_s=SOLVE_LIMIT_S, objective=objective)

    def _inputs(self, required: bool = False) -> Inputs | None:
        """Under --objective goodput, the learning model's inputs now with their standard errors (every rank takes
        part: a gather; tfrun.freeze.controller Note [learning gate]), else None; when some stage has no noise
        scale yet, None, or an error if `required`."""
        if not self.goodput or self.noise is None:
            return None
        c = self.config

        def make(scales, shares, updates):
            return goodput.measured(scales, shares, c.microbatch_size * c.seq_len, updates,
                                    learning_model=c.learning_model, adam_beta1=c.adam_betas[0],
                                    note="tfrun --freeze timely --objective goodput, the run's estimates")

        inputs = controller.measured_inputs(self.noise.gathered_jackknife(), c.num_stages, make)
        if inputs is None and required:
            raise TfrunError("--objective goodput: the monitor phase measured no positive |G|^2 on some stage: "
                             "lengthen --monitor-steps")
        return inputs

    def _seed_explain(self) -> dict | None:
        if not self.goodput:
            return None
        after = self.plan.goodput.value.goodput
        return {"moves": [], "goodput_before": 1.0, "goodput_after": after, "goodput_target": after}

    def _apply(self, plan_json: dict, step: int, ramp: int, reason: str, events: list[dict],
               solve_s: float | None = None, explain: dict | None = None) -> None:
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
                       "mean_freeze_ratio": plan.mean_ratio_per_stage(), **(explain or {})})
        if self.goodput and self.reference is not None:  # the inputs it was solved with (null: not resolved)
            events[-1] |= {"noise_scale_tokens": list(self.reference.noise.noise_scale_tokens),
                           "noise_log_se": list(self.reference.noise_log_se),
                           controller.weights(self.reference.noise)[0]: list(controller.weights(
                               self.reference.noise)[1]), "weight_log_se": list(self.reference.weight_log_se)}

    # -- checks ---------------------------------------------------------------------------------------------

    def _check_drift(self, step: int) -> list[dict]:
        """--objective makespan: re-plan when an action time drifted (Note [drift])."""
        measured = self.drift.measure(step, self.timer, self.plan)
        decision = None
        if measured is not None:
            drifted = self.drift.drifted(measured)
            if drifted:
                plan, solve_s = self._solve(replace(drift.scaled_profile(self.plan, drifted), noise=None))
                decision = (plan, solve_s, drift.describe(drifted))
        decision = _broadcast(decision, self.group)
        if decision is None:
            return []
        events: list[dict] = []
        self._apply(decision[0], step + 1, 0, decision[2], events, decision[1])
        return events

    def _check_goodput(self, step: int) -> list[dict]:
        """--objective goodput: the controller's check (tfrun.freeze.controller Note [goodput controller]); the action
        times at every check, or at every IDLE_DRIFT_EVERY-th while the plan freezes nothing (Note [idle plan])."""
        self.checks += 1
        idle = not any(m > 0 for m in self.plan.mean_ratio_per_stage())
        measured = self.drift.measure(step, self.timer, self.plan) if not idle or \
            self.checks % IDLE_DRIFT_EVERY == 0 else None
        now = self._inputs()
        decision = None
        if dist.get_rank() == 0:
            drifted = self.drift.drifted(measured) if measured is not None else {}
            decision = controller.decide(self.plan, self.reference, now, drifted, self.config.noise_replan_z,
                                         self.pending, self._solved, self.config.dp)
        decision = _broadcast(decision, self.group)
        if decision is None:
            return []
        self.reference, self.pending = decision.reference, decision.pending
        events: list[dict] = []
        if decision.plan_json is None:  # moved inputs, the plan kept (hysteresis): counted and shown
            self.solve_s.append(decision.solve_s)
            events.append({"event": "check", "step": step, "reason": decision.reason, "time": time.time(),
                           "solve_s": decision.solve_s, **decision.explain})
        else:
            self._apply(decision.plan_json, step + 1, 0, decision.reason, events, decision.solve_s, decision.explain)
        return events

    # -- reports --------------------------------------------------------------------------------------------

    def describe(self) -> str:
        """The phases as one line (printed at the start of a run)."""
        parts = [f"{n} {lo}-{hi - 1}" if hi is not None else f"{n} from {lo}" for n, lo, hi in self.bounds]
        c = self.config
        seed = ""
        if c.plan_path:
            seed = f", seeded by {c.plan_path}" if self.plan is not None else \
                f", the schedule of {c.plan_path} (a plan for makespan: tfrun.freeze.phases Note [goodput start])"
        noise = ""
        if self.goodput:
            gate = f"by more than {c.noise_replan_z:g} standard errors" if c.noise_replan_z else \
                f"by more than {controller.NOISE_REPLAN:.0%} (no gate)"
            noise = (f" or the learning model's inputs move {gate}, if a new plan gains more than "
                     f"{controller.MARGIN:.0%}, moving each stage at most {controller.MAX_MOVE:g} a re-plan")
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
        """The plans, the controller's memory, and until the first plan is solved the monitor and probe
        measurements so far (so that a run resumed in either phase continues it)."""
        measuring: tuple[list, list] = ([], [])
        if self.plan is None and any(n == "monitor" for n, _, _ in self.bounds):
            probe_end = next(hi for n, _, hi in self.bounds if n == "probe")
            measuring = tuple([(r.step, r.action, r.rank, r.start_ms, r.end_ms) for r in rows]
                              for rows in self.timer.window(self.start("monitor"), probe_end))
        return {"plan": self.plan_json, "plans": [p.to_dict() for p in self.plans], "solve_s": self.solve_s,
                "measuring": measuring, "reference": self.reference.to_dict() if self.reference else None,
                "pending": self.pending, "checks": self.checks}

    def load_state_dict(self, state: dict) -> None:
        self.plan_json = state["plan"]
        self.plan = plan_mod.from_dict(self.plan_json) if self.plan_json is not None else None
        self.plans = [PlanInForce(**p) for p in state["plans"]]
        self.solve_s = list(state["solve_s"])
        self.reference = Inputs.from_state(state)
        self.pending, self.checks = bool(state.get("pending", False)), int(state.get("checks", 0))
        self.timer.restore(*([ActionTime(*row) for row in rows] for rows in state["measuring"]))



def _broadcast(obj, group):
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]
