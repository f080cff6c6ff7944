"""fastlp's margin schedule: how many periods of each run stay untied (Note [periodic compression], Margins).

Part of tfplan.solve.fastlp. Margins holds the schedule of margins and the current compressions (tied.Compressed)
of one solve, and the start-time windows of tfplan.solve.fastlp.bound, built once when first needed.

Note [two margins]
  Both bounds of a phase hold for any ties, so the tied primal (U) and the tied dual (L) need not share a
  margin, and they do not need the same one: the plan of a phase can be periodic long before its prices
  are, or the other way round. On 1F1B 32 x 512 with the random-0 profile (benchmarks/solver_scale.py),
  phase 2's tied dual reached the optimum at the third margin (16k primal columns) while the tied primal
  needed the fourth (30k); phase 3's tied dual at that fourth margin then took 65 s of GLOP, at the third
  18 s, with the same optimum. So each side keeps its own margin: after a gap, a side grows if its value
  moved at its last growth (or it has none yet), and both grow when neither moved (a plateau of both,
  which a larger margin may still lift). A phase hands on to the next the smallest dual margin whose bound
  met its optimum; its primal margin is handed on as before (phase 3 starts from phase 2's basis). A dual
  handed a smaller margin than the primal's grows alone first, up to the primal's, before the rule above
  applies: growing the primal too at the first gap cost a round and a primal twice as large on small
  random instances (1F1B 4 x 32, tests/tfplan/solve/fastlp/test_margins.py).

Note [lagging runs]
  Phases 2-3 mostly start from the time-aligned margins (aligned_margins): each run keeps untied the periods
  its neighbours take to settle in the unfrozen schedule. The plan's timing is not the unfrozen one, and a
  run that the unfrozen timing calls settled early can need far more. On random-0 1F1B 32 x 512
  (benchmarks/solver_scale.py), stage 0's forward run started at 2 periods at its head where the others had
  4-56, and phase 2's primal needed about 23 there: doubling every run (2 m + 1) took four margins, the last
  of 30k LP columns, where growing that one run's head alone from the third margin (12 more columns) met the
  optimum (measured, one run grown at a time). So in phases 2-3 a grown margin (the primal's and the dual's)
  also lifts each end of every run to the median over the runs of that end's 2 m + 1: a run far behind its
  peers catches up at the next growth, for few columns, and runs at or above the median grow as before.
  Phase 1 starts at the same margin everywhere, where the median changes nothing. Measured with fastlp.solve
  on 45 instances (cap 0.9; the benchmark's random profiles and the uniform one; 1F1B, interleaved 1F1B, ZBV,
  interleaved ZB, DualPipeV, looped BFS, GPipe; up to 64 x 8192 and a million actions; one run each before
  and after, 2026-12-03): 37 certified at the same margins as before, in the same time to the noise. Five
  got faster: random-0 1F1B 32 x 512 11.9 -> 2.0 s (phase 2 certified at 10.4k columns instead of 30.0k),
  32 x 16384 17.9 -> 6.6 s, 32 x 512 random-8 2.9 -> 1.5 s, 16 x 256 random-2 4.9 -> 0.4 s and random-7
  1.6 -> 0.3 s. Three certified at a larger margin (1F1B 32 x 512 random-5 8.1k -> 9.5k columns, random-9
  7.6k -> 8.9k, interleaved 16 x 512 random-3 29.2k -> 31.0k) in the same time to the noise (random-9 twice
  each: 2.10, 1.90 s before, 2.11, 2.18 s after).

Note [catch-up rounds]
  Note [two margins] has a dual handed a smaller margin than the primal's grow alone first, capped at the
  primal's margin. Such a round grows the dual only where it lagged, so its value staying put says nothing of
  whether the dual's margin is large enough, and rounds.certified does not count it as a growth that moved
  nothing (caught_up). It did: on the hard instances of benchmarks/solver_scale.py (`--figures hard`; 1F1B 32 x
  16384) phase 2's dual started 13-158 periods behind the primal's of about 2,500-2,700 in all; on seeds 25 and
  26 its catch-up round moved nothing, and the primal then grew alone, the dual still short at its first margin,
  until the primal's value stalled (seed 25, spread 3: three times, then both, to 75k LP columns, and phase 3 at
  96k took 152 s; seed 26: twice, then both, to 39k). Counting it no more, both sides grow at the next gap: phase
  2 certified at 20k and 11k columns (fastlp.solve 183 -> 13.5 s and 22.7 -> 11.6 s, with Note [kept compression]
  in tfplan.solve.fastlp.rounds; the same optima). A dual behind by fewer than CATCH_UP_SHARE of its own periods
  is not caught up alone at all: such a round costs a tied dual solve (0.5-1 s there) and changes a few runs.

Note [phase 3 growth]
  Phase 3 grows its margins by half (m -> ceil(1.5 m) + 1), not doubling as phases 1-2 do. Where phase 3 needs a
  second margin at all, its first (phase 2's) falls short by little, and that second round is the costliest of a
  solve: through phase 2 at the new margin, then phase 3's LPs from those bases (Note [phase 3 through phase 2] in
  tfplan.solve.fastlp.phases), GLOP's time growing faster than the columns. On the three hard instances of
  benchmarks/solver_scale.py whose phase 3 needed a second margin (1F1B 32 x 16384, cap 0.9; fastlp.solve, one run
  each, alone on the 2-core machine, 2026-12-07 10:29-10:36 UTC; phase 3's seconds, its last LP's columns): seed 27
  16.2 s at 14,859 columns doubling, 11.5 s at 11,672 growing by half; seed 28 10.9 s (13,393) against 7.9 s
  (10,566); seed 15 6.5 s against 5.4 s (the dual alone grew there). Each certified at its second margin, with the
  same optimum to the tolerance (seed 27 786.28907002 and 786.28905945, seed 28 637.36731528 and 637.36729450:
  3.3e-8 relative). Growing by a quarter cost seed 28 a third round (12.0 s). Phases 1-2 keep doubling: their
  rounds are cheap, and fewer of them is what counts there.

Note [phase 1's growth]
  Phase 1 starts at 2 periods, and at its first gap grows to at least where phases 2-3 start (the cheaper of the
  stage count and the time-aligned margins), not to 5. Its rounds are cheap in GLOP but not in Python (each builds
  a compression, a tied dual's rows and a safe bound over every action), and on the hard instances of
  benchmarks/solver_scale.py with a p2p lag its optimum needed four (2, 5, 11, 23 periods on seed 27); phase 2
  then starts at phase 1's compression. Where 2 periods certify, as on uniform 1F1B 32 x 512, nothing changes:
  started at phases 2-3's margin instead, phase 1 took 1.5 s there against 0.19 s (fastlp.solve 1.6 -> 2.8 s).
  Measured: docs/benchmarks.md, "Hard instances, phase 1's growth and phase 3's".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfplan.solve.fastlp.bound import Windows
from tfplan.solve.fastlp.graph import GraphArrays, Runs, Ties
from tfplan.solve.fastlp.tied import Compressed
from tfplan.step.dag import Dag

PHASE3_GROWTH = 1.5
"""Phase 3 grows a margin m to ceil(1.5 m) + 1 rather than 2 m + 1 (Note [phase 3 growth])."""
CATCH_UP_SHARE = 0.1
"""A dual behind the primal's margin by fewer periods than this share of its own is not caught up alone first (Note
[catch-up rounds])."""


class Margins:
    """The margin schedule and the current compression (Note [periodic compression], Margins).

    A margin is a pair of (num_runs,) arrays: periods left untied at the head and at the tail of each run.
    Phase 1 starts at `first` everywhere. Phases 2-3 start at the cheaper (fewer untied actions) of `later`
    everywhere and the time-aligned margins of aligned_margins. A gap grows a margin to 2 m + 1 (phase 1: at least
    to where phases 2-3 start, Note [phase 1's growth]; phase 3: Note [phase 3 growth]; in phases 2-3 each end at
    least the median over the runs, Note [lagging runs]); None stands for "nothing tied" (the full LP). `current`
    is the tied primal's margin, `dual` the tied dual's (Note [two margins]); the dual's is never None (an untied
    primal certifies itself).
    """

    def __init__(self, dag: Dag, g: GraphArrays, runs: Runs, first: int, later: int | None,
                 start_ms: Sequence[float]) -> None:
        self.dag, self.g, self.runs = dag, g, runs
        k = runs.num_runs
        self.candidates = [(np.full(k, max(2, dag.schedule.num_stages) if later is None else later),) * 2]
        if later is None:
            aligned = aligned_margins(runs, start_ms)
            if aligned is not None:
                self.candidates.append(aligned)
        self._later = min(self.candidates, key=lambda m: self._untied(m))  # where phases 2-3 start
        self.current: tuple[np.ndarray, np.ndarray] | None = (np.full(k, first), np.full(k, first))
        self.dual: tuple[np.ndarray, np.ndarray] = self.current
        self._catch_up = False  # the dual was handed a smaller margin than the primal's (Note [two margins])
        self.caught_up = False  # the last advance only caught the dual up (Note [catch-up rounds])
        self._phase = 1  # how a margin grows depends on it (_widened)
        self._compressed: dict[object, Compressed] = {}  # the primal's (current) and the last other one
        self._windows: dict[str, Windows] = {}

    def chain_windows(self) -> Windows:
        """Windows.chains of the graph (numpy, tens of ms per million actions), computed once."""
        if "chains" not in self._windows:
            self._windows["chains"] = Windows.chains(self.g, self.dag)
        return self._windows["chains"]

    def path_windows(self) -> Windows:
        """Windows.build of the graph (tighter; seconds per million actions), computed once, when first asked."""
        if "paths" not in self._windows:
            self._windows["paths"] = Windows.build(self.g, self.dag)
        return self._windows["paths"]

    def start(self, phase: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The primal's margin for `phase` (also moves the dual's to at least the phase's starting margin)."""
        self._phase = phase
        if phase > 1 and self.current is not None:
            best = self._later
            self.current = (np.maximum(self.current[0], best[0]), np.maximum(self.current[1], best[1]))
            dual = (np.maximum(self.dual[0], best[0]), np.maximum(self.dual[1], best[1]))
            # Per run, that maximum can tie nothing where the primal's still ties something: then the dual
            # starts at the primal's margin (a tied dual must tie something; Margins docstring).
            self.dual = dual if self.runs.ties(self.g.n, dual).num_tied else self.current
        self._catch_up = self.current is not None and self._dual_behind(self.current)
        return self.current

    def advance(self, moved_primal: bool, moved_dual: bool) -> tuple[bool, bool]:
        """After a gap, grow the margins as Note [two margins] says, given whether each side's value moved at its
        last growth. Returns which sides to solve again (primal, dual); the primal's margin is then `current`."""
        margin = self.current
        assert margin is not None, "an untied primal certifies itself"
        self._catch_up = self._catch_up and self._dual_behind(margin)
        if self._catch_up:  # so few periods behind that a round for them says nothing (Note [catch-up rounds])
            behind = sum(int(np.maximum(0, m - d).sum()) for m, d in zip(margin, self.dual))
            self._catch_up = behind >= CATCH_UP_SHARE * sum(int(d.sum()) for d in self.dual)
        self.caught_up = self._catch_up
        if self._catch_up:
            assert self.grow_dual(cap=margin), "a margin below a tied primal's can grow"
            return False, True
        primal, dual = moved_primal or not moved_dual, moved_dual or not moved_primal
        if dual and not self.grow_dual():
            primal, dual = True, False  # the dual cannot grow further while tied: the primal does
        if primal:
            self.grow(margin)
        return primal, dual

    def grow(self, margin: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
        """The primal's margin grown (_widened); None once that ties nothing."""
        self.current = self._grown(margin)
        return self.current

    def grow_dual(self, cap: tuple[np.ndarray, np.ndarray] | None = None) -> bool:
        """The dual's margin grown as the primal's (_widened), at most `cap` where it is below `cap` (never shrunk);
        False (unchanged) when that would tie nothing."""
        grown = self._widened(self.dual)
        if cap is not None:
            grown = (np.maximum(self.dual[0], np.minimum(grown[0], cap[0])),
                     np.maximum(self.dual[1], np.minimum(grown[1], cap[1])))
        if not self.runs.ties(self.g.n, grown).num_tied:
            return False
        self.dual = grown
        return True

    def keep(self, margin: tuple[np.ndarray, np.ndarray] | None, c: Compressed) -> None:
        """Make `margin`, whose compression is `c`, the primal's again (the next phase starts from the point a phase
        kept there, Note [kept compression] in tfplan.solve.fastlp.rounds)."""
        self.current = margin
        self._compressed[_key(margin)] = c

    def _dual_behind(self, margin: tuple[np.ndarray, np.ndarray]) -> bool:
        """Whether the dual's margin is below the (tied) primal's `margin` for some run."""
        return bool(np.any(self.dual[0] < margin[0]) or np.any(self.dual[1] < margin[1]))

    def compressed(self, margin: tuple[np.ndarray, np.ndarray] | None) -> Compressed:
        """The compression at `margin`. The primal's (current) one stays cached while the dual's change: phase 3
        recognises phase 2's compression by identity to start from its basis (Note [warm phase 3])."""
        key = _key(margin)
        if key not in self._compressed:
            keep = _key(self.current)
            self._compressed = {k: c for k, c in self._compressed.items() if k == keep}
            ties = Ties.none(self.g.n) if margin is None else self.runs.ties(self.g.n, margin)
            self._compressed[key] = Compressed(self.g, ties)
        return self._compressed[key]

    def _grown(self, margin: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
        grown = self._widened(margin)
        return grown if self.runs.ties(self.g.n, grown).num_tied else None

    def _widened(self, margin: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """2 m + 1 per run and end (phase 3: ceil(1.5 m) + 1, Note [phase 3 growth]); in phase 1 at least where phases
        2-3 start (Note [phase 1's growth]), in phases 2-3 at least the median over the runs (Note [lagging runs])."""
        growth = PHASE3_GROWTH if self._phase == 3 else 2.0
        head, tail = (np.ceil(growth * m).astype(np.int64) + 1 for m in margin)
        if self._phase == 1:
            head, tail = np.maximum(head, self._later[0]), np.maximum(tail, self._later[1])
        elif len(head):
            head = np.maximum(head, int(np.median(head)))
            tail = np.maximum(tail, int(np.median(tail)))
        return head, tail

    def _untied(self, margin: tuple[np.ndarray, np.ndarray]) -> int:
        return self.g.n - self.runs.ties(self.g.n, margin).num_tied


def _key(margin: tuple[np.ndarray, np.ndarray] | None) -> object:
    return None if margin is None else (margin[0].tobytes(), margin[1].tobytes())


def aligned_margins(runs: Runs, start_ms: Sequence[float], slack: int = 2, limit: int = 2000):
    """Margins from the timing of the unfrozen schedule: a run that enters its steady state before the runs
    running beside it (overlapping in time) are all in theirs keeps the periods in between untied, twice over,
    plus `slack`; the same at its end. This follows the pipeline's fill and drain rank by rank (1F1B: a stage
    late in the pipeline starts its steady state early), where one margin for all runs must fit the worst.
    None when there are no runs or more than `limit` (the overlap test is quadratic)."""
    k = runs.num_runs
    if k == 0 or k > limit:
        return None
    start = np.asarray(start_ms)
    first, last = runs.nodes[runs.start[:-1]], runs.nodes[runs.start[1:] - 1]
    t0, t1 = start[first], start[last]
    period = start[runs.nodes[runs.start[:-1] + 1]] - t0
    overlap = (t0[:, None] <= t1[None, :]) & (t0[None, :] <= t1[:, None])
    all_in = np.where(overlap, t0[None, :], -np.inf).max(axis=1)  # when every overlapping run is steady
    all_out = np.where(overlap, t1[None, :], np.inf).min(axis=1)
    ok = period > 0
    per = np.where(ok, period, 1.0)
    head = np.where(ok, np.ceil(2 * (all_in - t0) / per), np.inf) + slack
    tail = np.where(ok, np.ceil(2 * (t1 - all_out) / per), np.inf) + slack
    cap = np.diff(runs.start)  # a margin past the run's length unties it all
    return np.minimum(head, cap).astype(np.int64), np.minimum(tail, cap).astype(np.int64)
