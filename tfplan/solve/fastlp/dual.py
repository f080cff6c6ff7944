"""The tied dual of fastlp: a restriction of the full LP's dual, so its optimum is a lower bound (Note [periodic
compression] in tfplan.solve.fastlp); tfplan.solve.fastlp.bound turns its solution into a safe bound on the full LP.

Its columns (dual_layout) are one dual variable per row group of the tied primal (tied.Compressed) and per
other row; its rows, one per column of the full LP, are kept once where tied actions give identical rows.
"""

from __future__ import annotations

import numpy as np

from tfplan.solve.fastlp.tied import AT_LOWER, BASIC, FREE, INF, Compressed, Phase, SparseLP


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
    into_levels, out_index, out_levels = g.row_levels()  # level k: rows that take slot k of their action
    mats = []
    for owner, groups, var in ((g.row_v, into_levels, c.row_group),
                               (out_index, out_levels, np.concatenate([c.row_group, sink_var]))):
        mat = np.full((n, max(1, len(groups))), -1, dtype=np.int64)
        for slot, rows in enumerate(groups):
            mat[owner[rows], slot] = var[rows]
        mats.append(_sorted_rows(mat))
    return mats[0], mats[1]


def _sorted_rows(mat: np.ndarray) -> np.ndarray:
    """np.sort(mat, axis=1), by a min and a max for the usual width 2 (a million rows: 2.7 ms against np.sort's 27)."""
    if mat.shape[1] != 2:
        return np.sort(mat, axis=1)
    out = np.empty_like(mat)
    np.minimum(mat[:, 0], mat[:, 1], out=out[:, 0])
    np.maximum(mat[:, 0], mat[:, 1], out=out[:, 1])
    return out


