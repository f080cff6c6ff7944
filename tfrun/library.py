"""The freezer as a library: TimelyFreeze's per-(stage, micro-batch) freezing and per-action timing on your own
`PipelineStage`s and torch schedule, in the training loop you already have (docs/library.md).

    stage = PipelineStage(my_stage_module, stage_index, num_stages, device)      # built your way
    hooks = FreezeHooks.from_plan("plan.json", [stage], schedule_class="ScheduleGPipe", num_microbatches=8)
    schedule = ScheduleGPipe(stage, 8, loss_fn=hooks.timed_loss(loss_fn))       # your schedule, as usual
    for step in range(steps):
        with hooks.step(step):
            schedule.step(x, target=y)                                           # as usual
        optimizer.step(); optimizer.zero_grad()

`FreezeHooks` installs tfrun.distributed.runtime's overrides on each stage (tfrun.distributed.runtime.install_hooks: the
stage's class becomes a subclass of its own), so every torch schedule that calls the stage's per-chunk methods (all of
them) runs the plan: in micro-batch j of stage s, the tensors the freezer selects for that action (a share of
the stage's weight-gradient work equal to the plan's ratio, tfrun.freeze.freezing) get no gradient from it. A plan
that freezes nothing leaves every gradient bit for bit as without the hooks (examples/own_pipeline.py, tested).

`measured_profile` turns the hooks' timings of unfrozen and fully frozen steps, and your loop's step times, into
a tfplan profile (tfrun's one profile builder), so `tfplan solve` can plan a model that is not tfrun's. The
online controller (tfrun.freeze.online) is not offered here.

`clip_grad_norm(params, max_norm, group)` clips the gradient of a model split over the pipeline's ranks to a
global L2 norm, as `tfrun train --clip-grad-norm` does (tfrun.optim.clipping Note [global clipping]).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from tfrun.distributed.runtime import DETACH, StepState, install_hooks
from tfrun.errors import TfrunError
from tfrun.freeze.candidates import candidates
from tfrun.freeze.freezing import AUTO, Freezer
from tfrun.measure.timing import ActionTimer, gather_records
from tfrun.optim.clipping import clip_grad_norm  # noqa: F401 - part of the library API (docs/library.md)


class FreezeHooks:
    """Freezing and timing hooks on one process's pipeline stages.

    Args:
        stages: this process's PipelineStage objects (any subclass), before the schedule is built on them.
        num_microbatches: micro-batches per step of the schedule.
        ratios: (stage index, micro-batch) -> freeze ratio in [0, 1] of that micro-batch's backward; absent = 0.
        seed: freeze-selection seed (the same on every process).
        policy: which tensors an action freezes (tfrun.freeze.freezing Note [freeze policy]).
        method: "detach" or "grad" (tfrun.distributed.runtime Note [freeze methods]).
        redraw_every: steps per window of frozen sets (tfrun.freeze.freezing).
        autocast: a compute dtype for the forwards (tfrun.distributed.runtime Note [autocast]), e.g. torch.bfloat16.
    """

    def __init__(self, stages: Sequence, *, num_microbatches: int,
                 ratios: Mapping[tuple[int, int], float] | None = None, seed: int = 0, policy: str = AUTO,
                 method: str = DETACH, redraw_every: int = 10, autocast: torch.dtype | None = None) -> None:
        if not stages:
            raise TfrunError("FreezeHooks needs at least one PipelineStage")
        ratios = dict(ratios or {})
        for (s, mb), r in ratios.items():
            if not 0.0 <= r <= 1.0 or not 0 <= mb < num_microbatches:
                raise TfrunError(f"ratios[({s}, {mb})]: need a ratio in [0, 1] and a micro-batch < {num_microbatches}")
        self.stages = list(stages)
        self.num_microbatches = num_microbatches
        local = {st.stage_index: st.submod for st in self.stages}
        self.freezer = Freezer({s: candidates(m) for s, m in local.items()},
                               {k: r for k, r in ratios.items() if k[0] in local}, num_microbatches=num_microbatches,
                               seed=seed, redraw_every=redraw_every, policy=policy)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.timer = ActionTimer(rank, self.stages[0].device)
        self.state = StepState(freezing=True)
        for st in self.stages:
            install_hooks(st, freezer=self.freezer, timer=self.timer, state=self.state, method=method,
                          autocast=autocast)

    @classmethod
    def from_plan(cls, plan: str | Path, stages: Sequence, *, num_microbatches: int,
                  schedule_class: str | None = None, **kwargs) -> FreezeHooks:
        """Hooks that apply a `tfplan solve` plan. The plan must be for this split (stage count) and these
        micro-batches; `schedule_class` (e.g. "ScheduleGPipe"), when given, must be the plan's schedule's torch
        class, since the plan's ratios are solved for that order.

        Raises:
            TfrunError / TfplanError: an unreadable plan, or one for another pipeline.
        """
        from tfplan.plan import plan as plan_mod
        from tfplan.schedule import schedules

        p = plan_mod.load(plan)
        sched = p.schedule
        num_stages = stages[0].num_stages if stages else 0
        torch_class = schedules.get_spec(sched.name).torch_class if sched.name in schedules.SCHEDULES else None
        if sched.num_stages != num_stages or sched.num_microbatches != num_microbatches:
            raise TfrunError(f"{plan}: planned for {sched.num_stages} stages x {sched.num_microbatches} micro-batches, "
                             f"these stages are {num_stages} x {num_microbatches}")
        loop_class = (schedule_class or "").lower().removeprefix("schedule")
        if schedule_class is not None and torch_class is not None and torch_class.lower() != loop_class:
            raise TfrunError(f"{plan}: planned for torch's {torch_class} ({sched.name}), the loop runs "
                             f"{schedule_class}")
        ratios = {(a.stage, a.mb): r for a, r in zip(p.dag.actions, p.ratios) if r > 0}
        return cls(stages, num_microbatches=num_microbatches, ratios=ratios, **kwargs)

    @contextlib.contextmanager
    def step(self, step: int, *, timed: bool = True) -> Iterator[None]:
        """Wrap one `schedule.step(...)`: the freezer's selections for training step `step`, and its timing."""
        self.state.begin(step)
        self.timer.enabled = timed
        self.timer.begin_step(step)
        yield
        self.timer.end_step()
        self.freezer.end_step(step, self.state.frozen_counts)

    def timed_loss(self, loss_fn: Callable) -> Callable:
        """loss_fn, its time counted in the last stage's forward (as tfrun does; tfrun.measure.timing.extend_last)."""
        return lambda output, target: self.timer.extend_last(loss_fn, output, target)

    def set_ratios(self, ratios: Mapping[tuple[int, int], float], start_step: int) -> None:
        """Apply other ratios from `start_step` on (e.g. everything at 1.0 to time frozen backwards)."""
        local = {st.stage_index for st in self.stages}
        self.freezer.set_plan({k: r for k, r in ratios.items() if k[0] in local}, start_step, 0)

    @property
    def frozen_shares(self) -> dict[tuple[int, int], float]:
        """(stage, micro-batch) -> the share of its weight-gradient work frozen in the last step."""
        return dict(self.state.shares)

    def state_dict(self) -> dict:
        """The freezer's state (the plan in force, statistics), for your checkpoints."""
        return self.freezer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.freezer.load_state_dict(state)


