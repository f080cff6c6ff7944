"""tfplan.solve.fastlp.exact, and the safe bound computed with it against the same formula in rational arithmetic."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tfplan.solve.fastlp.instances import _random_profile
from tfplan.schedule import schedules
from tfplan.solve.fastlp import exact
from tfplan.solve.fastlp.bound import FullDual, Windows, safe_lower_bound
from tfplan.solve.fastlp.graph import GraphArrays, levels
from tfplan.solve.fastlp.tied import Phase
from tfplan.step import dag as dag_mod

FLOATS = st.floats(min_value=-1e100, max_value=1e100, allow_nan=False).filter(lambda x: x == 0 or abs(x) > 1e-100)


def value(pair) -> Fraction:
    return Fraction(float(pair[0])) + Fraction(float(pair[1]))


@given(FLOATS, FLOATS)
def test_two_sum_and_two_prod_are_exact(a: float, b: float) -> None:
    s, e = exact.two_sum(a, b)
    assert Fraction(s) + Fraction(e) == Fraction(a) + Fraction(b) and s == a + b
    p, e = exact.two_prod(a, b)
    assert Fraction(p) + Fraction(e) == Fraction(a) * Fraction(b) and p == a * b


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3000))
def test_sums_prefix_sums_and_scatter_adds_are_exact_to_their_bounds(seed: int, n: int) -> None:
    # Magnitudes 1e-8 .. 1e8 with both signs: float64 sums of these lose everything below 1e-8 of the total.
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 9, n)
    terms = [Fraction(v) for v in x.tolist()]
    size = sum(abs(t) for t in terms)
    tol = size * Fraction(2) ** -96  # exact.total's bound: log2(3000) 2**-106 < 2**-96
    assert abs(value(exact.total(exact.pair(x))) - sum(terms)) <= tol
    pre = exact.prefix(exact.pair(x))
    running = Fraction(0)
    for i, t in enumerate(terms):
        running += t
        assert abs(value((pre[0][i], pre[1][i])) - running) <= tol
    index = rng.integers(0, max(1, n // 3), n)  # repeated targets
    got = exact.scatter_add(int(index.max()) + 1, index, x, levels(index))
    want = [Fraction(0)] * (int(index.max()) + 1)
    for i, t in zip(index.tolist(), terms):
        want[i] += t
    assert all(abs(value((got[0][i], got[1][i])) - w) <= tol for i, w in enumerate(want))


def _reference_bound(g: GraphArrays, phase: Phase, dual: FullDual, windows: Windows) -> Fraction:
    """bound.py's module docstring, in rational arithmetic, one loop per kind of column."""
    F = Fraction
    n, frz = g.n, g.frz.tolist()
    y = [F(max(0.0, v)) for v in dual.y.tolist()]
    kappa = [F(max(0.0, v)) for v in dual.kappa.tolist()]
    lam = [F(max(0.0, v)) for v in dual.lam.tolist()]
    stage = g.stage.tolist()
    size = [sum(1 for a in range(n) if frz[a] and stage[a] == s) for s in range(len(phase.caps))]
    d_max, delta = [F(v) for v in g.d_max.tolist()], [F(v) for v in g.delta.tolist()]
    t_max = F(phase.t_max)
    bound = F(0)
    into, out = [F(0)] * n, [F(0)] * n
    for u, v, lag, flow in zip(g.row_u.tolist(), g.row_v.tolist(), g.row_lag.tolist(), y):
        bound += flow * (d_max[u] + F(lag))
        into[v] += flow
        out[u] += flow
    for u, tail, price in zip(g.sinks.tolist(), g.sink_tail.tolist(), kappa):
        bound += price * (d_max[u] + F(tail))
        out[u] += price
    bound -= sum(F(float(c)) * size[s] * lam[s] for s, c in enumerate(phase.caps))
    for v in range(n):
        at_t = into[v] - out[v]
        head = F(float(windows.head[0][v])) + F(float(windows.head[1][v]))
        tail = F(float(windows.tail[0][v])) + F(float(windows.tail[1][v]))
        bound -= at_t * (max(head, t_max - tail) if at_t > 0 else head)
    reduced_T = F(int(phase.number == 1)) - sum(kappa)
    bound += reduced_T * (F(windows.t_min[0]) + F(windows.t_min[1]) if reduced_T >= 0 else t_max)
    rho = F(max(0.0, dual.rho))
    if phase.number == 3:
        bound -= F(phase.r_ub) * rho
        p = [F(max(0.0, v)) for v in dual.p.tolist()]
        sigma = [F(v) for v in dual.sigma.tolist()]
        for s in range(len(phase.caps)):
            at_mu = size[s] * sigma[s] + sum(p[a] for a in range(n) if frz[a] and stage[a] == s)
            if size[s]:
                bound -= max(F(0), at_mu)
        bound -= sum(max(F(0), p[a] - 2) for a in range(n) if frz[a])
    for a in range(n):
        if frz[a]:
            at_r = delta[a] * out[a] - lam[stage[a]]
            if phase.number == 3:
                at_r -= rho + sigma[stage[a]] + p[a]
            bound -= max(F(0), at_r - int(phase.number == 2))
    return bound


