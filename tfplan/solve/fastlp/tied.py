"""The tied primal of fastlp (an upper bound), and what it shares with the tied dual (tfplan.solve.fastlp.dual).

Part of tfplan.solve.fastlp; Note [periodic compression] there says why both are exact bounds. Both are built
as sparse COO matrices (numpy) from GraphArrays + Ties; tfplan.solve.fastlp hands them to GLOP. Phases follow
Note [three-phase LP] in tfplan.solve.lp:
  phase 1  min T;   phase 2  min sum r, T <= t_ub;
  phase 3  min 2 sum e, also sum r <= r_ub, |A_s| mu_s = sum_{a in A_s} r_a, e_a >= r_a - mu_s (e_a >= 0).
Tied actions share r, so they share e (= max(0, r - mu_s) at the optimum): a tied e column weighs as many
actions as it stands for, like its r column; mu_s is one column per stage. dual.dual_layout names the tied dual's
columns, which tfplan.solve.fastlp.bound expands into a dual vector of the full LP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tfplan.solve.fastlp.graph import GraphArrays, Ties

INF = float("inf")
FREE, AT_LOWER, AT_UPPER, FIXED, BASIC = 1, 2, 3, 4, 5
"""A column's or row's status in a basis (LPResult.basis): math_opt's BasisStatusProto codes."""


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
    blocks: dict[str, slice] = field(default_factory=dict)
    """Row blocks by name (tied_primal: "prec", "sink", "cap", "total", "mean", "dev", "tau"), so
    that the duals of an untied primal can be read as a dual vector of the full LP (tfplan.solve.fastlp.bound)."""
    prec_rows: np.ndarray | None = None
    """tied_primal: the GraphArrays precedence row of each row of the "prec" block."""


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
    t_max: float = INF
    """A bound on T that some optimal solution keeps (phase 1: the unfrozen makespan; phases 2-3: t_ub). Not a
    row of the LP: the safe lower bound of tfplan.solve.fastlp.bound needs finite bounds on t and T."""


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
            if "lag_id" not in g.memo:  # the same for every compression of g
                g.memo["lag_id"] = np.unique(g.row_lag, return_inverse=True)[1].ravel()
            lag_id = g.memo["lag_id"][t]
            nrun, nspan, nlag = ties.num_runs, int(span.max() - span.min()) + 1, int(lag_id.max()) + 1
            assert float(nrun) * nrun * nspan * nlag < 2.0**62, "fastlp: group key overflows"
            key = ((run_u[t] * nrun + run_v[t]) * nspan + (span - span.min())) * nlag + lag_id
            group[t], sizes = _dense_ids(key)
        rest = np.flatnonzero(~tied_row)  # every other row is a group of its own
        group[rest] = len(sizes) + np.arange(len(rest))
        self.row_group = group
        self.group_size = np.concatenate([sizes, np.ones(len(rest), dtype=np.int64)])
        self.num_groups = len(self.group_size)
        # Phase 3 and the caps need the stage of every ratio column.
        self.r_stage = g.stage[self.r_nodes]
        self.stage_size = np.bincount(g.stage[g.frz], minlength=self.num_stages)  # |A_s|
        self.stages = np.flatnonzero(self.stage_size)  # stages with a freeze group: one cap (and mu) each
        self.stage_idx = np.full(self.num_stages, -1)
        self.stage_idx[self.stages] = np.arange(len(self.stages))
        self.weight = self.count[self.r_nodes].astype(np.float64)  # actions per ratio column
        self.memo: dict[str, object] = {}
        """What the LPs of every phase derive from this compression alone (tfplan.solve.fastlp.dual: the tied dual's
        incidence and its distinct rows), kept because phases 2 and 3 (and a dual's later rounds) share it."""


