"""Why a prediction missed: line up a plan's predicted actions with a run's measured ones (`tfplan explain`).

A tfrun run directory holds run_config.json (the schedule and ratios it ran, and the plan's path),
timings.json (per action: median start and duration, ms from the step start; per rank: the tail after its
last action) and summary.json (the measured step). The plan predicts every action's start and duration
(tfplan.step.simulate). The residual of an action is measured minus predicted. The step's error splits into:
  actions    replaying the DAG with the measured durations (plus the profile's dispatch cost) instead of the
             predicted ones: what the actions' own times cost or saved;
  waits      the measured makespan minus that replay: time the ranks spent waiting or communicating beyond
             the modelled p2p lag (and the step's head before the first action). With the run's per-step
             durations (timings.json step_durations) it splits in two:
               variability  the median over steps of each step replayed with its own action times, minus the
                            replay of those steps' median times. Each step's makespan is its longest path, and the
                            longest of several noisy paths exceeds the longest of their medians: the more
                            paths are near-critical (an LP plan balances them), the more this costs;
               idle         the rest: time between actions that no replay of measured times explains
                            (hand-overs slower than the p2p lag, dispatch above its median, the head);
  tails      the measured ranks' tails against the profile's;
  rest       whatever else (barriers, Python between steps) against the profile's step overhead.

Note [speed per kind]: a run made on another day than its profile runs at another speed of the machine, and its
kinds need not move alike: on interleaved zero-bubble the forwards once ran x1.19 their profiled time while the
backwards ran at theirs, so a speed read from the forwards alone put the prediction 15% above the measured step
(docs/benchmarks.md, "Prediction at the machine's speed"). Most of that was the profile's own error, found
later: its unfrozen backwards carried the noise meter's hooks (tfrun.cli.profiling Note [hook-free timings]). What
stays is a plan's partly frozen backwards, which run faster than the straight line between unfrozen and frozen
says (a prefix on stage 0 falls below it). The prediction at the run's speed therefore scales
each action kind (F, B, I, W) by its own factor, the measured over the predicted time summed over the kind's
actions, and the ranks' tails by theirs, and replays the DAG with those times; the profile's step overhead
stays as it is. What remains of the error is the schedule's: hand-overs, waits, the spread between steps.
Reads only files: tfplan never imports tfrun or torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfplan.cost import goodput
from tfplan.errors import TfplanError
from tfplan.fileio import read_json
from tfplan.plan import plan as plan_mod
from tfplan.report import summary as summary_mod
from tfplan.schedule.actions import parse_action
from tfplan.step.dag import Dag
from tfplan.step.simulate import Simulation, simulate


@dataclass(frozen=True, kw_only=True, slots=True)
class ActionResidual:
    """One action, predicted against measured (ms; measured starts shifted so the first action starts at 0)."""

    action: str
    rank: int
    predicted_start_ms: float
    predicted_ms: float
    measured_start_ms: float
    measured_ms: float

    @property
    def residual_ms(self) -> float:
        return self.measured_ms - self.predicted_ms


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    """Everything `tfplan explain` prints."""

    run_dir: str
    freeze: str
    """The run's freeze mode (plan, none, all): which prediction it is compared with."""
    actions: list[ActionResidual]
    predicted_step_ms: float
    measured_step_ms: float
    parts: dict[str, tuple[float, float]]
    """Step decomposition: name -> (predicted ms, measured ms) for makespan, tails, overhead."""
    error_parts: dict[str, float]
    """The step's error (measured - predicted, ms) split into actions, waits, tails and rest."""
    waits_split: dict[str, float] | None
    """error_parts["waits"] split into variability and idle (ms; module docstring), or None when the run
    recorded no per-step durations."""
    predicted_path: list[str]
    """Actions on the predicted critical path."""
    measured_path: list[str]
    """Actions on the critical path of the DAG replayed with measured durations."""
    predicted: Simulation
    """The plan's timeline."""
    replayed: Simulation
    """The DAG with the measured durations (and the plan's lags): no waits beyond the modelled ones."""
    measured: Simulation
    """The measured timeline: every action at its median start and duration."""
    predicted_dag: Dag
    kind_speed: dict[str, float]
    """Measured / predicted time per action kind (F, B, I, W: summed over its actions; Note [speed per kind])
    and of the ranks' tails (`tail`); a kind whose predicted time is 0 is left out."""
    speed_step_ms: float
    """The plan's step at the run's speed per kind (Note [speed per kind]), ms."""
    learning: dict[str, Any] | None = None
    """A plan solved or evaluated with a noise section (tfplan.cost.goodput): its learning model, the efficiency
    it predicted at its own stage means and the same model's efficiency at the run's realised freeze ratios (the
    freezer's draws and ramp move them); None without."""

    @property
    def error(self) -> float:
        return (self.measured_step_ms - self.predicted_step_ms) / self.predicted_step_ms

    @property
    def forward_speed(self) -> float:
        """Median over the forwards of measured / predicted time: how fast the machine ran during the run
        against its profile. Forwards are never frozen, so their drift is the machine's, not the model's."""
        ratios = [a.measured_ms / a.predicted_ms for a in self.actions
                  if parse_action(a.action).kind == "F" and a.predicted_ms > 0]
        return statistics.median(ratios) if ratios else 1.0

    @property
    def speed_adjusted_error(self) -> float:
        """The error of the prediction scaled by `forward_speed`: what remains when the machine's drift
        between the profile and the run is taken out (every part of the step assumed to drift alike)."""
        predicted = self.predicted_step_ms * self.forward_speed
        return (self.measured_step_ms - predicted) / predicted

    @property
    def speed_error(self) -> float:
        """The error of the prediction at the run's speed per kind (Note [speed per kind])."""
        return (self.measured_step_ms - self.speed_step_ms) / self.speed_step_ms

    def by_kind(self) -> list[tuple[str, int, float, float]]:
        """(kind, count, predicted ms, measured ms) summed over the step's actions of each kind, in F B I W
        order."""
        sums: dict[str, list[float]] = {}
        for a in self.actions:
            row = sums.setdefault(parse_action(a.action).kind, [0, 0.0, 0.0])
            row[0] += 1
            row[1] += a.predicted_ms
            row[2] += a.measured_ms
        return [(k, int(n), p, m) for k, (n, p, m) in sorted(sums.items(), key=lambda kv: "FBIW".find(kv[0]))]

    def by_stage_kind(self) -> list[tuple[str, int, float, float, float]]:
        """(stage+kind, count, mean predicted ms, mean measured ms, summed residual ms), largest |sum| first."""
        groups: dict[str, list[ActionResidual]] = {}
        for a in self.actions:
            action = parse_action(a.action)
            groups.setdefault(f"{action.stage}{action.kind}", []).append(a)
        rows = [(key, len(items), statistics.fmean(a.predicted_ms for a in items),
                 statistics.fmean(a.measured_ms for a in items), sum(a.residual_ms for a in items))
                for key, items in groups.items()]
        return sorted(rows, key=lambda r: -abs(r[4]))

    def largest(self, k: int = 10) -> list[ActionResidual]:
        return sorted(self.actions, key=lambda a: -abs(a.residual_ms))[:k]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir, "freeze": self.freeze, "predicted_step_ms": self.predicted_step_ms,
            "measured_step_ms": self.measured_step_ms, "error": self.error,
            "forward_speed": self.forward_speed, "speed_adjusted_error": self.speed_adjusted_error,
            "kind_speed": self.kind_speed, "speed_step_ms": self.speed_step_ms, "speed_error": self.speed_error,
            "by_kind": [{"kind": k, "count": n, "predicted_ms": p, "measured_ms": m} for k, n, p, m in self.by_kind()],
            "parts": {k: {"predicted_ms": p, "measured_ms": m} for k, (p, m) in self.parts.items()},
            "error_parts_ms": self.error_parts, "waits_split_ms": self.waits_split,
            "by_stage_kind": [{"key": k, "count": n, "predicted_ms": p, "measured_ms": m, "residual_sum_ms": r}
                              for k, n, p, m, r in self.by_stage_kind()],
            "largest": [{"action": a.action, "rank": a.rank, "predicted_ms": a.predicted_ms,
                         "measured_ms": a.measured_ms, "predicted_start_ms": a.predicted_start_ms,
                         "measured_start_ms": a.measured_start_ms} for a in self.largest()],
            "predicted_critical_path": self.predicted_path, "measured_critical_path": self.measured_path,
            "learning": self.learning,
        }


