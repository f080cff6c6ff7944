"""The DAG as numpy arrays, its LP rows, and the periodic structure that fastlp compresses.

Part of tfplan.solve.fastlp (the Note [periodic compression] there explains the method). Three steps:
  GraphArrays.from_dag   the Dag's lists as flat numpy arrays (n = actions), with the LP's precedence rows:
                         the same set as lp.precedence_rows, vectorised;
  Runs.detect            maximal chains of repeating actions (same stage and kind, q micro-batches apart,
                         shifted predecessors);
  Runs.ties              node v "ties" to a representative rep[v] of its run, off[v] periods later, leaving
                         a margin of periods untied at both ends of every run.
Every array is indexed by node (action) unless named otherwise; times in ms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tfplan.step.dag import Dag

FIRST_MARGIN = 2
"""Periods left untied at each end of a run in phase 1's first round (tfplan.solve.fastlp.phases.solve's default)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GraphArrays:
    """A Dag as flat arrays, plus its LP rows (Note [redundant rows] in tfplan.solve.lp)."""

    n: int
    """Number of actions."""
    cls: np.ndarray
    """(n,) int: stage * 4 + kind code; actions of one class have the same durations."""
    mb: np.ndarray
    """(n,) int: micro-batch."""
    stage: np.ndarray
    """(n,) int: stage."""
    rank: np.ndarray
    """(n,) int: rank."""
    pos: np.ndarray
    """(n,) int: index of the action in its rank's list."""
    preds: np.ndarray
    """(3, n) int: the Dag's three predecessor slots (-1 = none)."""
    lags: np.ndarray
    """(3, n) float: lag of each predecessor slot (ms)."""
    d_max: np.ndarray
    """(n,) float: unfrozen duration (ms)."""
    delta: np.ndarray
    """(n,) float: d_max - d_min for actions in a freeze group (Dag.freeze_mask), else 0 (ms)."""
    frz: np.ndarray
    """(n,) bool: the action is in its stage's freeze group (has a ratio variable)."""
    row_u: np.ndarray
    """(E,) int: tail of each precedence row t_v >= t_u + d_u + lag."""
    row_v: np.ndarray
    """(E,) int: head of each precedence row."""
    row_lag: np.ndarray
    """(E,) float: lag of each precedence row (ms)."""
    sinks: np.ndarray
    """Sorted node ids of each rank's last action (rows T >= t_u + d_u + tail; tfplan.step.dag Note [rank tails]);
    every node without successors is among them."""
    sink_tail: np.ndarray
    """(K,) float: the tail after each of `sinks` (its rank's tail, ms)."""
    topo: np.ndarray
    """(n,) int: a topological order of the nodes (the Dag's)."""
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    """What is derived from these arrays once per solve (row_levels; the compressions' lag ids)."""

    def row_levels(self) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray]]:
        """(levels(row_v), out_index, levels(out_index)), out_index the rows' tails then the sinks: which rows
        reach their head (and which rows and sink rows their tail) without two reaching one action, computed once
        per graph. The safe bound's exact flow sums scatter by them (tfplan.solve.fastlp.bound), and the tied
        dual's incidence places each row in a slot of its action by them (tfplan.solve.fastlp.dual)."""
        if "row_levels" not in self.memo:
            out_index = np.concatenate([self.row_u, self.sinks]).astype(np.int32 if self.n < 2**31 else np.int64)
            self.memo["row_levels"] = (levels(self.row_v), out_index, levels(out_index))
        return self.memo["row_levels"]

    @classmethod
    def from_dag(cls, dag: Dag) -> GraphArrays:
        n = dag.num_nodes
        stage, kind, mb = dag.action_arrays()
        rank = np.asarray(dag.rank, dtype=np.int64)
        preds = np.stack([np.fromiter(p, np.int64, n) for p in dag.preds]) if n else np.zeros((3, 0), np.int64)
        lags = np.stack([np.fromiter(x, np.float64, n) for x in dag.lags]) if n else np.zeros((3, 0))
        d_max = np.asarray(dag.d_max, dtype=np.float64)
        d_min = np.asarray(dag.d_min, dtype=np.float64)
        frz = np.fromiter(dag.freeze_mask(), bool, n)
        delta = np.where(frz, d_max - d_min, 0.0)
        row_u, row_v, row_lag, _ = _rows(n, rank, preds, lags)
        finish = sorted(dag.finish()) if n else []
        sinks = np.fromiter((u for u, _ in finish), np.int64, len(finish))
        sink_tail = np.fromiter((t for _, t in finish), np.float64, len(finish))
        return cls(
            n=n, cls=stage * 4 + kind, mb=mb, stage=stage, rank=rank, pos=_positions(preds[0]),
            preds=preds, lags=lags, d_max=d_max, delta=delta, frz=frz,
            row_u=row_u, row_v=row_v, row_lag=row_lag, sinks=sinks, sink_tail=sink_tail,
            topo=np.fromiter(dag.topo, np.int64, n),
        )


