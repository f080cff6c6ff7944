"""The online goodput mode's controller (`tfrun train --freeze timely --objective goodput`): what a check does when
the learning model's inputs or the action times moved (tfrun.freeze.online runs it on rank 0 and broadcasts it).

Note [goodput controller]: the third study's online goodput mode re-planned whenever a stage's noise estimate moved
by 25% or an action time by 10%, and each re-plan jumped to the new optimum: most re-plans answered the estimator's
own scatter, and the plan swung between the LP's vertices (docs/results.md, "Why the online goodput mode misses").
This controller has memory, and moves only on evidence:
  start      the stable phase starts from the goodput plan solved on the probe's own profile and noise (the fixed
             method that won), with no ramp; a seed plan solved for goodput (tfplan solve --objective goodput) is
             that plan already, any other seed only names the schedule (tfrun.freeze.phases Note [goodput start]);
  reference  the inputs the plan in force was last judged with: per stage its noise scale and its weight (the
             learning model's update or |G|^2 share), with their standard errors (Note [learning gate]);
  gate       a check considers a new plan for learning only when some input moved beyond `z` standard errors of
             the two estimates (and beyond NOISE_REPLAN relative); a drift of the action times (tfrun.freeze.drift
             Note [drift]) solves with the reference's noise unless the inputs moved too;
  hysteresis the goodput optimum at the current inputs must beat the plan in force, judged at the same inputs
             and times, by more than MARGIN; otherwise the plan stays (on a drift its times are updated, its
             ratios kept) and the reference becomes the current inputs, at which the plan was just confirmed;
  bound      one re-plan moves the stage means at most MAX_MOVE towards the optimum, along the segment (Note
             [replan bound]); later checks continue the move (`pending`) until it is within MARGIN;
  explained  every plan event says which input moved, by how many standard errors, and the predicted goodput of
             the old plan, the new one and the optimum at the inputs it was solved with; a check that moved inputs
             but kept the plan is an event too ("check"): re-plans on learning are counted and shown.
MARGIN, MAX_MOVE and the gate's default (GATE_Z) are constants, not options: options would add fields to every run's
config (the calibration runs' cell identity: tfrun.records.efficiency.cell_key).

Note [replan bound]: under the goodput model a plan's predicted goodput P(m) / T(m) is quasi-concave in the stage
means m (P concave, T the makespan LP's value at caps m, convex and piecewise linear), so on the segment from the
plan in force to the optimum it is never below its value at the plan in force. A bounded move therefore steps
along that segment, m' = m + t (m* - m) with t = MAX_MOVE / max_s |m*_s - m_s|, and puts in force the fastest plan
within those means (the three-phase makespan LP at per-stage caps m', tfplan.plan.job.solve_schedule; the goodput
plan is that LP at the optimum's means). Per-stage clipping would leave the segment and could lose goodput.

Note [learning gate]: the inputs' standard errors are the jackknife's over the estimator's window (as Note [noise
gate] in tfrun.freeze.noise_estimators): each measured step of the window left out in turn, every stage's sums
recomputed, then the noise scale ln(tr / |G|^2) per stage and the weight share ln(x_s / sum x) across stages (x
the learning model's weight: sqrt(n |G|^2) summed over a stage's tensors for adam, |G|^2 otherwise). Shares, not
the weights themselves: every stage's |G|^2 falls together as the loss falls, which moves no plan. A stage with
fewer than MIN_JACKKNIFE measured steps in its window, or a leave-one-out estimate that is not positive, has no
resolved error and its inputs cannot move it. A seed plan's inputs have no measured error: the current
estimate's own counts twice. Since every stage's estimate rests on whole unfrozen micro-batches (Note [unfrozen
measurement]), freezing a stage cannot take its resolution away.

Note [unfrozen measurement]: a measured step under the goodput controller leaves a block of K = max(2, M // 4)
whole micro-batches unfrozen on every stage, turning by K with each measured step (as the probe's block does), so
that every tensor of every stage is reached by at least K micro-batches and K x b sequences: its estimate that
step is a two-batch estimate from micro-batches in which it was unfrozen (tfrun.freeze.noise Note [noise scale]),
the same quantity the monitor phase measures with nothing frozen. Without it a heavily frozen stage's tensors were
reached by fewer than two micro-batches in many steps and left out of its sums (crossing seed 0: stage 1 at 0.90
had no resolved standard error), and the goodput policy's choice of which tensors to freeze, made from their
estimates, starved the tensors it judged noisy of new ones. What it costs, where the plan freezes (nothing where
it freezes nothing): the measured step runs K of M micro-batches unfrozen, which gives back about a third of the
plan's saving on that step (the critical path runs through them), predicted on the tiny profile's 1F1B plans at M =
8 (profiles/tiny-cpu-2stages-mb2.json, the four block positions averaged): +9.5% of a measured step on its goodput
plan (means 0.23 / 0.80), +11.1% on its cap-0.9 plan. What those micro-batches compute for tensors the plan freezes
in them is a shadow (tfrun.freeze.noise Note [shadow gradients]): it feeds the estimate, not the update, so a
measured step learns what the plan's step learns and costs only time. With the hooks' own +12-15% of a measured
step (docs/cost-model.md, "Which noise estimator" 6) a measured step costs about +22-26%, so under the goodput
mode --noise-every defaults to 10 (GOODPUT_NOISE_EVERY): +2.2-2.6% of the run's time (at 5 it would be +4.3-5.2%,
over the 3% budget), -2.2 to -2.5% of its goodput. The action times of measured
steps (their hooks and these blocks) are left out of the drift checks' medians, as the monitor's and the
probe's measured steps are left out of the first plan's profile (tfrun.freeze.phases Note [hook-free profile]).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tfplan.cost import goodput
from tfplan.cost.goodput import NoiseModel
from tfplan.plan import job
from tfplan.plan import plan as plan_mod
from tfplan.step import dag as dag_mod
from tfrun.config.train_config import MIN_JACKKNIFE
from tfrun.freeze import drift

NOISE_REPLAN = 0.25
"""A learning input counts as moved only beyond this relative change too (the third study's rule, alone at z = 0)."""
MARGIN = 0.01
"""Hysteresis: a new plan must promise more than this share of goodput above the plan in force."""
MAX_MOVE = 0.25
"""The most one re-plan moves a stage's mean ratio (Note [replan bound])."""
IDLE_DRIFT_EVERY = 4
"""While the plan in force freezes nothing, the action times are checked at every 4th check only (Note [idle
plan] in tfrun.freeze.online)."""


def measured_block(measured: int, num_microbatches: int) -> frozenset[int]:
    """The micro-batches left unfrozen on the measured step that follows `measured` earlier ones (Note [unfrozen
    measurement]).

    >>> sorted(measured_block(0, 8)), sorted(measured_block(1, 8)), sorted(measured_block(3, 8))
    ([0, 1], [2, 3], [6, 7])
    >>> sorted(measured_block(1, 3))
    [0, 2]
    """
    k = min(num_microbatches, max(2, num_microbatches // 4))
    return frozenset((measured * k + j) % num_microbatches for j in range(k))


@dataclass(frozen=True, kw_only=True, slots=True)
class Inputs:
    """The learning model's inputs at one check, with their standard errors (Note [learning gate])."""

    noise: NoiseModel
    """Per stage the noise scale and weights, as a profile's noise section."""
    noise_log_se: tuple[float | None, ...]
    """Per stage, the standard error of ln(noise scale); None: not resolved."""
    weight_log_se: tuple[float | None, ...]
    """Per stage, the standard error of ln(its weight share); None: not resolved."""
    measured_se: bool = True
    """False for a seed plan's inputs, which carry no error (the current estimate's counts twice)."""

    def to_dict(self) -> dict:
        return {"noise": self.noise.to_dict(), "noise_log_se": list(self.noise_log_se),
                "weight_log_se": list(self.weight_log_se), "measured_se": self.measured_se}

    @staticmethod
    def from_dict(obj: dict) -> Inputs:
        noise = goodput.from_dict(obj["noise"], len(obj["noise"]["noise_scale_tokens"]), None)
        return Inputs(noise=noise, noise_log_se=tuple(obj["noise_log_se"]),
                      weight_log_se=tuple(obj["weight_log_se"]), measured_se=obj["measured_se"])


    @staticmethod
    def from_state(state: dict) -> Inputs | None:
        """An online checkpoint's reference; one written before the controller has its plan's noise and noise
        spreads (log standard errors; inf: not resolved) and no weight errors."""
        if state.get("reference"):
            return Inputs.from_dict(state["reference"])
        if state.get("noise") is None:
            return None
        n = len(state["noise"]["noise_scale_tokens"])
        spread = {int(s): float(v) for s, v in state.get("noise_spread", {}).items()}
        return Inputs(noise=goodput.from_dict(state["noise"], n, None), weight_log_se=(None,) * n,
                      noise_log_se=tuple(v if math.isfinite(v := spread.get(s, math.inf)) else None for s in range(n)))


def weights(noise: NoiseModel) -> tuple[str, tuple[float, ...]]:
    """(name, per stage) of the learning model's weight: update shares for adam, |G|^2 shares otherwise."""
    if noise.learning_model == "adam" and noise.update_share is not None:
        return "update_share", noise.update_share
    return "grad_sq_share", noise.grad_sq_share


def measured_inputs(jack: dict[int, tuple], num_stages: int, make: Callable[..., NoiseModel]) -> Inputs | None:
    """The inputs from every stage's NoiseMeter.gathered_jackknife; `make(scales, gsq_shares, update_shares)` the
    noise section. None when some stage has no positive |G|^2 (no noise scale)."""
    full = [jack[s][0] if s in jack else None for s in range(num_stages)]
    if any(f is None or not f[0] > 0 or not math.isfinite(f[1]) for f in full):
        return None
    total_gsq, total_update = sum(f[0] for f in full), sum(f[2] for f in full)
    noise = make([f[1] / f[0] for f in full], [f[0] / total_gsq for f in full],
                 [f[2] / total_update for f in full] if total_update > 0 else None)
    loo = [jack[s][1] for s in range(num_stages)]
    noise_se = tuple(_spread([math.log(v[1] / v[0]) if v[0] > 0 and v[1] > 0 else None for v in part.values()])
                     if len(part) >= MIN_JACKKNIFE else None for part in loo)
    column = 2 if weights(noise)[0] == "update_share" else 0
    slots = sorted({k for part in loo for k in part})
    rows = [[loo[s].get(k, full[s])[column] for s in range(num_stages)] for k in slots]
    shares = [[math.log(x / sum(row)) if x > 0 else None for x in row] for row in rows]
    weight_se = tuple(_spread([r[s] for r in shares]) if len(slots) >= MIN_JACKKNIFE else None
                      for s in range(num_stages))
    return Inputs(noise=noise, noise_log_se=noise_se, weight_log_se=weight_se)


def _spread(logs: Sequence[float | None]) -> float | None:
    """The jackknife standard error sqrt((n - 1) / n sum (x_k - mean)^2); None when some value is not defined.

    >>> round(_spread([0.0, 0.3, 0.6]), 4), _spread([0.0, None, 1.0])
    (0.3464, None)
    """
    if any(x is None for x in logs) or not logs:
        return None
    mean = sum(logs) / len(logs)
    return math.sqrt((len(logs) - 1) / len(logs) * sum((x - mean) ** 2 for x in logs))


@dataclass(frozen=True, kw_only=True, slots=True)
class Move:
    """One learning input's move since the reference."""

    stage: int
    input: str
    """noise_scale, update_share or grad_sq_share."""
    before: float
    after: float
    z: float | None
    """Standard errors moved (None: not resolved, under the relative rule alone)."""

    def text(self) -> str:
        """'stage 1 x3.42 (2.2 SE)'."""
        return f"stage {self.stage} x{self.after / self.before:.2f}" + (f" ({self.z:.1f} SE)" if self.z else "")

    def to_dict(self) -> dict:
        return {"stage": self.stage, "input": self.input, "from": self.before, "to": self.after, "z": self.z}


def moves(reference: Inputs, now: Inputs, z: float) -> list[Move]:
    """The inputs that moved since `reference` (Note [learning gate]): beyond NOISE_REPLAN relative and, with z > 0,
    beyond z standard errors of the two estimates; z = 0 looks at the noise scales alone (the third study's rule)."""
    out = []
    named = [("noise_scale", reference.noise.noise_scale_tokens, now.noise.noise_scale_tokens,
              reference.noise_log_se, now.noise_log_se)]
    (name, was), (name_now, is_) = weights(reference.noise), weights(now.noise)
    if z > 0 and name == name_now:
        named.append((name, was, is_, reference.weight_log_se, now.weight_log_se))
    for what, before, after, se_before, se_now in named:
        for s, (a, b) in enumerate(zip(before, after)):
            if not (a > 0 and b > 0 and abs(b / a - 1.0) > NOISE_REPLAN):
                continue
            se = _joint(se_before[s] if reference.measured_se else se_now[s], se_now[s])
            score = abs(math.log(b / a)) / se if se else None
            if z > 0 and not (score is not None and score > z):
                continue
            out.append(Move(stage=s, input=what, before=a, after=b, z=score))
    return out


def _joint(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) else math.hypot(a, b)


def describe(found: list[Move]) -> str:
    """A re-plan's reason: 'noise: stage 1 x3.42 (2.2 SE); update share: stage 0 x0.61 (2.5 SE)'."""
    parts = []
    for what, label in (("noise_scale", "noise"), ("update_share", "update share"), ("grad_sq_share", "|G|^2 share")):
        some = [m.text() for m in found if m.input == what]
        if some:
            parts.append(f"{label}: " + ", ".join(some))
    return "; ".join(parts)


def bounded_means(current: Sequence[float], target: Sequence[float], max_move: float = MAX_MOVE
                  ) -> tuple[list[float], bool]:
    """The means one re-plan moves to, and whether the bound cut the move short (Note [replan bound]).

    >>> bounded_means([0.9, 0.0], [0.1, 0.2])
    ([0.65, 0.0625], True)
    >>> bounded_means([0.5, 0.5], [0.6, 0.4])
    ([0.6, 0.4], False)
    """
    span = max((abs(t - c) for c, t in zip(current, target)), default=0.0)
    if span <= max_move + 1e-12:
        return list(target), False
    t = max_move / span
    return [c + t * (g - c) for c, g in zip(current, target)], True


def goodput_at(plan: plan_mod.Plan, prof, noise: NoiseModel) -> float:
    """The plan's ratios' predicted goodput on profile `prof` under `noise`, relative to no freezing there."""
    predicted = plan_mod.predict(dag_mod.build(plan.schedule, prof), plan.ratios)[0]
    return goodput.evaluate(plan.mean_ratio_per_stage(), predicted.planned_ms, predicted.no_freeze_ms,
                            job.batch_tokens(prof, plan.schedule, noise), noise).goodput


def retimed(plan: plan_mod.Plan, prof, noise: NoiseModel) -> plan_mod.Plan:
    """The plan's ratios on profile `prof` (a drift re-plan that keeps the ratios: the times follow the machine),
    its predictions and goodput record recomputed under `noise`; no solver record (no LP made it)."""
    dag = dag_mod.build(plan.schedule, prof)
    predicted = plan_mod.predict(dag, plan.ratios)[0]
    record = goodput.plan_goodput("goodput", noise, job.batch_tokens(prof, plan.schedule, noise),
                                  plan.mean_ratio_per_stage(), predicted.planned_ms, predicted.no_freeze_ms)
    return replace(plan, dag=dag, profile_name=prof.name, profile_hash=prof.content_hash(), predicted=predicted,
                   solver=None, goodput=record, timelines=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """What a check decided (rank 0's, broadcast)."""

    plan_json: dict | None
    """The plan to put in force, or None: the plan in force stays (a `check` event)."""
    reason: str
    explain: dict
    """The event's explanation fields (Note [goodput controller])."""
    reference: Inputs | None
    """The reference inputs from now on."""
    pending: bool
    """Whether the bound cut the move short (the next check continues it)."""
    solve_s: float


def decide(plan: plan_mod.Plan, reference: Inputs | None, now: Inputs | None, drifted: dict[str, float], z: float,
           pending: bool, solve: Callable[..., plan_mod.Plan], dp: int = 1) -> Decision | None:
    """Note [goodput controller] for one check on rank 0; `solve(profile, caps, objective)` the in-run LP (caps None:
    the run's), `dp` the run's replicas (a plan's profile does not record them; the batch counts them). None:
    nothing moved, nothing to do; also None while there are no learning inputs at all (no reference, no estimate
    yet), since a goodput plan cannot be solved without them."""
    reference = reference if reference is not None else now  # (then nothing moved: `now` is the reference)
    found = moves(reference, now, z) if now is not None and reference is not None else []
    if not drifted and not found and not pending:
        return None
    judged = now if found else reference
    if judged is None:
        return None
    prof = replace(drift.scaled_profile(plan, drifted) if drifted else drift.plan_profile(plan), noise=judged.noise,
                   dp=dp)
    start = time.perf_counter()
    best = solve(prof, None, "goodput")
    before, target = goodput_at(plan, prof, judged.noise), best.goodput.value.goodput
    reasons = ([drift.describe(drifted)] if drifted else []) + ([describe(found)] if found else [])
    explain = {"moves": [m.to_dict() for m in found] + [{"input": "time", "key": k, "ratio": v}
                                                        for k, v in sorted(drifted.items())],
               "goodput_before": before, "goodput_target": target}
    if not target > before * (1.0 + MARGIN):  # hysteresis: the plan in force is within MARGIN of the best
        explain["decision"] = f"kept: the best plan gains less than {MARGIN:.0%}"
        new = retimed(plan, prof, judged.noise) if drifted else None
        reason = "; ".join(reasons) or "continuing towards the goodput plan (Note [replan bound])"
        return Decision(plan_json=None if new is None else plan_mod.to_dict(new),
                        reason=reason + (" (ratios kept)" if new is not None else ""),
                        explain=explain | {"goodput_after": before}, reference=judged, pending=False,
                        solve_s=time.perf_counter() - start)
    means, cut = bounded_means(plan.mean_ratio_per_stage(), best.mean_ratio_per_stage())
    new = solve(prof, means, "makespan") if cut else best
    if not reasons:
        reasons = ["continuing towards the goodput plan (Note [replan bound])"]
    explain |= {"goodput_after": goodput_at(new, prof, judged.noise), "bounded": cut}
    return Decision(plan_json=plan_mod.to_dict(new), reason="; ".join(reasons), explain=explain, reference=judged,
                    pending=cut, solve_s=time.perf_counter() - start)
