"""Online TimelyFreeze (`tfrun train --freeze timely`): a run measures its own pipeline, solves the LP and
freezes, re-planning when its action times drift (METHOD.md section 5, and beyond it).

Phases, in optimizer steps (lengths from the run's config; `--plan` seeds the first plan and skips monitor
and probe):
  warmup   no freezing; nothing measured (shapes, allocator and caches settle);
  monitor  no freezing; every action timed: F, B (or I and W), dispatch, p2p, the ranks' tails, the step;
  probe    Note [probe]: whole micro-batches frozen on every stage, the rest not: frozen B / W times;
  (solve)  on rank 0 with tfplan (the same solver and defaults as `tfplan solve`) from the profile of the
           monitor and probe steps; the plan is broadcast, so every rank applies the identical plan, and
           written to DIR/plan.json and DIR/plans/stepNNNNNNN.json;
  ramp     ratios rise linearly to the plan;
  stable   the plan in force; Note [drift].

Note [probe]: the reference freezes everything for about 110 steps to measure the lower bound, while little
is learned. We freeze a block of max(1, M / 4) whole micro-batches per probe step, moving each step, so a few
steps give every stage's frozen time several samples while three quarters of each step still trains.

Note [drift]: every `replan_window` steps of the stable phase, each measured action is compared with the
plan's duration for the share it actually froze (d_max - share (d_max - d_min), dispatch aside); if the median
ratio measured / expected of some (stage, kind) is off by more than `replan_threshold`, that stage-kind's
costs (both ends) are scaled by the ratio and the LP is solved again, from the next step, without a ramp.
Medians over a window of steps x micro-batches make a single slow step harmless.

Every phase start, the probe, each solve and re-plan are records of metrics.jsonl with an "event" field.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from tfplan import dag as dag_mod
from tfplan import job, schedules
from tfplan import plan as plan_mod
from tfplan import profile as profile_mod
from tfplan.actions import FREEZABLE, parse_action
from tfplan.fileio import write_json_atomic
from tfplan.lp import DEFAULT_TIME_LIMIT_S
from tfrun import measure
from tfrun.config import TrainConfig
from tfrun.freezing import Freezer
from tfrun.timing import ActionTime, ActionTimer, gather_records

SOLVE_LIMIT_S = DEFAULT_TIME_LIMIT_S
"""The in-run solve's time limit (tfplan solve's default); Note [solve timeout]."""
MIN_DRIFT_SAMPLES = 8
"""A (stage, kind) end with fewer samples in a drift window is not judged (one slow step is not a drift)."""
FIELDS = {"F": ("forward_ms",), "B": ("backward_ms", "backward_frozen_ms"), "I": ("backward_input_ms",),
          "W": ("backward_weight_ms", "backward_weight_frozen_ms")}


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


class OnlinePlanner:
    """The online mode's state on one rank; decisions are made on rank 0 and broadcast."""

    def __init__(self, config: TrainConfig, freezer: Freezer, timer: ActionTimer, out: Path,
                 stage_numel: dict[int, int]) -> None:
        self.config, self.freezer, self.timer, self.out = config, freezer, timer, out
        self.restored: tuple[list[ActionTime], list[ActionTime]] = ([], [])
        """Measurements of the monitor and probe steps from before a resume (checkpointed until solved)."""
        self.bounds = phase_bounds(config)
        self.stage_numel = stage_numel
        self.plan: dict | None = None
        """The plan in force as JSON (tfplan's format), identical on every rank."""
        self.plans: list[dict] = []
        """(step, predicted ms, reason) of every plan put in force."""
        self.solve_s: list[float] = []
        self.share_history: dict[tuple[int, str], float] = {}
        # Note [solve timeout]: rank 0 solves while the others wait in a broadcast. The default group's
        # collective timeout is short (a dead rank must be noticed quickly), so the plan travels in a group of
        # its own whose timeout outlasts the solve's time limit.
        self.group = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=SOLVE_LIMIT_S + 180))
        """(step, freezable action) -> the share it froze, for recent steps on this rank (Note [drift])."""
        if config.plan_path is not None:  # a seed plan: in force (ramped) from the end of the warm-up
            self.plan = plan_mod.to_dict(plan_mod.load(config.plan_path))

    def phase(self, step: int) -> str:
        return next(name for name, lo, hi in self.bounds if step >= lo and (hi is None or step < hi))

    def start(self, name: str) -> int:
        return next(lo for n, lo, _ in self.bounds if n == name)

    def before_step(self, step: int) -> list[dict]:
        """Set the freezer for `step`; returns the event records of phases starting at `step`."""
        events = []
        for name, lo, _ in self.bounds:
            if lo == step:
                events.append({"event": "phase", "phase": name, "step": step, "time": time.time()})
                if name == "probe":
                    self.freezer.set_probe(step, max(1, self.config.num_microbatches // 4))
                if name != "warmup" and self.plan is not None and not self.plans:  # the seed plan, ramped
                    self._apply(self.plan, step, self.config.ramp_steps, "seed plan", events)
        return events

    def after_step(self, step: int, metrics: list[dict]) -> list[dict]:
        """After `step` (all ranks call it): solve at the end of the probe, check drift in the stable phase."""
        probe_end = next((hi for n, _, hi in self.bounds if n == "probe"), None)
        records = self.restored[0] + self.timer.records
        if probe_end is not None and step == probe_end - 1 and self.plan is None:
            return self._solve_from_probe(step, records, self.restored[1] + self.timer.spans, metrics)
        stable = self.start("stable")
        window = self.config.replan_window
        if self.plan is not None and step >= stable + window - 1 and (step - stable + 1) % window == 0:
            return self._check_drift(step, records)
        return []

    # -- the first plan -------------------------------------------------------------------------------------

    def _solve_from_probe(self, step: int, records, spans, metrics) -> list[dict]:
        monitor = (self.start("monitor"), self.start("probe"))
        probe = (self.start("probe"), step + 1)
        mine = [r for r in records if monitor[0] <= r.step < probe[1]]
        all_records = gather_records(mine)
        all_spans = gather_records([s for s in spans if monitor[0] <= s.step < monitor[1]])
        plan, solve_s = None, 0.0
        if dist.get_rank() == 0:
            in_probe = {(s, m) for s in range(probe[0], probe[1]) for m in self.freezer.probe_microbatches(s)}

            def share_of(r: ActionTime) -> float:
                if not probe[0] <= r.step < probe[1]:
                    return 0.0
                return 1.0 if (r.step, parse_action(r.action).mb) in in_probe else 0.0

            step_ms = statistics.median(row["step_time_ms"] for row in metrics
                                        if "event" not in row and monitor[0] <= row["step"] < monitor[1])
            prof = measure.measured_profile(
                self.config, all_records, all_spans, step_ms, f"online-{self.config.model}", self.stage_numel,
                share_of=share_of, replay_records=[r for r in all_records if r.step < monitor[1]])
            prof = _fill_unmeasured(prof, self.config)
            plan, solve_s = self._solve(prof)
        plan, solve_s = _broadcast((plan, solve_s), self.group)
        events = [{"event": "probe", "step": step, "probe_steps": probe[1] - probe[0], "time": time.time(),
                   "microbatches_per_step": self.freezer.probe[1]}]
        self._apply(plan, step + 1, self.config.ramp_steps, "first plan", events, solve_s)
        return events

    def _solve(self, prof: profile_mod.Profile) -> tuple[dict, float]:
        """Rank 0: the LP for this run's schedule on `prof`; returns the plan JSON and the solve's seconds."""
        c = self.config
        sched = schedules.from_order([[parse_action(a) for a in row] for row in c.order], name=c.schedule_name,
                                     num_microbatches=c.num_microbatches)
        dag = dag_mod.build(sched, prof)
        caps = c.max_freeze_ratio if len(c.max_freeze_ratio) > 1 else c.max_freeze_ratio * c.num_stages
        start = time.perf_counter()
        solution = job.solve_dag(dag, caps, time_limit_s=SOLVE_LIMIT_S)
        solve_s = time.perf_counter() - start
        return plan_mod.to_dict(plan_mod.make_plan(dag, solution, caps, prof)), solve_s

    def _apply(self, plan: dict, step: int, ramp: int, reason: str, events: list[dict],
               solve_s: float | None = None) -> None:
        """Put `plan` in force from `step` on every rank; rank 0 writes it."""
        old = self.plan["predicted"]["planned_ms"] if self.plan is not None and self.plans else None
        self.plan = plan
        ratios = {(s, m): r for s, row in enumerate(plan["freeze_ratio"]) for m, r in enumerate(row) if r > 0}
        local = set(self.freezer.stage_candidates)
        self.freezer.set_plan({k: r for k, r in ratios.items() if k[0] in local}, step, ramp)
        predicted = plan["predicted"]["planned_ms"]
        self.plans.append({"step": step, "predicted_ms": predicted, "reason": reason})
        if solve_s is not None:
            self.solve_s.append(solve_s)
        if dist.get_rank() == 0:
            (self.out / "plans").mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.out / "plans" / f"step{step:07d}.json", plan)
            write_json_atomic(self.out / "plan.json", plan)
        events.append({"event": "plan", "step": step, "reason": reason, "time": time.time(),
                       "old_predicted_ms": old, "new_predicted_ms": predicted, "solve_s": solve_s,
                       "mean_freeze_ratio": plan["mean_freeze_ratio"]})

    # -- drift ----------------------------------------------------------------------------------------------

    def _check_drift(self, step: int, records: list[ActionTime]) -> list[dict]:
        window = (step - self.config.replan_window + 1, step + 1)
        mine = [(r.step, r.action, r.rank, r.start_ms, r.end_ms, self.share_history.get((r.step, r.action), 0.0))
                for r in records if window[0] <= r.step < window[1]]
        parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, parts, dst=0)
        decision = None
        if dist.get_rank() == 0:
            rows = [row for part in parts for row in part]
            drift = _drift(plan_mod.from_dict(self.plan), rows)
            worst = max(drift.items(), key=lambda kv: abs(kv[1] - 1.0), default=None)
            if worst is not None and abs(worst[1] - 1.0) > self.config.replan_threshold:
                prof = _scaled_profile(plan_mod.from_dict(self.plan), drift, self.config.replan_threshold)
                plan, solve_s = self._solve(prof)
                decision = (plan, solve_s, drift)
        decision = _broadcast(decision, self.group)
        if decision is None:
            return []
        plan, solve_s, drift = decision
        reason = "drift: " + ", ".join(f"stage {_describe(k)} x{v:.2f}" for k, v in sorted(drift.items())
                                       if abs(v - 1.0) > self.config.replan_threshold)
        events: list[dict] = []
        self._apply(plan, step + 1, 0, reason, events, solve_s)
        return events

    def record_shares(self, step: int, shares: dict[tuple[int, int], float]) -> None:
        """Remember the share each local (stage, micro-batch) froze at `step` (for the drift check)."""
        for (s, m), share in shares.items():
            for kind in FREEZABLE:
                self.share_history[(step, f"{s}{kind}{m}")] = share
        cutoff = step - 2 * self.config.replan_window
        for key in [k for k in self.share_history if k[0] < cutoff]:
            del self.share_history[key]

    def describe(self) -> str:
        """The phases as one line (printed at the start of a run)."""
        parts = [f"{n} {lo}-{hi - 1}" if hi is not None else f"{n} from {lo}" for n, lo, hi in self.bounds]
        c = self.config
        seed = f", seeded by {c.plan_path}" if c.plan_path else ""
        return (f"online TimelyFreeze{seed}: {', '.join(parts)}; caps {c.max_freeze_ratio}; re-plan when an "
                f"action kind drifts by more than {c.replan_threshold:.0%} (checked every {c.replan_window} steps)")

    def profile(self) -> profile_mod.Profile | None:
        """The profile of the plan in force (measured in this run, rescaled at each re-plan)."""
        if self.plan is None:
            return None
        p = self.plan["profile"]
        return profile_mod.from_dict({"schema_version": profile_mod.SCHEMA_VERSION, "name": p["name"],
                                      "source": {"kind": "measured", "tool": "tfrun --freeze timely"},
                                      "p2p_ms": p["p2p_ms"], "dispatch_ms": p.get("dispatch_ms", 0.0),
                                      "step_overhead_ms": p["step_overhead_ms"], "stages": p["stages"]})

    # -- state ----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The plans, and until the first is solved the monitor and probe measurements so far (so that a run
        resumed in either phase continues it)."""
        measuring: tuple[list, list] = ([], [])
        if self.plan is None and any(n == "monitor" for n, _, _ in self.bounds):
            first = self.start("monitor")
            measuring = tuple([(r.step, r.action, r.rank, r.start_ms, r.end_ms) for r in rows if r.step >= first]
                              for rows in (self.restored[0] + self.timer.records, self.restored[1] + self.timer.spans))
        return {"plan": self.plan, "plans": self.plans, "solve_s": self.solve_s, "measuring": measuring}

    def load_state_dict(self, state: dict) -> None:
        self.plan, self.plans, self.solve_s = state["plan"], state["plans"], state["solve_s"]
        if self.plan is not None and self.plan.get("schema_version") != plan_mod.SCHEMA_VERSION:
            self.plan = plan_mod.to_dict(plan_mod.from_dict(self.plan))  # a checkpoint of an older tfrun
        self.restored = tuple([ActionTime(*row) for row in rows] for rows in state["measuring"])

    def summary(self, metrics: list[dict]) -> dict:
        """summary.json's online fields: phases, the stable phase's median step and prediction error, the
        share of wall time outside the stable phase, solves and re-plans."""
        steps = [row for row in metrics if "event" not in row]
        last = steps[-1]["step"] if steps else -1
        phases = [{"name": n, "start_step": lo, "end_step": min(hi, last + 1) if hi is not None else last + 1}
                  for n, lo, hi in self.bounds if lo <= last]
        stable_start = self.start("stable")
        stable = [row for row in steps if row["step"] >= stable_start and row.get("timed")]
        stable_ms = statistics.median(row["step_time_ms"] for row in stable) if stable else None
        # Each plan's prediction against the stable steps it was in force for (a re-plan starts a segment).
        plans = []
        for k, p in enumerate(self.plans):
            end = self.plans[k + 1]["step"] if k + 1 < len(self.plans) else last + 1
            segment = [row["step_time_ms"] for row in stable if p["step"] <= row["step"] < end]
            measured = statistics.median(segment) if segment else None
            plans.append(p | {"measured_ms": measured,
                              "error": (measured - p["predicted_ms"]) / p["predicted_ms"] if measured else None})
        last_plan = next((p for p in reversed(plans) if p["measured_ms"] is not None), None)
        total = sum(row["step_time_ms"] for row in steps)
        outside = sum(row["step_time_ms"] for row in steps if row["step"] < stable_start)
        in_stable = [row for row in steps if row["step"] >= stable_start]
        num_stages = self.config.num_stages
        return {
            "planned_freeze_ratio": self.plan["mean_freeze_ratio"] if self.plan else [0.0] * num_stages,
            "realised_freeze_ratio": [statistics.fmean(row["freeze_ratio"][s] for row in in_stable) if in_stable
                                      else 0.0 for s in range(num_stages)],
            "phases": phases,
            "stable_step_time_ms": stable_ms,
            "stable_predicted_step_ms": last_plan["predicted_ms"] if last_plan else None,
            "stable_prediction_error": last_plan["error"] if last_plan else None,
            "outside_stable_share": outside / total if total else None,
            "solve_s": self.solve_s,
            "plans": plans,
            "replans": sum(1 for p in self.plans if p["reason"].startswith("drift")),
        }


def _describe(key: str) -> str:
    """A drift key in words: "1F" -> "1 F", "0B-frozen" -> "0 B frozen"."""
    base, _, frozen = key.partition("-")
    return f"{base[:-1]} {base[-1]}" + (" frozen" if frozen else "")


def _broadcast(obj, group):
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _fill_unmeasured(prof: profile_mod.Profile, config: TrainConfig) -> profile_mod.Profile:
    """The online profile measures only the schedule's own backward kinds; keep the others consistent (they
    do not enter the plan): a full-backward schedule's I = frozen B and W = B - frozen B; a split schedule's
    B = I + W and frozen B = I + frozen W."""
    kinds = {parse_action(a).kind for row in config.order for a in row}
    stages = []
    for c in prof.stages:
        if "B" in kinds:
            c = replace(c, backward_input_ms=c.backward_frozen_ms,
                        backward_weight_ms=c.backward_ms - c.backward_frozen_ms, backward_weight_frozen_ms=0.0)
        else:
            c = replace(c, backward_ms=c.backward_input_ms + c.backward_weight_ms,
                        backward_frozen_ms=c.backward_input_ms + c.backward_weight_frozen_ms)
        stages.append(c)
    return replace(prof, stages=tuple(stages))


def _drift(plan: plan_mod.Plan, rows: list[tuple]) -> dict[str, float]:
    """Note [drift]: key -> median over the window of measured / planned duration, where the key names a
    (stage, kind) and which end of its linear model the samples measured: "1F" (F and I: fixed), "0B" (B or W
    that froze nothing: its unfrozen time), "0B-frozen" (that froze everything: its frozen time). Samples at
    partial shares are left out: how a partial share saves time depends on the policy (on stage 0 a random
    subset saves little until everything is frozen), and the model's line must not be refitted to it."""
    dag = plan.dag
    node = {str(a): v for v, a in enumerate(dag.actions)}
    ratios: dict[str, list[float]] = {}
    for _, action, _, start, end, share in rows:
        v, a = node[action], parse_action(action)
        if a.kind in FREEZABLE and 1e-6 < share < 1 - 1e-6:
            continue
        frozen = a.kind in FREEZABLE and share >= 1 - 1e-6
        expected = (dag.d_min[v] if frozen else dag.d_max[v]) - dag.dispatch_ms
        if expected > 0.5:  # sub-millisecond actions (a frozen stage-0 backward) are all noise
            ratios.setdefault(f"{a.stage}{a.kind}{'-frozen' if frozen else ''}", []).append((end - start) / expected)
    return {k: statistics.median(v) for k, v in ratios.items() if len(v) >= MIN_DRIFT_SAMPLES}