def _dense_ids(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(key, return_inverse=True, return_counts=True)[1:] for non-negative int keys: by counting when
    the keys' range is small (2M rows of a million actions: 6 ms against np.unique's 22-35 ms)."""
    top = int(key.max()) + 1
    if top > 8 * len(key) + 4096:
        _, inv, sizes = np.unique(key, return_inverse=True, return_counts=True)
        return inv.ravel(), sizes
    counts = np.bincount(key, minlength=top)
    present = counts > 0
    ids = np.cumsum(present, dtype=np.int64) - 1
    return ids[key], counts[present]


def tied_primal(c: Compressed, phase: Phase) -> SparseLP:
    """The LP with tied variables (a restriction: its optimum is >= the true one).

    Columns: t per free node, tau per run, r per ratio column, T, then (phase 3) mu per capped stage and e per
    ratio column.
    """
    g, ties = c.g, c.ties
    nt, nr, ntau, ns = len(c.free_nodes), len(c.r_nodes), ties.num_runs, len(c.stages)
    three = phase.number == 3
    col = {"t": 0, "tau": nt, "r": nt + ntau, "T": nt + ntau + nr, "mu": nt + ntau + nr + 1}
    col["e"] = col["mu"] + ns
    ncols = col["e"] + nr if three else col["mu"]
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
    blocks: dict[str, slice] = {}

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

    def block(name: str, start: int, size: int) -> np.ndarray:
        blocks[name] = slice(start, start + size)
        return start + np.arange(size)

    rows = block("prec", 0, m)
    t_terms(rows, v, 1.0)
    t_terms(rows, u, -1.0)
    r_terms(rows, u)
    lo = [g.d_max[u] + lag]
    # Finish rows T >= t_u + d_u + tail (tfplan.step.dag Note [rank tails]).
    sk = g.sinks
    rows = block("sink", m, len(sk))
    ri.append(rows)
    ci.append(np.full(len(sk), col["T"]))
    val.append(np.ones(len(sk)))
    t_terms(rows, sk, -1.0)
    r_terms(rows, sk)
    lo.append(g.d_max[sk] + g.sink_tail)
    nrow = m + len(sk)
    hi = [np.full(nrow, INF)]
    # Caps: sum over the stage's ratio columns, each weighted by the nodes it stands for.
    r_cols = col["r"] + np.arange(nr)
    r_stage = c.stage_idx[c.r_stage]  # capped-stage index of each ratio column
    block("cap", nrow, ns)
    ri.append(nrow + r_stage)
    ci.append(r_cols)
    val.append(c.weight)
    lo.append(np.full(ns, -INF))
    hi.append(phase.caps[c.stages] * c.stage_size[c.stages])
    nrow += ns
    obj = np.zeros(ncols)
    if phase.number == 1:
        obj[col["T"]] = 1.0
    elif phase.number == 2:
        obj[r_cols] = c.weight
    else:
        rows = block("total", nrow, 1)  # total freeze kept
        ri.append(np.repeat(rows, nr))
        ci.append(r_cols)
        val.append(c.weight)
        lo.append(np.array([-INF]))
        hi.append(np.array([phase.r_ub]))
        rows = block("mean", nrow + 1, ns)  # |A_s| mu_s - sum_{a in A_s} r_a = 0
        ri += [rows, rows[r_stage]]
        ci += [col["mu"] + np.arange(ns), r_cols]
        val += [c.stage_size[c.stages].astype(np.float64), -c.weight]
        lo.append(np.zeros(ns))
        hi.append(np.zeros(ns))
        nrow += 1 + ns
        e_cols = col["e"] + np.arange(nr)
        rows = block("dev", nrow, nr)  # e - r + mu >= 0 (Note [one-sided deviation] in tfplan.solve.lp)
        ri += [rows, rows, rows]
        ci += [e_cols, r_cols, col["mu"] + r_stage]
        val += [np.ones(nr), -np.ones(nr), np.ones(nr)]
        lo.append(np.zeros(nr))
        hi.append(np.full(nr, INF))
        nrow += nr
        obj[e_cols] = 2.0 * c.weight
    # A run's start times may fall (looped BFS runs backwards in reverse micro-batch order): tau is free,
    # and t >= 0 is kept for the last node of each run (t_rep >= 0 covers the first; affine in between).
    span = np.zeros(ntau, dtype=np.int64)
    tied = np.flatnonzero(ties.run >= 0)
    np.maximum.at(span, ties.run[tied], ties.off[tied])
    rows = block("tau", nrow, ntau)
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
    ub[r_cols] = 1.0
    ub[col["T"]] = phase.t_ub
    return SparseLP(
        obj=obj, lb=lb, ub=ub, ri=np.concatenate(ri), ci=np.concatenate(ci), val=np.concatenate(val),
        row_lo=np.concatenate(lo), row_hi=np.concatenate(hi), blocks=blocks, prec_rows=pick,
    )


def phase3_basis(c: Compressed, primal2: SparseLP, primal3: SparseLP, x2: np.ndarray,
                 basis2: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A starting basis for phase 3's tied primal from phase 2's optimal one, same ties (Note [warm phase 3] in
    tfplan.solve.fastlp.phases). Phase 3 adds columns mu, e after phase 2's and rows total, mean, dev before the tau
    rows; each new row gets one new basic variable: the total row its slack (R2 is within its bound), mean row s
    mu_s, deviation row a e_a where phase 2's r_a is above its stage's mean (else the row's slack). The matrix
    of new rows against new basics is triangular, so the basis is as regular as phase 2's. Codes: LPResult.basis.
    """
    nt, nr, ns = len(c.free_nodes), len(c.r_nodes), len(c.stages)
    first_r = nt + c.ties.num_runs  # tied_primal's r columns
    r = x2[first_r: first_r + nr]
    stage = c.stage_idx[c.r_stage]
    mu = np.bincount(stage, weights=c.weight * r, minlength=ns) / c.stage_size[c.stages]
    above = r - mu[stage] > 0.0
    cols = np.concatenate([basis2[0], np.full(ns, BASIC), np.where(above, BASIC, AT_LOWER)])
    rows = np.full(len(primal3.row_lo), FREE, dtype=np.int64)
    for name in ("prec", "sink", "cap", "tau"):
        rows[primal3.blocks[name]] = basis2[1][primal2.blocks[name]]
    rows[primal3.blocks["total"]] = BASIC
    rows[primal3.blocks["mean"]] = FIXED
    rows[primal3.blocks["dev"]] = np.where(above, AT_LOWER, BASIC)
    assert len(cols) == len(primal3.lb), "phase 3 appends mu and e to phase 2's columns"
    return cols, rows


