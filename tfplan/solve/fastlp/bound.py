"""A safe lower bound on an LP phase's optimum from any dual vector (Note [LP certificate] in tfplan.solve.lp).

Part of tfplan.solve.fastlp. Write a phase's full LP (Note [three-phase LP]) as  min c'x  s.t.  A x >= b (the mean
rows of phase 3 as equalities),  0 <= x <= u,  with rows and duals
  precedence  t_v - t_u + delta_u r_u >= d_u + lag      y >= 0    (one per GraphArrays row)
  finish      T - t_u + delta_u r_u >= d_u               kappa >= 0 (one per sink)
  cap         -sum_{a in A_s} r_a >= -c_s |A_s|          lambda >= 0
  total       -sum_a r_a >= -r_ub                        rho >= 0   (phase 3)
  mean        |A_s| mu_s - sum_{a in A_s} r_a = 0        sigma free (phase 3)
  deviation   e_a - r_a + mu_s >= 0                         p >= 0     (phase 3; e_a costs 2)
For every such y and every x of the LP,  c'x >= b'y + (c - A'y)'x >= b'y - sum_j max(0, (A'y - c)_j) u_j
(weak duality with the bounds kept apart), so that is a lower bound L however inexact y is: a dual that GLOP
solved to its tolerance, or one tied across repeating actions, only loosens it. The bounds u must be finite
and kept by some optimal solution: r_a <= 1; T <= t_max and t_v <= t_max (every action ends before T; phase
1's t_max is the unfrozen makespan, phases 2-3 bound T by t_ub); e_a <= 1 and mu_s <= 1 (at the optimum e_a
= max(0, r_a - mu_s) and mu_s is a mean of ratios). The sums run over the full LP's columns, vectorised (n actions).

Windows. The start-time columns weigh a flow imbalance by t_max, thousands of ms. In phases 2-3 the flows
carry the price of time (theta = sum kappa, e.g. 3,400 ratio units per ms on heterogeneous 1F1B 32 x 512),
so rounding alone leaves ~1e-14 of imbalance at thousands of actions, and t_max times that was 7e-9 of the
phase-3 optimum there, above GAP_TOL, although GLOP's own dual value agreed with U to 3e-10. Moving flow
to balance it does not help (the value moves with it: measured, the bound got worse). What does: tighter
bounds on the columns. Every feasible point has t_v >= head_v (earliest start with every action at d_min) and
t_v + tail_v <= T <= t_max (tail_v: longest d_min path from v's start to the end), and T >= the all-frozen
makespan (Windows). An imbalance then costs its window, t_max minus the all-frozen makespan at most (40 ms
against 2,530 there: the bound came within 3e-8 of GLOP's dual value), and a surplus earns its head.
fastlp uses cheap windows in every bound: each rank's chain of actions alone (Windows.chains, numpy; measured
on uniform 1F1B 32 x 16384, they certified phase 3 where build's 3 s pass had been needed), and the longest
paths (Windows.build, about 3 s per million actions) only when a bound still misses the gap tolerance.

Rounding. Every sum here is a double-double sum (tfplan.solve.fastlp.exact, Note [bound rounding]), and the chains'
windows are exact prefix sums; Windows.build's longest paths are float64 sums along paths of up to ~60,000
actions. On random-0 1F1B 32 x 16384 they are off by up to 1.2e-8 ms, and the phase-3 bound with them was
the same to the last bit as with the paths summed in long double.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tfplan.solve.fastlp import exact
from tfplan.solve.fastlp.dual import dual_layout
from tfplan.solve.fastlp.exact import two_prod, two_sum
from tfplan.solve.fastlp.graph import GraphArrays
from tfplan.solve.fastlp.tied import Compressed, Phase, SparseLP
from tfplan.step.dag import Dag
from tfplan.step.simulate import earliest_starts


@dataclass(frozen=True, kw_only=True, slots=True)
class FullDual:
    """A dual vector of one phase's full LP: one value per row (module docstring)."""

    y: np.ndarray
    """(E,) per precedence row, in GraphArrays order."""
    kappa: np.ndarray
    """(K,) per sink row, in GraphArrays.sinks order."""
    lam: np.ndarray
    """(S,) per stage's cap row (0 for a stage without a freeze group)."""
    rho: float = 0.0
    """The total-freeze row (phase 3)."""
    sigma: np.ndarray | None = None
    """(S,) per stage's mean row (phase 3; any sign)."""
    p: np.ndarray | None = None
    """(n,) per action's row e - r + mu >= 0 (phase 3; 0 outside the freeze groups)."""


