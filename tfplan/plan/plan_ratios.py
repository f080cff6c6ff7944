"""The freeze ratios of a plan file: the stage x micro-batch table that version 3 writes, and the per-action
list of versions 1-2, each read back to one ratio per DAG node with errors naming the field (tfplan.plan.plan
Note [compact plan]).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from tfplan.errors import TfplanError
from tfplan.step.dag import Dag


def ratio_table(dag: Dag, ratios: Sequence[float]) -> list[list[float]]:
    """Stage x micro-batch table of the ratios of the actions freezing can shorten (B and W; Note [compact
    plan]); every other action's ratio is 0 in every valid plan.

    >>> from tfplan import dag as dag_mod, profile, schedules
    >>> dag = dag_mod.build(schedules.generate("1f1b", 2, 2), profile.uniform(2))
    >>> [str(a) for a in dag.actions]
    ['0F0', '0F1', '0B0', '0B1', '1F0', '1B0', '1F1', '1B1']
    >>> ratio_table(dag, [0.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.0, 0.0])
    [[0.5, 0.25], [1.0, 0.0]]
    """
    table = [[0.0] * dag.schedule.num_microbatches for _ in range(dag.schedule.num_stages)]
    for a, r, f in zip(dag.actions, ratios, dag.freezable):
        if f:
            table[a.stage][a.mb] = r
    return table


def require(obj: Any, key: str, kind: type | tuple[type, ...], path: str) -> Any:
    """obj[key], which must exist and be of `kind` (a bool is not a number); else one error naming path + key."""
    if not isinstance(obj, dict) or key not in obj:
        raise TfplanError(f"{path}{key}: missing required field")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise TfplanError(f"{path}{key}: wrong type {type(value).__name__}")
    return value


def ratios_v3(obj: dict[str, Any], dag: Dag) -> tuple[float, ...]:
    """Per node, from a version-3 plan's stage x micro-batch table `freeze_ratio` (Note [compact plan])."""
    table = require(obj, "freeze_ratio", list, "")
    sched = dag.schedule
    if len(table) != sched.num_stages:
        raise TfplanError(f"freeze_ratio: must have one row per stage ({sched.num_stages}), got {len(table)}")
    for s, row in enumerate(table):
        if not isinstance(row, list) or len(row) != sched.num_microbatches:
            raise TfplanError(f"freeze_ratio[{s}]: must list one ratio per micro-batch ({sched.num_microbatches})")
        for m, r in enumerate(row):
            if isinstance(r, bool) or not isinstance(r, (int, float)):
                raise TfplanError(f"freeze_ratio[{s}][{m}]: must be a number, got {json.dumps(r)}")
            if not (math.isfinite(r) and 0.0 <= r <= 1.0):
                raise TfplanError(f"freeze_ratio[{s}][{m}]: must be in [0, 1], got {r}")
    ratios = [0.0] * dag.num_nodes
    for v, (a, can_freeze, f) in enumerate(zip(dag.actions, dag.freeze_mask(), dag.freezable)):
        if f:
            r = float(table[a.stage][a.mb])
            if r > 0 and not can_freeze:
                raise TfplanError(f"freeze_ratio[{a.stage}][{a.mb}]: {a} has freeze_ratio {r:g}, but freezing "
                                  "cannot shorten it")
            ratios[v] = r
    return tuple(ratios)


def ratios_v2(obj: dict[str, Any], dag: Dag) -> tuple[float, ...]:
    """Per node, from a version-1 or -2 plan's list `actions` of {action, freeze_ratio, ...} objects."""
    actions = require(obj, "actions", list, "")
    ratio_of: dict[str, float] = {}
    for i, item in enumerate(actions):
        name = require(item, "action", str, f"actions[{i}].")
        ratio = require(item, "freeze_ratio", (int, float), f"actions[{i}].")
        if not (math.isfinite(ratio) and 0.0 <= ratio <= 1.0):
            raise TfplanError(f"actions[{i}].freeze_ratio: must be in [0, 1], got {ratio}")
        if name in ratio_of:
            raise TfplanError(f"actions[{i}].action: {name} listed twice")
        ratio_of[name] = float(ratio)
    names = [str(a) for a in dag.actions]
    missing = [n for n in names if n not in ratio_of]
    if missing or len(ratio_of) != len(names):
        extra = sorted(set(ratio_of) - set(names))
        raise TfplanError(f"actions: must list every scheduled action once (missing {missing[:3]}, extra {extra[:3]})")
    for n, can_freeze in zip(names, dag.freeze_mask()):
        if ratio_of[n] > 0 and not can_freeze:
            raise TfplanError(f"actions: {n} has freeze_ratio {ratio_of[n]:g}, but freezing cannot shorten it")
    return tuple(ratio_of[n] for n in names)
