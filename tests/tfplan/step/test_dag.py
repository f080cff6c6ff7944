"""The action DAG: edge kinds exactly as METHOD.md section 2, p2p lags only across ranks, networkx export,
deadlock (cycle) detection naming the actions."""

from __future__ import annotations

import dataclasses
import re

import networkx as nx
import pytest

from tfplan.cost import profile
from tfplan.cost.profile import Profile, StageCost
from tfplan.errors import TfplanError
from tfplan.schedule import schedules
from tfplan.schedule.actions import Action, parse_action
from tfplan.step import dag as dag_mod

P2P = 0.25


def _order(*ranks: str) -> list[list[Action]]:
    return [[parse_action(a) for a in rank.split()] for rank in ranks]


def _edges(dag: dag_mod.Dag) -> set[tuple[str, str, float, str]]:
    return {(str(dag.actions[u]), str(dag.actions[v]), lag, kind) for u, v, lag, kind in dag.edges()}


def _hetero(num_stages: int, p2p: float = P2P) -> Profile:
    stages = tuple(
        StageCost(
            forward_ms=1.0 + s,
            backward_ms=2.0 + s,
            backward_frozen_ms=1.0 + s / 2,
            backward_input_ms=1.5 + s,
            backward_weight_ms=0.5 + s,
            backward_weight_frozen_ms=0.1 * s,
        )
        for s in range(num_stages)
    )
    return Profile(name="h", p2p_ms=p2p, stages=stages)


def test_gpipe_2x2_edges_by_hand() -> None:
    sched = schedules.generate("gpipe", 2, 2)
    dag = dag_mod.build(sched, profile.uniform(2, p2p_ms=P2P))
    expected = {
        # 1. same rank: each action -> the next one
        ("0F0", "0F1", 0.0, "rank"),
        ("0F1", "0B0", 0.0, "rank"),
        ("0B0", "0B1", 0.0, "rank"),
        ("1F0", "1F1", 0.0, "rank"),
        ("1F1", "1B0", 0.0, "rank"),
        ("1B0", "1B1", 0.0, "rank"),
        # 2. forward pipeline, 3. backward pipeline (different ranks: p2p lag)
        ("0F0", "1F0", P2P, "pipeline"),
        ("0F1", "1F1", P2P, "pipeline"),
        ("1B0", "0B0", P2P, "pipeline"),
        ("1B1", "0B1", P2P, "pipeline"),
        # 4. within a stage: F -> B
        ("0F0", "0B0", 0.0, "stage"),
        ("0F1", "0B1", 0.0, "stage"),
        ("1F0", "1B0", 0.0, "stage"),
        ("1F1", "1B1", 0.0, "stage"),
    }
    assert _edges(dag) == expected
    assert len(dag.edges()) == len(expected)


def test_split_backward_edges_by_hand() -> None:
    sched = schedules.from_order(_order("0F0 0F1 0I0 0W0 0I1 0W1", "1F0 1I0 1F1 1I1 1W0 1W1"))
    dag = dag_mod.build(sched, _hetero(2))
    rank = {
        ("0F0", "0F1"),
        ("0F1", "0I0"),
        ("0I0", "0W0"),
        ("0W0", "0I1"),
        ("0I1", "0W1"),
        ("1F0", "1I0"),
        ("1I0", "1F1"),
        ("1F1", "1I1"),
        ("1I1", "1W0"),
        ("1W0", "1W1"),
    }
    pipeline = {("0F0", "1F0"), ("0F1", "1F1"), ("1I0", "0I0"), ("1I1", "0I1")}  # W sends nothing
    stage = {
        ("0F0", "0I0"),
        ("0F1", "0I1"),
        ("0I0", "0W0"),
        ("0I1", "0W1"),
        ("1F0", "1I0"),
        ("1F1", "1I1"),
        ("1I0", "1W0"),
        ("1I1", "1W1"),
    }
    expected = (
        {(u, v, 0.0, "rank") for u, v in rank}
        | {(u, v, P2P, "pipeline") for u, v in pipeline}
        | {(u, v, 0.0, "stage") for u, v in stage}
    )
    assert _edges(dag) == expected