def _distinct_rows(c: Compressed, sink_var: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The kept rows of the tied dual: every untied node's, and a tied node's when no earlier node of its run has
    the same row. Returns the in- and out-incidence (as _incidence) of the nodes whose t-row is kept, the
    out-incidence of those whose r-row is kept, and those nodes (keep_r). The same in every phase (the sinks'
    kappa columns follow the y columns in every dual_layout), so computed once per compression (c.memo): 0.18-0.3 s
    at a million actions (0.5 s the first time; _incidence 0.04 s of it), and only the kept rows are held."""
    key = ("dual rows", int(sink_var[0]) if len(sink_var) else -1)
    if key not in c.memo:
        g, ties = c.g, c.ties
        inc_in, inc_out = _incidence(c, sink_var)
        tied = ties.rep != np.arange(g.n)
        cand = np.flatnonzero(tied)
        sig = np.hstack([ties.run[cand, None], inc_in[cand], inc_out[cand]])
        keep_t = np.union1d(np.flatnonzero(~tied), cand[_first_distinct(sig)])
        cand = np.flatnonzero(tied & g.frz)
        sig = np.hstack([ties.run[cand, None], inc_out[cand]])
        keep_r = np.union1d(np.flatnonzero(~tied & g.frz), cand[_first_distinct(sig)])
        c.memo[key] = (inc_in[keep_t], inc_out[keep_t], inc_out[keep_r], keep_r)
    return c.memo[key]


def dual_layout(c: Compressed, phase: Phase) -> dict[str, slice]:
    """The tied dual's columns, by name: y per row group, kappa per sink row, lambda per capped stage, beta per
    ratio column (its r <= 1), theta (T <= t_ub, when bounded), and in phase 3 rho (sum r <= r_ub), sigma per
    capped stage (its mean row; free) and p per ratio column (e >= r - mu)."""
    three = phase.number == 3
    sizes = [
        ("y", c.num_groups), ("kappa", len(c.g.sinks)), ("lambda", len(c.stages)), ("beta", len(c.r_nodes)),
        ("theta", int(phase.t_ub < INF)), ("rho", int(three)), ("sigma", len(c.stages) if three else 0),
        ("p", len(c.r_nodes) if three else 0),
    ]
    layout, at = {}, 0
    for name, size in sizes:
        layout[name] = slice(at, at + size)
        at += size
    return layout


def tied_dual(c: Compressed, phase: Phase) -> SparseLP:
    """The dual LP with tied dual variables (a restriction of the dual: its optimum is <= the true one).

    Columns: dual_layout (all >= 0 but sigma). Rows: one per primal column of the full LP (t_v, r_a, T, and in
    phase 3 mu_s, e_a), identical rows kept once.
    """
    g, ties = c.g, c.ties
    nr, ns = len(c.r_nodes), len(c.stages)
    sk = g.sinks
    three = phase.number == 3
    col = dual_layout(c, phase)
    ncols = col["p"].stop
    obj = np.zeros(ncols)
    # Objective: right-hand sides, each tied group counted once per row it stands for.
    grp_rhs = np.zeros(c.num_groups)
    grp_rhs[c.row_group] = g.d_max[g.row_u] + g.row_lag
    obj[col["y"]] = grp_rhs * c.group_size
    obj[col["kappa"]] = g.d_max[sk] + g.sink_tail
    obj[col["lambda"]] = -phase.caps[c.stages] * c.stage_size[c.stages]
    obj[col["beta"]] = -c.weight
    obj[col["theta"]] = -phase.t_ub
    obj[col["rho"]] = -phase.r_ub
    sink_var = col["kappa"].start + np.arange(len(sk))
    in_t, out_t, out, keep_r = _distinct_rows(c, sink_var)
    ri, ci, val, hi = [], [], [], []
    nrow = 0
    # t-constraints: in-rows minus out-rows (minus kappa at sinks) <= 0; tied nodes kept once per signature.
    for mat, sign in ((in_t, 1.0), (out_t, -1.0)):
        rows, slots = np.nonzero(mat >= 0)
        ri.append(nrow + rows)
        ci.append(mat[rows, slots])
        val.append(np.full(len(rows), sign))
    hi.append(np.zeros(len(in_t)))
    nrow += len(in_t)
    # r-constraints: delta (out-rows + kappa) - lambda_s - beta [- rho - sigma_s - p] <= c_r.
    rows, slots = np.nonzero(out >= 0)
    ri.append(nrow + rows)
    ci.append(out[rows, slots])
    val.append(g.delta[keep_r][rows])
    rows = nrow + np.arange(len(keep_r))
    rc = c.rcol[ties.rep[keep_r]]
    stage = c.stage_idx[g.stage[keep_r]]
    ones = np.ones(len(rows))
    ri += [rows, rows]
    ci += [col["lambda"].start + stage, col["beta"].start + rc]
    val += [-ones, -ones]
    if three:
        ri += [rows] * 3
        ci += [np.full(len(rows), col["rho"].start), col["sigma"].start + stage, col["p"].start + rc]
        val += [-ones, -ones, -ones]
    hi.append(np.full(len(rows), 1.0 if phase.number == 2 else 0.0))
    nrow += len(rows)
    # T: sum kappa - theta <= 1 (phase 1) or 0.
    ri.append(np.full(len(sk) + int(phase.t_ub < INF), nrow))
    ci += [sink_var, np.arange(col["theta"].start, col["theta"].stop)]
    val += [np.ones(len(sk)), -np.ones(col["theta"].stop - col["theta"].start)]
    hi.append(np.array([1.0 if phase.number == 1 else 0.0]))
    nrow += 1
    if three:
        # mu_s: |A_s| sigma_s + sum_{a in A_s} p_a <= 0, a tied p counted once per action.
        ri += [nrow + np.arange(ns), nrow + c.stage_idx[c.r_stage]]
        ci += [col["sigma"].start + np.arange(ns), col["p"].start + np.arange(nr)]
        val += [c.stage_size[c.stages].astype(np.float64), c.weight]
        hi.append(np.zeros(ns))
        nrow += ns
        # e_a: p_a <= 2, its cost (identical for the actions of one ratio column: kept once).
        ri.append(nrow + np.arange(nr))
        ci.append(col["p"].start + np.arange(nr))
        val.append(np.ones(nr))
        hi.append(np.full(nr, 2.0))
        nrow += nr
    hi = np.concatenate(hi)
    lb = np.zeros(ncols)
    lb[col["sigma"]] = -INF
    return SparseLP(
        obj=obj, lb=lb, ub=np.full(ncols, INF), ri=np.concatenate(ri), ci=np.concatenate(ci),
        val=np.concatenate(val), row_lo=np.full(len(hi), -INF), row_hi=hi, maximize=True,
    )


def phase3_dual_basis(basis2: tuple[np.ndarray, np.ndarray], lp3: SparseLP) -> tuple[np.ndarray, np.ndarray] | None:
    """A starting basis for phase 3's tied dual from phase 2's optimal one at the same compression (Note [warm
    phase 3] in tfplan.solve.fastlp.phases). tied_dual appends phase 3's columns (rho, sigma, p) after phase 2's and
    its rows (mu, e) after phase 2's: the new columns start nonbasic at 0 (sigma, free, as FREE), the new rows
    basic, so the basis stays square. None when phase 2's basis is larger than this LP (another compression).
    Codes: LPResult.basis."""
    n2, m2 = len(basis2[0]), len(basis2[1])
    if n2 > len(lp3.lb) or m2 > len(lp3.row_hi):
        return None
    cols = np.concatenate([basis2[0], np.where(np.isfinite(lp3.lb[n2:]), AT_LOWER, FREE)])
    rows = np.concatenate([basis2[1], np.full(len(lp3.row_hi) - m2, BASIC)])
    return cols, rows


def phase2_dual_basis(basis1: tuple[np.ndarray, np.ndarray], lp2: SparseLP) -> tuple[np.ndarray, np.ndarray] | None:
    """A starting basis for phase 2's tied dual from the goodput certificate's phase-1 tied dual at the same
    compression (Note [goodput handover] in tfplan.solve.fastlp.goodput): phase 2 appends the theta column (T <=
    t_ub), which starts nonbasic at 0; the cap prices, fixed there, start nonbasic at 0 where they are not basic
    (as every nonbasic column: the tied dual's columns have no upper bounds). The rows are the same. None when
    the sizes do not fit (another compression). Codes: LPResult.basis."""
    n1 = len(basis1[0])
    if n1 > len(lp2.lb) or len(basis1[1]) != len(lp2.row_hi):
        return None
    cols = np.concatenate([basis1[0], np.zeros(len(lp2.lb) - n1, dtype=basis1[0].dtype)])
    cols = np.where(cols == BASIC, BASIC, np.where(np.isfinite(lp2.lb), AT_LOWER, FREE))
    return cols, basis1[1].copy()
