"""The training step as a DAG of actions (METHOD.md section 2).

Edges (u -> v: v starts after u ends, plus a lag in ms):
  rank      each action -> the next action in its rank's list;
  forward   F(s, m) -> F(s+1, m), lag = p2p_ms when the stages sit on different ranks;
  backward  B/I(s+1, m) -> B/I(s, m), same lag;
  stage     F(s, m) -> B/I(s, m) and I(s, m) -> W(s, m).
Every action has at most one predecessor of each kind, so we store three predecessor slots per node
(-1 = none) instead of adjacency sets: the simulator and the solver read them as flat arrays.
`to_networkx` gives the same graph with START/FINISH as a networkx.DiGraph.

Note [freeze groups]: an action has a freeze ratio when it is a B or W action (the kinds whose work shrinks
when parameters are frozen) and its frozen duration is below its unfrozen one. An action freezing cannot
shorten (d_min == d_max, e.g. a profile that declares a backward unfreezable) is neither frozen nor counted in
its stage's cap (METHOD.md counts every B/W; the difference only matters for such profiles). Dag.freeze_mask
is the one definition; the LP backends, the plan loader and the predictions all use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tfplan.cost.profile import Profile, StageCost
from tfplan.errors import TfplanError
from tfplan.schedule.actions import FREEZABLE, KINDS, Action
from tfplan.schedule.schedules import Schedule

EDGE_KINDS = ("rank", "pipeline", "stage")  # the kind of predecessor slot 0, 1, 2
KIND_CODE = {kind: code for code, kind in enumerate(KINDS)}  # F 0, B 1, I 2, W 3: kinds as ints in arrays


@dataclass(slots=True)
class Dag:
    """A schedule's action graph with min/max durations.

    Node i is `actions[i]`; lists are indexed by node. Durations in ms.
    """

    schedule: Schedule
    actions: list[Action]
    rank: list[int]
    preds: tuple[list[int], list[int], list[int]]
    """preds[k][i]: node i's predecessor of kind EDGE_KINDS[k], or -1."""
    lags: tuple[list[float], list[float], list[float]]
    """lags[k][i]: lag (ms) on the edge preds[k][i] -> i."""
    d_max: list[float]
    """Duration with nothing frozen."""
    d_min: list[float]
    """Duration with everything frozen (= d_max for fixed actions F and I)."""
    freezable: list[bool]
    """B and W actions (their duration can shrink)."""
    topo: list[int]
    """A topological order of the nodes."""
    stage_costs: tuple[StageCost, ...] = ()
    """The per-stage costs the durations came from (after splitting a per-layer profile)."""
    p2p_ms: float = 0.0
    """Lag on pipeline edges between stages on different ranks."""
    dispatch_ms: float = 0.0
    """The profile's per-action runtime cost, already included in every d_max and d_min."""
    tail_ms: tuple[float, ...] = ()
    """Per rank: work after its last action (its stages' tails: the optimizer); the step ends at the latest
    rank end plus tail (Note [rank tails])."""
    step_overhead_ms: float = 0.0
    """Per-step time outside the DAG and the tails (from the profile), added to predicted step times."""
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    """What freeze_groups and tfplan.step.simulate derive from the fields above, kept because one job asks for it
    several times (at a million actions each costs a second). A Dag's fields are not changed after build;
    dataclasses.replace makes a new Dag with an empty memo."""

    @property
    def num_nodes(self) -> int:
        return len(self.actions)

    def durations(self, ratios: Sequence[float] | float = 0.0) -> list[float]:
        """Durations at freeze ratios: d = d_max - r (d_max - d_min) (METHOD.md section 3).

        Args:
            ratios: one ratio per node (ignored on fixed nodes), or a single ratio for every freezable node.
        """
        if isinstance(ratios, (int, float)):
            r = float(ratios)
            return [hi - r * (hi - lo) if f else hi for hi, lo, f in zip(self.d_max, self.d_min, self.freezable)]
        assert len(ratios) == self.num_nodes
        return [hi - r * (hi - lo) for hi, lo, r in zip(self.d_max, self.d_min, ratios)]

    def action_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(stage, KIND_CODE of the kind, micro-batch) per node as (n,) int64 arrays (kept from build)."""
        if "action arrays" not in self.memo:
            self.memo["action arrays"] = _action_arrays(self.actions)
        return self.memo["action arrays"]

    def freeze_mask(self) -> list[bool]:
        """Per node: whether it has a freeze ratio (Note [freeze groups]): a B or W action whose frozen duration
        is below its unfrozen one. The one definition of "freezable" that the caps, both LP backends and the
        plan loader use."""
        return [f and lo < hi for f, hi, lo in zip(self.freezable, self.d_max, self.d_min)]

    def freeze_groups(self) -> list[list[int]]:
        """Per stage: its nodes with a freeze ratio (freeze_mask), the A_s whose mean ratio the stage's cap bounds.

        >>> from tfplan import profile, schedules
        >>> dag = build(schedules.generate("1f1b", 2, 2), profile.uniform(2))
        >>> [[str(dag.actions[v]) for v in g] for g in dag.freeze_groups()]
        [['0B0', '0B1'], ['1B0', '1B1']]
        """
        groups = self.memo.get("freeze_groups")
        if groups is None:
            lists: list[list[int]] = [[] for _ in range(self.schedule.num_stages)]
            for v, ok in enumerate(self.freeze_mask()):
                if ok:
                    lists[self.actions[v].stage].append(v)
            groups = self.memo["freeze_groups"] = tuple(tuple(g) for g in lists)
        return [list(g) for g in groups]  # the caller's own lists

    def finish(self) -> list[tuple[int, float]]:
        """Note [rank tails]: (last node, tail ms) per rank. The step's makespan T satisfies
        T >= end(last node of rank r) + tail_r for every rank; every sink of the DAG is some rank's last node,
        so these rows replace "T >= end of every sink" in the simulator and both LP backends. A rank whose
        last node has successors and no tail is left out (its row is implied; leaving it out keeps the LP
        of a tail-free profile exactly as it was).

        >>> from tfplan import profile, schedules
        >>> sched = schedules.generate("1f1b", 2, 2)
        >>> dag = build(sched, profile.uniform(2))
        >>> [(str(dag.actions[v]), tail) for v, tail in dag.finish()]
        [('0B1', 0.0)]
        >>> dag = build(sched, profile.uniform(2, tail_ms=0.5))
        >>> [(str(dag.actions[v]), tail) for v, tail in dag.finish()]
        [('0B1', 0.5), ('1B1', 0.5)]
        """
        rows = self.memo.get("finish")
        if rows is None:
            last = {r: hi - 1 for r, (lo, hi) in enumerate(self.rank_bounds()) if hi > lo}
            tails = self.tail_ms or (0.0,) * self.schedule.num_ranks
            has_succ = set().union(*self.preds)  # C-level, and once per Dag (a tenth of a second per million)
            rows = self.memo["finish"] = tuple((last[r], tails[r]) for r in sorted(last)
                                               if tails[r] > 0 or last[r] not in has_succ)
        return list(rows)

    def rank_bounds(self) -> list[tuple[int, int]]:
        """Per rank: the node range [lo, hi) of its actions (nodes are numbered rank by rank in execution order).

        >>> from tfplan import profile, schedules
        >>> build(schedules.generate("1f1b", 2, 2), profile.uniform(2)).rank_bounds()
        [(0, 4), (4, 8)]
        """
        bounds, at = [], 0
        for actions in self.schedule.order:
            bounds.append((at, at + len(actions)))
            at += len(actions)
        return bounds

    def edges(self) -> list[tuple[int, int, float, str]]:
        """Every edge as (u, v, lag_ms, kind); a pair linked by two kinds appears once per kind."""
        out = []
        for k, kind in enumerate(EDGE_KINDS):
            out += [(u, v, lag, kind) for v, (u, lag) in enumerate(zip(self.preds[k], self.lags[k])) if u >= 0]
        return out


def _costs(cost: StageCost, kind: str) -> tuple[float, float]:
    """(max, min) duration of one action kind on a stage."""
    if kind == "F":
        return cost.forward_ms, cost.forward_ms
    if kind == "B":
        return cost.backward_ms, cost.backward_frozen_ms
    if kind == "I":
        return cost.backward_input_ms, cost.backward_input_ms
    return cost.backward_weight_ms, cost.backward_weight_frozen_ms


def build(schedule: Schedule, profile: Profile, layers_per_stage: Sequence[int] | None = None) -> Dag:
    """Build the DAG of `schedule` with durations from `profile`.

    Raises:
        TfplanError: the profile does not fit the schedule, or the schedule deadlocks (a cycle).
    """
    costs = profile.stage_costs(schedule.num_stages, layers_per_stage)
    actions = [a for rank_actions in schedule.order for a in rank_actions]
    n = len(actions)
    # Whole arrays, not a loop over actions (a million-action DAG: 0.8-1.1 s against 1.6-2.2 s): every (stage, kind,
    # micro-batch) names at most one node, so a table indexed by it finds each predecessor; the schedule is
    # validated, so the ones the edges need exist.
    stage, kind, mb = _action_arrays(actions)
    num_mb = schedule.num_microbatches
    node = np.full(schedule.num_stages * len(KINDS) * num_mb + 1, -1, dtype=np.int64)
    none = len(node) - 1  # node[none] = -1: "no predecessor"
    node[(stage * len(KINDS) + kind) * num_mb + mb] = np.arange(n)

    def find(s: np.ndarray, k: int, where: np.ndarray) -> np.ndarray:
        """Per action where `where` holds: the node of (s, k, its micro-batch); -1 elsewhere or if none."""
        return node[np.where(where, (s * len(KINDS) + k) * num_mb + mb, none)]

    f, b, i, w = (KIND_CODE[k] for k in ("F", "B", "I", "W"))
    is_f, is_w, is_back = kind == f, kind == w, (kind == b) | (kind == i)
    up = is_back & (stage < schedule.num_stages - 1)
    up_b, up_i = find(stage + 1, b, up), find(stage + 1, i, up)
    pipe = np.where(is_f, find(stage - 1, f, is_f & (stage > 0)), np.where(up_b >= 0, up_b, up_i))
    same = np.where(is_back, find(stage, f, is_back), find(stage, i, is_w))
    on_rank = np.asarray(schedule.stage_to_rank, dtype=np.int64)
    p2p = profile.p2p_ms
    crosses = (pipe >= 0) & (on_rank[stage[np.maximum(pipe, 0)]] != on_rank[stage])
    sizes = np.array([len(rank_actions) for rank_actions in schedule.order], dtype=np.int64)
    prev_rank = np.arange(n) - 1  # each rank's first action has none, the others the one before
    prev_rank[(np.cumsum(sizes) - sizes)[sizes > 0]] = -1

    # The float lists index a few shared floats (per stage and kind; 0 or p2p), as the per-action loop did:
    # ndarray.tolist() made a float object per action (three lists: the million-action command's peak rose from
    # 1441 to 1511-1519 MiB).
    dispatch = profile.dispatch_ms
    by_kind = [(hi + dispatch, lo + dispatch) for c in costs for hi, lo in (_costs(c, k) for k in KINDS)]
    cells = (stage * len(KINDS) + kind).tolist()  # index into by_kind
    tails = [0.0] * schedule.num_ranks
    for s, cost in enumerate(costs):
        tails[schedule.stage_to_rank[s]] += cost.tail_ms
    dag = Dag(
        schedule=schedule,
        actions=actions,
        rank=np.repeat(np.arange(len(sizes)), sizes).tolist(),
        preds=(prev_rank.tolist(), pipe.tolist(), same.tolist()),
        lags=([0.0] * n, list(map([0.0, p2p].__getitem__, crosses.tolist())), [0.0] * n),
        d_max=list(map([hi for hi, _ in by_kind].__getitem__, cells)),
        d_min=list(map([lo for _, lo in by_kind].__getitem__, cells)),
        freezable=np.isin(kind, [KIND_CODE[k] for k in FREEZABLE]).tolist(),
        topo=[],
        stage_costs=tuple(costs),
        p2p_ms=p2p,
        dispatch_ms=dispatch,
        tail_ms=tuple(tails),
        step_overhead_ms=profile.step_overhead_ms,
    )
    dag.memo["action arrays"] = (stage, kind, mb)
    dag.topo = _topological_order(dag)
    return dag


def _action_arrays(actions: Sequence[Action]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stage, KIND_CODE of the kind, micro-batch) per action, as (n,) int64 arrays."""
    n = len(actions)  # generator expressions: several times faster than zip(*actions) at a million actions
    return (np.fromiter((a[0] for a in actions), np.int64, n),
            np.fromiter((KIND_CODE[a[1]] for a in actions), np.int64, n),
            np.fromiter((a[2] for a in actions), np.int64, n))