def _scaled_profile(plan: plan_mod.Plan, drift: dict[str, float], threshold: float) -> profile_mod.Profile:
    """The plan's profile with each drifted end of each (stage, kind) scaled by its measured ratio (frozen
    times kept at or below unfrozen ones)."""
    costs = list(plan.dag.stage_costs)
    for key, ratio in drift.items():
        if abs(ratio - 1.0) <= threshold:
            continue
        base, _, frozen = key.partition("-")
        s, kind = int(base[:-1]), base[-1]
        fields = FIELDS[kind][1:] if frozen else FIELDS[kind][:1]
        costs[s] = replace(costs[s], **{f: getattr(costs[s], f) * ratio for f in fields})
    for s, c in enumerate(costs):
        costs[s] = replace(c, backward_frozen_ms=min(c.backward_frozen_ms, c.backward_ms),
                           backward_weight_frozen_ms=min(c.backward_weight_frozen_ms, c.backward_weight_ms))
    dag = plan.dag
    return profile_mod.Profile(name=f"{plan.profile_name}-rescaled", source={"kind": "measured", "rescaled": drift},
                               p2p_ms=dag.p2p_ms, dispatch_ms=dag.dispatch_ms, step_overhead_ms=dag.step_overhead_ms,
                               stages=tuple(costs))
