"""tfrun.optim.optimizer: weight decay on tensors of two or more dimensions only, settable betas and eps."""

from __future__ import annotations

from tests.conftest import torch_or_skip


def test_decay_falls_on_matrices_and_embeddings_only() -> None:
    torch_or_skip()
    from tfrun.models import MODELS, build_stage
    from tfrun.optim.optimizer import adamw, param_groups

    stage = build_stage(MODELS["tiny"], 0, 2, 0)
    groups = param_groups(stage.parameters(), 0.1)
    decayed = {id(p) for p in groups[0]["params"]}
    names = {n for n, p in stage.named_parameters() if id(p) in decayed}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in groups[0]["params"]) and all(p.ndim < 2 for p in groups[1]["params"])
    assert any("embed" in n for n in names) and not any("norm" in n for n in names)
    assert sum(len(g["params"]) for g in groups) == len(list(stage.parameters()))
    opt = adamw(stage.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-6)
    assert all(g["betas"] == (0.8, 0.95) and g["eps"] == 1e-6 for g in opt.param_groups)


def test_no_decay_keeps_one_group_as_before() -> None:
    torch = torch_or_skip()
    from tfrun.optim.optimizer import adamw

    params = [torch.nn.Parameter(torch.ones(3, 3)), torch.nn.Parameter(torch.ones(3))]
    opt = adamw(params, lr=1e-3)
    assert len(opt.param_groups) == 1  # the optimizer state of checkpoints written before still loads


def test_the_decayed_step_equals_torch_adamw_with_the_same_groups() -> None:
    torch = torch_or_skip()
    from tfrun.optim.optimizer import adamw

    torch.manual_seed(0)
    w, b = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4))
    w2, b2 = (torch.nn.Parameter(t.detach().clone()) for t in (w, b))
    ours = adamw([w, b], lr=0.1, weight_decay=0.5)
    ref = torch.optim.AdamW([{"params": [w2], "weight_decay": 0.5}, {"params": [b2], "weight_decay": 0.0}], lr=0.1)
    for p in (w, b, w2, b2):
        p.grad = torch.ones_like(p)
    ours.step()
    ref.step()
    assert torch.equal(w, w2) and torch.equal(b, b2)