def _topological_order(dag: Dag) -> list[int]:
    """The ranks' lists merged: each rank runs down its list until an action waits for another rank's action
    not yet placed, and resumes when that one is placed. Nodes are numbered rank by rank (build), so the rank
    chain (slot 0) needs no check. Linear, with no successor lists to build; a node left over means a deadlock.
    """
    n = dag.num_nodes
    _, p1, p2 = dag.preds
    bounds = dag.rank_bounds()
    nxt = [lo for lo, _ in bounds]
    placed = bytearray(n + 1)
    placed[n] = 1  # placed[-1]: a missing predecessor (-1) counts as placed
    waiting: dict[int, list[int]] = {}  # node -> ranks whose next action waits for it
    order: list[int] = []
    ready = list(range(len(bounds)))
    while ready:
        r = ready.pop()
        i, end = nxt[r], bounds[r][1]
        while i < end:
            u = p1[i] if not placed[p1[i]] else p2[i] if not placed[p2[i]] else -1
            if u >= 0:
                waiting.setdefault(u, []).append(r)
                break
            placed[i] = 1
            order.append(i)
            woken = waiting.pop(i, None)
            if woken is not None:
                ready.extend(woken)
            i += 1
        nxt[r] = i
    if len(order) < n:
        _report_cycle(dag, [v for v in range(n) if not placed[v]])
    return order