def _exists(path: Path, what: str) -> Path:
    if not path.exists():
        raise TfplanError(f"{path} not found: is {path.parent} a tfrun run directory with its {what}?")
    return path


def _read(path: Path, what: str) -> Any:
    return read_json(_exists(path, what), what)


def _check_run_files(run: Path, config: Any, timings: Any) -> None:
    """The fields of run_config.json and timings.json that explain reads, with their types (one line each)."""
    def bad(name: str, field: str, want: str) -> TfplanError:
        return TfplanError(f"{run / name}: {field}: must be {want}")

    def num(v: Any) -> bool:  # times in ms, and ratios: finite and >= 0 (NaN broke the report's columns)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf

    if not isinstance(config, dict):
        raise bad("run_config.json", "run configuration", "a JSON object")
    order = config.get("order")
    if not isinstance(order, list) or not all(isinstance(r, list) and all(isinstance(a, str) for a in r)
                                              for r in order):
        raise bad("run_config.json", "order", "a list of per-rank lists of action strings")
    if not isinstance(config.get("plan_path"), (str, type(None))):
        raise bad("run_config.json", "plan_path", "a string or null")
    if not isinstance(config.get("freeze", "plan"), str):
        raise bad("run_config.json", "freeze", "a string")
    ratios = config.get("ratios", {})
    if not isinstance(ratios, dict) or not all(num(v) and v <= 1 for v in ratios.values()):
        raise bad("run_config.json", "ratios", "an object of numbers in [0, 1] per action")
    if not isinstance(timings, dict):
        raise bad("timings.json", "timings", "a JSON object")
    actions = timings.get("actions")
    if not isinstance(actions, dict) or not all(
            isinstance(row, dict) and num(row.get("start_ms")) and num(row.get("duration_ms"))
            for row in actions.values()):
        raise bad("timings.json", "actions", "an object of {start_ms, duration_ms} per action (finite, >= 0)")
    spans = timings.get("makespan_ms")
    if not isinstance(spans, dict) or not spans or not all(num(v) for v in spans.values()):
        raise bad("timings.json", "makespan_ms", "a non-empty object of finite numbers >= 0")
    per_step = timings.get("step_durations")
    if per_step is not None and not (
            isinstance(per_step, dict) and isinstance(per_step.get("actions"), list)
            and all(isinstance(a, str) for a in per_step["actions"]) and isinstance(per_step.get("ms"), dict)
            and all(isinstance(row, list) and len(row) == len(per_step["actions"]) and all(num(x) for x in row)
                    for row in per_step["ms"].values())):
        raise bad("timings.json", "step_durations", "{actions: [names], ms: {step: [one number per action]}}")
    ranks = timings.get("ranks", [])
    if not isinstance(ranks, list) or not all(
            isinstance(r, dict) and type(r.get("rank")) is int and num(r.get("tail_ms") or 0.0) for r in ranks):
        raise bad("timings.json", "ranks", "a list of {rank, tail_ms}")


