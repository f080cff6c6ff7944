"""tfrun.models.hf_config: config files as users bring them (Note [config fields by effect]). The published configs
of five open checkpoints (tests/golden/hf-configs) and the files transformers' `save_pretrained` writes for every
family load; every field that changes the forward in a way tfrun does not implement is refused with one line
naming it; metadata is accepted; unknown fields warn, or are refused where their name speaks of the forward."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip

torch_or_skip()
from tfrun.models import ModelError, hf_config  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "hf-configs"
PUBLISHED = {  # file -> fields of the ModelConfig it must give
    "llama3.1-8b.json": {"family": "llama", "dim": 4096, "n_layers": 32, "n_kv_heads": 8, "tie_embeddings": False,
                         "head_dim": 128, "rope_theta": 500000.0, "qkv_bias": False, "sliding_window": None},
    "llama3.2-1b.json": {"family": "llama", "dim": 2048, "n_layers": 16, "tie_embeddings": True, "head_dim": 64,
                         "attn_head_dim": None},
    "qwen2.5-0.5b.json": {"family": "qwen2", "dim": 896, "n_heads": 14, "n_kv_heads": 2, "tie_embeddings": True,
                          "qkv_bias": True, "out_bias": False, "qk_norm": False, "sliding_window": None,
                          "norm_eps": 1e-6, "rope_theta": 1e6},
    "qwen3-0.6b.json": {"family": "qwen3", "dim": 1024, "n_heads": 16, "head_dim": 128, "attn_head_dim": 128,
                        "qk_norm": True, "qkv_bias": False, "tie_embeddings": True, "sliding_window": None},
    "mistral-7b-v0.1.json": {"family": "mistral", "dim": 4096, "vocab_size": 32000, "sliding_window": 4096,
                             "tie_embeddings": False, "max_seq_len": 32768},
}


def _read(raw: dict, tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return hf_config.read_config(path, raw)


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_published_configs_load(name, tmp_path, caplog):
    raw = json.loads((GOLDEN / name).read_text())
    with caplog.at_level(logging.WARNING):
        cfg = _read(raw, tmp_path)
    for field, value in PUBLISHED[name].items():
        assert getattr(cfg, field) == value, (name, field)
    assert "ignoring fields" not in caplog.text  # every field of a published config is known


@pytest.mark.parametrize("family", ["llama", "llama-biases", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("diff", [True, False], ids=["save_pretrained", "every-default"])
def test_what_transformers_writes_loads(family, diff, tmp_path):
    """`save_pretrained`'s config.json (only what differs from the defaults), and the same config with every field
    transformers' config classes define written out (use_diff=False)."""
    pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
    from tests.hf_models import family_config

    path = tmp_path / "config.json"
    family_config(family, tied=family == "qwen2").to_json_file(path, use_diff=diff)
    raw = json.loads(path.read_text())
    cfg = hf_config.read_config(path, raw)
    assert cfg.family == family.split("-")[0] and cfg.dim == 32 and cfg.n_layers == 4
    assert cfg.qkv_bias == (family in ("qwen2", "llama-biases")) and cfg.mlp_bias == (family == "llama-biases")
    assert cfg.qk_norm == (family == "qwen3") and (cfg.head_dim == 16) == (family == "qwen3")
    assert cfg.sliding_window == (64 if family == "mistral" else None)


def test_metadata_token_ids_and_generation_settings_are_accepted(tmp_path, caplog):
    raw = json.loads((GOLDEN / "llama3.2-1b.json").read_text()) | {
        "_name_or_path": "meta-llama/Llama-3.2-1B", "_commit_hash": "4e20de362430cd3b72f300e6b0f18e50e7166e08",
        "_attn_implementation_autoset": True, "unk_token_id": None, "pad_token_id": 128004, "temperature": 0.6,
        "top_p": 0.9, "do_sample": True, "max_length": 4096, "output_hidden_states": False, "torchscript": False,
        "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": False}, "id2label": {"0": "A"}}
    with caplog.at_level(logging.WARNING):
        assert _read(raw, tmp_path).dim == 2048
    assert "ignoring fields" not in caplog.text


