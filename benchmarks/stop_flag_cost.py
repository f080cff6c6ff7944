"""What the per-step stop/checkpoint agreement costs (tfrun.distributed.signals.StepControl.after_step: one all_reduce
of two int64 on gloo), on 2 CPU ranks of this machine, against a tiny-model step.

    python benchmarks/stop_flag_cost.py [--calls 2000]

Prints the median and p90 of one call in microseconds; compare with summary.json's step_time_ms of a
`tfrun train` run (tiny model, 2 x 32 tokens, M = 4: about 100 ms on this machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _worker(rank: int, world: int, store: str, calls: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from tfrun.config.train_config import TrainConfig
    from tfrun.distributed.signals import StepControl, StopRequest

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    config = TrainConfig(order=[["0F0"], ["1F0"]], num_stages=2, num_microbatches=1, stage_to_rank=[0, 1],
                         checkpoint_every=0, checkpoint_minutes=10.0)
    control = StepControl(config, StopRequest(Path(out) / "STOP"), torch.device("cpu"))
    for step in range(calls):
        control.after_step(step, last=False)
    times = control.poll_ms[calls // 10:]  # the first calls warm the connections up
    dist.barrier()
    if rank == 0:
        Path(out, "times.txt").write_text("\n".join(map(str, times)))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        mp.spawn(_worker, args=(2, f"{tmp}/store", args.calls, tmp), nprocs=2)
        wall = time.perf_counter() - start
        times = sorted(float(x) for x in Path(tmp, "times.txt").read_text().split())
    p90 = times[int(0.9 * len(times))]
    print(f"StepControl.after_step on 2 gloo ranks, {len(times)} calls timed ({wall:.1f} s with start-up; load "
          f"average {os.getloadavg()[0]:.2f}): median {statistics.median(times) * 1e3:.0f} us, p90 {p90 * 1e3:.0f} us")


if __name__ == "__main__":
    main()
