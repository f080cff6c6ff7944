"""Simulator: closed forms, agreement with an independent networkx longest-path computation, critical path,
bounds, monotonicity in uniform freezing, per-step overhead."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfplan.cost import profile
from tfplan.cost.profile import Profile, StageCost
from tfplan.errors import TfplanError
from tfplan.schedule import schedules
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

GRID = [(p, m) for p in (1, 2, 3, 4, 5, 7) for m in (1, 2, 3, 4, 5, 7, 8, 9, 12, 13)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("f", "b"), [(1.0, 2.0), (1.3, 0.7), (0.25, 3.5)])
def test_closed_forms_uniform_gpipe_and_1f1b(name: str, f: float, b: float) -> None:
    checked = 0
    for p, m in GRID:
        if name == "1f1b" and m < p:
            continue
        sched = schedules.generate(name, p, m)
        sim = simulate(dag_mod.build(sched, profile.uniform(p, forward_ms=f, backward_ms=b, backward_frozen_ms=b / 2)))
        assert sim.makespan_ms == pytest.approx((m + p - 1) * (f + b), rel=1e-12), (p, m)
        assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-9, abs=1e-12), (p, m)
        assert sim.busy_ms == pytest.approx([m * (f + b)] * p, rel=1e-12)
        checked += 1
    assert checked >= 40


def test_toy_numbers() -> None:
    # METHOD.md section 4: the 4 x 8 toy takes 33 without freezing and 22 with everything frozen.
    prof = profile.uniform(4)
    for name in ("gpipe", "1f1b"):
        dag = dag_mod.build(schedules.generate(name, 4, 8), prof)
        assert simulate(dag).makespan_ms == 33.0
        assert simulate(dag, dag.d_min).makespan_ms == 22.0


# ---------------------------------------------------------------------------------------------------------
# Random heterogeneous instances


def _time(rng: random.Random, hi: float = 5.0) -> float:
    """A duration in [0, hi] ms; now and then exactly 0 (e.g. stage 0's input gradient)."""
    return 0.0 if rng.random() < 0.1 else rng.uniform(0.0, hi)


def random_instance(seed: int, max_ranks: int = 4, max_mbs: int = 8) -> tuple[dag_mod.Dag, list[float]]:
    """(dag, durations): a schedule of any kind with a random heterogeneous profile, p2p lag, step overhead
    and random per-action freeze ratios. Drawn from one seed so that 50 examples cover many shapes."""
    rng = random.Random(seed)
    while True:
        name = rng.choice(sorted(schedules.SCHEDULES))
        spec = schedules.SCHEDULES[name]
        v = rng.randint(spec.min_stages_per_rank, spec.max_stages_per_rank or 3)
        try:
            sched = schedules.generate(name, rng.randint(1, max_ranks), rng.randint(1, max_mbs), v)
            break
        except TfplanError:
            continue  # arguments this schedule cannot run
    costs = []
    for _ in range(sched.num_stages):
        b, w = _time(rng), _time(rng)
        costs.append(
            StageCost(
                forward_ms=_time(rng),
                backward_ms=b,
                backward_frozen_ms=b * rng.choice([0.0, 1.0, rng.random()]),
                backward_input_ms=_time(rng),
                backward_weight_ms=w,
                backward_weight_frozen_ms=w * rng.choice([0.0, 1.0, rng.random()]),
            )
        )
    p2p = rng.choice([0.0, 0.05, 1.0, rng.uniform(0.0, 2.0)])
    prof = Profile(name="random", p2p_ms=p2p, step_overhead_ms=rng.choice([0.0, 3.5]), stages=tuple(costs))
    dag = dag_mod.build(sched, prof)
    ratios = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(dag.num_nodes)]
    return dag, dag.durations(ratios)


SEEDS = st.integers(0, 2**32 - 1)


def networkx_schedule(dag: dag_mod.Dag, durations) -> tuple[dict, float]:
    """Earliest start times by an independent longest-path pass over dag.to_networkx."""
    g = dag_mod.to_networkx(dag)
    start, end = {}, {}
    for v in nx.topological_sort(g):
        preds = [end[u] + g.edges[u, v]["lag_ms"] for u in g.predecessors(v)]
        start[v] = max(preds, default=0.0)
        end[v] = start[v] + (durations[v] if isinstance(v, int) else 0.0)
    return start, end["FINISH"]


