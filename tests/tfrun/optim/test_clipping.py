"""tfrun.optim.clipping on one process: the norm and the clipped gradients equal torch.nn.utils.clip_grad_norm_'s,
and a step's finiteness names the stages. (Across pipeline ranks and replicas, against the whole model on one
process: tests/tfrun/distributed/test_runtime.py's clip cases and tests/tfrun/distributed/test_rank.py.)"""

from __future__ import annotations

import math

import pytest

from tests.conftest import torch_or_skip


def _params(seed: int, scale: float = 1.0):
    torch = torch_or_skip()
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in ((8, 5), (5,), (3, 3, 2))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    return params


@pytest.mark.parametrize("max_norm", [0.1, 1.0, 100.0])
def test_clip_grad_norm_equals_torch_on_one_process(max_norm: float) -> None:
    torch = torch_or_skip()
    from tfrun.optim.clipping import clip_grad_norm

    ours, theirs = _params(0), _params(0)
    norm = clip_grad_norm(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert norm == pytest.approx(float(expected), rel=1e-6)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    if max_norm > norm:
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, _params(0)))  # untouched below the limit


def test_step_norm_sums_every_stage_and_names_the_bad_ones() -> None:
    torch = torch_or_skip()
    from tfrun.optim.clipping import step_norm

    stages = {0: _params(1), 1: _params(2)}
    check = step_norm(stages, 2, losses_finite=True, counts=True, device=torch.device("cpu"))
    total = math.sqrt(sum(float(p.grad.double().square().sum()) for ps in stages.values() for p in ps))
    assert check.finite and check.norm == pytest.approx(total, rel=1e-12)
    stages[1][0].grad[0, 0] = float("nan")
    check = step_norm(stages, 2, losses_finite=False, counts=True, device=torch.device("cpu"))
    assert not check.finite and math.isnan(check.norm)
    assert check.bad_grad_stages == (1,) and check.bad_loss_stages == (1,)


def test_measuring_only_and_an_infinite_norm_leave_the_gradients() -> None:
    torch_or_skip()
    from tfrun.optim.clipping import clip_grad_norm

    params = _params(3)
    before = [p.grad.clone() for p in params]
    assert clip_grad_norm(params, 0.0) > 0  # max_norm <= 0: measure only
    params[0].grad[0, 0] = float("inf")
    assert math.isinf(clip_grad_norm(params, 1.0))
    assert all((a.grad[1:] == b[1:]).all() for a, b in zip(params, before))
