"""One rank of a tfrun job: forked by tfrun's launcher (tfrun.distributed.launch Note [forked ranks]), or
`python -m tfrun.cli.worker CONFIG.json` under a launcher of your own that sets torchrun's variables.

Joins the process group (nccl when this rank has a CUDA device, else gloo), runs the training loop and on
failure leaves a one-line error for the launcher in OUT/errors/rank{r}.txt before exiting with code 1.
SIGTERM and SIGINT stop the run gracefully after the current step (tfrun.distributed.signals Note [graceful stop]).
"""

from __future__ import annotations

import datetime as dt
import gc
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from tfrun.config.train_config import TrainConfig
from tfrun.distributed.launch import STORE_ENV
from tfrun.distributed.signals import STOP_FILE, StopRequest
from tfrun.errors import TfrunError

# A rank blocked on a hung peer gives up after this long (gloo and nccl both honour it). A dead peer is found
# sooner: the launcher sees the exit and stops the other ranks (tfrun.distributed.launch Note [dead ranks]).
COLLECTIVE_TIMEOUT = dt.timedelta(seconds=int(os.environ.get("TFRUN_TIMEOUT_S", "60")))


def init_process_group() -> None:
    """Join the job tfrun's launcher (its file store) or torchrun (its variables) set up; the backend is nccl only if
    this rank has a CUDA device."""
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    store = os.environ.get(STORE_ENV)
    if store:
        dist.init_process_group(backend=backend, init_method=f"file://{store}", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=COLLECTIVE_TIMEOUT)
    else:
        dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)


def run_worker(config: TrainConfig) -> int:
    """Run this rank; returns the process exit code."""
    from tfrun import train

    stop = StopRequest(Path(config.out_dir) / STOP_FILE)
    stop.install()
    init_process_group()
    rank = dist.get_rank()
    try:
        if rank == 0:
            stop.stop_file.unlink(missing_ok=True)  # a stale request; the first step's barrier orders this
        _maybe_inject_fault(rank, -1)
        if config.retime is not None:
            from tfrun import retime

            retime.run(config)
        else:
            train.run(config, fault_hook=lambda step: _maybe_inject_fault(rank, step), stop=stop)
        dist.barrier()  # leave together: no rank tears its group down while rank 0 still writes the outputs
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the launcher, then exits 1
        line = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        try:
            errors = Path(config.out_dir) / "errors"
            errors.mkdir(parents=True, exist_ok=True)
            (errors / f"rank{rank}.txt").write_text(line + "\n\n" + traceback.format_exc())
        except OSError:  # a full or read-only disk: stderr (OUT/launcher.log) still names the error
            pass
        print(f"error: rank {rank}: {line}", file=sys.stderr, flush=True)  # in OUT/launcher.log (or torchrun's output)
        return 1
    finally:
        # Collect the schedule's reference cycles (stages, pending p2p work) while the interpreter is alive:
        # gloo work freed during interpreter finalisation can abort the process (seen once: SIGABRT at exit,
        # "terminate called without an active exception", after a complete run).
        gc.collect()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a peer may already be gone
                pass


def _maybe_inject_fault(rank: int, step: int) -> None:
    """Test hook: TFRUN_FAULT=rank:step makes that rank die abruptly (os._exit) before that step;
    TFRUN_FAULT=rank:step:kill makes it SIGKILL itself TFRUN_FAULT_DELAY_S (default 0.05) seconds into it."""
    spec = os.environ.get("TFRUN_FAULT")
    if spec and spec == f"{rank}:{step}":
        os._exit(17)
    if spec and spec == f"{rank}:{step}:kill":
        delay = float(os.environ.get("TFRUN_FAULT_DELAY_S", "0.05"))
        threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()


def main(argv: list[str] | None = None) -> None:
    """`python -m tfrun.cli.worker CONFIG.json`; an unreadable or invalid config is one line, exit 1."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tfrun.cli.worker RUN_CONFIG.json (a rank of a job: see tfrun.distributed.launch)",
              file=sys.stderr)
        sys.exit(2)
    try:
        config = TrainConfig.load(argv[0])
        config.check()
    except TfrunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    sys.exit(run_worker(config))


if __name__ == "__main__":
    main()