@settings(max_examples=50, deadline=None)
@given(seed=SEEDS)
def test_start_times_equal_networkx_longest_path(seed: int) -> None:
    dag, dur = random_instance(seed)
    sim = simulate(dag, dur)
    start, finish = networkx_schedule(dag, dur)
    for v in range(dag.num_nodes):
        assert sim.start_ms[v] == pytest.approx(start[v], rel=1e-12, abs=1e-12)
        assert sim.end_ms[v] == pytest.approx(start[v] + dur[v], rel=1e-12, abs=1e-12)
    assert sim.makespan_ms == pytest.approx(finish, rel=1e-12, abs=1e-12)
    assert sim.batch_time_ms == pytest.approx(finish + dag.step_overhead_ms, rel=1e-12, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(seed=SEEDS)
def test_makespan_bounds_and_critical_path(seed: int) -> None:
    dag, dur = random_instance(seed)
    sim = simulate(dag, dur)
    # Every rank's busy time is the sum of its durations, and fits in the makespan.
    busy = [0.0] * dag.schedule.num_ranks
    for r, d in zip(dag.rank, dur):
        busy[r] += d
    assert sim.busy_ms == pytest.approx(busy, rel=1e-12, abs=1e-12)
    assert sim.actions_end_ms == max(sim.end_ms, default=0.0)  # found among the ranks' last actions
    for b in sim.busy_ms:
        assert sim.makespan_ms >= b - 1e-9
    assert sim.idle_ms == pytest.approx([sim.makespan_ms - b for b in busy], abs=1e-9)
    idle = sum(sim.makespan_ms - b for b in busy)
    if sim.makespan_ms > 0:
        assert sim.bubble_fraction == pytest.approx(idle / (len(busy) * sim.makespan_ms), abs=1e-12)
    # The critical path is a chain of DAG edges, each tight, from time 0 to the makespan.
    path = sim.critical_path
    assert path
    edges = {}
    for u, v, lag, _ in dag.edges():
        edges[(u, v)] = max(lag, edges.get((u, v), lag))
    total = dur[path[0]]
    assert sim.start_ms[path[0]] == pytest.approx(0.0, abs=1e-9)
    for u, v in zip(path, path[1:]):
        assert (u, v) in edges, (str(dag.actions[u]), str(dag.actions[v]))
        assert sim.end_ms[u] + edges[(u, v)] == pytest.approx(sim.start_ms[v], rel=1e-9, abs=1e-9)
        total += edges[(u, v)] + dur[v]
    assert sim.end_ms[path[-1]] == pytest.approx(sim.makespan_ms, rel=1e-12, abs=1e-12)
    # makespan >= the critical path's durations plus lags, and equal to it.
    assert sim.makespan_ms == pytest.approx(total, rel=1e-9, abs=1e-9)
    # And no path is longer: the longest path in networkx (durations on nodes, lags on edges) has that length.
    g = dag_mod.to_networkx(dag)
    for u, v in g.edges:
        g.edges[u, v]["w"] = g.edges[u, v]["lag_ms"] + (dur[v] if isinstance(v, int) else 0.0)
    assert nx.dag_longest_path_length(g, weight="w") == pytest.approx(sim.makespan_ms, rel=1e-9, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, r1=st.floats(0.0, 1.0), r2=st.floats(0.0, 1.0))
def test_uniform_freezing_never_makes_it_slower(seed: int, r1: float, r2: float) -> None:
    dag, _ = random_instance(seed)
    lo, hi = sorted((r1, r2))
    none = simulate(dag).makespan_ms
    at_lo = simulate(dag, dag.durations(lo)).makespan_ms
    at_hi = simulate(dag, dag.durations(hi)).makespan_ms
    frozen = simulate(dag, dag.d_min).makespan_ms
    assert none >= at_lo - 1e-9
    assert at_lo >= at_hi - 1e-9
    assert at_hi >= frozen - 1e-9
    assert simulate(dag, dag.durations(1.0)).makespan_ms == pytest.approx(frozen, abs=1e-9)


def test_step_overhead_is_added_to_batch_time() -> None:
    prof = Profile(name="o", p2p_ms=0.0, step_overhead_ms=4.5, stages=profile.uniform(2).stages)
    sim = simulate(dag_mod.build(schedules.generate("1f1b", 2, 3), prof))
    assert sim.makespan_ms == 12.0  # (3 + 2 - 1) x 3
    assert sim.step_overhead_ms == 4.5
    assert sim.batch_time_ms == 16.5
    # Bubbles are measured on the DAG alone.
    assert sim.bubble_fraction == pytest.approx(1 / 4)


def test_rank_tails_and_dispatch_end_the_step() -> None:
    # Note [rank tails]: the step ends at max over ranks of (last action's end + tail); the dispatch cost
    # lengthens every action. 1F1B 2 x 2 with F = 1, B = 2 ends at (M + P - 1)(F + B) = 9 (rank 0's 0B1).
    sched = schedules.generate("1f1b", 2, 2)
    plain_dag = dag_mod.build(sched, profile.uniform(2))
    plain = simulate(plain_dag)
    assert plain.makespan_ms == plain.actions_end_ms == 9.0
    last = [max(v for v in range(plain_dag.num_nodes) if plain_dag.rank[v] == r) for r in (0, 1)]
    assert [plain.end_ms[v] for v in last] == [9.0, 7.0]
    costs = [replace(plain_dag.stage_costs[0], tail_ms=t) for t in (0.5, 4.0)]
    sim = simulate(dag_mod.build(sched, Profile(name="t", stages=tuple(costs))))
    assert sim.actions_end_ms == 9.0 and sim.makespan_ms == 11.0  # rank 1: 7 + 4
    assert sim.batch_time_ms == 11.0 and [str(plain_dag.actions[v]) for v in sim.critical_path][-1] == "1B1"
    slow = simulate(dag_mod.build(sched, Profile(name="d", dispatch_ms=0.25, stages=profile.uniform(2).stages)))
    assert slow.busy_ms == [2 * 1.25 + 2 * 2.25] * 2


def test_p2p_lag_adds_to_the_pipeline_fill() -> None:
    # GPipe 3 ranks x 1 micro-batch: F0 F1 F2 then B2 B1 B0, four rank crossings.
    prof = profile.uniform(3, p2p_ms=0.5)
    sim = simulate(dag_mod.build(schedules.generate("gpipe", 3, 1), prof))
    assert sim.makespan_ms == pytest.approx(3 * (1 + 2) + 4 * 0.5)
    assert len(sim.critical_path) == 6


def test_known_start_times_1f1b_2x2() -> None:
    dag = dag_mod.build(schedules.generate("1f1b", 2, 2), profile.uniform(2))
    sim = simulate(dag)
    got = {str(a): (s, e) for a, s, e in zip(dag.actions, sim.start_ms, sim.end_ms)}
    assert got == {
        "0F0": (0.0, 1.0),
        "0F1": (1.0, 2.0),
        "1F0": (1.0, 2.0),
        "1B0": (2.0, 4.0),
        "1F1": (4.0, 5.0),
        "1B1": (5.0, 7.0),
        "0B0": (4.0, 6.0),
        "0B1": (7.0, 9.0),
    }
    assert [str(dag.actions[v]) for v in sim.critical_path] == ["0F0", "1F0", "1B0", "1F1", "1B1", "0B1"]


def test_zero_durations() -> None:
    dag = dag_mod.build(schedules.generate("gpipe", 2, 2), profile.uniform(2))
    sim = simulate(dag, [0.0] * dag.num_nodes)
    assert sim.makespan_ms == 0.0 and sim.bubble_fraction == 0.0
    assert math.isfinite(sim.bubble_fraction)


def test_the_memo_follows_the_durations_not_the_list() -> None:
    # Dag.memo keeps the unfrozen simulation and the last other one: a caller's list changed in place, or
    # another Dag from dataclasses.replace, gets its own simulation; freeze_groups hands out fresh lists.
    dag = dag_mod.build(schedules.generate("1f1b", 4, 8), profile.uniform(4))
    durations = dag.durations(0.5)
    first = simulate(dag, durations)
    assert simulate(dag, list(durations)) is first and simulate(dag) is simulate(dag, list(dag.d_max))
    durations[:] = dag.d_min
    assert simulate(dag, durations).makespan_ms == simulate(replace(dag), dag.d_min).makespan_ms
    assert simulate(dag, durations).makespan_ms < first.makespan_ms
    assert simulate(dag, dag.durations(0.5)).makespan_ms == first.makespan_ms
    groups = dag.freeze_groups()
    groups[0].clear()
    fresh = dag_mod.build(dag.schedule, profile.uniform(4))
    assert dag.freeze_groups()[0] and dag.freeze_groups() == fresh.freeze_groups()
