"""tfrun.library: the runnable example (examples/own_pipeline.py, an nn.Sequential MLP that is not a tfrun model,
under torch's ScheduleGPipe on 2 gloo ranks) gets the same gradients with the hooks and a plan that freezes
nothing as without them, and a plan that freezes stage 1 leaves its gradients out; plans for another pipeline
are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["gradients_equal_without_hooks"] and r["plan_applied"] for r in reports), reports


def test_a_plan_for_another_pipeline_is_refused(tmp_path):
    torch_or_skip()
    from tests.test_train import _plan
    from tfrun.errors import TfrunError
    from tfrun.library import FreezeHooks

    plan = _plan(tmp_path, "1f1b", 2, 4)
    stage = SimpleNamespace(num_stages=2)
    with pytest.raises(TfrunError, match="planned for 2 stages x 4 micro-batches, these stages are 2 x 8"):
        FreezeHooks.from_plan(plan, [stage], num_microbatches=8)
    with pytest.raises(TfrunError, match="planned for torch.s 1F1B \\(1f1b\\), the loop runs ScheduleGPipe"):
        FreezeHooks.from_plan(plan, [stage], num_microbatches=4, schedule_class="ScheduleGPipe")