def from_tied_dual(c: Compressed, phase: Phase, x: np.ndarray) -> FullDual:
    """Expand a tied dual's solution (tied_dual's columns) to the full LP: a row group's rows all take the
    group's value, a tied action takes its ratio column's p."""
    col = dual_layout(c, phase)
    g, S = c.g, len(phase.caps)
    lam = np.zeros(S)
    lam[c.stages] = x[col["lambda"]]
    out = {"y": x[col["y"]][c.row_group], "kappa": x[col["kappa"]], "lam": lam}
    if phase.number == 3:
        sigma = np.zeros(S)
        sigma[c.stages] = x[col["sigma"]]
        column = np.full(g.n, -1)
        column[g.frz] = c.rcol[c.ties.rep[g.frz]]
        p = np.zeros(g.n)
        p[g.frz] = x[col["p"]][column[g.frz]]
        out |= {"rho": float(x[col["rho"]][0]), "sigma": sigma, "p": p}
    return FullDual(**out)


def from_primal_duals(c: Compressed, phase: Phase, lp: SparseLP, duals: np.ndarray) -> FullDual:
    """The row duals of an untied tied_primal (the full LP) as a FullDual. GLOP's dual of a row whose upper
    side binds is <= 0 in a minimisation, hence the minus signs on the cap and total rows."""
    assert c.ties.num_tied == 0, "only an untied primal is the full LP"
    g, S, b = c.g, len(phase.caps), lp.blocks
    y = np.zeros(len(g.row_u))
    y[lp.prec_rows] = duals[b["prec"]]
    lam = np.zeros(S)
    lam[c.stages] = -duals[b["cap"]]
    out = {"y": y, "kappa": duals[b["sink"]], "lam": lam}
    if phase.number == 3:
        sigma = np.zeros(S)
        sigma[c.stages] = duals[b["mean"]]
        p = np.zeros(g.n)
        p[c.r_nodes] = duals[b["dev"]]
        out |= {"rho": float(-duals[b["total"]][0]), "sigma": sigma, "p": p}
    return FullDual(**out)


