"""The online mode's phases (`tfrun train --freeze timely`, tfrun.freeze.online): where each starts, which steps
measure the gradient noise scale whatever --noise-every says, which steps' action times make the first plan's
profile, and whether a seed plan (--plan) is put in force.

Note [goodput start]: the goodput mode starts its stable phase from the goodput plan of its own probe (the fixed
method that won in docs/results.md: a plan solved once for goodput on a profile and noise measured at the start),
with no ramp (--ramp-steps defaults to 0 under goodput). A seed plan (--plan) solved for goodput is such a plan
already: it is in force from the end of the warm-up (by default none, below) and its noise section is the
controller's first reference. A seed plan solved for makespan describes another objective, and often a profile of
another day (its first check re-planned in every run of the third study): under goodput it names the schedule only,
and the run measures (monitor, probe) as it does without one.
A goodput seed plan is in force from the first step: under goodput with a seed plan solved for goodput, --warmup-steps
defaults to 0 (tfrun.cli.setup.warmup_steps), as the fixed plan runs. With the old default of 5 unfrozen steps
first, the seeded run learned far less than the same plan run fixed (benchmarks/accuracy_vs_speed.py, large batch
from scratch, seeds 0-2, clock-free efficiency: 0.714 / 0.543 / 0.667 against the fixed plan's 0.857 / 0.757 /
0.863), though it then froze less; with the warm-up at 0 and all else the same, 0.806 / 0.728 / 0.829; with
measurement and re-plans off as well, the fixed plan's run bit for bit (docs/results.md, "The online mode seeded by
the fixed goodput plan"). Neither the auto freeze policy (0.554 / 0.458 / 0.639) nor --grad-rescale (0.700 / 0.756
/ 0.651) undid the warm-up's cost. Chosen on those three cells; held out, crossing and fine-tuning (seeds 0-2, warm-up
5 -> 0): 0.838 -> 1.008, 0.870 -> 0.793, 0.646 -> 0.878 and 0.613 -> 0.639, 0.677 -> 0.670, 0.610 -> 0.618, better
at four of six cells.

Note [hook-free profile]: a step that measures the noise scale runs the meter's hooks and its per-sequence norms
alongside the backward, and is slower: in a 60-step run of the tiny model (2 ranks, 1F1B, M = 8, beside another job
on the 2 cores) the monitor's 9 steps that measured took 1,310 ms (median) and its 6 others 1,041 ms (+26%;
docs/cost-model.md, "Which noise estimator", has +12-15% on a quiet machine). Under goodput the first plan's profile
leaves such steps of the monitor and the probe out, as the drift checks do (tfrun.freeze.controller Note [unfrozen
measurement]): a profile made of them priced the unfrozen backward too high, which makes freezing look cheaper than
it is, and the first drift check then re-planned on the hooks alone ("drift: stage 0 B x0.79" on the tiny model). So
the monitor measures the noise on every other step (8 of the default 15, with the --noise-every steps that fall in
it: a full window of 8), and times the pipeline on the others. Where fewer than two monitor steps (or no probe step)
are left, as under --noise-every 1, every step pays the hooks alike and all are kept.
"""

from __future__ import annotations

from tfplan.plan import plan as plan_mod
from tfrun.config.train_config import TrainConfig


def phase_bounds(config: TrainConfig, seeded: bool | None = None) -> list[tuple[str, int, int | None]]:
    """(name, first step, end step exclusive or None) of each phase, in order; `seeded`: whether a seed plan skips
    monitor and probe (default: whether there is one; Note [goodput start])."""
    seeded = config.plan_path is not None if seeded is None else seeded
    lengths = [("warmup", config.warmup_steps), ("monitor", 0 if seeded else config.monitor_steps),
               ("probe", 0 if seeded else config.probe_steps), ("ramp", config.ramp_steps)]
    out, step = [], 0
    for name, n in lengths:
        if n:
            out.append((name, step, step + n))
            step += n
    out.append(("stable", step, None))
    return out


def forces_noise(config: TrainConfig, bounds: list[tuple[str, int, int | None]], step: int) -> bool:
    """Whether `step` must measure the noise scale whatever --noise-every says: every other monitor step under
    goodput, from its first (tfrun.freeze.online Note [online goodput]; the others time the pipeline: Note [hook-free
    profile])."""
    monitor = next(((lo, hi) for name, lo, hi in bounds if name == "monitor"), None)
    return (config.freeze == "timely" and config.objective == "goodput" and monitor is not None
            and monitor[0] <= step < monitor[1] and (step - monitor[0]) % 2 == 0)


def profiled_steps(config: TrainConfig, bounds: list[tuple[str, int, int | None]], lo: int, hi: int,
                   least: int) -> set[int]:
    """The steps of lo..hi-1 whose action times go into the first plan's profile (Note [hook-free profile]): under
    goodput those that did not measure the noise scale (NoiseMeter.begin_step's rule), unless fewer than `least` are
    left; else all.

    >>> from tfrun.config.train_config import TrainConfig
    >>> c = TrainConfig(order=[["0F0", "0B0"], ["1F0", "1B0"]], num_stages=2, num_microbatches=1,
    ...                 stage_to_rank=[0, 1], freeze="timely", objective="goodput", noise_every=10)
    >>> bounds = phase_bounds(c)
    >>> bounds[1:3], sorted(profiled_steps(c, bounds, 5, 20, 2)), sorted(profiled_steps(c, bounds, 20, 25, 1))
    ([('monitor', 5, 20), ('probe', 20, 25)], [6, 8, 12, 14, 16, 18], [21, 22, 23, 24])
    """
    every = config.noise_every
    unhooked = {s for s in range(lo, hi) if not (forces_noise(config, bounds, s) or (every > 0 and s % every == 0))}
    return unhooked if config.objective == "goodput" and len(unhooked) >= least else set(range(lo, hi))


def solved_for_goodput(plan: plan_mod.Plan) -> bool:
    """Whether `plan` was solved for goodput (tfplan solve --objective goodput): under goodput it is put in force as
    the seed plan, from the first step by default (Note [goodput start])."""
    return plan.goodput is not None and plan.goodput.objective == "goodput"


def seed_starts(seed: plan_mod.Plan, config: TrainConfig) -> bool:
    """Whether a seed plan is put in force (else, under goodput, it names the schedule only: Note [goodput start])."""
    return config.objective != "goodput" or solved_for_goodput(seed)
