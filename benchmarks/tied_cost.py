"""What keeping a tied embedding tied across stages costs (tfrun.distributed.tied Note [tied embeddings across
stages]): the one all-reduce a step between the first and last stage's ranks, timed on 2 gloo ranks on this
machine for the embedding shapes of real tied models, median of --repeats, with the bandwidth it implies.

On a cluster the same all-reduce moves 2 x V x D x 4 bytes per step over the link between the two ranks (fp32
gradients: tfrun keeps master weights in float32); divide by the link's bandwidth for its cost there.

    python benchmarks/tied_cost.py                # tiny .. Llama-3.2-1B's 128256 x 2048
    python benchmarks/tied_cost.py --shapes 256x256,49152x576 --repeats 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

SHAPES = {"tiny (ours)": (256, 256), "SmolLM2-135M": (49152, 576), "Qwen2.5-0.5B": (151936, 896),
          "Llama-3.2-1B": (128256, 2048)}


def _rank(rank: int, world: int, init: str, shapes: list[tuple[str, int, int]], repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from tfrun.distributed.tied import TiedEmbedding

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for name, rows, cols in shapes:
        stage = nn.Module()
        if rank == 0:
            stage.embed = nn.Embedding(rows, cols)
            modules = {0: stage}
        else:
            stage.head = nn.Linear(cols, rows, bias=False)
            modules = {1: stage}
        tie = TiedEmbedding(modules, 2, [0, 1], rank, 0, 1)
        param = next(stage.parameters())
        times = []
        for _ in range(repeats + 1):
            param.grad = torch.ones_like(param)
            dist.barrier()
            t0 = time.perf_counter()
            tie.reduce()
            times.append((time.perf_counter() - t0) * 1e3)
        if rank == 0:
            queue.put((name, rows, cols, statistics.median(times[1:]), times[1:]))
        del stage, modules, tie, param
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=None, help="VxD,... (default: the named models')")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import torch.multiprocessing as mp

    if args.shapes:
        shapes = [(s, *map(int, s.split("x"))) for s in args.shapes.split(",")]
    else:
        shapes = [(name, rows, cols) for name, (rows, cols) in SHAPES.items()]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'store')}"
        procs = [ctx.Process(target=_rank, args=(r, 2, init, shapes, args.repeats, queue)) for r in range(2)]
        for p in procs:
            p.start()
        rows = [queue.get() for _ in shapes]
        for p in procs:
            p.join()
    print(f"tied-embedding all-reduce on 2 gloo ranks (this machine, load average {os.getloadavg()[0]:.2f}); "
          f"median of {args.repeats}, ms")
    print(f"{'model':16s} {'V x D':>14s} {'MB (fp32)':>10s} {'ms':>9s} {'GB/s':>6s}  repeats")
    for name, v, d, med, times in rows:
        mb = v * d * 4 / 1e6
        print(f"{name:16s} {f'{v} x {d}':>14s} {mb:10.1f} {med:9.2f} {mb / med:6.2f}  "
              f"{', '.join(f'{t:.1f}' for t in times)}")


if __name__ == "__main__":
    main()
