"""tfrun.cli.setup: defaults that depend on the plan are resolved once it is read."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conftest import torch_or_skip

torch_or_skip()
from tfrun.cli import setup  # noqa: E402


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A plan solved for goodput and one solved for makespan, 2 ranks x 4 micro-batches."""
    from tfplan.cost import goodput, profile
    from tfplan.plan import job, plan
    from tfplan.schedule import schedules

    root = tmp_path_factory.mktemp("plans")
    sched = schedules.generate("1f1b", 2, 4)
    noisy = replace(profile.uniform(2), noise=goodput.measured([20.0, 20.0], [0.5, 0.5], 64, [0.5, 0.5]))
    plan.write(job.solve_schedule(sched, noisy, 0.9, objective="goodput"), root / "goodput.json")
    plan.write(job.solve_schedule(sched, profile.uniform(2), 0.9), root / "makespan.json")
    return root


@pytest.mark.parametrize(("seed", "objective", "given", "expected"), [
    ("goodput", "goodput", None, 0),  # the goodput seed plan runs from the first step (Note [goodput start])
    ("makespan", "goodput", None, 5),  # it names the schedule only: the run measures after a warm-up
    ("goodput", "makespan", None, 5),
    ("goodput", "goodput", 3, 3),  # a value given is kept
    (None, "goodput", None, 5),
])
def test_the_warmup_default_follows_the_seed_plan(plans, tmp_path, seed, objective, given, expected):
    where = {"schedule": "1f1b", "ranks": 2, "microbatches": 4} if seed is None else {"force": True}
    config = setup.train_config(plan_path=None if seed is None else str(plans / f"{seed}.json"), global_batch=None,
                                microbatch_size=2, freeze="timely", objective=objective, warmup_steps=given,
                                out_dir=str(tmp_path / "out"), seq_len=32, **where)
    assert config.warmup_steps == expected