def _positions(prev: np.ndarray) -> np.ndarray:
    """Index of each action in its rank's list, from the rank-chain slot (prev[v] = previous action or -1)."""
    n = len(prev)
    idx = np.arange(n)
    if np.all((prev == -1) | (prev == idx - 1)):  # dag.build lists ranks one after another
        first = np.maximum.accumulate(np.where(prev == -1, idx, 0))
        return idx - first
    pos = np.zeros(n, dtype=np.int64)
    heads = np.flatnonzero(prev == -1)
    nxt = np.full(n, -1)
    nxt[prev[prev >= 0]] = np.flatnonzero(prev >= 0)
    for h in heads.tolist():  # general layout: walk each chain
        k, v = 0, h
        while v >= 0:
            pos[v] = k
            k, v = k + 1, nxt[v]
    return pos


def _rows(n: int, rank: np.ndarray, preds: np.ndarray, lags: np.ndarray):
    """Precedence rows and sinks, exactly as lp.precedence_rows (order aside).

    A pair (u, v) linked through two slots of v gives one row with the larger lag; no sort is needed
    because duplicates can only sit in the slots of one node.
    """
    has_succ = np.zeros(n, dtype=bool)
    keep = []
    for k in range(3):
        ok = preds[k] >= 0
        has_succ[preds[k][ok]] = True
        if k == 2:  # same-stage edges on one rank with no lag are implied by the rank chain
            ok &= ~((lags[2] == 0.0) & (rank[np.maximum(preds[2], 0)] == rank))
        keep.append(ok)
    lag = lags.copy()
    for k in range(3):
        for j in range(k + 1, 3):
            dup = keep[k] & keep[j] & (preds[k] == preds[j])
            if dup.any():  # keep slot k with the larger lag, drop slot j
                lag[k] = np.where(dup, np.maximum(lag[k], lag[j]), lag[k])
                keep[j] = keep[j] & ~dup
    vs = [np.flatnonzero(keep[k]) for k in range(3)]
    u = np.concatenate([preds[k][vs[k]] for k in range(3)])
    lag_out = np.concatenate([lag[k][vs[k]] for k in range(3)])
    return u, np.concatenate(vs), lag_out, np.flatnonzero(~has_succ)


@dataclass(frozen=True, kw_only=True, slots=True)
class Ties:
    """How actions repeat: the LP variables of a tied node are its representative's (Note [periodic compression]).

    A tied node v (rep[v] != v) has r_v = r_rep and t_v = t_rep + off[v] * tau[run[v]]; an untied node
    (rep[v] == v, off 0, run -1) keeps its own variables; a representative (rep[v] == v, run >= 0) heads a run.
    """

    rep: np.ndarray
    """(n,) int: representative node."""
    off: np.ndarray
    """(n,) int: periods after the representative."""
    run: np.ndarray
    """(n,) int: run id (one tau variable each) or -1 for untied nodes."""
    num_runs: int
    """Number of runs."""
    period_mb: int
    """Micro-batches per period (0 when nothing repeats)."""

    @property
    def num_tied(self) -> int:
        return int(np.count_nonzero(self.rep != np.arange(len(self.rep))))

    @classmethod
    def build(cls, n: int, tied, rep_of, off_of, run_of, num_runs: int, period_mb: int) -> Ties:
        rep = np.arange(n)
        off = np.zeros(n, dtype=np.int64)
        run = np.full(n, -1, dtype=np.int64)
        rep[tied], off[tied], run[tied] = rep_of, off_of, run_of
        return cls(rep=rep, off=off, run=run, num_runs=num_runs, period_mb=period_mb)

    @classmethod
    def none(cls, n: int) -> Ties:
        return cls(rep=np.arange(n), off=np.zeros(n, np.int64), run=np.full(n, -1), num_runs=0, period_mb=0)