def explain(run_dir: str | Path, plan_path: str | Path | None = None) -> Explanation:
    """Compare run `run_dir` with the plan it ran (or `plan_path`).

    Raises:
        TfplanError: missing or unreadable files, a plan whose schedule is not the run's, or timings that
            lack actions (a run too short to time every action).
    """
    run = Path(run_dir)
    config = _read(run / "run_config.json", "run configuration")
    timings = _read(run / "timings.json", "timings (written at the end of a run)")
    summary = summary_mod.load(_exists(run / "summary.json", "summary"), required=("step_time_ms",))
    if not isinstance(timings, dict) or timings.get("schema_version") != 2:
        raise TfplanError(f"{run / 'timings.json'}: written by an older tfrun (schema 2 needed); run it again")
    _check_run_files(run, config, timings)
    path = plan_path or config.get("plan_path")
    if not path:
        raise TfplanError(f"{run}: the run names no plan; give --plan")
    plan = plan_mod.load(path)
    dag = plan.dag
    order = [[str(a) for a in row] for row in plan.schedule.order]
    if order != config["order"]:
        raise TfplanError(f"plan {path} has another schedule than run {run} (compare their orders)")
    freeze = config.get("freeze", "plan")
    if freeze in ("plan", "uniform", "timely+apf", "timely+autofreeze"):  # the run's fixed ratios per action
        run_ratios = config.get("ratios", {})
        ratios = [run_ratios.get(str(a), 0.0) for a in dag.actions]
    elif freeze in ("none", "all"):
        ratios = [0.0 if freeze == "none" else 1.0] * dag.num_nodes
    else:
        raise TfplanError(f"{run}: a --freeze {freeze} run has no fixed ratios to predict from (explain runs of "
                          "plan, uniform, none, all and the hybrids)")
    predicted = simulate(dag, dag.durations(ratios))
    measured = timings["actions"]
    missing = [str(a) for a in dag.actions if str(a) not in measured]
    if missing:
        raise TfplanError(f"{run}: no timing for {len(missing)} actions (e.g. {missing[0]}): run more steps")
    origin = min(row["start_ms"] for row in measured.values())
    actions = [ActionResidual(action=str(a), rank=dag.rank[v], predicted_start_ms=predicted.start_ms[v],
                              predicted_ms=predicted.end_ms[v] - predicted.start_ms[v],
                              measured_start_ms=measured[str(a)]["start_ms"] - origin,
                              measured_ms=measured[str(a)]["duration_ms"] + dag.dispatch_ms)
               for v, a in enumerate(dag.actions)]
    replayed = simulate(dag, [a.measured_ms for a in actions])
    # Measured spans run from the first compute start to the last end; a DAG node starts with its dispatch.
    measured_makespan = statistics.median(timings["makespan_ms"].values()) + dag.dispatch_ms
    tails = [r.get("tail_ms") or 0.0 for r in sorted(timings.get("ranks", []), key=lambda r: r["rank"])]
    rank_end = [max(a.measured_start_ms + a.measured_ms for a in actions if a.rank == r)
                for r in range(plan.schedule.num_ranks)]
    measured_finish = max(e + (tails[r] if r < len(tails) else 0.0) for r, e in enumerate(rank_end))
    step = summary["step_time_ms"]
    predicted_finish = predicted.makespan_ms
    parts = {
        "makespan": (predicted.actions_end_ms, measured_makespan),
        "tails": (predicted_finish - predicted.actions_end_ms, measured_finish - measured_makespan),
        "overhead": (dag.step_overhead_ms, step - measured_finish),
    }
    error_parts = {
        "actions": replayed.actions_end_ms - predicted.actions_end_ms,
        "waits": measured_makespan - replayed.actions_end_ms,
        "tails": parts["tails"][1] - parts["tails"][0],
        "rest": parts["overhead"][1] - parts["overhead"][0],
    }
    variability = _variability(dag, timings.get("step_durations"))
    waits_split = None if variability is None else {"variability": variability,
                                                     "idle": error_parts["waits"] - variability}
    kind_speed, speed_step = _at_speed(dag, actions, tails, predicted.step_overhead_ms)
    starts = [a.measured_start_ms for a in actions]
    ends = [a.measured_start_ms + a.measured_ms for a in actions]
    busy = [sum(a.measured_ms for a in actions if a.rank == r) for r in range(plan.schedule.num_ranks)]
    timeline = Simulation(start_ms=starts, end_ms=ends, makespan_ms=measured_finish, actions_end_ms=max(ends),
                          step_overhead_ms=step - measured_finish, busy_ms=busy, critical_path=[])
    return Explanation(
        run_dir=str(run), freeze=freeze, actions=actions, predicted_step_ms=predicted.batch_time_ms,
        measured_step_ms=step, parts=parts, error_parts=error_parts, waits_split=waits_split,
        predicted_path=[str(dag.actions[v]) for v in predicted.critical_path],
        measured_path=[str(dag.actions[v]) for v in replayed.critical_path], predicted=predicted, replayed=replayed,
        measured=timeline, predicted_dag=dag, kind_speed=kind_speed, speed_step_ms=speed_step,
        learning=_learning(plan, summary.get("realised_freeze_ratio")),
    )