@pytest.mark.parametrize("number", [1, 2, 3])
@pytest.mark.parametrize(("name", "ranks", "mbs", "v"), [("1f1b", 4, 24, None), ("zbv", 2, 12, 2)])
def test_the_safe_bound_is_the_formula_in_exact_arithmetic(number: int, name: str, ranks: int, mbs: int,
                                                           v: int | None) -> None:
    # Note [bound rounding]: flows of ~1e4 per ms, start times of ~1e5 ms and imbalances at every node, as
    # at a million actions, and a bound that is a small difference of those terms (one stage's cap is chosen
    # so that the bound comes out near 0). The double-double sums must meet the exact value to 1e-12; the
    # float64 sums of before failed every case of this test.
    sched = schedules.generate(name, ranks, mbs, v)
    dag = dag_mod.build(sched, _random_profile(sched.num_stages, seed=4, p2p_ms=0.05))
    g = GraphArrays.from_dag(dag)
    rng = np.random.default_rng(number)
    S = sched.num_stages
    dual = FullDual(y=rng.random(len(g.row_u)) * 1e4 - 1e3, kappa=rng.random(len(g.sinks)) * 1e3,
                    lam=rng.random(S) * 1e3, rho=float(rng.random() * 700), sigma=rng.standard_normal(S) * 1e3,
                    p=rng.random(g.n) * 3)
    t_max = 1e5 + rng.random()
    r_ub = float(g.n) / 3 + rng.random()
    size = np.bincount(g.stage[g.frz], minlength=S)
    s = int(np.argmax(size))  # the stage whose cap row cancels the rest: b'y there is -cap |A_s| lambda_s

    def phase_at(caps: np.ndarray) -> Phase:
        if number == 1:
            return Phase(number=number, caps=caps, t_max=t_max)
        return Phase(number=number, caps=caps, t_ub=t_max, t_max=t_max, r_ub=r_ub)

    for windows in (Windows.chains(g, dag), Windows.build(g, dag)):
        caps = rng.uniform(0.1, 0.9, S)
        caps[s] = 0.0
        rest = _reference_bound(g, phase_at(caps), dual, windows)
        caps[s] = float(rest / (int(size[s]) * Fraction(float(dual.lam[s]))))
        phase = phase_at(caps)
        want = _reference_bound(g, phase, dual, windows)
        assert abs(want) < 1e-3 * abs(rest)  # a small difference of large terms
        got = safe_lower_bound(g, phase, dual, windows)
        assert abs(Fraction(got) - want) <= 4 * 2.0**-53 * abs(want) + Fraction(1, 10**12)


def test_chain_windows_are_exact_sums() -> None:
    # Windows.chains: each action's head is the exact sum of its rank's earlier d_min and rank-edge lags.
    sched = schedules.generate("1f1b", 3, 40)
    dag = dag_mod.build(sched, _random_profile(3, seed=8, p2p_ms=0.03))
    g = GraphArrays.from_dag(dag)
    w = Windows.chains(g, dag)
    d_min = [Fraction(a) - Fraction(b) for a, b in zip(g.d_max.tolist(), g.delta.tolist())]
    for lo, hi in dag.rank_bounds():
        head = Fraction(0)
        for i in range(lo, hi):
            if i > lo:
                head += d_min[i - 1] + Fraction(float(g.lags[0][i]))
            assert value((w.head[0][i], w.head[1][i])) == head