def _shift_ok(g: GraphArrays, q: int) -> tuple[np.ndarray, np.ndarray]:
    """For every node v: w = the same (stage, kind) q micro-batches later (or -1), and whether v -> w is a
    symmetry of v's incoming edges: each predecessor of w is the shifted predecessor of v, same lag."""
    n = g.n
    mbs = int(g.mb.max()) + 1 + q
    index = np.full((int(g.cls.max()) + 1) * mbs, -1, dtype=np.int64)
    index[g.cls * mbs + g.mb] = np.arange(n)
    w = index[g.cls * mbs + g.mb + q]
    ok = w >= 0
    ws = np.where(ok, w, 0)
    for k in range(3):
        p, pw = g.preds[k], g.preds[k][ws]
        both_none = (p < 0) & (pw < 0)
        pp, ppw = np.maximum(p, 0), np.maximum(pw, 0)
        same = (p >= 0) & (pw >= 0) & (g.cls[ppw] == g.cls[pp]) & (g.mb[ppw] == g.mb[pp] + q)
        ok &= (both_none | same) & (g.lags[k][ws] == g.lags[k])
    # The same number of list positions apart as most of its (stage, kind): the rank repeats its pattern.
    # (Looped BFS runs its backwards in reverse micro-batch order: steps can be negative.)
    idx = np.flatnonzero(ok)
    if len(idx):
        step = g.pos[w[idx]] - g.pos[idx]
        # Per class, the most frequent step (the largest of equally frequent ones), from one count per (class,
        # step): a bincount where that grid is small (np.unique over column pairs took 0.9 s at a million).
        low, span, classes = int(step.min()), int(step.max() - step.min()) + 1, int(g.cls.max()) + 1
        key = g.cls[idx] * span + (step - low)
        if classes * span <= 1 << 24:
            counts = np.bincount(key, minlength=classes * span).reshape(classes, span)
            mode = low + span - 1 - counts[:, ::-1].argmax(axis=1)
        else:
            keys, counts = np.unique(key, return_counts=True)
            order = np.lexsort((counts, keys // span))  # per class, the most frequent step last
            mode = np.zeros(classes, dtype=np.int64)
            mode[keys[order] // span] = low + keys[order] % span
        ok[idx] = step == mode[g.cls[idx]]
    return np.where(ok, w, -1), ok


@dataclass(frozen=True, kw_only=True, slots=True)
class Runs:
    """Maximal chains of repeating actions (Note [periodic compression]), before any margin is cut off."""

    period_mb: int
    """Micro-batches per period q."""
    nodes: np.ndarray
    """Node ids of all runs, run after run, each in order."""
    start: np.ndarray
    """(num_runs + 1,) offsets of each run in `nodes`."""

    @classmethod
    def detect(cls, g: GraphArrays, min_run: int = 4) -> Runs:
        """Among a few candidate periods q, keep the one whose runs tie most actions at phase 1's margin of
        FIRST_MARGIN periods at each end.

        A run is a maximal chain v, w(v), w(w(v)), ... of same-(stage, kind) actions q micro-batches apart
        where every step is a symmetry of the incoming edges (_shift_ok). Counting the actions the runs cover
        instead chose q = 1 on interleaved 1F1B 16 x 512: its chains break at every round of 16 micro-batches,
        so 3,101 runs of about 10 covered 92% of the actions but tied 44%, and GLOP did not solve phase 1's
        29,000-column LP within a minute; q = 16 ties 84% in 1,024 runs.
        """
        best = cls(period_mb=0, nodes=np.zeros(0, np.int64), start=np.zeros(1, np.int64))
        if g.n == 0:
            return best
        num_mb = int(g.mb.max()) + 1
        num_ranks = int(g.rank.max()) + 1
        best_tied = 0
        for q in sorted({1, 2, 3, 4, num_ranks, 2 * num_ranks}):
            if q >= num_mb:
                continue
            runs = cls._chains(g, q, min_run)
            tied = runs.ties(g.n, (FIRST_MARGIN, FIRST_MARGIN), min_run).num_tied
            if tied > best_tied:
                best, best_tied = runs, tied
            if best_tied >= 0.9 * g.n:
                break  # the smallest period that ties almost everything
        return best

    @classmethod
    def _chains(cls, g: GraphArrays, q: int, min_run: int) -> Runs:
        n = g.n
        w, ok = _shift_ok(g, q)
        # w is one-to-one and micro-batches grow along it: the ok steps form disjoint simple chains.
        reached = np.zeros(n, dtype=bool)
        reached[w[ok]] = True
        starts = np.flatnonzero(ok & ~reached)
        if len(starts) == 0:
            return cls(period_mb=q, nodes=np.zeros(0, np.int64), start=np.zeros(1, np.int64))
        run_of = np.full(n, -1, dtype=np.int64)
        idx_of = np.full(n, -1, dtype=np.int64)
        cur, live = starts.copy(), np.arange(len(starts))
        k = 0
        while len(live):  # lock-step over all chains: one period per pass
            c = cur[live]
            run_of[c], idx_of[c] = live, k
            step = ok[c]
            live = live[step]
            cur[live] = w[c[step]]
            k += 1
        length = np.bincount(run_of[run_of >= 0], minlength=len(starts))
        member = np.flatnonzero((run_of >= 0) & (length[np.maximum(run_of, 0)] >= min_run))
        order = np.lexsort((idx_of[member], run_of[member]))
        nodes = member[order]
        lengths = length[length >= min_run]
        return cls(period_mb=q, nodes=nodes, start=np.concatenate([[0], np.cumsum(lengths)]))

    @property
    def num_runs(self) -> int:
        return len(self.start) - 1

    def ties(self, n: int, margin, min_run: int = 4) -> Ties:
        """Tie each run's periods except margin = (head, tail) periods at its two ends (n = number of nodes).

        head and tail are ints or (num_runs,) arrays (one margin per run).
        """
        m_head, m_tail = (np.broadcast_to(np.asarray(m, dtype=np.int64), (len(self.start) - 1,)) for m in margin)
        lengths = np.diff(self.start)
        keep = np.flatnonzero(lengths - m_head - m_tail >= min_run)
        sizes = lengths[keep] - m_head[keep] - m_tail[keep]
        # Positions in self.nodes of the tied nodes of each kept run, run after run.
        first = self.start[keep] + m_head[keep]
        run_id = np.repeat(np.arange(len(keep)), sizes)
        offset = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        tied = self.nodes[np.repeat(first, sizes) + offset]
        return Ties.build(n, tied, self.nodes[first][run_id], offset, run_id, len(keep), self.period_mb)


def levels(index: np.ndarray) -> list[np.ndarray]:
    """Positions of `index` split into groups in which no target repeats, so that tfplan.solve.fastlp.exact's
    scatter_add can add pairs into their targets without collisions (and GraphArrays.row_levels' k-th group gives
    its rows slot k of their action): each pass keeps one position per target still pending (whichever a fancy
    assignment with repeated targets lets win: exactly one does). O(len(index)) per group."""
    if len(index) == 0:
        return []
    mark = np.full(int(index.max()) + 1, -1, dtype=np.int64)
    rest, out = np.arange(len(index)), []
    while len(rest):
        mark[index[rest]] = rest
        won = mark[index[rest]] == rest
        out.append(rest[won].astype(np.int32 if len(index) < 2**31 else np.int64))
        rest = rest[~won]
    return out
