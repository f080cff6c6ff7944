"""The plans the plan tests share: a job on the toy profiles solved into a Plan (_plan), and a plan object
written back in its version-2 form (_as_version_2)."""

from __future__ import annotations

import copy
import json

from tests.conftest import PROFILES
from tfplan.plan import plan as plan_mod
from tfplan.plan.job import JobSpec, solve_job
from tfplan.step.simulate import simulate

HETERO = str(PROFILES / "toy-hetero-4.json")
UNIFORM = str(PROFILES / "toy-uniform-4.json")


def _plan(schedule: str = "1f1b", m: int = 8, caps=0.9, path: str = HETERO, **kw) -> plan_mod.Plan:
    return solve_job(JobSpec(profile_path=path, schedule=schedule, num_microbatches=m, **kw), caps)


def _as_version_2(obj: dict) -> dict:
    """A version-3 plan object as tfplan wrote it in version 2 (issue 9 to issue 23): one object per action
    with its name, rank, ratio, planned start and duration and both costs, instead of the ratio table."""
    plan = plan_mod.from_dict(obj)
    dag = plan.dag
    sim = simulate(dag, dag.durations(list(plan.ratios)))
    old = {k: v for k, v in copy.deepcopy(obj).items() if k != "freeze_ratio"} | {"schema_version": 2}
    old["actions"] = [
        {"action": str(a), "rank": dag.rank[v], "freeze_ratio": plan.ratios[v], "start_ms": sim.start_ms[v],
         "duration_ms": sim.end_ms[v] - sim.start_ms[v], "max_ms": dag.d_max[v], "min_ms": dag.d_min[v]}
        for v, a in enumerate(dag.actions)
    ]
    return json.loads(json.dumps(old))
