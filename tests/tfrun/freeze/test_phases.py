"""tfrun.freeze.phases: where the online mode's phases start, which steps measure the noise scale and which make the
first plan's profile, and which seed plans start a run."""

from __future__ import annotations

import pytest

from tests.conftest import torch_or_skip


def test_phases_follow_the_options_and_a_seed_plan_skips_measuring():
    pytest.importorskip("torch")
    from tfrun.config.train_config import TrainConfig
    from tfrun.freeze.phases import phase_bounds

    base = dict(order=[["0F0", "0B0"], ["1F0", "1B0"]], num_stages=2, num_microbatches=1, stage_to_rank=[0, 1],
                freeze="timely", warmup_steps=3, monitor_steps=5, probe_steps=2, ramp_steps=4)
    assert phase_bounds(TrainConfig(**base)) == [("warmup", 0, 3), ("monitor", 3, 8), ("probe", 8, 10),
                                                 ("ramp", 10, 14), ("stable", 14, None)]
    seeded = TrainConfig(**base, plan_path="plan.json")
    assert phase_bounds(seeded) == [("warmup", 0, 3), ("ramp", 3, 7), ("stable", 7, None)]
    # Note [goodput start]: under goodput a seed plan solved for makespan names the schedule only
    assert phase_bounds(seeded, seeded=False) == phase_bounds(TrainConfig(**base))


def test_under_goodput_the_monitor_measures_every_other_step_and_the_profile_takes_the_others():
    pytest.importorskip("torch")
    from tfrun.config.train_config import TrainConfig
    from tfrun.freeze.phases import forces_noise, phase_bounds, profiled_steps

    base = dict(order=[["0F0", "0B0"], ["1F0", "1B0"]], num_stages=2, num_microbatches=1, stage_to_rank=[0, 1],
                freeze="timely", warmup_steps=3, monitor_steps=6, probe_steps=3, noise_every=5)
    goodput, makespan = TrainConfig(**base, objective="goodput"), TrainConfig(**base)
    bounds = phase_bounds(goodput)
    assert bounds[1:3] == [("monitor", 3, 9), ("probe", 9, 12)]
    assert [s for s in range(14) if forces_noise(goodput, bounds, s)] == [3, 5, 7]
    assert not any(forces_noise(makespan, bounds, s) for s in range(14))
    # Note [hook-free profile]: 3, 5, 7 (forced) and 5, 10 (--noise-every 5) measured; the others are the profile's
    assert profiled_steps(goodput, bounds, 3, 9, 2) == {4, 6, 8}
    assert profiled_steps(goodput, bounds, 9, 12, 1) == {9, 11}
    assert profiled_steps(goodput, bounds, 3, 9, 4) == set(range(3, 9))  # too few left: all (hooks alike)
    assert profiled_steps(makespan, bounds, 3, 9, 2) == set(range(3, 9))  # the makespan mode as before
    every_step = TrainConfig(**(base | {"noise_every": 1}), objective="goodput")
    assert profiled_steps(every_step, bounds, 3, 9, 2) == set(range(3, 9))


def test_under_goodput_only_a_seed_solved_for_goodput_starts_the_run():
    torch_or_skip()
    from dataclasses import replace

    from tfplan.cost import goodput, profile
    from tfplan.plan import job
    from tfplan.schedule import schedules
    from tfrun.config.train_config import TrainConfig
    from tfrun.freeze.phases import seed_starts

    noisy = replace(profile.uniform(2), noise=goodput.measured([20.0, 20.0], [0.5, 0.5], 64, [0.5, 0.5]))
    sched = schedules.generate("1f1b", 2, 4)
    makespan, for_goodput = (job.solve_schedule(sched, noisy, 0.9, objective=o) for o in ("makespan", "goodput"))
    base = dict(order=[["0F0", "0B0"], ["1F0", "1B0"]], num_stages=2, num_microbatches=1, stage_to_rank=[0, 1],
                freeze="timely")
    assert seed_starts(makespan, TrainConfig(**base)) and seed_starts(for_goodput, TrainConfig(**base))
    assert not seed_starts(makespan, TrainConfig(**base, objective="goodput"))
    assert seed_starts(for_goodput, TrainConfig(**base, objective="goodput"))