def carried_point(old: Compressed, x_old: np.ndarray, new: Compressed) -> np.ndarray:
    """The point x_old of a phase-1 or phase-2 tied primal at compression `old`, at compression `new` whose ties
    are a subset of old's (a larger margin): every action's start and ratio expanded from old's representatives,
    then taken at new's (Note [warm margins] in tfplan.solve.fastlp.phases). It satisfies every row of new's tied
    primal that x_old satisfies in old's, with the same objective."""
    g = old.g
    nt, ntau_old = len(old.free_nodes), old.ties.num_runs
    tau_old = x_old[nt: nt + ntau_old]
    t = x_old[:nt][old.tcol[old.ties.rep]]  # every action's start, from its representative and its run's period
    drift = old.ties.off > 0
    t[drift] += old.ties.off[drift] * tau_old[old.ties.run[drift]]
    r = np.zeros(g.n)
    r[g.frz] = x_old[nt + ntau_old + old.rcol[old.ties.rep[g.frz]]]
    tau = np.zeros(new.ties.num_runs)
    tied = np.flatnonzero(new.ties.run >= 0)
    assert np.all(old.ties.run[tied] >= 0), "new's tied actions are tied in old"
    tau[new.ties.run[tied]] = tau_old[old.ties.run[tied]]  # new's runs are parts of old's
    assert len(x_old) == nt + ntau_old + len(old.r_nodes) + 1, "phases 1-2 only: columns t, tau, r, T"
    return np.concatenate([t[new.free_nodes], tau, r[new.r_nodes], x_old[-1:]])


def basis_of_point(lp: SparseLP, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A starting basis for `lp` at its feasible point x (Note [warm margins] in tfplan.solve.fastlp.phases): each
    column and row takes the status of its value (a column at a bound nonbasic there, a row with no slack nonbasic at
    its bound, the rest basic); then the count is made square (math_opt rejects a basis that is not): surplus
    basic rows with the least slack become nonbasic, then if need be the bounded columns nearest their lower
    bounds (x is then not exactly the basic solution, but near it), or missing basics are made up from tight
    rows (degenerate basics). GLOP replaces what is singular with slacks. Codes: LPResult.basis."""
    cols = np.full(len(x), BASIC, dtype=np.int64)
    cols[x <= lp.lb] = AT_LOWER
    cols[x >= lp.ub] = AT_UPPER
    activity = np.bincount(lp.ri, weights=lp.val * x[lp.ci], minlength=len(lp.row_lo))
    lower, upper = activity - lp.row_lo, lp.row_hi - activity
    slack = np.minimum(lower, upper)
    rows = np.where(slack <= 1e-9 * np.maximum(1.0, np.abs(activity)), np.where(lower <= upper, AT_LOWER, AT_UPPER),
                    BASIC)
    surplus = int(np.count_nonzero(cols == BASIC) + np.count_nonzero(rows == BASIC)) - len(rows)
    if surplus > 0:  # not a vertex of the larger LP: the least-slack basic rows bind
        candidates = np.flatnonzero(rows == BASIC)
        drop = candidates[np.argsort(slack[candidates], kind="stable")[:surplus]]
        rows[drop] = np.where(lower[drop] <= upper[drop], AT_LOWER, AT_UPPER)
        surplus -= len(drop)
        bounded = np.flatnonzero((cols == BASIC) & np.isfinite(lp.lb))  # then columns, at their lower bounds
        cols[bounded[np.argsort(x[bounded] - lp.lb[bounded], kind="stable")[:surplus]]] = AT_LOWER
    elif surplus < 0:  # degenerate: some tight rows are basic at zero slack
        rows[np.flatnonzero(rows != BASIC)[:-surplus]] = BASIC
    return cols, rows


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
