"""Analytic cost model: FLOPs against hand arithmetic, parameter counts against the published totals, the
6 x parameters x tokens rule, times from FLOPs and bytes, names and errors, and stage partitioning."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from tfplan.cost import costmodel as cm
from tfplan.cost import hardware as hw
from tfplan.cost import profile as prof
from tfplan.errors import TfplanError

# A made-up shape to count by hand: d=64, 2 blocks, 4 query heads of 16, 2 kv heads, f=128, V=100.
TOY = hw.ModelShape(name="toy", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    intermediate_size=128, vocab_size=100)
B, T = 2, 8  # 16 tokens


def test_block_forward_flops_by_hand():
    # tokens N = B*T = 16; q_out = 4*16 = 64; kv_out = 2*16 = 32.
    # q: 2*N*d*q_out = 2*16*64*64 = 131072; k, v: 2*16*64*32 = 65536 each; o: 2*16*64*64 = 131072.
    # Causal pairs per head: B*T(T+1)/2 = 2*36 = 72; scores = av = 2*heads*head_dim*pairs = 2*4*16*72 = 9216.
    # gate, up, down: 2*16*64*128 = 262144 each.
    assert cm.block_forward_flops(TOY, B, T) == {
        "q": 131072, "k": 65536, "v": 65536, "scores": 9216, "av": 9216, "o": 131072,
        "gate": 262144, "up": 262144, "down": 262144,
    }


def test_layer_work_by_hand():
    embed, block0, block1, head = cm.layer_work(TOY, B, T)
    assert [w.name for w in (embed, block0, block1, head)] == ["embed", "block0", "block1", "head"]
    # Matmuls with weights: 131072 + 65536 + 65536 + 131072 + 3*262144 = 1179648; attention: 2*9216 = 18432.
    assert block0.forward_flops == 1179648 + 18432 == 1198080
    assert block0.backward_input_flops == 1179648 + 2 * 18432 == 1216512  # attention backward = 2x forward
    assert block0.backward_weight_flops == 1179648
    assert block1 == cm.LayerWork(**{**_fields(block0), "name": "block1"})
    # Block parameters: attention 64*(64+32+32+64) = 12288, MLP 3*64*128 = 24576, two norms 128 -> 36992;
    # accumulating their gradients reads two and writes one bf16 tensor: 6 bytes each.
    assert block0.backward_weight_bytes == 6 * 36992
    # Head: 2*N*d*V = 2*16*64*100 = 204800 per matmul; cross-entropy 14 and 22 bytes per logit (16*100).
    assert (head.forward_flops, head.backward_input_flops, head.backward_weight_flops) == (204800,) * 3
    assert (head.forward_bytes, head.backward_input_bytes) == (14 * 1600, 22 * 1600)
    assert head.backward_weight_bytes == 6 * (100 * 64 + 64)
    # Embedding: a gather (no FLOPs) reading and writing N*d bf16; no input gradient; a dense V*d gradient
    # (zero-fill 2 + accumulate 6 bytes per element) plus an index-add over N*d rows (6 bytes per element).
    assert (embed.forward_flops, embed.backward_input_flops, embed.backward_weight_flops) == (0, 0, 0)
    assert embed.forward_bytes == 4 * 16 * 64
    assert embed.backward_input_bytes == 0
    assert embed.backward_weight_bytes == 8 * 100 * 64 + 6 * 16 * 64


def _fields(work: cm.LayerWork) -> dict:
    return {name: getattr(work, name) for name in cm.LayerWork.__slots__}


def test_step_flops_by_hand_and_per_microbatch():
    # 2 blocks x (1198080 + 1216512 + 1179648) + 3 x 204800 = 7188480 + 614400.
    assert cm.step_flops(TOY, B, T) == 7802880
    assert cm.step_flops(TOY, B, T, num_microbatches=8) == 8 * 7802880
    # The same number as 6 x (matmul parameters) x tokens + 3 x attention forward per block:
    # matmul parameters = 2 x 36864 + 6400 (head) = 80128; 6*80128*16 + 3*18432*2 = 7692288 + 110592.
    assert 6 * 80128 * 16 + 3 * 18432 * 2 == 7802880


def test_six_n_d_rule_for_8b():
    """Forward + backward of all layers vs 6 x parameters x tokens plus attention, 8B at T=2048.

    Exact: step FLOPs = 6 x (parameters - embedding table - norm weights) x tokens + 3 x attention forward.
    Rule of thumb: 6 N D + attention overestimates because it charges the embedding table (a lookup, no
    matmul) like a weight matrix: 525.3M of 8030.3M parameters, 6.5%. Hence the 7% tolerance.
    """
    m, tokens = hw.get_model("llama3-8b"), 4 * 2048
    flops = cm.step_flops(m, 4, 2048)
    # Causal attention forward per block: 2 matmuls x 2 x heads x head_dim x B x T(T+1)/2 = 2 d B T (T+1).
    attention = 3 * m.num_layers * 2 * m.hidden_size * 4 * 2048 * 2049
    n = cm.parameter_count(m)
    matmul_params = n - m.vocab_size * m.hidden_size - (2 * m.num_layers + 1) * m.hidden_size
    assert flops == pytest.approx(6 * matmul_params * tokens + attention, rel=1e-12)
    rule = 6 * n * tokens + attention
    assert 0.93 < flops / rule < 1.0
    # The shortfall is the embedding table's 6 x V x d x tokens (norm weights add < 1e-4).
    assert flops / rule == pytest.approx(1 - 6 * m.vocab_size * m.hidden_size * tokens / rule, abs=1e-4)


@pytest.mark.parametrize(
    ("name", "published"),
    [("llama3.2-1b", 1.24e9), ("llama3.2-3b", 3.21e9), ("llama3.1-8b", 8.03e9), ("llama3.1-70b", 70.6e9)],
)
def test_parameter_counts_match_published(name, published):
    assert cm.parameter_count(name) == pytest.approx(published, rel=0.01)


def test_parameter_counts_exact():
    # Sums of the safetensors shapes of each Hugging Face checkpoint (tied heads counted once).
    assert cm.parameter_count("llama3.2-1b") == 1_235_814_400
    assert cm.parameter_count("llama3.2-3b") == 3_212_749_824
    assert cm.parameter_count("llama3.1-8b") == 8_030_261_248
    assert cm.parameter_count("llama3.1-70b") == 70_553_706_496


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [("llama3-8b", "llama3.1-8b"), ("Llama-3.1-8B", "llama3.1-8b"),
     ("meta-llama/Llama-3.1-8B-Instruct", "llama3.1-8b"), ("llama3-1b", "llama3.2-1b"),
     ("LLAMA3.2-3B", "llama3.2-3b"), ("llama3-70b", "llama3.1-70b")],
)
def test_model_aliases(alias, canonical):
    assert hw.get_model(alias) is hw.MODELS[canonical]


def test_gpu_and_link_names():
    for alias, name in [("A100", "a100"), ("a100-sxm4-80gb", "a100"), ("H100 SXM", "h100"),
                        ("NVIDIA H200", "h200"), ("nvidia-h200", "h200"), ("h200", "h200")]:
        assert hw.get_gpu(alias).name == name
    assert hw.get_link("nvlink", "a100").name == "nvlink3"
    assert hw.get_link("nvlink", "h100").name == hw.get_link("NVLink", "h200").name == "nvlink4"
    assert hw.get_link("pcie", "a100").gb_per_s == 32.0
    assert hw.get_link("ib", "h200").name == hw.get_link("InfiniBand", "h100").name == "ib-ndr"
    assert hw.get_link("ib-hdr", "h100").gb_per_s == 25.0  # a specific generation overrides the GPU's


@pytest.mark.parametrize(
    ("call", "listed"),
    [
        (lambda: hw.get_model("gpt-5"), ["llama3.2-1b", "llama3.1-70b", "llama3-8b"]),
        (lambda: hw.get_gpu("v100"), ["a100", "h100", "h200"]),
        (lambda: hw.get_link("ethernet", "h100"), ["nvlink3", "pcie5", "ib-ndr"]),
        (lambda: cm.analytic_profile("llama3-8b", "mi300x", 1, 2048), ["a100", "h100", "h200"]),
    ],
)
def test_unknown_names_list_the_known_ones(call, listed):
    with pytest.raises(TfplanError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for name in listed:
        assert name in message


def test_custom_shape_objects():
    hf = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 128, "vocab_size": 100, "model_type": "toy"}
    assert hw.get_model(hf) == TOY
    titan = SimpleNamespace(name="toy", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                            vocab_size=100)
    assert cm.layer_work(titan, B, T) == cm.layer_work(TOY, B, T)
    mha = hw.get_model(SimpleNamespace(dim=64, n_layers=1, n_heads=4, ffn_dim=128, vocab_size=10))
    assert mha.num_kv_heads == 4 and mha.name == "custom"
    with pytest.raises(TfplanError, match="intermediate_size"):
        hw.get_model(SimpleNamespace(dim=64, n_layers=1, n_heads=4, vocab_size=10))
    with pytest.raises(TfplanError, match="divide"):
        hw.get_model(SimpleNamespace(dim=64, n_layers=1, n_heads=5, ffn_dim=8, vocab_size=10))


def test_times_from_flops_and_bytes():
    p = cm.analytic_profile("llama3-8b", "h100", 2, 2048, mfu=0.5)
    work = cm.layer_work("llama3-8b", 2, 2048)
    flop_ms, byte_ms = 1e3 / (989e12 * 0.5), 1e3 / 3350e9
    assert len(p.layers) == 34 and [c.name for c in p.layers[:2]] == ["embed", "block0"]
    for cost, w in zip(p.layers, work, strict=True):
        assert cost.forward_ms == pytest.approx(w.forward_flops * flop_ms + w.forward_bytes * byte_ms)
        i_ms = w.backward_input_flops * flop_ms + w.backward_input_bytes * byte_ms
        w_ms = w.backward_weight_flops * flop_ms + w.backward_weight_bytes * byte_ms
        assert (cost.backward_input_ms, cost.backward_frozen_ms) == pytest.approx((i_ms, i_ms))
        assert cost.backward_weight_ms == pytest.approx(w_ms)
        assert cost.backward_ms == pytest.approx(i_ms + w_ms)
        assert cost.backward_weight_frozen_ms == 0.0
        # The tail: AdamW over the layer's parameters at HBM bandwidth; fp32 gradients to reduce across replicas.
        assert cost.tail_ms == pytest.approx(w.params * 28 * byte_ms) and cost.grad_bytes == 4 * w.params
    assert sum(w.params for w in work) == cm.parameter_count("llama3-8b")  # 8B: embedding and head untied
    # Blocks are pure compute in F: halving the mfu doubles their forward time.
    slow = cm.analytic_profile("llama3-8b", "h100", 2, 2048, mfu=0.25)
    assert slow.layers[5].forward_ms == pytest.approx(2 * p.layers[5].forward_ms)
    # p2p: B*T*d bf16 = 2*2048*4096*2 bytes over NVLink4 (450 GB/s) plus 5 us.
    assert p.p2p_ms == pytest.approx(33554432 / 450e9 * 1e3 + 0.005)
    assert p.source == {
        "kind": "analytic", "formula": "tfplan.cost.costmodel v2 (docs/cost-model.md)", "formula_version": 2,
        "model": "llama3.1-8b", "gpu": "h100", "mfu": 0.5, "link": "nvlink4", "microbatch_size": 2,
        "seq_len": 2048, "peak_bf16_tflops": 989.0, "hbm_gb_per_s": 3350.0, "link_gb_per_s": 450.0,
        "link_latency_us": 5.0,
    }
    assert p.name == "analytic-llama3.1-8b-h100-b2-t2048"


def test_profile_is_valid_json_profile():
    p = cm.analytic_profile("llama3-1b", "a100", 1, 1024, link="ib", step_overhead_ms=3.0)
    again = prof.from_dict(p.to_dict())
    assert again == p
    assert again.step_overhead_ms == 3.0 and again.source["link"] == "ib-hdr"


def test_partition_8b_into_4_stages():
    p = cm.analytic_profile("llama3-8b", "h200", 1, 2048)
    stages = p.stage_costs(4)
    first, rest = stages[0], stages[1:]
    assert first.name.startswith("embed..")
    # Stage 0 needs no input gradient: fully frozen backward and I are 0, W is the whole backward.
    assert first.backward_frozen_ms == 0.0 and first.backward_input_ms == 0.0
    assert first.backward_weight_ms == first.backward_ms > 0
    for stage in rest:
        assert 0 < stage.backward_frozen_ms < stage.backward_ms
        assert stage.backward_input_ms + stage.backward_weight_ms == pytest.approx(stage.backward_ms)
    assert math.fsum(s.forward_ms for s in stages) == pytest.approx(math.fsum(c.forward_ms for c in p.layers))
    # Balanced: no stage more than one block's F+B above the mean.
    totals = [s.forward_ms + s.backward_ms for s in stages]
    block = p.layers[1].forward_ms + p.layers[1].backward_ms
    assert max(totals) - sum(totals) / 4 < block


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"mfu": 0.0}, "mfu"), ({"mfu": 1.5}, "mfu"), ({"microbatch_size": 0}, "microbatch_size"),
     ({"seq_len": 2.5}, "seq_len"), ({"step_overhead_ms": -1.0}, "step_overhead_ms")],
)
def test_bad_arguments(kwargs, field):
    args = {"model": "llama3-8b", "gpu": "h100", "microbatch_size": 1, "seq_len": 2048} | kwargs
    with pytest.raises(TfplanError, match=field):
        cm.analytic_profile(**args)


def test_warns_when_matmuls_are_memory_bound():
    # H100 ridge point: 989e12 FLOP/s / 3.35e12 B/s ~ 295 FLOP per byte; 128 tokens is below it.
    with pytest.warns(UserWarning, match="ridge point"):
        cm.analytic_profile("llama3-8b", "h100", 1, 128)
