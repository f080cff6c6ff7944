"""The two small LPs of fastlp: the tied primal (an upper bound) and the tied dual (a lower bound).

Part of tfplan.fastlp; Note [periodic compression] there says why both are exact bounds. Both are built
as sparse COO matrices (numpy) from GraphArrays + Ties; tfplan.fastlp hands them to GLOP. Phases follow
Note [three-phase LP] in tfplan.solver:
  phase 1  min T;   phase 2  min sum r, T <= t_ub;   phase 3  min sum_s z_s, also sum r <= r_ub, z_s >= r_a.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tfplan.fastlp_graph import GraphArrays, Ties

INF = float("inf")


@dataclass(slots=True)
class SparseLP:
    """min/max obj.x  s.t.  row_lo <= A x <= row_hi,  lb <= x <= ub; A given as COO triples."""

    obj: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    ri: np.ndarray
    ci: np.ndarray
    val: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray
    maximize: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Phase:
    """Which LP phase and the bounds carried over from earlier phases."""

    number: int
    """1 (makespan), 2 (total freeze) or 3 (even spread)."""
    caps: np.ndarray
    """(S,) cap on the mean ratio per stage."""
    t_ub: float = INF
    """Bound on T (phases 2-3)."""
    r_ub: float = INF
    """Bound on sum of ratios (phase 3)."""


class Compressed:
    """Index maps shared by the tied primal and dual of one (GraphArrays, Ties) pair.

    Free nodes (rep[v] == v) own a start-time column; freezable free nodes own a ratio column that stands
    for `count` nodes. Rows are grouped: a precedence row whose both ends are tied belongs to the group
    (run_u, run_v, off_v - off_u, lag), all other rows are groups of one (Note [periodic compression]).
    """

    def __init__(self, g: GraphArrays, ties: Ties) -> None:
        self.g, self.ties = g, ties
        n = g.n
        free = ties.rep == np.arange(n)
        self.free_nodes = np.flatnonzero(free)
        self.tcol = np.full(n, -1, dtype=np.int64)
        self.tcol[self.free_nodes] = np.arange(len(self.free_nodes))
        self.count = np.bincount(ties.rep, minlength=n)  # nodes each free node stands for
        self.r_nodes = np.flatnonzero(free & g.frz)
        self.rcol = np.full(n, -1, dtype=np.int64)
        self.rcol[self.r_nodes] = np.arange(len(self.r_nodes))
        self.num_stages = int(g.stage.max()) + 1 if n else 0
        # Row groups: key (run_u, run_v, span, lag) for rows between tied nodes (a run has one rep).
        u, v = g.row_u, g.row_v
        run_u, run_v = ties.run[u], ties.run[v]
        tied_row = (run_u >= 0) & (run_v >= 0)
        group = np.empty(len(u), dtype=np.int64)
        t = np.flatnonzero(tied_row)
        sizes = np.zeros(0, dtype=np.int64)
        if len(t):
            span = ties.off[v[t]] - ties.off[u[t]]
            lag_id = np.unique(g.row_lag[t], return_inverse=True)[1].ravel()
            nrun, nspan, nlag = ties.num_runs, int(span.max() - span.min()) + 1, int(lag_id.max()) + 1
            assert float(nrun) * nrun * nspan * nlag < 2.0**62, "fastlp: group key overflows"
            key = ((run_u[t] * nrun + run_v[t]) * nspan + (span - span.min())) * nlag + lag_id
            _, inv, sizes = np.unique(key, return_inverse=True, return_counts=True)
            group[t] = inv.ravel()
        rest = np.flatnonzero(~tied_row)  # every other row is a group of its own
        group[rest] = len(sizes) + np.arange(len(rest))
        self.row_group = group
        self.group_size = np.concatenate([sizes, np.ones(len(rest), dtype=np.int64)])
        self.num_groups = len(self.group_size)
        # Phase 3 and the caps need the stage of every ratio column.
        self.r_stage = g.stage[self.r_nodes]
        self.stage_size = np.bincount(g.stage[g.frz], minlength=self.num_stages)  # |A_s|


def tied_primal(c: Compressed, phase: Phase) -> SparseLP:
    """The LP with tied variables (a restriction: its optimum is >= the true one).

    Columns: t per free node, tau per run, r per ratio column, T, then z per stage (phase 3).
    """
    g, ties = c.g, c.ties
    nt, nr, ntau = len(c.free_nodes), len(c.r_nodes), ties.num_runs
    S = c.num_stages
    col = {"t": 0, "tau": nt, "r": nt + ntau, "T": nt + ntau + nr, "z": nt + ntau + nr + 1}
    ncols = col["z"] + (S if phase.number == 3 else 0)
    # Precedence rows: within a tied group only the extreme offsets (the row is affine in off_u).
    u, v, lag, grp = g.row_u, g.row_v, g.row_lag, c.row_group
    order = np.lexsort((ties.off[u], grp))
    gs = grp[order]
    first = np.ones(len(gs), dtype=bool)
    first[1:] = gs[1:] != gs[:-1]
    last = np.ones(len(gs), dtype=bool)
    last[:-1] = gs[1:] != gs[:-1]
    pick = order[first | last]
    u, v, lag = u[pick], v[pick], lag[pick]
    m = len(u)
    ri, ci, val = [], [], []

    def t_terms(rows, nodes, sign):
        ri.append(rows)
        ci.append(col["t"] + c.tcol[ties.rep[nodes]])
        val.append(np.full(len(rows), sign, dtype=np.float64))
        drift = ties.off[nodes] > 0
        ri.append(rows[drift])
        ci.append(col["tau"] + ties.run[nodes[drift]])
        val.append(sign * ties.off[nodes[drift]].astype(np.float64))

    def r_terms(rows, nodes):
        f = g.frz[nodes]
        ri.append(rows[f])
        ci.append(col["r"] + c.rcol[ties.rep[nodes[f]]])
        val.append(g.delta[nodes[f]])

    rows = np.arange(m)
    t_terms(rows, v, 1.0)
    t_terms(rows, u, -1.0)
    r_terms(rows, u)
    lo = [g.d_max[u] + lag]
    # Sink rows T >= t_u + d_u.
    sk = g.sinks
    rows = m + np.arange(len(sk))
    ri.append(rows)
    ci.append(np.full(len(sk), col["T"]))
    val.append(np.ones(len(sk)))
    t_terms(rows, sk, -1.0)
    r_terms(rows, sk)
    lo.append(g.d_max[sk])
    nrow = m + len(sk)
    hi = [np.full(nrow, INF)]
    # Caps: sum over the stage's ratio columns, each weighted by the nodes it stands for.
    weight = c.count[c.r_nodes].astype(np.float64)
    stages = np.flatnonzero(c.stage_size)
    cap_row = np.full(S, -1)
    cap_row[stages] = nrow + np.arange(len(stages))
    ri.append(cap_row[c.r_stage])
    ci.append(col["r"] + np.arange(nr))
    val.append(weight)
    lo.append(np.full(len(stages), -INF))
    hi.append(phase.caps[stages] * c.stage_size[stages])
    nrow += len(stages)
    obj = np.zeros(ncols)
    if phase.number == 1:
        obj[col["T"]] = 1.0
    elif phase.number == 2:
        obj[col["r"]: col["r"] + nr] = weight
    else:
        ri.append(np.full(nr, nrow))  # total freeze kept
        ci.append(col["r"] + np.arange(nr))
        val.append(weight)
        lo.append(np.array([-INF]))
        hi.append(np.array([phase.r_ub]))
        nrow += 1
        rows = nrow + np.arange(nr)  # z_s - r >= 0
        ri += [rows, rows]
        ci += [col["z"] + c.r_stage, col["r"] + np.arange(nr)]
        val += [np.ones(nr), -np.ones(nr)]
        lo.append(np.zeros(nr))
        hi.append(np.full(nr, INF))
        nrow += nr
        obj[col["z"] + stages] = 1.0
    # A run's start times may fall (looped BFS runs backwards in reverse micro-batch order): tau is free,
    # and t >= 0 is kept for the last node of each run (t_rep >= 0 covers the first; affine in between).
    span = np.zeros(ntau, dtype=np.int64)
    tied = np.flatnonzero(ties.run >= 0)
    np.maximum.at(span, ties.run[tied], ties.off[tied])
    rows = nrow + np.arange(ntau)
    reps = np.zeros(ntau, dtype=np.int64)
    reps[ties.run[tied]] = ties.rep[tied]
    ri += [rows, rows]
    ci += [col["t"] + c.tcol[reps], col["tau"] + np.arange(ntau)]
    val += [np.ones(ntau), span.astype(np.float64)]
    lo.append(np.zeros(ntau))
    hi.append(np.full(ntau, INF))
    nrow += ntau
    lb = np.zeros(ncols)
    lb[col["tau"]: col["tau"] + ntau] = -INF
    ub = np.full(ncols, INF)
    ub[col["r"]: col["r"] + nr] = 1.0
    ub[col["T"]] = phase.t_ub
    return SparseLP(
        obj=obj, lb=lb, ub=ub, ri=np.concatenate(ri), ci=np.concatenate(ci), val=np.concatenate(val),
        row_lo=np.concatenate(lo), row_hi=np.concatenate(hi),
    )


def expand_ratios(c: Compressed, x: np.ndarray) -> np.ndarray:
    """Per-node ratios from a tied-primal solution x (tied nodes take their representative's), in [0, 1]."""
    r = np.zeros(c.g.n)
    first = len(c.free_nodes) + c.ties.num_runs  # the r columns of tied_primal
    free_r = np.clip(x[first: first + len(c.r_nodes)], 0.0, 1.0)
    per_free = np.zeros(c.g.n)
    per_free[c.r_nodes] = free_r
    frz = c.g.frz
    r[frz] = per_free[c.ties.rep[frz]]
    return r


def _first_distinct(sig: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of each distinct row of the int matrix sig, ascending. Exact: rows are
    hashed, then every row is compared with its hash group's first row (np.unique on collisions)."""
    if len(sig) == 0:
        return np.zeros(0, dtype=np.int64)
    mult = np.random.default_rng(12345).integers(1, 2**62, size=sig.shape[1], dtype=np.uint64) | np.uint64(1)
    h = (sig.astype(np.uint64) * mult).sum(axis=1, dtype=np.uint64)
    order = np.argsort(h, kind="stable")
    hs = h[order]
    new = np.ones(len(hs), dtype=bool)
    new[1:] = hs[1:] != hs[:-1]
    first_pos = np.maximum.accumulate(np.where(new, np.arange(len(hs)), 0))
    if np.any(sig[order] != sig[order[first_pos]]):
        return np.sort(np.unique(sig, axis=0, return_index=True)[1])
    return np.sort(order[new])


def _incidence(c: Compressed, sink_var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node, sorted row-group ids of its in-rows and of its out-rows (sinks add their kappa column to
    the out side), -1 padded: (n, width) int arrays."""
    g, n = c.g, c.g.n
    sk = g.sinks
    owner_in, var_in = g.row_v, c.row_group
    owner_out = np.concatenate([g.row_u, sk])
    var_out = np.concatenate([c.row_group, sink_var])
    mats = []
    for owner, var in ((owner_in, var_in), (owner_out, var_out)):
        order = np.argsort(owner, kind="stable")
        owner, var = owner[order], var[order]
        first = np.searchsorted(owner, np.arange(n))
        slot = np.arange(len(owner)) - first[owner]
        width = int(slot.max()) + 1 if len(slot) else 1
        mat = np.full((n, width), -1, dtype=np.int64)
        mat[owner, slot] = var
        mats.append(np.sort(mat, axis=1))
    return mats[0], mats[1]


def tied_dual(c: Compressed, phase: Phase) -> SparseLP:
    """The dual LP with tied dual variables (a restriction of the dual: its optimum is <= the true one).

    Columns (all >= 0): y per row group, kappa per sink row, lambda per capped stage, mu per ratio column
    (its r <= 1 bound), theta (T <= t_ub), rho (sum r <= r_ub) and zeta per ratio column (z_s >= r).
    Rows: one per primal column of the full LP (t_v, r_a, T, z_s), identical rows kept once.
    """
    g, ties = c.g, c.ties
    n, G, S = g.n, c.num_groups, c.num_stages
    nr = len(c.r_nodes)
    sk = g.sinks
    stages = np.flatnonzero(c.stage_size)
    stage_idx = np.full(S, -1)
    stage_idx[stages] = np.arange(len(stages))
    three = phase.number == 3
    has_theta = phase.t_ub < INF
    col = {"y": 0, "k": G}
    col["l"] = col["k"] + len(sk)
    col["mu"] = col["l"] + len(stages)
    col["theta"] = col["mu"] + nr
    col["rho"] = col["theta"] + int(has_theta)
    col["zeta"] = col["rho"] + int(three)
    ncols = col["zeta"] + (nr if three else 0)
    obj = np.zeros(ncols)
    # Objective: right-hand sides, each tied group counted once per row it stands for.
    grp_rhs = np.zeros(G)
    grp_rhs[c.row_group] = g.d_max[g.row_u] + g.row_lag
    obj[:G] = grp_rhs * c.group_size
    obj[col["k"]: col["l"]] = g.d_max[sk]
    obj[col["l"]: col["mu"]] = -phase.caps[stages] * c.stage_size[stages]
    weight = c.count[c.r_nodes].astype(np.float64)
    obj[col["mu"]: col["theta"]] = -weight
    if has_theta:
        obj[col["theta"]] = -phase.t_ub
    if three:
        obj[col["rho"]] = -phase.r_ub
    sink_var = col["k"] + np.arange(len(sk))
    inc_in, inc_out = _incidence(c, sink_var)
    tied = ties.rep != np.arange(n)
    ri, ci, val, hi = [], [], [], []
    nrow = 0
    # t-constraints: in-rows minus out-rows (minus kappa at sinks) <= 0; tied nodes kept once per signature.
    cand = np.flatnonzero(tied)
    sig = np.hstack([ties.run[cand, None], inc_in[cand], inc_out[cand]])
    keep_t = np.union1d(np.flatnonzero(~tied), cand[_first_distinct(sig)])
    for mat, sign in ((inc_in, 1.0), (inc_out, -1.0)):
        rows, slots = np.nonzero(mat[keep_t] >= 0)
        ri.append(nrow + rows)
        ci.append(mat[keep_t][rows, slots])
        val.append(np.full(len(rows), sign))
    hi.append(np.zeros(len(keep_t)))
    nrow += len(keep_t)
    # r-constraints: delta (out-rows + kappa) - lambda_s - rho - zeta - mu <= c_r.
    frz = g.frz
    cand = np.flatnonzero(tied & frz)
    sig = np.hstack([ties.run[cand, None], inc_out[cand]])
    keep_r = np.union1d(np.flatnonzero(~tied & frz), cand[_first_distinct(sig)])
    out = inc_out[keep_r]
    rows, slots = np.nonzero(out >= 0)
    ri.append(nrow + rows)
    ci.append(out[rows, slots])
    val.append(g.delta[keep_r][rows])
    rows = nrow + np.arange(len(keep_r))
    rc = c.rcol[ties.rep[keep_r]]
    ri += [rows, rows]
    ci += [col["l"] + stage_idx[g.stage[keep_r]], col["mu"] + rc]
    val += [-np.ones(len(rows)), -np.ones(len(rows))]
    if three:
        ri += [rows, rows]
        ci += [np.full(len(rows), col["rho"]), col["zeta"] + rc]
        val += [-np.ones(len(rows)), -np.ones(len(rows))]
    hi.append(np.full(len(rows), 1.0 if phase.number == 2 else 0.0))
    nrow += len(rows)
    # T: sum kappa - theta <= 1 (phase 1) or 0.
    ri.append(np.full(len(sk), nrow))
    ci.append(sink_var)
    val.append(np.ones(len(sk)))
    if has_theta:
        ri.append(np.array([nrow]))
        ci.append(np.array([col["theta"]]))
        val.append(np.array([-1.0]))
    hi.append(np.array([1.0 if phase.number == 1 else 0.0]))
    nrow += 1
    if three:  # z_s: sum over the stage's (tied) zeta <= 1
        ri.append(nrow + stage_idx[c.r_stage])
        ci.append(col["zeta"] + np.arange(nr))
        val.append(weight)
        hi.append(np.ones(len(stages)))
        nrow += len(stages)
    hi = np.concatenate(hi)
    return SparseLP(
        obj=obj, lb=np.zeros(ncols), ub=np.full(ncols, INF), ri=np.concatenate(ri), ci=np.concatenate(ci),
        val=np.concatenate(val), row_lo=np.full(len(hi), -INF), row_hi=hi, maximize=True,
    )
