"""Which parameters a (stage, micro-batch) action freezes at a step, given the plan's freeze ratio.

A stage's tensors and their costs are tfrun.freeze.candidates (Note [freeze share]); the windows of frozen
sets are drawn by tfrun.freeze.allocate.

Note [freeze policy]: the choices of `--freeze-policy` (measured in docs/benchmarks.md, "Freeze policies"):
  auto      (default) stage 0 freezes prefixes (linear time) in every window in which the plan leaves some
            micro-batch unfrozen (it then trains the whole stage), and rotating random subsets otherwise
            (tfrun.freeze.allocate Note [stage 0]); every other stage freezes rotating random subsets (Note
            [rotation]). Every tensor learns in every window. Measured: on LP plans it trains as well as the
            best policy (prefix), and on a plan that freezes everything at 0.9 as well as `random`.
  skip      whole-backward skips in a share r of steps on every stage (tfrun.freeze.allocate Note [skip]): exact
            mean times, but steps vary and the mean step exceeds the LP's; trains worst of all.
  random    rotating random subsets on every stage (fair, but stage 0 saves little until r = 1).
  prefix    stage 0 always freezes a prefix (embedding, block 0, ...): linear in time, but the front of the
            model never learns while its ratios stay high (measured: 18 of 19 stage-0 tensors never updated
            in 1000 steps at cap 0.9 under interleaved ZB). Rotating subsets elsewhere.
  weighted  stage 0 draws a random subset weighted towards the front (the paper's code), frozen as a
            prefix of that random order; rotating subsets elsewhere.
  goodput   stage 0 as `auto`; elsewhere one rotating turn per window, then the tensors with the least learning
            per ms of weight-gradient work frozen first (tfrun.freeze.allocate Note [goodput order]; the learning
            from each tensor's measured noise scale and |G|^2, goodput_priority). Until the noise is measured,
            as `auto`. The default under `--objective goodput`.
Every policy plans a window of `redraw_every` steps at once (tfrun.freeze.allocate Note [window budget]): over
every window a stage's realised mean ratio is at most its planned mean. Selections are functions of
(seed, step, stage, micro-batch) and the Freezer's state, never of the data-parallel rank.

Note [stale guard]: with `max_stale_steps` K > 0, a tensor that received no gradient in K consecutive steps
is unfrozen in one micro-batch of the next step (the one with the smallest planned ratio), whatever the plan
says. Rotation already bounds the gap whenever a window's unfrozen share adds up to a turn, so K is off by
default; it matters for plans that put a stage at ratios near 1.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass

from tfrun.config.train_config import FREEZE_POLICIES
from tfrun.freeze import allocate
from tfrun.freeze.candidates import Candidate, goodput_priority

log = logging.getLogger(__name__)

POLICIES = FREEZE_POLICIES
AUTO, SKIP, RANDOM, PREFIX, WEIGHTED, GOODPUT = POLICIES
ROTATE = "rotate"  # the per-stage mode of `random` (and of other stages under auto/prefix/weighted)
PREFIX_OR_ROTATE = "prefix|rotate"  # stage 0 under auto: tfrun.freeze.allocate Note [stage 0]


@dataclass(frozen=True, kw_only=True, slots=True)
class Selection:
    """The parameters one action freezes."""

    names: frozenset[str]
    """Frozen parameter names."""
    share: float
    """Realised frozen share of the stage's weight-gradient cost, in [0, 1]."""


def stage_mode(policy: str, stage: int) -> str:
    """The selection mode a policy uses on a stage (Note [freeze policy])."""
    if policy == SKIP:
        return SKIP
    if stage == 0 and policy in (AUTO, PREFIX, WEIGHTED, GOODPUT):
        return PREFIX_OR_ROTATE if policy in (AUTO, GOODPUT) else policy
    return GOODPUT if policy == GOODPUT else ROTATE


