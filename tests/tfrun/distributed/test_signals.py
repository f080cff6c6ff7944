"""Graceful stops and per-step agreement (tfrun.distributed.signals): a first signal or OUT/STOP asks for a stop, a
duplicate within a second is the same request, a later second signal aborts; StepControl's checkpoint
triggers by steps, by minutes and on a stop; the resume command. One-rank gloo group; the multi-rank
behaviour is in tests/tfrun/test_train.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, torch_or_skip

torch = torch_or_skip()

from tfrun.config.train_config import TrainConfig  # noqa: E402
from tfrun.distributed.signals import DUPLICATE_S, StepControl, StopRequest, resume_command  # noqa: E402

CONFIG = TrainConfig(order=[["0F0", "0B0"]], num_stages=1, num_microbatches=1, stage_to_rank=[0], steps=10,
                     checkpoint_every=3, checkpoint_minutes=1.0)


def test_a_first_signal_or_the_stop_file_requests_a_stop(tmp_path) -> None:
    stop = StopRequest(tmp_path / "STOP")
    assert not stop.requested()
    (tmp_path / "STOP").touch()
    assert stop.requested() and stop.reason().endswith("STOP exists")
    stop = StopRequest()
    stop._handle(signal.SIGTERM, None)
    stop._handle(signal.SIGINT, None)  # within DUPLICATE_S: the same request (torchrun forwards a Ctrl-C)
    assert stop.requested() and stop.reason() == "SIGTERM"


def test_a_second_signal_later_aborts_at_once() -> None:
    code = textwrap.dedent(f"""
        import os, signal, time
        from tfrun.distributed.signals import StopRequest
        stop = StopRequest()
        stop.install()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        assert stop.requested()
        stop._first_at -= {DUPLICATE_S} + 1
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        print("still running")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 128 + signal.SIGINT and proc.stdout == ""
    assert proc.stderr.strip() == "aborted by a second SIGINT"


def test_checkpoints_by_steps_by_minutes_and_on_a_stop(single_rank_group) -> None:
    stop = StopRequest()
    control = StepControl(CONFIG, stop, torch.device("cpu"))
    saves = [step for step in range(7) if control.after_step(step, last=False)]
    assert saves == [2, 5] and not control.stopping
    control.last_save -= 61  # a minute passed on rank 0's clock
    assert control.after_step(6, last=False) and not control.after_step(7, last=False)
    stop._handle(signal.SIGTERM, None)
    assert control.after_step(7, last=False) and control.stopping
    control = StepControl(CONFIG, stop, torch.device("cpu"))
    assert control.after_step(9, last=True) and not control.stopping  # the last step just ends the run
    assert len(control.poll_ms) == 1 and control.poll_ms[0] >= 0


@pytest.mark.parametrize(("argv", "expected"), [
    (["tfrun", "train", "--plan", "p.json", "--out", "runs/a"], "tfrun train --plan p.json --resume runs/a"),
    (["x", "train", "--out=runs/a", "--steps", "9"], "tfrun train --steps 9 --resume runs/a"),
    (["x", "train", "--resume", "runs/a", "--lr", "0.1"], "tfrun train --lr 0.1 --resume runs/a"),
    (["x", "train", "--data", "my file.txt"], "tfrun train --data 'my file.txt' --resume runs/a"),
])
def test_the_resume_command_replaces_out(argv, expected) -> None:
    assert resume_command("runs/a", argv) == expected