@dataclass(frozen=True, kw_only=True, slots=True)
class Windows:
    """Bounds on every start time that every feasible point keeps, whatever its ratios (module docstring), as
    double-double pairs (tfplan.solve.fastlp.exact; Note [bound rounding])."""

    head: tuple[np.ndarray, np.ndarray]
    """(n,) earliest start of each action with every action at d_min (ms)."""
    tail: tuple[np.ndarray, np.ndarray]
    """(n,) longest path from each action's start to the end with every action at d_min, itself included (ms)."""
    t_min: tuple[float, float]
    """The all-frozen makespan: a lower bound on T (ms)."""

    @classmethod
    def _of(cls, head, tail) -> Windows:
        span = exact.add(head, tail)
        if len(span[0]) == 0:
            return cls(head=head, tail=tail, t_min=(0.0, 0.0))
        at = np.flatnonzero(span[0] == span[0].max())
        at = at[np.argmax(span[1][at])]
        return cls(head=head, tail=tail, t_min=(float(span[0][at]), float(span[1][at])))

    def late(self, t_max: float):
        """(n,) the latest start of each action, max(head, t_max - tail), as a pair (7 ms per million actions;
        not kept: 16 MB there)."""
        return exact.maximum(self.head, exact.add_float(exact.neg(self.tail), t_max))

    @classmethod
    def build(cls, g: GraphArrays, dag: Dag) -> Windows:
        """A forward and a backward pass over the DAG's three predecessor slots in topological order, as
        tfplan.step.simulate does (pure Python, about 3 s per million actions on a busy 2-core machine). `dag` is
        g's Dag: its own lists, since converting g's arrays to lists took 250 MB more at a million actions.
        In float64: each path's sum rounds at every action (module docstring, Rounding)."""
        n = g.n
        d_min = (g.d_max - g.delta).tolist()  # d_max outside the freeze groups, as the LP has it
        p0, p1, p2 = dag.preds
        l0, l1, l2 = dag.lags
        topo = dag.topo
        head = np.asarray(earliest_starts(topo, (p0, p1, p2), (l0, l1, l2), d_min)[0])  # lists freed at once
        after = [0.0] * (n + 1)  # longest path from an action's end to the end; after[-1] is scratch
        for u, tail in zip(g.sinks.tolist(), g.sink_tail.tolist()):
            after[u] = tail  # its rank's tail follows the rank's last action
        tail = [0.0] * n
        for v in reversed(topo):
            t = d_min[v] + after[v]
            tail[v] = t
            u, x = p0[v], l0[v] + t
            if x > after[u]:
                after[u] = x
            u, x = p1[v], l1[v] + t
            if x > after[u]:
                after[u] = x
            u, x = p2[v], l2[v] + t
            if x > after[u]:
                after[u] = x
        del after
        return cls._of(exact.pair(head), exact.pair(np.asarray(tail)))

    @classmethod
    def chains(cls, g: GraphArrays, dag: Dag) -> Windows:
        """Looser windows in numpy time (tens of ms per million actions, against seconds for build): each rank's
        own chain of actions is a path, so its length before an action (its predecessors on the rank at d_min,
        with the rank edges' lags) bounds the action's earliest start from below, and its length from the
        action's start to the rank's end (plus the rank's tail when its last action is a sink) bounds the
        action's tail. Where the ranks are balanced (a uniform profile) they are nearly as tight as build's.
        `dag` is g's Dag, whose nodes are numbered rank by rank (Dag.rank_bounds). In double-double: prefix
        sums of pairs (tfplan.solve.fastlp.exact.prefix), exact to about 2**-100."""
        n = g.n
        ranks = [(lo, hi) for lo, hi in dag.rank_bounds() if hi > lo]
        if n == 0:
            return cls._of(exact.pair(np.zeros(0)), exact.pair(np.zeros(0)))
        lo, hi = np.array([r[0] for r in ranks]), np.array([r[1] for r in ranks])
        d = two_sum(g.d_max, -g.delta)  # d_min, exactly
        lag = g.lags[0].copy()
        lag[lo] = 0.0  # a rank's first action has no rank edge
        # All ranks' chains in one prefix sum; a rank's own sums are its entries minus the sum before it.
        through = exact.prefix(exact.add_float(d, lag))
        counts = hi - lo

        def each(x):  # per rank -> per node
            return np.repeat(x[0], counts), np.repeat(x[1], counts)

        base = each((np.where(lo > 0, through[0][lo - 1], 0.0), np.where(lo > 0, through[1][lo - 1], 0.0)))
        head = exact.add(exact.add(through, exact.neg(d)), exact.neg(base))
        after = np.zeros(n)
        after[g.sinks] = g.sink_tail  # the rank's tail when its last action is a sink
        end = each((through[0][hi - 1], through[1][hi - 1]))
        tail = exact.add_float(exact.add(exact.add(end, exact.neg(through)), d), np.repeat(after[hi - 1], counts))
        return cls._of(head, tail)


