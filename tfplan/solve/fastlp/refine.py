"""A GLOP solution recomputed from its optimal basis with a sparse LU (scipy, optional): Note [refined duals].

Part of tfplan.solve.fastlp. refined() takes an LPResult that carries its basis and returns it with x replaced by the
basic solution that basis defines, solved again in float64 and iteratively refined; without scipy (the `fast`
extra) or when the basis cannot be factorised, the result comes back unchanged.

Note [refined duals]
  The safe bound (tfplan.solve.fastlp.bound) charges every violated row of the dual: a t-row's flow surplus at the
  latest start time its window allows, an r-row's excess at u = 1. GLOP returns a point whose rows hold to
  its tolerances, and its bound-shifting (provide_strong_optimal_guarantee) leaves the rows at equality
  off by up to that much too; a tied dual's row stands for thousands of rows of the full LP, and so does its
  violation. Measured on random-0 1F1B 32 x 16384, phase 3's warm tied dual (33,002 columns, 13,767 basic):
  its rows off by up to 5.4e-10 (t-rows) and 4.4e-8 (r-rows), and its safe bound 6.4e-7 (relative) below U
  with the chains' windows, 1.2e-7 with the longest paths' (the tolerance is 1e-7), so a dual was solved
  again from scratch (6 s). The same basis factorised by scipy's SuperLU (16 ms) and refined (REFINE_STEPS:
  the active rows off by 2.2e-10, then 5.7e-12, 3.2e-12, 1.8e-12, the rounding of flows of thousands) gives a
  safe bound 8.6e-8 below U with the chains' windows: phase 3 certified at once. GLOP itself cannot do this:
  solved again from that basis (0 iterations, or with a 1e-12 feasibility tolerance) its point moved, but
  its bound did not (6.4-7.2e-7 below U). The refined point may leave a basic variable below its bound by
  rounding (5e-13 there): it is clipped, which the bound's own clipping would do anyway. Any dual vector
  gives a safe bound, so a refined point can only change how tight L is, never whether it holds; it is not
  always tighter (phase 2 there: 5e-12 relative looser, both far within 1e-9), so fastlp refines only a dual
  whose bound falls short of GLOP's own value, and keeps the better of the two (lower.dual_bound).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from tfplan.solve.fastlp.glop import LPResult
from tfplan.solve.fastlp.tied import AT_LOWER, AT_UPPER, BASIC, FIXED, SparseLP

log = logging.getLogger(__name__)

REFINE_STEPS = 5  # at most; each costs two sparse products and a solve (ms at 30k columns)


def refined(lp: SparseLP, result: LPResult | None) -> LPResult | None:
    """`result` with x the basic solution of its basis (Note [refined duals]); unchanged without a basis, without
    scipy, or when the basis is not square or singular."""
    if result is None or result.basis is None:
        return result
    try:
        from scipy.sparse import csr_matrix
        from scipy.sparse.linalg import splu
    except ImportError:
        return result
    cols, rows = result.basis
    basic, active = np.flatnonzero(cols == BASIC), np.flatnonzero(rows != BASIC)
    if len(basic) != len(active) or len(basic) == 0:
        return result
    # Nonbasic columns sit at their bound (a free one at 0); a nonbasic row at the side its status names.
    x = np.where(cols == AT_UPPER, lp.ub, np.where((cols == AT_LOWER) | (cols == FIXED), lp.lb, 0.0))
    x[basic] = 0.0
    if not np.all(np.isfinite(x)):
        return result
    side = rows[active]
    rhs = np.where(side == AT_UPPER, lp.row_hi[active], lp.row_lo[active])
    if not np.all(np.isfinite(rhs)):
        return result
    a = csr_matrix((lp.val, (lp.ri, lp.ci)), shape=(len(lp.row_lo), len(lp.lb)))[active]  # duplicates summed
    rhs = rhs - a @ x
    m = a[:, basic].tocsc()
    try:
        lu = splu(m)
    except RuntimeError:  # singular: GLOP's basis is singular in float64 only by accident; keep its point
        return result
    x_b = lu.solve(rhs)
    residual = np.abs(rhs - m @ x_b).max(initial=0.0)
    for _ in range(REFINE_STEPS):  # iterative refinement, while it helps
        step = x_b + lu.solve(rhs - m @ x_b)
        now = np.abs(rhs - m @ step).max(initial=0.0)
        if not now < residual:
            break
        x_b, residual = step, now
    if not np.all(np.isfinite(x_b)):
        return result
    x[basic] = x_b
    x = np.clip(x, lp.lb, lp.ub)
    log.debug("refined: %d basic columns, moved by up to %.3g, rows off by %.3g", len(basic),
              float(np.abs(x - result.x).max()), residual)
    return replace(result, x=x)