class Freezer:
    """Per-(stage, micro-batch) frozen parameter sets for one rank's stages, and what they realised.

    Args:
        stage_candidates: stage index -> its candidates (from `candidates`).
        ratios: (stage, micro-batch) -> planned freeze ratio of that micro-batch's B or W action.
        num_microbatches: micro-batches per step M.
        seed: selection seed (the same on every data-parallel replica).
        redraw_every: window length in steps (>= 1), Note [window budget].
        ramp_steps: ratios ramp linearly from 0 to the plan over this many steps (0 = from the first step).
        policy: one of POLICIES (Note [freeze policy]).
        max_stale_steps: Note [stale guard] (0 = off).
        signal: a baseline (tfrun.freeze.baselines APF or AutoFreeze). Alone (hybrid False) it decides everything:
            its frozen tensors, in every micro-batch of a step, and the ratios are ignored. With hybrid True
            the ratios decide how much each action freezes and the signal which tensors (its `preferred`
            ones first, METHOD.md section 5).
        noise: the rank's tfrun.freeze.noise.NoiseMeter, whose per-tensor estimates order the `goodput` policy's
            tensors (goodput_priority), with `batch_tokens` the step's batch in tokens.

    A plan can change during training (`set_plan`, the online mode): windows and the ramp then count from the
    step the new plan starts ("epoch"). `set_probe` freezes whole micro-batches on every stage for measuring
    (tfrun.freeze.online); `set_measured` leaves whole micro-batches of one step unfrozen on every stage for the
    noise scale (tfrun.freeze.controller Note [unfrozen measurement]).
    """

    def __init__(
        self,
        stage_candidates: dict[int, list[Candidate]],
        ratios: Mapping[tuple[int, int], float],
        *,
        num_microbatches: int,
        seed: int,
        redraw_every: int = 10,
        ramp_steps: int = 0,
        policy: str = AUTO,
        max_stale_steps: int = 0,
        signal=None,
        hybrid: bool = False,
        noise=None,
        batch_tokens: float = 0.0,
    ) -> None:
        assert redraw_every >= 1 and ramp_steps >= 0 and max_stale_steps >= 0 and policy in POLICIES
        self.stage_candidates = stage_candidates
        self.ratios = dict(ratios)
        self.num_microbatches = num_microbatches
        self.seed, self.redraw_every, self.ramp_steps = seed, redraw_every, ramp_steps
        self.policy, self.max_stale_steps = policy, max_stale_steps
        self._plans: dict[int, tuple[int, list[list[Selection]]]] = {}  # stage -> (window, (W, M) selections)
        # Skip stages: (window, debt at its start, debt at its end or None until planned),
        # tfrun.freeze.allocate.skip_steps.
        self._debt: dict[int, tuple[int, list[float], list[float] | None]] = {}
        self._forced: tuple[int, dict[int, dict[int, frozenset[str]]]] = (-1, {})  # step, stage -> mb -> names
        self.stats = {s: TensorStats(len(c)) for s, c in stage_candidates.items()}
        self._warned: set[int] = set()
        self.epoch = 0
        """The step the plan in force started at."""
        self.probe: tuple[int, int] | None = None
        """(first step, micro-batches per step) while probing (probe_microbatches), else None."""
        self.signal, self.hybrid = signal, hybrid
        self._preferred: dict[int, tuple[int, frozenset[str]]] = {}  # hybrid: stage -> (window, preferred names)
        self.noise, self.batch_tokens = noise, batch_tokens
        self._priority: dict[int, tuple[int, list[float] | None]] = {}  # goodput: stage -> (window, priorities)
        self._fixed: tuple[int, dict[int, Selection]] = (-1, {})  # a baseline's step -> stage -> Selection
        self._measured: tuple[int, frozenset[int]] = (-1, frozenset())  # step, micro-batches left unfrozen

    def set_plan(self, ratios: Mapping[tuple[int, int], float], start_step: int, ramp_steps: int) -> None:
        """Apply new planned ratios from `start_step`, ramped over `ramp_steps`; ends a probe."""
        self.ratios, self.epoch, self.ramp_steps, self.probe = dict(ratios), start_step, ramp_steps, None
        self._plans.clear()
        self._debt.clear()
        self._preferred.clear()
        self._priority.clear()
        self._forced = (-1, {})

    def set_probe(self, start_step: int, per_step: int) -> None:
        """From `start_step`, freeze every parameter of `per_step` whole micro-batches per step on every stage
        (probe_microbatches) and nothing else, until the next set_plan."""
        assert 1 <= per_step <= self.num_microbatches
        self.probe = (start_step, per_step)

    def set_measured(self, step: int, microbatches: frozenset[int]) -> None:
        """At `step` only, compute every gradient in `microbatches` on every stage, whatever the plan says; the
        plan's own choice there (`shadowed`) still decides what the update learns from (the window plans, their
        carries and the ramp are not touched)."""
        self._measured = (step, frozenset(microbatches))

    def probe_microbatches(self, step: int) -> frozenset[int]:
        """The micro-batches frozen entirely at `step` of a probe: a block of `per_step` that moves by
        `per_step` each step, so consecutive probe steps cover every micro-batch."""
        if self.probe is None or step < self.probe[0]:
            return frozenset()
        start, k = self.probe
        return frozenset(((step - start) * k + j) % self.num_microbatches for j in range(k))

    def ramp(self, step: int) -> float:
        """Fraction of the planned ratios applied at `step` (0-based)."""
        if self.ramp_steps == 0:
            return 1.0
        return min(1.0, (step - self.epoch + 1) / self.ramp_steps)

    def selection(self, step: int, stage: int, mb: int) -> Selection:
        """The parameters frozen in stage `stage`'s micro-batch `mb` at training step `step`."""
        if self.probe is not None and step >= self.probe[0]:
            everything = range(len(self.stage_candidates[stage])) if mb in self.probe_microbatches(step) else ()
            return self._selection(stage, set(everything))
        if self._measured[0] == step and mb in self._measured[1]:
            return self._selection(stage, set())
        return self._plan_selection(step, stage, mb)

    def shadowed(self, step: int, stage: int, mb: int) -> frozenset[str]:
        """The names the plan freezes in `mb` of a measured step, which `set_measured` computes anyway: their
        gradients feed the noise scale and stay out of the update (tfrun.freeze.noise Note [shadow gradients]);
        empty outside the measured block."""
        if self._measured[0] != step or mb not in self._measured[1]:
            return frozenset()
        return self._plan_selection(step, stage, mb).names

    def _plan_selection(self, step: int, stage: int, mb: int) -> Selection:
        if self.signal is not None and not self.hybrid:  # a baseline alone: its tensors in every micro-batch
            if self._fixed[0] != step:
                self._fixed = (step, {})
            if stage not in self._fixed[1]:
                names = self.signal.frozen(step, stage)
                self._fixed[1][stage] = self._selection(stage, {self._index(stage, n) for n in names})
            return self._fixed[1][stage]
        assert step >= self.epoch, "a step before the plan in force"
        window = (step - self.epoch) // self.redraw_every
        sel = self._window_plan(stage, window)[step - self.epoch - window * self.redraw_every][mb]
        if self.max_stale_steps:
            forced = self._forced_names(step, stage).get(mb)
            if forced:
                sel = self._selection(stage, {self._index(stage, n) for n in sel.names - forced})
        return sel

    def before_optimizer(self, step: int, modules: dict, frozen_counts: Mapping[tuple[int, str], int] | None = None,
                         rescaled: bool = False) -> None:
        """The step's gradients are complete (a baseline reads them: `frozen_counts` says how many micro-batches
        each tensor was frozen in, `rescaled` whether --grad-rescale already scaled them to the full step)."""
        if self.signal is not None:
            self.signal.before_optimizer(step, modules, frozen_counts, rescaled)

    def after_optimizer(self, step: int, modules: dict) -> None:
        """The parameters are updated (a baseline reads the update and may change its frozen set)."""
        if self.signal is not None:
            self.signal.after_optimizer(step, modules)

    def end_step(self, step: int, frozen_counts: Mapping[tuple[int, str], int]) -> None:
        """Record what step `step` realised: (stage, name) -> micro-batches in which it was frozen."""
        for s, cands in self.stage_candidates.items():
            counts = [frozen_counts.get((s, c.name), 0) for c in cands]
            self.stats[s].record(step, [self.num_microbatches - k for k in counts])

    # -- planning ---------------------------------------------------------------------------------------------

    def _window_plan(self, stage: int, window: int) -> list[list[Selection]]:
        cached = self._plans.get(stage)
        if cached is not None and cached[0] == window:
            return cached[1]
        w, m = self.redraw_every, self.num_microbatches
        allowance = [[self.ratios.get((stage, j), 0.0) * self.ramp(self.epoch + window * w + t) for j in range(m)]
                     for t in range(w)]
        cands = self.stage_candidates[stage]
        costs = [c.cost for c in cands]
        mode = stage_mode(self.policy, stage)
        rng = random.Random(f"{self.seed}/{window}/{stage}")  # str seeds hash deterministically
        if not cands:
            cells = [[frozenset()] * m for _ in range(w)]
        elif self.signal is not None:  # hybrid: the baseline's candidates first, as prefixes of weighted orders
            got = self._preferred.get(stage)
            if got is None or got[0] != window:  # the signal as of the window's start (kept for a resume)
                got = self._preferred[stage] = (window, frozenset(self.signal.preferred(self.epoch + window * w,
                                                                                         stage)))
            preferred = {self._index(stage, n) for n in got[1]}
            orders = [[allocate.preferring_order(len(cands), preferred, rng) for _ in range(m)] for _ in range(w)]
            cells = allocate.prefix(costs, lambda t, j: orders[t][j], allowance)
        elif mode == SKIP:
            start = self._window_debt(stage, window)
            skip, end = allocate.skip_steps(allowance, start)
            self._debt[stage] = (window, start, end)
            everything = frozenset(range(len(cands)))
            cells = [[everything if s else frozenset() for s in row] for row in skip]
        elif mode in (PREFIX, PREFIX_OR_ROTATE):
            cells = allocate.prefix(costs, lambda t, j: range(len(cands)), allowance)
            if mode == PREFIX_OR_ROTATE and frozenset.intersection(*(c for row in cells for c in row)):
                # a prefix would starve some tensor for the whole window (tfrun.freeze.allocate Note [stage 0])
                if stage not in self._warned:
                    self._warned.add(stage)
                    log.warning("stage %d: the plan leaves no micro-batch unfrozen, so the auto policy freezes "
                                "rotating subsets there, which saves less time than planned; a plan solved with "
                                "tfplan's default --stage0-anchor leaves one (tfplan.plan.job Note [stage-0 anchor])",
                                stage)
                cells = allocate.rotate(costs, rng.sample(range(len(cands)), len(cands)), allowance)
        elif mode == ROTATE:
            cells = allocate.rotate(costs, rng.sample(range(len(cands)), len(cands)), allowance)
        elif mode == GOODPUT:
            got = self._priority.get(stage)
            if got is None or got[0] != window:  # the estimates as of the window's start (kept for a resume)
                estimates = self.noise.tensor_estimates(stage) if self.noise is not None else {}
                got = self._priority[stage] = (window, goodput_priority(cands, estimates, self.batch_tokens))
            cells = allocate.rotate(costs, rng.sample(range(len(cands)), len(cands)), allowance, priority=got[1])
        else:
            orders = [[allocate.weighted_order(len(cands), rng) for _ in range(m)] for _ in range(w)]  # weighted
            cells = allocate.prefix(costs, lambda t, j: orders[t][j], allowance)
        plan = [[self._selection(stage, cell) for cell in row] for row in cells]
        self._plans[stage] = (window, plan)
        return plan

    def _window_debt(self, stage: int, window: int) -> list[float]:
        """The skip debt at the start of `window`: the end of the last planned window before it."""
        got = self._debt.get(stage)
        if got is None or got[0] > window:
            return [0.0] * self.num_microbatches
        if got[0] == window:
            return got[1]
        if got[2] is None:  # restored from a checkpoint: plan that window again to learn its end
            self._window_plan(stage, got[0])
            got = self._debt[stage]
        return got[2]

    def _selection(self, stage: int, frozen: set[int] | frozenset[int]) -> Selection:
        cands = self.stage_candidates[stage]
        total = sum(c.cost for c in cands)
        share = sum(cands[i].cost for i in frozen) / total if total > 0 else 0.0
        return Selection(names=frozenset(cands[i].name for i in frozen), share=min(1.0, share))

    def _index(self, stage: int, name: str) -> int:
        return next(i for i, c in enumerate(self.stage_candidates[stage]) if c.name == name)

    def _forced_names(self, step: int, stage: int) -> dict[int, frozenset[str]]:
        """Micro-batch -> names to unfreeze in it at `step` (Note [stale guard])."""
        if self._forced[0] != step:
            self._forced = (step, {})
        by_stage = self._forced[1]
        if stage not in by_stage:
            window = (step - self.epoch) // self.redraw_every
            row = self._window_plan(stage, window)[step - self.epoch - window * self.redraw_every]
            stale = self.stats[stage].stale(step, self.max_stale_steps)
            forced: dict[int, set[str]] = {}
            mbs = sorted(range(self.num_microbatches), key=lambda j: (self.ratios.get((stage, j), 0.0), j))
            for i in stale:
                name = self.stage_candidates[stage][i].name
                if all(name in row[j].names for j in mbs):  # frozen everywhere this step: free it once
                    forced.setdefault(mbs[0], set()).add(name)
            by_stage[stage] = {j: frozenset(n) for j, n in forced.items()}
        return by_stage[stage]

    # -- state ------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything history-dependent: skip debts and per-tensor statistics (selection is otherwise a
        function of seed, step, stage and micro-batch)."""
        return {
            "seed": self.seed, "policy": self.policy, "redraw_every": self.redraw_every,
            "ratios": [[s, m, r] for (s, m), r in sorted(self.ratios.items())], "epoch": self.epoch,
            "ramp_steps": self.ramp_steps, "probe": list(self.probe) if self.probe else None,
            "debt": {s: [w, list(start)] for s, (w, start, _) in self._debt.items()},
            "stats": {s: st.state_dict() for s, st in self.stats.items()},
            "signal": self.signal.state_dict() if self.signal is not None else None,
            "preferred": {s: [w, sorted(names)] for s, (w, names) in self._preferred.items()},
            "priority": {s: [w, values] for s, (w, values) in self._priority.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if "ratios" in state:  # the plan in force (it changes in online runs)
            self.set_plan({(s, m): r for s, m, r in state["ratios"]}, state["epoch"], state["ramp_steps"])
            self.probe = tuple(state["probe"]) if state["probe"] else None
        self._debt = {int(s): (int(w), [float(x) for x in d], None) for s, (w, d) in state.get("debt", {}).items()}
        for s, st in state.get("stats", {}).items():
            self.stats[int(s)].load_state_dict(st)
        if self.signal is not None and state.get("signal") is not None:
            self.signal.load_state_dict(state["signal"])
        self._preferred = {int(s): (int(w), frozenset(n)) for s, (w, n) in state.get("preferred", {}).items()}
        self._priority = {int(s): (int(w), v) for s, (w, v) in state.get("priority", {}).items()}
        self._plans.clear()
        self._forced = (-1, {})


class TensorStats:
    """Per-tensor update history of one stage (Note [stale guard]; written to freeze_stats.json)."""

    def __init__(self, n: int) -> None:
        self.steps = 0
        self.steps_updated = [0] * n
        """Steps in which the tensor received gradient from at least one micro-batch."""
        self.contributions = [0] * n
        """(step, micro-batch) pairs that contributed gradient."""
        self.last_update = [-1] * n
        """Last step with an update (-1: none yet)."""
        self.longest_gap = [0] * n
        """Most consecutive steps without an update."""

    def record(self, step: int, contributions: list[int]) -> None:
        self.steps += 1
        for i, c in enumerate(contributions):
            self.contributions[i] += c
            if c > 0:
                self.steps_updated[i] += 1
                self.last_update[i] = step
            self.longest_gap[i] = max(self.longest_gap[i], step - self.last_update[i])

    def row(self, i: int) -> dict:
        """Tensor i's statistics (a freeze_stats.json row, without stage, name and cost)."""
        return {"steps": self.steps, "steps_updated": self.steps_updated[i], "contributions": self.contributions[i],
                "last_update": self.last_update[i], "longest_gap": self.longest_gap[i]}

    def stale(self, step: int, k: int) -> list[int]:
        """Tensors with no update in the k steps before `step`."""
        return [i for i, last in enumerate(self.last_update) if step - 1 - last >= k]

    def state_dict(self) -> dict:
        return {"steps": self.steps, "steps_updated": self.steps_updated, "contributions": self.contributions,
                "last_update": self.last_update, "longest_gap": self.longest_gap}

    def load_state_dict(self, state: dict) -> None:
        for key in ("steps_updated", "contributions", "last_update", "longest_gap"):
            setattr(self, key, list(state[key]))
        self.steps = int(state["steps"])
