"""tfrun.distributed.runtime Note [autocast] on CPU: --precision bf16 runs a rank's forwards under torch.autocast (CPU
autocast to bfloat16 stands in for CUDA's) with float32 parameters, gradients and optimizer state; auto means
bf16 on CUDA only. One process, a one-rank pipeline built by tfrun.distributed.rank (the production path)."""

from __future__ import annotations

import pytest

from tests.conftest import torch_or_skip

torch = torch_or_skip()

from tfrun.config.train_config import TrainConfig  # noqa: E402
from tfrun.distributed.rank import build_rank  # noqa: E402


def _step(precision: str) -> tuple[float, dict, object]:
    config = TrainConfig(order=[["0F0", "0F1", "0B0", "0B1"]], num_stages=1, num_microbatches=2, stage_to_rank=[0],
                         freeze="none", model="tiny", microbatch_size=2, seq_len=16, precision=precision)
    r = build_rank(config, torch.device("cpu"))
    tokens = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(0))
    losses: list = []
    r.state.begin(0)
    r.runtime.step(tokens[:, :-1], target=tokens[:, 1:], losses=losses)
    grads = {n: p.grad for n, p in r.modules[0].named_parameters()}
    r.optimizer.step()
    return sum(float(v.detach()) for v in losses) / 2, grads, r


def test_bf16_autocast_keeps_float32_master_weights(single_rank_group):
    loss32, grads32, _ = _step("fp32")
    loss16, grads16, r = _step("bf16")
    assert abs(loss16 - loss32) < 0.05 and loss16 != loss32  # computed in bf16, close to fp32
    assert all(g.dtype == torch.float32 for g in grads16.values())
    assert all(p.dtype == torch.float32 for p in r.modules[0].parameters())
    assert all(v.dtype == torch.float32 for s in r.optimizer.state.values() for v in s.values() if v.dim())
    name = "layers.0.mlp.w1.weight"
    assert not torch.equal(grads16[name], grads32[name])
    assert torch.allclose(grads16[name], grads32[name], rtol=0.1, atol=1e-3)


@pytest.mark.parametrize("precision, cuda, dtype", [
    ("auto", False, "float32"), ("auto", True, "bfloat16"), ("fp32", True, "float32"), ("bf16", False, "bfloat16"),
])
def test_compute_dtype(precision, cuda, dtype):
    config = TrainConfig(order=[["0F0", "0B0"]], num_stages=1, num_microbatches=1, stage_to_rank=[0],
                         precision=precision)
    assert config.compute_dtype(cuda) == dtype