def _learning(plan: plan_mod.Plan, realised: list[float] | None) -> dict[str, Any] | None:
    """Explanation.learning: the plan's learning model at its means and at the run's realised ratios."""
    g = plan.goodput
    if g is None:
        return None
    means = plan.mean_ratio_per_stage()
    out = {"learning_model": g.noise.learning_model, "batch_tokens": g.batch_tokens, "planned_ratios": means,
           "planned_efficiency": g.value.efficiency, "realised_ratios": realised, "realised_efficiency": None}
    if realised is not None and len(realised) == len(means):
        base = goodput.progress([0.0] * len(means), g.batch_tokens, g.noise)
        out["realised_efficiency"] = goodput.progress(realised, g.batch_tokens, g.noise) / base if base > 0 else 1.0
    return out


def _at_speed(dag: Dag, actions: list[ActionResidual], tails: list[float],
              overhead_ms: float) -> tuple[dict[str, float], float]:
    """(speed per kind, the plan's step at those speeds in ms): Note [speed per kind]. `actions` in the DAG's
    node order; `tails`: the run's measured tail per rank."""
    sums: dict[str, list[float]] = {}
    for v, a in enumerate(actions):
        pair = sums.setdefault(dag.actions[v].kind, [0.0, 0.0])
        pair[0] += a.predicted_ms
        pair[1] += a.measured_ms
    speed = {kind: m / p for kind, (p, m) in sums.items() if p > 0}
    profiled = sum(dag.tail_ms)
    if profiled > 0 and tails:
        speed["tail"] = sum(tails) / profiled
    scaled = simulate(dag, [a.predicted_ms * speed.get(dag.actions[v].kind, 1.0) for v, a in enumerate(actions)])
    ends = [scaled.actions_end_ms] + [scaled.end_ms[u] + tail * speed.get("tail", 1.0) for u, tail in dag.finish()]
    return speed, max(ends) + overhead_ms


