"""The two small LPs of fastlp: the tied primal (an upper bound) and the tied dual (a lower bound).

Part of tfplan.fastlp; Note [periodic compression] there says why both are exact bounds. Both are built
as sparse matrices from GraphArrays + Ties and solved with GLOP through ortools' model_builder helper
(filled entry by entry: no scipy). Phases follow Note [three-phase LP] in tfplan.solver:
  phase 1  min T;   phase 2  min sum r, T <= t_ub;   phase 3  min sum_s z_s, also sum r <= r_ub, z_s >= r_a.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import linear_solver_pb2, pywraplp
from ortools.linear_solver.python import model_builder_helper as mbh

from tfplan.errors import TfplanError
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


@dataclass(frozen=True, slots=True)
class LPResult:
    objective: float
    x: np.ndarray
    iterations: int
    wall_s: float


def solve_glop(lp: SparseLP, what: str) -> LPResult:
    """Solve with GLOP (presolve on, default tolerances, as tfplan.solver).

    The model is filled through model_builder's helper (one call per entry, no scipy), then handed to
    pywraplp as a proto, which reports simplex iterations.

    Raises:
        TfplanError: any status but OPTIMAL.
    """
    start = time.perf_counter()
    ri, ci, val = _coalesce(lp.ri, lp.ci, lp.val)
    h = mbh.ModelBuilderHelper()
    h.add_var_array_with_bounds(lp.lb.astype(np.float64), lp.ub.astype(np.float64), np.zeros(len(lp.lb), bool), "")
    add, set_lo, set_hi = h.add_linear_constraint, h.set_constraint_lower_bound, h.set_constraint_upper_bound
    for lo, hi in zip(lp.row_lo.tolist(), lp.row_hi.tolist()):
        k = add()
        set_lo(k, lo)
        set_hi(k, hi)
    set_coef = h.set_constraint_coefficient
    for r, c, v in zip(ri.tolist(), ci.tolist(), val.tolist()):
        set_coef(r, c, v)
    nz = np.flatnonzero(lp.obj)
    h.set_objective_coefficients(nz.tolist(), lp.obj[nz].tolist())
    h.set_maximize(lp.maximize)
    solver = pywraplp.Solver.CreateSolver("GLOP")
    assert solver is not None, "OR-Tools was built without GLOP"
    error = solver.LoadModelFromProto(mbh.to_mpmodel_proto(h))
    assert not error, error
    status = solver.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        raise TfplanError(f"fastlp {what}: GLOP returned status {status} instead of OPTIMAL")
    response = linear_solver_pb2.MPSolutionResponse()
    solver.FillSolutionResponseProto(response)
    return LPResult(
        objective=solver.Objective().Value(), x=np.asarray(response.variable_value), iterations=solver.iterations(),
        wall_s=time.perf_counter() - start,
    )


def _coalesce(ri: np.ndarray, ci: np.ndarray, val: np.ndarray):
    """Sum duplicate (row, col) entries and drop zeros."""
    if len(ri) == 0:
        return ri, ci, val
    key = ri * (int(ci.max()) + 1) + ci
    order = np.argsort(key, kind="stable")
    key, ri, ci, val = key[order], ri[order], ci[order], val[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    idx = np.flatnonzero(first)
    sums = np.add.reduceat(val, idx)
    keep = sums != 0.0
    return ri[idx][keep], ci[idx][keep], sums[keep]


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
    (rep_u, rep_v, off_v - off_u, lag), all other rows are groups of one (Note [periodic compression]).
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
        # Row groups.
        u, v, lag = g.row_u, g.row_v, g.row_lag
        tied_row = (ties.run[u] >= 0) & (ties.run[v] >= 0)
        lag_id = np.unique(lag, return_inverse=True)[1]
        span = ties.off[v] - ties.off[u]
        keys = np.stack([ties.rep[u], ties.rep[v], span, lag_id])
        keys[:, ~tied_row] = -1
        keys = np.vstack([keys, np.where(tied_row, -1, np.arange(len(u)))])  # untied rows: one group each
        _, self.row_group, self.group_size = np.unique(keys, axis=1, return_inverse=True, return_counts=True)
        self.row_group = self.row_group.ravel()
        self.num_groups = len(self.group_size)
        # Drift columns stand for run_scale * tau (the start-time change over the whole run): coefficients
        # off / run_scale stay in [0, 1], which keeps the LP well scaled for runs of thousands of periods.
        self.run_scale = np.ones(max(ties.num_runs, 1))
        tied_nodes = ties.run >= 0
        np.maximum.at(self.run_scale, ties.run[tied_nodes], ties.off[tied_nodes].astype(np.float64))
        # Phase 3 and the caps need the stage of every ratio column.
        self.r_stage = g.stage[self.r_nodes]
        self.group_sizes_A = np.bincount(g.stage[g.frz], minlength=self.num_stages)  # |A_s|


def tied_primal(c: Compressed, phase: Phase) -> tuple[SparseLP, dict[str, int]]:
    """The LP with tied variables (a restriction: its optimum is >= the true one). Returns LP and column offsets."""
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
        val.append(sign * ties.off[nodes[drift]] / c.run_scale[ties.run[nodes[drift]]])

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
    stages = np.flatnonzero(c.group_sizes_A)
    cap_row = np.full(S, -1)
    cap_row[stages] = nrow + np.arange(len(stages))
    ri.append(cap_row[c.r_stage])
    ci.append(col["r"] + np.arange(nr))
    val.append(weight)
    lo.append(np.full(len(stages), -INF))
    hi.append(phase.caps[stages] * c.group_sizes_A[stages])
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
    lb = np.zeros(ncols)
    ub = np.full(ncols, INF)
    ub[col["r"]: col["r"] + nr] = 1.0
    ub[col["T"]] = phase.t_ub
    lp = SparseLP(
        obj=obj, lb=lb, ub=ub, ri=np.concatenate(ri), ci=np.concatenate(ci), val=np.concatenate(val),
        row_lo=np.concatenate(lo), row_hi=np.concatenate(hi),
    )
    return lp, col


def expand_ratios(c: Compressed, x: np.ndarray, col: dict[str, int]) -> np.ndarray:
    """Per-node ratios from a tied-primal solution (tied nodes take their representative's)."""
    r = np.zeros(c.g.n)
    free_r = np.clip(x[col["r"]: col["r"] + len(c.r_nodes)], 0.0, 1.0)
    per_free = np.zeros(c.g.n)
    per_free[c.r_nodes] = free_r
    frz = c.g.frz
    r[frz] = per_free[c.ties.rep[frz]]
    return r


def _distinct(owner: np.ndarray, code: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Among `candidates` (node ids), one node per distinct multiset {code[i] : owner[i] == node}.

    Nodes outside `candidates` are not compared. Exact (no hashing): sorts padded integer signatures.
    """
    if len(candidates) == 0:
        return candidates
    sel = np.isin(owner, candidates)
    owner, code = owner[sel], code[sel]
    order = np.lexsort((code, owner))
    owner, code = owner[order], code[order]
    slot = np.zeros(len(owner), dtype=np.int64)  # position of each entry within its node's list
    if len(owner):
        starts = np.ones(len(owner), dtype=bool)
        starts[1:] = owner[1:] != owner[:-1]
        first_idx = np.maximum.accumulate(np.where(starts, np.arange(len(owner)), 0))
        slot = np.arange(len(owner)) - first_idx
    width = int(slot.max()) + 1 if len(slot) else 1
    where = np.searchsorted(candidates, owner)
    sig = np.full((len(candidates), width), -1, dtype=np.int64)
    sig[where, slot] = code
    _, first = np.unique(sig, axis=0, return_index=True)
    return candidates[np.sort(first)]


def tied_dual(c: Compressed, phase: Phase) -> SparseLP:
    """The dual LP with tied dual variables (a restriction of the dual: its optimum is <= the true one)."""
    g, ties = c.g, c.ties
    n, G, S = g.n, c.num_groups, c.num_stages
    nr = len(c.r_nodes)
    sk = g.sinks
    stages = np.flatnonzero(c.group_sizes_A)
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
    obj[col["l"]: col["mu"]] = -phase.caps[stages] * c.group_sizes_A[stages]
    weight = c.count[c.r_nodes].astype(np.float64)
    obj[col["mu"]: col["theta"]] = -weight
    if has_theta:
        obj[col["theta"]] = -phase.t_ub
    if three:
        obj[col["rho"]] = -phase.r_ub
    sink_col = np.full(n, -1)
    sink_col[sk] = col["k"] + np.arange(len(sk))
    # t-constraints: in-rows minus out-rows (minus kappa at sinks) <= 0, one per distinct signature.
    owner = np.concatenate([g.row_v, g.row_u, sk])
    var = np.concatenate([c.row_group, c.row_group, sink_col[sk]])
    sign = np.concatenate([np.ones(len(g.row_v)), -np.ones(len(g.row_u)), -np.ones(len(sk))])
    tied = np.flatnonzero(ties.rep != np.arange(n))
    keep_t = np.union1d(np.flatnonzero(ties.rep == np.arange(n)), _distinct(owner, 2 * var + (sign > 0), tied))
    ri, ci, val, hi = [], [], [], []
    sel = np.isin(owner, keep_t)
    row_of = np.full(n, -1)
    row_of[keep_t] = np.arange(len(keep_t))
    ri.append(row_of[owner[sel]])
    ci.append(var[sel])
    val.append(sign[sel])
    hi.append(np.zeros(len(keep_t)))
    nrow = len(keep_t)
    # r-constraints: delta (out-rows + kappa) - lambda_s - rho - zeta - mu <= c_r.
    frz = np.flatnonzero(g.frz)
    owner = np.concatenate([g.row_u, sk])
    var = np.concatenate([c.row_group, sink_col[sk]])
    sel = g.frz[owner]
    owner, var = owner[sel], var[sel]
    tied_f = frz[ties.rep[frz] != frz]
    keep_r = np.union1d(frz[ties.rep[frz] == frz], _distinct(owner, var, tied_f))
    row_of = np.full(n, -1)
    row_of[keep_r] = nrow + np.arange(len(keep_r))
    sel = np.isin(owner, keep_r)
    ri.append(row_of[owner[sel]])
    ci.append(var[sel])
    val.append(g.delta[owner[sel]])
    rows = row_of[keep_r]
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
    ci.append(col["k"] + np.arange(len(sk)))
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


def transpose_max(lp: SparseLP) -> SparseLP:
    """For max b.y s.t. A y <= c, y >= 0: the equal-valued min c.x s.t. A'x >= b, x >= 0 (LP duality)."""
    assert lp.maximize and np.all(lp.lb == 0) and np.all(np.isinf(lp.ub)) and np.all(np.isinf(lp.row_lo))
    return SparseLP(
        obj=lp.row_hi.copy(), lb=np.zeros(len(lp.row_hi)), ub=np.full(len(lp.row_hi), INF),
        ri=lp.ci, ci=lp.ri, val=lp.val, row_lo=lp.obj.copy(), row_hi=np.full(len(lp.obj), INF),
    )