def safe_lower_bound(g: GraphArrays, phase: Phase, dual: FullDual, windows: Windows | None = None) -> float:
    """L = b'y + sum_j min over x_j in [l_j, u_j] of (c - A'y)_j x_j over the full LP's columns (module
    docstring); valid for any dual vector (those of the rows with a sign are clipped at 0 first, which keeps it
    valid). Start times lie in [0, t_max] (T in [0, t_max]), or with `windows` in [head, t_max - tail] (T in
    [t_min, t_max]), which weighs a flow imbalance by a window instead of t_max. Computed in double-double
    arithmetic (tfplan.solve.fastlp.exact, Note [bound rounding]): in float64 it came out 1e-7 above its exact value."""
    assert np.isfinite(phase.t_max), "the safe bound needs a finite bound on T"
    S, frz, st = len(phase.caps), g.frz, g.stage
    y, kappa, lam = (np.maximum(a, 0.0) for a in (dual.y, dual.kappa, dual.lam))
    size = np.bincount(st[frz], minlength=S).astype(np.float64)  # |A_s|
    into, out = _flows(g, y, kappa)  # per action: the flows into it; the flows out of it plus its sink price
    # b'y (rows, sinks, caps), then each column's min over its range, summed as they come (Note [bound rounding]).
    bound = exact.add(exact.dot(y, g.d_max[g.row_u]), exact.dot(kappa, g.d_max[g.sinks]))
    bound = exact.add(bound, exact.dot(kappa, g.sink_tail))
    bound = exact.add(bound, exact.neg(exact.dot(two_prod(np.asarray(phase.caps, dtype=np.float64), size), lam)))
    if g.row_lag.any():
        bound = exact.add(bound, exact.dot(y, g.row_lag))
    # t_v (cost 0) and T (cost 1 in phase 1): each at the end of its range that minimises (c - A'y) x.
    at_t = exact.add(into, exact.neg(out))
    del into
    up = exact.positive(at_t)
    reduced_T = exact.add((float(phase.number == 1), 0.0), exact.neg(exact.total(exact.pair(kappa))))
    if windows is None:
        bound = exact.add(bound, exact.neg(exact.mul_float(exact.total(exact.where(up, at_t)), phase.t_max)))
        if reduced_T[0] < 0.0:
            bound = exact.add(bound, exact.mul_float(reduced_T, phase.t_max))
    else:
        late = windows.late(phase.t_max)
        at = (np.where(up, late[0], windows.head[0]), np.where(up, late[1], windows.head[1]))
        bound = exact.add(bound, exact.neg(exact.dot(at_t, at)))
        del at
        bound = exact.add(bound, exact.mul(reduced_T, windows.t_min if reduced_T[0] >= 0.0 else (phase.t_max, 0.0)))
    del at_t, up
    # r_a (cost 1 in phase 2, u = 1).
    at_r = exact.add_float(exact.mul_float(exact.select(out, frz), g.delta[frz]), -lam[st[frz]])
    if phase.number == 3:
        rho = max(0.0, dual.rho)
        p = np.maximum(dual.p[frz], 0.0)
        bound = exact.add(bound, exact.neg(two_prod(float(phase.r_ub), rho)))
        for f in (-rho, -dual.sigma[st[frz]], -p):
            at_r = exact.add_float(at_r, f)
        # mu_s: cost 0, u = 1; its column sums |A_s| sigma_s and the p of its stage's deviation rows.
        at_mu = exact.add(two_prod(size, dual.sigma), _stage_sums(g, p, S))
        bound = exact.add(bound, exact.neg(exact.total(exact.where((size > 0) & exact.positive(at_mu), at_mu))))
        e_excess = two_sum(p, -2.0)  # e_a: cost 2, u = 1
        bound = exact.add(bound, exact.neg(exact.total(exact.where(exact.positive(e_excess), e_excess))))
    if phase.number == 2:
        at_r = exact.add_float(at_r, -1.0)
    bound = exact.add(bound, exact.neg(exact.total(exact.where(exact.positive(at_r), at_r))))
    return bound[0] + bound[1]


def _flows(g: GraphArrays, y: np.ndarray, kappa: np.ndarray):
    """Per action, as double-double pairs: the sum of the flows y of its incoming rows, and of its outgoing rows
    plus its sink price kappa (exact sums: no row's flow is rounded away; Note [bound rounding])."""
    into_levels, out_index, out_levels = g.row_levels()
    into = exact.scatter_add(g.n, g.row_v, y, into_levels)
    out = exact.scatter_add(g.n, out_index, np.concatenate([y, kappa]), out_levels)
    return into, out


def _stage_sums(g: GraphArrays, values: np.ndarray, num_stages: int):
    """The sum of `values` (one per action of a freeze group, in node order) per stage, as pairs; the actions'
    order by stage is kept in g.memo."""
    if "stage_order" not in g.memo:
        stage = g.stage[g.frz]
        order = np.argsort(stage, kind="stable")
        g.memo["stage_order"] = (order, np.searchsorted(stage[order], np.arange(num_stages + 1)))
    order, bounds = g.memo["stage_order"]
    hi, lo = np.zeros(num_stages), np.zeros(num_stages)
    for s in range(num_stages):
        hi[s], lo[s] = exact.total(exact.pair(values[order[bounds[s]:bounds[s + 1]]]))
    return hi, lo
