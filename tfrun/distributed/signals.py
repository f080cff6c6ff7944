"""Graceful stops and the per-step decisions every rank must take together.

Note [graceful stop]: SIGTERM or SIGINT to a rank, or the file OUT/STOP (which `tfrun train`'s launcher
writes on its first signal, and which a user may create), asks the run to stop: every rank finishes its
current step, they agree on that step (StepControl, one all_reduce of two integers per step), write a
checkpoint and exit 0. A second signal more than DUPLICATE_S after the first aborts the process at once
(exit 128 + signal). Within DUPLICATE_S it is taken as the same request: a Ctrl-C in a terminal reaches a
torchrun job's ranks both directly and forwarded by torchrun, milliseconds apart.

Note [checkpoint triggers]: after step k (0-based) a checkpoint is written when (k + 1) is a multiple of
checkpoint_every, when checkpoint_minutes passed on rank 0's clock since the last one (rank 0 decides and
the all_reduce tells everyone, so every rank checkpoints the same step), when a stop was requested, and
after the last step.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tfrun.config.train_config import TrainConfig

DUPLICATE_S = 1.0
"""A second signal this soon after the first is the same stop request (Note [graceful stop])."""
STOP_FILE = "STOP"
"""OUT/STOP asks a run to stop after its current step."""
LAUNCHED_ENV = "TFRUN_LAUNCHED"
"""Set by tfrun's launcher for its ranks: the launcher, not rank 0, prints how to resume."""
HANDLED = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """This process's stop request: a first SIGTERM/SIGINT or OUT/STOP asks for a graceful stop, a later
    second signal aborts (Note [graceful stop])."""

    def __init__(self, stop_file: Path | None = None) -> None:
        self.stop_file = stop_file
        self.signal_name: str | None = None
        """The first signal's name (SIGTERM, SIGINT), or None."""
        self._first_at: float | None = None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT in this process (call from the main thread)."""
        for sig in HANDLED:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self._first_at is None:
            self._first_at, self.signal_name = now, signal.Signals(signum).name
            return
        if now - self._first_at < DUPLICATE_S:
            return
        os.write(2, f"aborted by a second {signal.Signals(signum).name}\n".encode())
        os._exit(128 + signum)

    def requested(self) -> bool:
        return self.signal_name is not None or (self.stop_file is not None and self.stop_file.exists())

    def reason(self) -> str:
        return self.signal_name or f"{self.stop_file} exists"


class StepControl:
    """After each step, on every rank: checkpoint now? stop now? (Notes [graceful stop], [checkpoint
    triggers]). The decision is one all_reduce (MAX) of [stop requested anywhere, time trigger on rank 0]."""

    def __init__(self, config: TrainConfig, stop: StopRequest | None, device: torch.device) -> None:
        self.config, self.stop, self.device = config, stop, device
        self.rank = dist.get_rank()
        self.last_save = time.monotonic()
        self.stopping = False
        """True once every rank agreed to stop after this step."""
        self.poll_ms: list[float] = []
        """Wall time of each step's agreement (the all_reduce and its bookkeeping), ms."""

    def after_step(self, step: int, last: bool) -> bool:
        """Whether to checkpoint after `step` (0-based); sets `stopping`. Collective: every rank calls it."""
        t0 = time.perf_counter()
        minutes = self.config.checkpoint_minutes
        late = self.rank == 0 and minutes > 0 and time.monotonic() - self.last_save >= minutes * 60
        flags = torch.tensor([int(self.stop is not None and self.stop.requested()), int(late)], dtype=torch.int64,
                             device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, late = (bool(x) for x in flags.tolist())
        self.poll_ms.append((time.perf_counter() - t0) * 1e3)
        every = self.config.checkpoint_every
        save = last or stop or late or bool(every and (step + 1) % every == 0)
        self.stopping = stop and not last
        if save:
            self.last_save = time.monotonic()
        return save

    def report(self, steps_done: int) -> None:
        """Rank 0 of a job not started by tfrun's launcher: say where it stopped and how to resume."""
        if self.rank != 0 or os.environ.get(LAUNCHED_ENV):
            return
        why = self.stop.reason() if self.stop is not None else "a stop request"
        print(f"stopped after step {steps_done} of {self.config.steps} ({why}); checkpoint written: run the same "
              f"command with --resume {self.config.out_dir} (instead of --out) to continue", flush=True)


def resume_command(out: str, argv: list[str] | None = None) -> str:
    """The command that resumes this run: this process's `tfrun` arguments with --out / --resume replaced.

    >>> resume_command("runs/a", ["/usr/bin/tfrun", "train", "--plan", "p.json", "--out", "runs/a", "--quiet"])
    'tfrun train --plan p.json --quiet --resume runs/a'
    """
    args = list(sys.argv if argv is None else argv)[1:]
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("--out", "--resume"):
            skip = True
            continue
        if arg.startswith(("--out=", "--resume=")):
            continue
        kept.append(arg)
    return shlex.join(["tfrun", *kept, "--resume", out])
