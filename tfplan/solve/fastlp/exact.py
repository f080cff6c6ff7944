"""Sums of products in double-double arithmetic, vectorised: the safe bound's arithmetic (tfplan.solve.fastlp.bound).

Part of tfplan.solve.fastlp. A number is a pair (hi, lo) of float64 arrays (or floats) whose exact sum is the value,
with |lo| <= ulp(hi) / 2. two_sum and two_prod are Knuth's and Dekker's error-free transformations: a + b and
a * b as such a pair, exactly (barring overflow and underflow below 1e-290). Adding pairs loses at most about
2**-104 of the operands' magnitude, and `total` sums N terms to within log2(N) 2**-106 of their magnitudes.

Note [bound rounding]
  The safe bound L of a phase is a difference of huge sums: on 1F1B 32 x 16384 (random-0 profile) phase 3's
  terms reach 2.4e9 in magnitude for an L of 428.8, through dual flows of thousands of units per ms times start
  times of 75,000 ms. In float64 each node's flow imbalance (a few flows of ~1e3 added) carries ~1e-13 of
  rounding, which the window's start time turns into ~1e-8 per node: summed over a million nodes, L came out
  4.6e-5 (1.1e-7 relative) above its exact value (long double and double-double agree to 2e-8), enough to
  call a phase certified whose true gap was 1.0e-7, ten times phase 3's tolerance, and to make L exceed U.
  In double-double the bound is exact to about 1e-21 there (log2(N) 2**-106 of 2.4e9), for about three times
  the float64 time: 0.2 s against 0.07 s per bound at a million actions.
"""

from __future__ import annotations

import numpy as np

_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's splitter for float64


def two_sum(a, b):
    """(s, e) with s = fl(a + b) and s + e = a + b exactly."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _split(a):
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    """(p, e) with p = fl(a * b) and p + e = a * b exactly."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _renorm(s, e):
    hi = s + e
    return hi, e - (hi - s)


def add(x, y):
    """x + y for pairs."""
    s, e = two_sum(x[0], y[0])
    return _renorm(s, e + (x[1] + y[1]))


def add_float(x, f):
    """x + f for a pair x and floats f."""
    s, e = two_sum(x[0], f)
    return _renorm(s, e + x[1])


def mul_float(x, f):
    """x * f for a pair x and floats f."""
    p, e = two_prod(x[0], f)
    return _renorm(p, e + x[1] * f)


def mul(x, y):
    """x * y for two pairs (lo * lo, below 2**-104 of the product, dropped)."""
    p, e = two_prod(x[0], y[0])
    return _renorm(p, e + (x[0] * y[1] + x[1] * y[0]))


def prefix(x):
    """Inclusive prefix sums of a pair of arrays, as a pair: np.cumsum adds in order, so each step's rounding
    error is two_sum's of the previous sum and the next term, and the errors' own cumsum is far below 2**-53
    of them."""
    s = np.cumsum(x[0])
    _, e = two_sum(np.concatenate([[0.0], s[:-1]]), x[0])
    return two_sum(s, np.cumsum(e + x[1]))


def maximum(x, y):
    """Elementwise max of two pairs (normalised pairs compare as (hi, lo))."""
    take_y = (y[0] > x[0]) | ((y[0] == x[0]) & (y[1] > x[1]))
    return np.where(take_y, y[0], x[0]), np.where(take_y, y[1], x[1])


def neg(x):
    return -x[0], -x[1]


def select(x, mask):
    return x[0][mask], x[1][mask]


def where(mask, x):
    """x where mask, else 0."""
    return np.where(mask, x[0], 0.0), np.where(mask, x[1], 0.0)


def positive(x):
    """Where the pair's value is > 0 (its sign is hi's)."""
    return x[0] > 0.0


def total(x) -> tuple[float, float]:
    """The sum of all elements of a pair of arrays, as a pair of floats: the his in a pairwise tree of two_sum,
    whose errors (below 2**-53 of each level's sums) are added in float64 with the los (below 2**-53 of the
    his): exact to about log2(N) 2**-106 of the N terms' magnitudes. (Sum2's single pass over np.cumsum is
    as precise at these sizes but took 29 ms against the tree's 17 ms for two million terms.)"""
    hi = np.asarray(x[0], dtype=np.float64).ravel()
    err = float(np.sum(x[1]))
    while len(hi) > 1:
        if len(hi) % 2:
            hi = np.append(hi, 0.0)
        hi, e = two_sum(hi[0::2], hi[1::2])
        err += float(np.sum(e))
    return two_sum(float(hi[0]) if len(hi) else 0.0, err)


CHUNK = 1 << 18  # elements per step of dot: its temporaries stay at a few MB where the arrays have millions


def dot(x, y) -> tuple[float, float]:
    """sum_i x_i y_i for two pairs of arrays (or float arrays: exact.pair), as a pair of floats."""
    out = (0.0, 0.0)
    paired = isinstance(x, tuple) or isinstance(y, tuple)
    if paired:
        x, y = (v if isinstance(v, tuple) else pair(v) for v in (x, y))
    for i in range(0, len(x[0]) if paired else len(x), CHUNK):
        part = slice(i, i + CHUNK)
        if paired:
            out = add(out, total(mul((x[0][part], x[1][part]), (y[0][part], y[1][part]))))
        else:
            out = add(out, total(two_prod(x[part], y[part])))
    return out


def scatter_add(n: int, index: np.ndarray, values: np.ndarray, groups: list[np.ndarray]):
    """out[index[i]] += values[i] (floats) into n pairs, exactly (an np.add.at that rounds nothing away):
    `groups` is tfplan.solve.fastlp.graph.levels(index)."""
    hi, lo = np.zeros(n), np.zeros(n)
    for pos in groups:
        at = index[pos]
        hi[at], lo[at] = add_float((hi[at], lo[at]), values[pos])
    return hi, lo


def pair(x):
    """A float array as a pair."""
    x = np.asarray(x, dtype=np.float64)
    return x, np.zeros_like(x)