def _variability(dag: Dag, per_step: dict[str, Any] | None) -> float | None:
    """Median over steps of the DAG replayed with each step's own durations (plus dispatch), minus the replay
    of the same steps' median durations (ms); None without per-step durations for every action."""
    if not per_step or not per_step["ms"]:
        return None
    index = {a: i for i, a in enumerate(per_step["actions"])}
    if any(str(a) not in index for a in dag.actions):
        return None
    rows = [[row[index[str(a)]] + dag.dispatch_ms for a in dag.actions] for row in per_step["ms"].values()]
    spans = [simulate(dag, row).actions_end_ms for row in rows]
    medians = [statistics.median(col) for col in zip(*rows)]
    return statistics.median(spans) - simulate(dag, medians).actions_end_ms


def chrome_trace(ex: Explanation) -> dict[str, Any]:
    """Perfetto / chrome://tracing events: process 0 the prediction, process 1 the measurement, a track per
    rank; each measured event carries its predicted duration and residual."""
    events: list[dict[str, Any]] = []
    ranks = sorted({a.rank for a in ex.actions})
    for pid, name in ((0, f"predicted ({ex.predicted_step_ms:.1f} ms step)"),
                      (1, f"measured ({ex.measured_step_ms:.1f} ms step)")):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        for r in ranks:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": r, "args": {"name": f"rank {r}"}})
    for a in ex.actions:
        kind = parse_action(a.action).kind
        events.append({"ph": "X", "name": a.action, "cat": kind, "pid": 0, "tid": a.rank,
                       "ts": a.predicted_start_ms * 1e3, "dur": a.predicted_ms * 1e3})
        events.append({"ph": "X", "name": a.action, "cat": kind, "pid": 1, "tid": a.rank,
                       "ts": a.measured_start_ms * 1e3, "dur": a.measured_ms * 1e3,
                       "args": {"predicted_ms": a.predicted_ms, "residual_ms": a.residual_ms}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
