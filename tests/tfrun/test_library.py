"""tfrun.library: the runnable example (examples/own_pipeline.py, an nn.Sequential MLP that is not a tfrun model,
under torch's ScheduleGPipe on 2 gloo ranks) gets the same gradients with the hooks and a plan that freezes
nothing as without them, and a plan that freezes stage 1 leaves its gradients out; plans for another pipeline
are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, torch_or_skip


@pytest.mark.slow
def test_the_example_matches_the_plain_loop_on_two_ranks():
    torch_or_skip()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "own_pipeline.py"), "selftest", "--width", "64", "--depth", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    decoder, reports, text = json.JSONDecoder(), [], proc.stdout
    start = text.find("{")
    while start >= 0:  # every JSON object in the two ranks' shared output, however their lines interleave
        obj, end = decoder.raw_decode(text, start)
        reports.append(obj)
        start = text.find("{", end)
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["gradients_equal_without_hooks"] and r["plan_applied"] for r in reports), reports


def test_a_plan_for_another_pipeline_is_refused(tmp_path):
    torch_or_skip()
    from tests.tfrun.test_train import _plan
    from tfrun.errors import TfrunError
    from tfrun.library import FreezeHooks

    plan = _plan(tmp_path, "1f1b", 2, 4)
    stage = SimpleNamespace(num_stages=2)
    with pytest.raises(TfrunError, match="planned for 2 stages x 4 micro-batches, these stages are 2 x 8"):
        FreezeHooks.from_plan(plan, [stage], num_microbatches=8)
    with pytest.raises(TfrunError, match="planned for torch.s 1F1B \\(1f1b\\), the loop runs ScheduleGPipe"):
        FreezeHooks.from_plan(plan, [stage], num_microbatches=4, schedule_class="ScheduleGPipe")


def test_measured_profile_carries_the_loops_step_overhead(tmp_path):
    torch = torch_or_skip()
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from tfrun.library import FreezeHooks, measured_profile

    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'pg'}")
    try:
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        stage = PipelineStage(module, 0, 1, torch.device("cpu"))
        hooks = FreezeHooks([stage], num_microbatches=4)
        schedule = ScheduleGPipe(stage, 4, loss_fn=hooks.timed_loss(torch.nn.functional.cross_entropy))
        step_ms = {}
        for step in range(12):
            if step == 6:  # everything frozen from here: the frozen backward's time
                hooks.set_ratios({(0, mb): 1.0 for mb in range(4)}, 6)
            x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
            t0 = time.perf_counter()
            with hooks.step(step):
                schedule.step(x, target=y)
            time.sleep(0.02)  # the loop's own work outside the actions: 20 ms
            step_ms[step] = (time.perf_counter() - t0) * 1e3
        prof = measured_profile(hooks, unfrozen_steps=range(1, 6), frozen_steps=range(7, 12), step_ms=step_ms,
                                schedule="gpipe", name="mlp", source={"model": "test MLP"})
    finally:
        dist.destroy_process_group()
    s = prof.stages[0]
    assert s.forward_ms > 0 and s.backward_ms > 0 and s.backward_frozen_ms <= s.backward_ms
    # the 20 ms outside the actions, which the replay does not see (before the fix: 0); less a millisecond or
    # two when the replay of median action times comes out above the median step's actions (measured: 18.9 ms
    # under load)
    assert 15.0 <= prof.step_overhead_ms <= 60.0
    assert prof.source["tool"] == "tfrun.library" and prof.source["model"] == "test MLP"
    assert "seq_len" not in prof.source