def test_mixed_full_and_split_backward_between_stages() -> None:
    # Stage 1 splits its backward (I + W), stage 0 runs full backwards: I(1, m) -> B(0, m).
    sched = schedules.from_order(_order("0F0 0B0", "1F0 1I0 1W0"))
    dag = dag_mod.build(sched, _hetero(2))
    assert ("1I0", "0B0", P2P, "pipeline") in _edges(dag)
    assert not any(u == "1W0" and k == "pipeline" for u, _, _, k in _edges(dag))


def _expected_edges(sched: schedules.Schedule, p2p: float) -> set[tuple[str, str, float, str]]:
    """METHOD.md section 2, written out independently of tfplan.step.dag."""
    present = {a for rank in sched.order for a in rank}
    where = {a: r for r, rank in enumerate(sched.order) for a in rank}
    out = set()
    for rank in sched.order:
        out |= {(str(u), str(v), 0.0, "rank") for u, v in zip(rank, rank[1:])}
    for a in present:
        s, k, m = a
        if k == "F" and s + 1 < sched.num_stages:
            b = Action(s + 1, "F", m)
            out.add((str(a), str(b), p2p if where[a] != where[b] else 0.0, "pipeline"))
        if k in "BI" and s > 0:
            b = next(x for x in (Action(s - 1, "B", m), Action(s - 1, "I", m)) if x in present)
            out.add((str(a), str(b), p2p if where[a] != where[b] else 0.0, "pipeline"))
        if k in "BI":
            out.add((f"{s}F{m}", str(a), 0.0, "stage"))
        if k == "W":
            out.add((f"{s}I{m}", str(a), 0.0, "stage"))
    return out


SCHEDS = [
    ("gpipe", 3, 4, None),
    ("1f1b", 3, 5, None),
    ("interleaved-1f1b", 2, 4, 2),
    ("interleaved-1f1b", 1, 3, 3),
    ("looped-bfs", 3, 3, 2),
    ("interleaved-zb", 2, 4, 2),
    ("zbv", 2, 3, None),
    ("zbv", 3, 6, None),
    ("dualpipev", 2, 5, None),
    ("dualpipev", 3, 7, None),
]


@pytest.mark.parametrize(("name", "p", "m", "v"), SCHEDS, ids=[f"{n}-P{p}-M{m}" for n, p, m, _ in SCHEDS])
def test_edges_follow_method_section_2(name: str, p: int, m: int, v: int | None) -> None:
    sched = schedules.generate(name, p, m, v)
    dag = dag_mod.build(sched, _hetero(sched.num_stages))
    assert _edges(dag) == _expected_edges(sched, P2P)


@pytest.mark.parametrize(("name", "p", "m", "v"), SCHEDS, ids=[f"{n}-P{p}-M{m}" for n, p, m, _ in SCHEDS])
def test_p2p_lag_only_between_different_ranks(name: str, p: int, m: int, v: int | None) -> None:
    sched = schedules.generate(name, p, m, v)
    dag = dag_mod.build(sched, _hetero(sched.num_stages))
    same_rank_pipeline = 0
    for u, w, lag, kind in dag.edges():
        cross = dag.rank[u] != dag.rank[w]
        assert lag == (P2P if cross else 0.0), (str(dag.actions[u]), str(dag.actions[w]), kind)
        assert kind == "pipeline" or not cross  # only pipeline edges ever cross ranks
        same_rank_pipeline += kind == "pipeline" and not cross
    if name in ("zbv", "dualpipev") or p == 1:
        assert same_rank_pipeline > 0  # V turn (stages P-1 and P on one rank) or a single rank: lag 0 there


