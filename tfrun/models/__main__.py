"""Time the named CPU sizes, forward and backward per stage (one compute thread, as every pipeline rank runs):

    python -m tfrun.models
"""

from __future__ import annotations

import statistics
import time

import torch

from tfrun.models.llama import MODELS, build_stage, count_params, loss_fn


def _time_ms(fn, setup=lambda: None, repeats: int = 20) -> float:
    """Median wall time of fn(setup()) in milliseconds, setup untimed, after three warm-up calls."""
    times = []
    for _ in range(3 + repeats):
        arg = setup()
        start = time.perf_counter()
        fn(arg)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[3:])


def _benchmark(batch: int = 4, seq_len: int = 128, num_stages: int = 2) -> None:
    """Print forward (F), full backward (B) and input-only backward (I) ms per micro-batch per stage."""
    torch.set_num_threads(1)  # one compute thread per rank, as torchrun's OMP_NUM_THREADS=1 gives
    gen = torch.Generator().manual_seed(0)
    for name in ("tiny", "small"):
        cfg = MODELS[name]
        tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen)
        for s in range(num_stages):
            stage = build_stage(cfg, s, num_stages, seed=0)
            x = tokens if s == 0 else torch.randn(batch, seq_len, cfg.dim, requires_grad=True)

            def scalar(stage=stage, x=x, tokens=tokens) -> torch.Tensor:
                y = stage(x)  # a middle stage's gradient source is a stand-in scalar of its output
                return loss_fn(y, tokens) if stage.is_last else y.square().mean()

            fwd = _time_ms(lambda _, scalar=scalar: scalar().detach())
            bwd = _time_ms(lambda y: y.backward(), setup=scalar)
            # I: gradient for the stage input only, as when every weight is frozen (none on stage 0).
            inp = _time_ms(lambda y, x=x: torch.autograd.grad(y, [x]), setup=scalar) if s else None
            print(f"{name:6s} stage {s}/{num_stages} ({count_params(stage):,} params, threads=1, micro-batch "
                  f"{batch}x{seq_len}): F {fwd:.1f} ms, B {bwd:.1f} ms, I {'-' if inp is None else f'{inp:.1f}'} ms")


if __name__ == "__main__":
    _benchmark()
