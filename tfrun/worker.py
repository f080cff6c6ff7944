"""One rank of a tfrun job: `python -m tfrun.worker CONFIG.json` (started by torchrun; see tfrun.launch).

Joins the process group (nccl when this rank has a CUDA device, else gloo), runs the training loop and on
failure leaves a one-line error for the launcher in OUT/errors/rank{r}.txt before exiting with code 1.
"""

from __future__ import annotations

import datetime as dt
import gc
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from tfrun.config import TrainConfig

# A rank blocked on a dead peer gives up after this long (gloo and nccl both honour it).
COLLECTIVE_TIMEOUT = dt.timedelta(seconds=int(os.environ.get("TFRUN_TIMEOUT_S", "120")))


def init_process_group() -> None:
    """Join the job torchrun set up; the backend is nccl only if this rank has a CUDA device."""
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)


def run_worker(config: TrainConfig) -> int:
    """Run this rank; returns the process exit code."""
    from tfrun import train

    init_process_group()
    rank = dist.get_rank()
    try:
        _maybe_inject_fault(rank, -1)
        train.run(config, fault_hook=lambda step: _maybe_inject_fault(rank, step))
        dist.barrier()  # leave together: no rank tears its group down while rank 0 still writes the outputs
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the launcher, then exits 1
        errors = Path(config.out_dir) / "errors"
        errors.mkdir(parents=True, exist_ok=True)
        line = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        (errors / f"rank{rank}.txt").write_text(line + "\n\n" + traceback.format_exc())
        print(f"error: rank {rank}: {line}", file=sys.stderr, flush=True)  # torchrun shows it; our launcher logs it
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
    """Test hook: TFRUN_FAULT=rank:step makes that rank die abruptly (os._exit) before that step."""
    spec = os.environ.get("TFRUN_FAULT")
    if spec and spec == f"{rank}:{step}":
        os._exit(17)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.exit(run_worker(TrainConfig.load(argv[0])))


if __name__ == "__main__":
    main()
