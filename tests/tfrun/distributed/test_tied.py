"""tfrun.distributed.tied in one process, where one rank holds both copies (the V schedules' rank 0): the copies'
gradients summed into both (Note [tied freezing]: a use frozen in every micro-batch adds nothing, and neither use
leaves both without gradient); the head's copy left out of a checkpoint and its placeholder; a checkpoint that
trained the two apart refused. The two-rank path is tests/tfrun/test_tied.py's."""

from __future__ import annotations

import pytest

from tests.conftest import torch_or_skip

torch = torch_or_skip()
from tfrun.distributed.tied import TiedEmbedding  # noqa: E402
from tfrun.errors import TfrunError  # noqa: E402
from tfrun.models import ModelConfig, build_stage  # noqa: E402

CFG = ModelConfig(vocab_size=32, dim=8, n_layers=4, n_heads=2, n_kv_heads=1, ffn_dim=16, max_seq_len=16,
                  tie_embeddings=True)


def _tie() -> tuple[TiedEmbedding, dict]:
    modules = {0: build_stage(CFG, 0, 4, seed=0), 3: build_stage(CFG, 3, 4, seed=0)}
    assert torch.equal(modules[0].embed.weight, modules[3].head.weight)  # the head starts as the copy
    return TiedEmbedding(modules, 4, [0, 1, 1, 0], 0, 0, 1), modules


def test_both_copies_get_the_sum_of_the_uses_that_made_a_gradient():
    tie, _ = _tie()
    a, b = torch.randn(32, 8), torch.randn(32, 8)
    tie.embed.grad, tie.head.grad = a.clone(), b.clone()
    tie.reduce()
    assert torch.equal(tie.embed.grad, a + b) and torch.equal(tie.head.grad, a + b)
    assert tie.embed.grad.data_ptr() != tie.head.grad.data_ptr()  # two tensors: the optimizer steps each
    tie.embed.grad, tie.head.grad = None, b.clone()  # the embedding's use frozen in every micro-batch
    tie.reduce()
    assert torch.equal(tie.embed.grad, b) and torch.equal(tie.head.grad, b)
    tie.embed.grad = tie.head.grad = None  # neither use: AdamW skips both
    tie.reduce()
    assert tie.embed.grad is None and tie.head.grad is None


def test_the_norm_counts_the_parameter_once():
    tie, modules = _tie()
    params = {s: list(m.parameters()) for s, m in modules.items()}
    counted = tie.norm_params(params)
    assert not any(p is tie.head for p in counted[3]) and any(p is tie.embed for p in counted[0])
    assert sum(len(v) for v in counted.values()) == sum(len(v) for v in params.values()) - 1


def test_checkpoints_hold_the_matrix_once_and_refuse_one_trained_apart():
    tie, modules = _tie()
    states = tie.without_copy({s: m.state_dict() for s, m in modules.items()})
    assert "head.weight" not in states[3] and "embed.weight" in states[0]
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    saved = tie.without_copy_state(optimizer, optimizer.state_dict())
    assert len(saved["state"]) == len(params) - 1
    with torch.no_grad():
        modules[3].head.weight.add_(1.0)  # a placeholder's value does not matter: restore() overwrites it
    filled = tie.with_placeholder(3, modules[3], states[3], "--resume x")
    modules[3].load_state_dict(filled)
    del optimizer.state[tie.head]
    tie.restore(optimizer)
    assert torch.equal(tie.head, tie.embed) and tie.agree()
    assert torch.equal(optimizer.state[tie.head]["exp_avg"], optimizer.state[tie.embed]["exp_avg"])
    with pytest.raises(TfrunError, match="trained the tied embedding and LM head as two matrices"):
        tie.with_placeholder(3, modules[3], modules[3].state_dict(), "--resume x")