def measured_profile(hooks: FreezeHooks, *, unfrozen_steps: range, frozen_steps: range, step_ms: Mapping[int, float],
                     schedule: str, name: str, source: Mapping | None = None):
    """A tfplan profile from the hooks' timings, on rank 0 (None elsewhere; every process calls it): F, B (or I
    and W) from `unfrozen_steps` (nothing frozen) and their frozen times from `frozen_steps` (everything frozen:
    set_ratios(1.0)), medians over every micro-batch; and from the unfrozen steps the executor's dispatch cost,
    the p2p lag and the step overhead (your loop's measured step, `step_ms`: step -> ms of the whole step as
    you time it, optimizer included, against the replay of the measured actions on `schedule`, the tfplan name
    of your torch schedule). The one profile builder of tfrun (tfrun.measure.profile.measured_profile, Note [step
    overhead]), so `tfplan solve` predicts your loop's step, not only its compute.
    """
    from tfplan.schedule import schedules
    from tfrun.config.train_config import TrainConfig
    from tfrun.measure import profile as measure

    records = gather_records(hooks.timer.records)
    times = [step_ms[s] for s in unfrozen_steps if s in step_ms]
    if records is None:
        return None
    if not times:
        raise TfrunError("measured_profile: step_ms has none of the unfrozen steps")
    num_stages = hooks.stages[0].num_stages
    spec = schedules.get_spec(schedule)
    sched = schedules.generate(spec.name, num_stages // spec.default_stages_per_rank, hooks.num_microbatches)
    config = TrainConfig(order=[[str(a) for a in row] for row in sched.order], num_stages=sched.num_stages,
                         num_microbatches=hooks.num_microbatches, stage_to_rank=list(sched.stage_to_rank),
                         schedule_name=sched.name, model=name, freeze="none")
    kept = [r for r in records if r.step in unfrozen_steps or r.step in frozen_steps]
    prof = measure.measured_profile(
        config, kept, [], statistics.median(times), name, {},
        share_of=lambda r: 1.0 if r.step in frozen_steps else 0.0,
        replay_records=[r for r in kept if r.step in unfrozen_steps])
    # the loop's own shape and provenance, not a TrainConfig's defaults
    src = {k: v for k, v in prof.source.items() if k not in ("microbatch_size", "seq_len", "model", "freeze")}
    return replace(prof, source=src | {"tool": "tfrun.library", **(source or {})})