def test_unknown_fields_warn_once_unless_their_name_speaks_of_the_forward(tmp_path, caplog):
    base = json.loads((GOLDEN / "qwen3-0.6b.json").read_text())
    hf_config._warn_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # every rank and tool reads the file: one warning
            _read(base | {"release_notes": "v2", "lab_score": 3}, tmp_path)
    assert caplog.text.count("ignoring fields tfrun does not know: release_notes, lab_score") == 1
    _read(base | {"num_experts": 0, "final_logit_softcapping": None}, tmp_path)  # inert values of such fields
    for field, value in (("final_logit_softcapping", 30.0), ("num_experts", 8), ("residual_dropout", 0.1),
                         ("partial_rotary_factor", 0.5)):
        with pytest.raises(ModelError, match=f"field '{field}' = {value} may change the model"):
            _read(base | {field: value}, tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type 'gpt2'.*not a family tfrun reads"),
    ({"hidden_act": "gelu"}, "hidden_act = \"gelu\" is not supported"),
    ({"attention_dropout": 0.1}, "attention_dropout = 0.1 is not supported"),
    ({"add_cross_attention": True}, "add_cross_attention = true is not supported"),
    ({"is_encoder_decoder": True}, "is_encoder_decoder = true is not supported"),
    ({"sliding_window": 4096}, "sliding_window = 4096 is not a llama field tfrun reads"),
    ({"mlp_bias": "yes"}, "mlp_bias: must be true or false"),
    ({"attention_bias": 1}, "attention_bias: must be true or false"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn' is not supp"),
    ({"head_dim": 7}, "rotary embeddings need an even head width, got 7"),
    ({"num_hidden_layers": "four"}, "num_hidden_layers: must be an integer"),
])
def test_forward_changing_fields_are_refused_by_name(tmp_path, changes, message):
    raw = json.loads((GOLDEN / "llama3.1-8b.json").read_text()) | changes
    with pytest.raises(ModelError, match=message) as info:
        _read(raw, tmp_path)
    assert "config.json" in str(info.value) and "\n" not in str(info.value)


def test_the_families_windows_as_transformers_reads_them(tmp_path):
    qwen = json.loads((GOLDEN / "qwen2.5-0.5b.json").read_text())
    assert _read(qwen | {"use_sliding_window": True}, tmp_path).sliding_window == 32768
    layers = ["full_attention"] * 20 + ["sliding_attention"] * 4  # transformers 5's layer_types
    assert _read(qwen | {"layer_types": layers}, tmp_path).sliding_window == 32768
    assert _read(qwen | {"layer_types": ["full_attention"] * 24}, tmp_path).sliding_window is None
    mistral = json.loads((GOLDEN / "mistral-7b-v0.1.json").read_text())
    assert _read({k: v for k, v in mistral.items() if k != "sliding_window"}, tmp_path).sliding_window == 4096
    assert _read(mistral | {"sliding_window": None}, tmp_path).sliding_window is None
    with pytest.raises(ModelError, match="sliding_window: must be a positive integer"):
        _read(mistral | {"sliding_window": -1}, tmp_path)
    qwen3 = json.loads((GOLDEN / "qwen3-0.6b.json").read_text())
    assert _read({k: v for k, v in qwen3.items() if k != "head_dim"}, tmp_path).head_dim == 128  # Qwen3's default


def test_a_sequence_longer_than_the_sliding_window_is_refused(tmp_path):
    pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
    from tests.hf_models import make_family
    from tfrun.config.train_config import TrainConfig
    from tfrun.errors import TfrunError

    make_family(tmp_path / "m", "mistral", layers=2)  # sliding_window 64
    config = dict(order=[["0F0", "0B0"]], num_stages=1, num_microbatches=1, stage_to_rank=[0],
                  model=f"hf:{tmp_path / 'm'}")
    TrainConfig(**config, seq_len=64).check()
    with pytest.raises(TfrunError, match="--seq-len 65 exceeds model .* sliding_window 64"):
        TrainConfig(**config, seq_len=65).check()
