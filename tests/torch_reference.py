"""Ground truth from torch 2.13: what its schedule classes plan and what GPipe/1F1B execute.

Uses mocked PipelineStages (no process group): multi-stage classes give `pipeline_order`; for the
single-stage classes we run torch's own `_step_microbatches` with the stage's compute calls recorded,
because Schedule1F1B.pipeline_order misnumbers the last rank's forwards.
"""

from __future__ import annotations

from unittest import mock


def _mock_stage(rank: int, num_ranks: int, num_stages: int):
    from torch.distributed.pipelining.stage import PipelineStage

    # spec, not autospec: isinstance and attribute names are what torch's schedules check, and create_autospec
    # costs about 35 ms a stage (the schedule grid of tests/tfplan/schedule/test_schedules.py builds thousands)
    stage = mock.MagicMock(spec=PipelineStage)
    stage.group_rank, stage.group_size, stage.num_stages = rank, num_ranks, num_stages
    stage.stage_index, stage.submod = rank, None
    stage.is_first, stage.is_last = rank == 0, rank == num_stages - 1
    for name in ("get_fwd_recv_ops", "get_fwd_send_ops", "get_bwd_recv_ops", "get_bwd_send_ops"):
        getattr(stage, name).return_value = []
    return stage


def torch_order(torch_class: str, num_ranks: int, stages_per_rank: int, num_microbatches: int) -> list[list[str]]:
    """Per-rank compute actions torch runs, as strings (overlapped pairs expanded in order)."""
    from torch.distributed.pipelining import schedules as ts

    cls = ts.get_schedule_class(torch_class)
    m = num_microbatches
    if issubclass(cls, ts.PipelineScheduleSingle):
        return [_executed_single(cls, r, num_ranks, m) for r in range(num_ranks)]
    stage = _mock_stage(0, num_ranks, num_ranks * stages_per_rank)
    schedule = cls([stage] * stages_per_rank, m)
    order = []
    for r in range(num_ranks):
        actions = []
        for a in schedule.pipeline_order[r]:
            if a is None:
                continue
            for sub in a.sub_actions or (a,):
                actions.append(f"{sub.stage_index}{sub.computation_type.value}{sub.microbatch_index}")
        order.append(actions)
    return order


def _executed_single(cls, rank: int, num_ranks: int, m: int) -> list[str]:
    stage = _mock_stage(rank, num_ranks, num_ranks)
    log: list[str] = []
    stage.forward_one_chunk.side_effect = lambda i, *a, **k: log.append(f"{rank}F{i}")
    stage.backward_one_chunk.side_effect = lambda i, *a, **k: log.append(f"{rank}B{i}")
    schedule = cls(stage, m)
    patches = [
        mock.patch.object(schedule, "_check_inputs", return_value=([()] * m, [{}] * m)),
        *(
            mock.patch.object(schedule, name)
            for name in ("_initialize_stage", "_maybe_compute_loss", "_maybe_get_loss", "_update_losses")
        ),
    ]
    for p in patches:
        p.start()
    try:
        schedule._step_microbatches([()] * m, [{}] * m)
    finally:
        for p in patches:
            p.stop()
    return log


def load_csv_in_torch(path: str, num_ranks: int, num_stages: int, num_microbatches: int) -> list[list[str]]:
    """Load a compute-only CSV into torch's _PipelineScheduleRuntime (lowering and validation included)
    and return its compute order."""
    from torch.distributed.pipelining import schedules as ts

    stages = [_mock_stage(0, num_ranks, num_stages) for _ in range(num_stages // num_ranks)]
    runtime = ts._PipelineScheduleRuntime(stages, num_microbatches)
    runtime._load_csv(path, format="compute_only")
    return [
        [str(a) for a in runtime.pipeline_order[r] if a is not None and a.computation_type.value in "FBIW"]
        for r in range(num_ranks)
    ]
