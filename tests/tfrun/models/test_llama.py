"""tfrun.models.llama: stage shapes, split == 1-stage model bitwise, names, init loss, meta 8B, GQA, causality."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.conftest import torch_or_skip

torch = torch_or_skip()

from tfrun.models import (  # noqa: E402  (after the torch skip)
    MODELS,
    ModelConfig,
    ModelError,
    build_stage,
    count_params,
    loss_fn,
    split_layers,
)

# A small 6-layer config so that 2- and 3-stage splits (and an uneven 4-stage one) are all possible.
CFG = dataclasses.replace(MODELS["tiny"], dim=64, n_layers=6, n_heads=4, n_kv_heads=2, ffn_dim=128)
B, T = 2, 16


def _tokens(cfg: ModelConfig = CFG, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def _pipeline_forward(cfg: ModelConfig, num_stages: int, seed: int, tokens: torch.Tensor) -> torch.Tensor:
    x = tokens
    for s in range(num_stages):
        x = build_stage(cfg, s, num_stages, seed)(x)
    return x


@pytest.mark.parametrize(
    ("n_layers", "num_stages", "expected"),
    [
        (4, 1, [4]), (4, 2, [2, 2]), (5, 2, [3, 2]), (7, 3, [2, 3, 2]), (8, 3, [3, 3, 2]),
        (6, 4, [1, 2, 2, 1]), (9, 4, [2, 3, 2, 2]), (11, 4, [3, 3, 3, 2]),
    ],
)
def test_split_layers(n_layers: int, num_stages: int, expected: list[int]) -> None:
    assert split_layers(n_layers, num_stages) == expected


def test_split_layers_rejects_more_stages_than_layers() -> None:
    with pytest.raises(ModelError, match="num_stages"):
        split_layers(2, 3)
    with pytest.raises(ModelError, match="stage_index"):
        build_stage(CFG, 3, 3, seed=0)


def test_stage_shapes() -> None:
    tokens = _tokens()
    first, middle, last = (build_stage(CFG, s, 3, seed=0) for s in range(3))
    h = first(tokens)
    assert h.shape == (B, T, CFG.dim) and h.dtype == torch.float32
    h = middle(h)
    assert h.shape == (B, T, CFG.dim)
    logits = last(h)
    assert logits.shape == (B, T, CFG.vocab_size) and logits.dtype == torch.float32
    whole = build_stage(CFG, 0, 1, seed=0)
    assert whole(tokens).shape == (B, T, CFG.vocab_size)


@pytest.mark.parametrize("num_stages", [2, 3, 4])
def test_split_equals_single_stage(num_stages: int) -> None:
    tokens = _tokens()
    reference = build_stage(CFG, 0, 1, seed=7)(tokens)
    # Bitwise: the split runs the same ops in the same order on the same shapes.
    assert torch.equal(_pipeline_forward(CFG, num_stages, 7, tokens), reference)
    # And the parameters themselves are the same tensors, name by name.
    whole = dict(build_stage(CFG, 0, 1, seed=7).named_parameters())
    for s in range(num_stages):
        for name, p in build_stage(CFG, s, num_stages, seed=7).named_parameters():
            assert torch.equal(p, whole[name]), name


def test_seed_changes_values() -> None:
    a, b = build_stage(CFG, 0, 2, seed=0), build_stage(CFG, 0, 2, seed=1)
    assert not torch.equal(a.layers["0"].attn.wq.weight, b.layers["0"].attn.wq.weight)
    # Different layers get different draws.
    assert not torch.equal(a.layers["0"].attn.wq.weight, a.layers["1"].attn.wq.weight)


def test_parameter_names_use_global_layer_index() -> None:
    names = [set(dict(build_stage(CFG, s, 3, seed=0).named_parameters())) for s in range(3)]
    assert "embed.weight" in names[0] and "layers.0.attn.wq.weight" in names[0]
    assert "layers.1.mlp.w2.weight" in names[0]
    assert {n.split(".")[1] for n in names[1] if n.startswith("layers.")} == {"2", "3"}
    assert {"layers.5.attn_norm.weight", "norm.weight", "head.weight"} <= names[2]
    assert not any(n.startswith(("head", "norm")) for n in names[0] | names[1])
    assert not any(n.startswith("embed") for n in names[1] | names[2])
    # Rotary tables are buffers that are not saved.
    assert not any("rope" in k for k in build_stage(CFG, 1, 3, seed=0).state_dict())


def test_tied_embeddings_one_stage_shares_split_copies() -> None:
    cfg = dataclasses.replace(CFG, tie_embeddings=True)
    whole = build_stage(cfg, 0, 1, seed=3)
    assert whole.head.weight is whole.embed.weight
    assert "head.weight" not in dict(whole.named_parameters())
    untied = dataclasses.replace(CFG, tie_embeddings=False)
    assert count_params(whole) == count_params(build_stage(untied, 0, 1, seed=3)) - cfg.vocab_size * cfg.dim
    last = build_stage(cfg, 1, 2, seed=3)
    assert torch.equal(last.head.weight, whole.embed.weight)
    tokens = _tokens(cfg)
    assert torch.allclose(_pipeline_forward(cfg, 2, 3, tokens), whole(tokens), rtol=0, atol=1e-6)


def test_untrained_loss_is_near_uniform() -> None:
    cfg = MODELS["tiny"]
    tokens = torch.randint(0, 256, (2, 65), generator=torch.Generator().manual_seed(1))
    logits = build_stage(cfg, 0, 1, seed=0)(tokens[:, :-1])
    loss = loss_fn(logits, tokens[:, 1:])
    assert loss.dim() == 0 and loss.dtype == torch.float32
    assert abs(loss.item() - math.log(256)) < 0.15


def test_loss_fn_matches_hand_computation() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[0, 1, 2], [3, 4, 0]])
    by_hand = -torch.log_softmax(logits, -1).gather(-1, targets[..., None]).mean()
    assert torch.allclose(loss_fn(logits, targets), by_hand, atol=1e-6)


def _llama_layer_params(dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int) -> int:
    head_dim = dim // n_heads
    attn = dim * n_heads * head_dim * 2 + dim * n_kv_heads * head_dim * 2  # wq, wo; wk, wv
    return attn + 3 * dim * ffn_dim + 2 * dim  # SwiGLU w1, w2, w3; two RMSNorm weights


def test_meta_8b_stage_parameter_count() -> None:
    cfg = MODELS["llama3.1-8b"]
    per_layer = _llama_layer_params(4096, 32, 8, 14336)
    assert per_layer == 218_112_000
    embed = 128256 * 4096
    stages = [build_stage(cfg, s, 4, seed=0, device="meta") for s in range(4)]
    assert all(p.is_meta for st in stages for p in st.parameters())
    assert count_params(stages[0]) == embed + 8 * per_layer
    assert count_params(stages[1]) == 8 * per_layer
    assert count_params(stages[3]) == 8 * per_layer + 4096 + embed  # final norm + untied head
    # The published total: 8.03 B parameters.
    assert sum(count_params(st) for st in stages) == 8_030_261_248
    assert stages[3].head.weight.shape == (128256, 4096)
    assert stages[0].layers["0"].attn.wk.weight.shape == (1024, 4096)


def test_meta_1b_is_tied_in_one_stage() -> None:
    cfg = MODELS["llama3.2-1b"]
    whole = build_stage(cfg, 0, 1, seed=0, device="meta")
    # Published: 1.24 B parameters with the embedding shared by the head.
    assert count_params(whole) == 128256 * 2048 + 16 * _llama_layer_params(2048, 32, 8, 8192) + 2048
    assert count_params(whole) == 1_235_814_400


def test_gqa_matches_repeated_kv_heads() -> None:
    # n_kv_heads < n_heads must equal a full multi-head model whose k/v weights repeat each kv head.
    gqa_cfg = dataclasses.replace(CFG, n_layers=1, n_heads=4, n_kv_heads=2)
    mha_cfg = dataclasses.replace(gqa_cfg, n_kv_heads=4)
    gqa, mha = build_stage(gqa_cfg, 0, 1, seed=0), build_stage(mha_cfg, 0, 1, seed=0)
    hd = gqa_cfg.head_dim
    with torch.no_grad():
        for name, p in mha.named_parameters():
            src = dict(gqa.named_parameters())[name]
            if name.endswith(("wk.weight", "wv.weight")):
                # (n_kv * hd, dim) -> each kv head's hd rows twice, in head order 0,0,1,1.
                p.copy_(src.view(2, hd, -1).repeat_interleave(2, dim=0).reshape(4 * hd, -1))
            else:
                p.copy_(src)
    tokens = _tokens(gqa_cfg)
    assert torch.allclose(gqa(tokens), mha(tokens), atol=1e-5)
    assert gqa.layers["0"].attn.wk.weight.shape == (2 * hd, gqa_cfg.dim)


def test_causal() -> None:
    model = build_stage(CFG, 0, 1, seed=0)
    tokens = _tokens()
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % CFG.vocab_size
    a, b = model(tokens), model(changed)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_backward_reaches_every_parameter() -> None:
    model = build_stage(CFG, 0, 1, seed=0)
    tokens = _tokens()
    loss_fn(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_config_errors_and_dict_round_trip() -> None:
    with pytest.raises(ModelError, match="n_kv_heads"):
        dataclasses.replace(CFG, n_kv_heads=3)
    with pytest.raises(ModelError, match="dim"):
        dataclasses.replace(CFG, dim=66)
    with pytest.raises(ModelError, match="max_seq_len"):
        build_stage(dataclasses.replace(CFG, max_seq_len=8), 0, 1, seed=0)(_tokens())
    assert ModelConfig.from_dict(CFG.to_dict()) == CFG
    with pytest.raises(ModelError, match="model.bogus: unknown key"):
        ModelConfig.from_dict({**CFG.to_dict(), "bogus": 1})
    with pytest.raises(ModelError, match="model.dim: missing"):
        ModelConfig.from_dict({k: v for k, v in CFG.to_dict().items() if k != "dim"})


def test_split_gradients_equal_single_stage() -> None:
    # Backward stage by stage (as the pipeline does: each stage's input is a fresh leaf) gives the 1-stage
    # model's gradients for every parameter.
    tokens = _tokens()
    whole = build_stage(CFG, 0, 1, seed=5)
    loss_fn(whole(tokens[:, :-1]), tokens[:, 1:]).backward()
    stages = [build_stage(CFG, s, 3, seed=5) for s in range(3)]
    x, inputs, outputs = tokens[:, :-1], [], []
    for stage in stages:
        inputs.append(x)
        outputs.append(stage(x))
        x = outputs[-1].detach().requires_grad_()
    loss_fn(outputs[-1], tokens[:, 1:]).backward()
    for s in (1, 0):
        outputs[s].backward(inputs[s + 1].grad)
    reference = dict(whole.named_parameters())
    for stage in stages:
        for name, p in stage.named_parameters():
            assert torch.allclose(p.grad, reference[name].grad, rtol=0, atol=1e-6), name