def test_v_turn_has_no_lag() -> None:
    sched = schedules.generate("zbv", 2, 3)  # stages 0,3 on rank 0 and 1,2 on rank 1
    edges = _edges(dag_mod.build(sched, _hetero(4)))
    assert ("1F0", "2F0", 0.0, "pipeline") in edges  # both on rank 1
    assert ("2F0", "3F0", P2P, "pipeline") in edges
    assert ("2I0", "1I0", 0.0, "pipeline") in edges
    assert ("1I0", "0I0", P2P, "pipeline") in edges


def test_durations_per_kind_and_freezability() -> None:
    sched = schedules.from_order(_order("0F0 0B0 0F1 0I1 0W1"))
    prof = _hetero(1)
    dag = dag_mod.build(sched, prof)
    c = prof.stages[0]
    got = {str(a): (hi, lo, f) for a, hi, lo, f in zip(dag.actions, dag.d_max, dag.d_min, dag.freezable)}
    assert got == {
        "0F0": (c.forward_ms, c.forward_ms, False),
        "0B0": (c.backward_ms, c.backward_frozen_ms, True),
        "0F1": (c.forward_ms, c.forward_ms, False),
        "0I1": (c.backward_input_ms, c.backward_input_ms, False),
        "0W1": (c.backward_weight_ms, c.backward_weight_frozen_ms, True),
    }
    # d(r) = w_max - r (w_max - w_min) on freezable nodes only.
    assert dag.durations(0.5) == [1.0, 1.5, 1.0, 1.5, 0.25]
    assert dag.durations([1.0, 0.5, 1.0, 1.0, 1.0]) == [1.0, 1.5, 1.0, 1.5, 0.0]
    assert dag.durations() == dag.d_max


def test_freeze_groups_hold_what_freezing_can_shorten() -> None:
    # Note [freeze groups]: B and W whose frozen duration is below the unfrozen one, per stage; here stage 1's W
    # cannot be shortened (frozen W = W), so 1W* are neither frozen nor counted.
    base = _hetero(2)
    stiff = dataclasses.replace(base.stages[1], backward_weight_frozen_ms=base.stages[1].backward_weight_ms)
    prof = Profile(name="s", p2p_ms=0.0, stages=(base.stages[0], stiff))
    dag = dag_mod.build(schedules.generate("interleaved-zb", 1, 2, 2), prof)
    names = [[str(dag.actions[v]) for v in g] for g in dag.freeze_groups()]
    assert names == [["0W0", "0W1"], []]
    assert [str(a) for a, ok in zip(dag.actions, dag.freeze_mask()) if ok] == ["0W0", "0W1"]
    assert all(dag.freezable[v] for v in range(dag.num_nodes) if dag.actions[v].kind == "W")


def test_topological_order_is_valid() -> None:
    sched = schedules.generate("dualpipev", 3, 7)
    dag = dag_mod.build(sched, _hetero(6))
    pos = {v: i for i, v in enumerate(dag.topo)}
    assert sorted(dag.topo) == list(range(dag.num_nodes))
    for u, v, _, _ in dag.edges():
        assert pos[u] < pos[v]


