"""Fixtures of the plan tests: the toy heterogeneous plan, and its object as version 3 and version 2 write it."""

from __future__ import annotations

import json

import pytest

from tests.tfplan.plan.toy_plans import _as_version_2, _plan
from tfplan.plan import plan as plan_mod


@pytest.fixture(scope="module")
def hetero_plan() -> plan_mod.Plan:
    return _plan()


@pytest.fixture
def plan_obj(hetero_plan) -> dict:
    return json.loads(json.dumps(plan_mod.to_dict(hetero_plan)))


@pytest.fixture
def plan_obj_v2(plan_obj) -> dict:
    return _as_version_2(plan_obj)