def _report_cycle(dag: Dag, stuck: list[int]) -> None:
    import networkx as nx  # here and in to_networkx only: importing it costs a third of a second per command

    graph = nx.DiGraph()
    stuck_set = set(stuck)
    for u, v, _, kind in dag.edges():
        if u in stuck_set and v in stuck_set:
            graph.add_edge(u, v, kind=kind)
    cycle = nx.find_cycle(graph)
    names = [f"{dag.actions[v]} (rank {dag.rank[v]})" for v, _ in cycle]
    chain = " -> ".join(names + [names[0]])
    raise TfplanError(
        f"schedule deadlocks: {len(stuck)} actions can never start; cycle (each waits for the previous): {chain}"
    )


def to_networkx(dag: Dag):
    """The DAG as networkx.DiGraph with START and FINISH.

    Node attributes: action (str), rank, stage, kind, mb, d_min_ms, d_max_ms, freezable.
    Edge attributes: lag_ms, kinds (tuple of EDGE_KINDS; one pair can be linked by two kinds).
    """
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_node("START", d_min_ms=0.0, d_max_ms=0.0, freezable=False)
    graph.add_node("FINISH", d_min_ms=0.0, d_max_ms=0.0, freezable=False)
    for i, a in enumerate(dag.actions):
        graph.add_node(
            i,
            action=str(a),
            rank=dag.rank[i],
            stage=a.stage,
            kind=a.kind,
            mb=a.mb,
            d_min_ms=dag.d_min[i],
            d_max_ms=dag.d_max[i],
            freezable=dag.freezable[i],
        )
    for u, v, lag, kind in dag.edges():
        if graph.has_edge(u, v):
            data = graph.edges[u, v]
            data["lag_ms"] = max(data["lag_ms"], lag)
            data["kinds"] = data["kinds"] + (kind,)
        else:
            graph.add_edge(u, v, lag_ms=lag, kinds=(kind,))
    for i in range(dag.num_nodes):
        if graph.in_degree(i) == 0:
            graph.add_edge("START", i, lag_ms=0.0, kinds=("start",))
        if graph.out_degree(i) == 0:
            graph.add_edge(i, "FINISH", lag_ms=0.0, kinds=("finish",))
    return graph