def test_to_networkx_has_start_finish_and_attributes() -> None:
    sched = schedules.generate("1f1b", 2, 3)
    prof = _hetero(2)
    dag = dag_mod.build(sched, prof)
    g = dag_mod.to_networkx(dag)
    assert nx.is_directed_acyclic_graph(g)
    assert set(g.nodes) == set(range(dag.num_nodes)) | {"START", "FINISH"}
    for i, a in enumerate(dag.actions):
        attrs = g.nodes[i]
        assert attrs["action"] == str(a)
        assert (attrs["stage"], attrs["kind"], attrs["mb"], attrs["rank"]) == (a.stage, a.kind, a.mb, dag.rank[i])
        assert (attrs["d_max_ms"], attrs["d_min_ms"]) == (dag.d_max[i], dag.d_min[i])
        assert attrs["freezable"] == (a.kind in "BW")
    # START feeds exactly the first forward of stage 0; FINISH collects the sinks.
    assert [str(dag.actions[v]) for v in g.successors("START")] == ["0F0"]
    assert sorted(str(dag.actions[u]) for u in g.predecessors("FINISH")) == ["0B2"]
    # Edge attributes: lag and the kinds linking the pair (1F0 -> 1B0 is both rank and stage).
    node = {str(a): i for i, a in enumerate(dag.actions)}
    assert g.edges[node["1F0"], node["1B0"]]["kinds"] == ("rank", "stage")
    assert g.edges[node["0F0"], node["1F0"]] == {"lag_ms": P2P, "kinds": ("pipeline",)}
    assert g.edges["START", node["0F0"]]["lag_ms"] == 0.0
    # Every DAG edge is there (pairs linked twice appear once).
    assert {(u, v) for u, v, _, _ in dag.edges()} == {(u, v) for u, v in g.edges if "START" != u and v != "FINISH"}


def test_deadlock_names_the_cycle() -> None:
    sched = schedules.from_order(_order("0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"))  # a valid order that deadlocks
    with pytest.raises(TfplanError) as info:
        dag_mod.build(sched, profile.uniform(2))
    message = str(info.value)
    assert message.startswith("schedule deadlocks: ")
    assert "\n" not in message
    chain = re.findall(r"(\d[FBIW]\d) \(rank (\d)\)", message)
    names = [a for a, _ in chain]
    # The cycle 0B0 -> 0F1 -> 1F1 -> 1B0 -> 0B0, starting anywhere, closed.
    assert names[0] == names[-1]
    assert set(names) == {"0B0", "0F1", "1F1", "1B0"}
    assert len(names) == 5
    assert all(int(r) == int(a[0]) for a, r in chain)  # each action shown with its rank


def test_deadlock_in_a_longer_custom_schedule() -> None:
    # Rank 2 (last) runs two forwards before its first backward, rank 1 only one: 1B0 waits for 2B0, which
    # waits for 2F1, which waits for 1F1, which rank 1 runs after 1B0.
    order = _order("0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1B0 1F1 1B1 1F2 1B2", "2F0 2F1 2B0 2B1 2F2 2B2")
    sched = schedules.from_order(order)
    with pytest.raises(TfplanError, match="schedule deadlocks: .* actions can never start; cycle") as info:
        dag_mod.build(sched, profile.uniform(3))
    assert set(re.findall(r"(\d[FB]\d) \(rank", str(info.value))) == {"1B0", "2B0", "2F1", "1F1"}


def test_profile_that_does_not_fit_the_schedule() -> None:
    sched = schedules.generate("1f1b", 3, 4)
    with pytest.raises(TfplanError, match="has 4 stages but the schedule has 3"):
        dag_mod.build(sched, profile.uniform(4))


def test_per_layer_profile_is_split_into_the_schedule_stages() -> None:
    layer = StageCost(
        forward_ms=1.0,
        backward_ms=2.0,
        backward_frozen_ms=1.0,
        backward_input_ms=1.0,
        backward_weight_ms=1.0,
        backward_weight_frozen_ms=0.0,
    )
    prof = Profile(name="l", p2p_ms=0.0, layers=(layer,) * 6)
    dag = dag_mod.build(schedules.generate("gpipe", 3, 2), prof)
    assert [c.forward_ms for c in dag.stage_costs] == [2.0, 2.0, 2.0]
    dag = dag_mod.build(schedules.generate("gpipe", 3, 2), prof, layers_per_stage=[1, 2, 3])
    assert [c.forward_ms for c in dag.stage_costs] == [1.0, 2.0, 3.0]
    assert dag.d_min[dag.actions.index(Action(0, "B", 0))] == 0.0  # first-stage rule
