"""tfrun.models.hf and tfrun.records.export: Hugging Face LLaMA checkpoints in (logits equal transformers' for 1, 2
and 4 stages; a rank opens only its shards; every unsupported config field and damaged tensor refused by name)
and out (an export that transformers loads with our weights). One process; transformers is the reference."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import torch_or_skip

torch = torch_or_skip()
pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
pytest.importorskip("safetensors", reason="the hf extra")

from tests.hf_models import LLAMA3_ROPE, make_llama  # noqa: E402
from tfrun import models  # noqa: E402
from tfrun.models import ModelError, hf  # noqa: E402

VARIANTS = {  # name -> shape: tied and untied, grouped-query and multi-head attention, rope scalings
    "untied-gqa": {"tied": False, "kv_heads": 2},
    "tied-llama3-rope": {"tied": True, "kv_heads": 2, "rope_scaling": LLAMA3_ROPE},
    "untied-mha-linear-rope": {"tied": False, "kv_heads": 4, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {name: (root / name, make_llama(root / name, scale=20.0, **shape)) for name, shape in VARIANTS.items()}


def _tokens(n: int = 40, vocab: int = 300) -> torch.Tensor:
    return torch.randint(0, vocab, (2, n), generator=torch.Generator().manual_seed(0))


def _ours(folder, num_stages: int, tokens: torch.Tensor) -> torch.Tensor:
    h = tokens
    for s in range(num_stages):
        h = models.build(f"hf:{folder}", s, num_stages, seed=0)(h)
    return h


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_equal_transformers(checkpoints, variant):
    folder, reference = checkpoints[variant]
    tokens = _tokens()  # 40 positions: past the llama3 variant's original context of 16
    with torch.no_grad():
        expected = reference(tokens).logits
        assert expected.std() > 0.1  # logits that differ: the comparison means something
        for num_stages in (1, 2, 4):
            got = _ours(folder, num_stages, tokens)
            assert torch.allclose(got, expected, rtol=0, atol=1e-5), (num_stages, (got - expected).abs().max())


def test_transformers_4_config_format_reads_the_same(checkpoints, tmp_path):
    """transformers 4 wrote rope_theta and rope_scaling at the top level, 5 writes rope_parameters."""
    folder, reference = checkpoints["tied-llama3-rope"]
    old = tmp_path / "v4"
    shutil.copytree(folder, old)
    raw = json.loads((old / "config.json").read_text())
    params = raw.pop("rope_parameters")
    raw["rope_theta"] = params.pop("rope_theta")
    raw["rope_scaling"] = params
    (old / "config.json").write_text(json.dumps(raw))
    assert models.model_config(f"hf:{old}") == models.model_config(f"hf:{folder}")
    assert models.model_config(f"hf:{old}").rope_scaling.kind == "llama3"
    with torch.no_grad():
        assert torch.allclose(_ours(old, 2, _tokens()), reference(_tokens()).logits, rtol=0, atol=1e-5)


def test_a_rank_opens_only_the_shards_holding_its_tensors(tmp_path, monkeypatch):
    import safetensors

    folder = tmp_path / "sharded"
    make_llama(folder, shard_kb=20)
    weight_map = json.loads((folder / hf.INDEX).read_text())["weight_map"]
    opened: list[str] = []
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda path, *a, **k: opened.append(path) or real(path, *a, **k))
    cfg = models.model_config(f"hf:{folder}")
    every = set()
    for s in range(4):
        opened.clear()
        stage = models.build(f"hf:{folder}", s, 4, seed=0)
        own = {weight_map[hf.source_name(n, cfg)] for n, _ in stage.named_parameters()}
        assert {p.rsplit("/", 1)[1] for p in opened} == own  # its shards, no other
        every |= own
    assert len(set(weight_map.values())) > len(own) and every == set(weight_map.values())


def test_export_of_a_one_stage_tied_run_stays_tied(tmp_path):
    """export_hf's merge, naming, ties and sharding on a run folder made by hand (a real run: test_train)."""
    from transformers import LlamaForCausalLM

    from tfrun.config.train_config import TrainConfig
    from tfrun.records.export import export_hf

    folder = tmp_path / "src"
    make_llama(folder, tied=True, layers=2)
    run = tmp_path / "run"
    config = TrainConfig(order=[["0F0", "0B0"]], num_stages=1, num_microbatches=1, stage_to_rank=[0],
                         model=f"hf:{folder}", out_dir=str(run))
    run.mkdir()
    config.save(run / "run_config.json")
    stage = models.build(f"hf:{folder}", 0, 1, seed=0)
    with torch.no_grad():
        for p in stage.parameters():
            p.add_(0.5)  # "trained"
    _fake_checkpoint(run, {0: stage.state_dict()})
    result = export_hf(str(run), str(tmp_path / "out"), max_shard_bytes=30_000)
    assert result.tied and len(result.files) > 1 and (tmp_path / "out" / hf.INDEX).exists()
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "out")
    assert loaded.config.tie_word_embeddings
    theirs = dict(loaded.named_parameters())
    for name, p in stage.named_parameters():
        assert torch.equal(theirs[hf.hf_name(name)], p), name
    with pytest.raises(Exception, match="not an empty folder"):
        export_hf(str(run), str(tmp_path / "out"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(Exception, match="afile is a file, not a folder"):  # (a FileExistsError traceback before)
        export_hf(str(run), str(tmp_path / "afile" / "hf"))
    assert export_hf(str(run), str(tmp_path / "step1"), step=1).step == 1
    with pytest.raises(Exception, match="checkpoint step 5: no such checkpoint"):
        export_hf(str(run), str(tmp_path / "step5"), step=5)
    assert not (tmp_path / "step5").exists()


def _fake_checkpoint(run, states: dict) -> None:
    """A complete one-rank checkpoint at step 1 (index with size and sha256, latest.json)."""
    import hashlib

    folder = run / "checkpoints" / "step0000001"
    folder.mkdir(parents=True)
    torch.save({"step": 1, "models": states}, folder / "rank0.pt")
    blob = (folder / "rank0.pt").read_bytes()
    index = {"schema_version": 1, "step": 1, "world_size": 1, "time": 0.0, "run": {},
             "files": {"rank0.pt": {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}}}
    (folder / "index.json").write_text(json.dumps(index))
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"step": 1, "world_size": 1}))


# -- refusals: each one line naming the file and the field or tensor -------------------------------------------


def _edit_config(folder, **changes):
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("changes, message", [  # (every field's rule: tests/tfrun/models/test_hf_config.py)
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type 'gpt2'.*not a family tfrun reads"),
    ({"hidden_act": "gelu"}, "hidden_act = \"gelu\" is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope_type 'yarn' is not supp"),
    ({"num_hidden_layers": "four"}, "num_hidden_layers: must be an integer"),
])
def test_config_refusals(tmp_path, changes, message):
    folder = tmp_path / "m"
    make_llama(folder, layers=2)
    _edit_config(folder, **changes)
    with pytest.raises(ModelError, match=message) as info:
        models.model_config(f"hf:{folder}")
    assert "config.json" in str(info.value) and "\n" not in str(info.value)


def test_a_tied_config_whose_file_holds_another_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "m"
    make_llama(folder, layers=2, tied=True)
    tensors = load_file(folder / hf.WEIGHTS)
    assert "lm_head.weight" not in tensors  # save_pretrained stores a tied head once
    save_file(tensors | {"lm_head.weight": tensors["model.embed_tokens.weight"].clone()}, folder / hf.WEIGHTS,
              metadata={"format": "pt"})
    models.check(f"hf:{folder}")  # a copy of the embedding: tied in fact
    save_file(tensors | {"lm_head.weight": tensors["model.embed_tokens.weight"] + 1e-3}, folder / hf.WEIGHTS,
              metadata={"format": "pt"})
    with pytest.raises(ModelError, match="lm_head.weight differs from model.embed_tokens.weight: the checkpoint "
                                         "is not tied in fact; set tie_word_embeddings to false"):
        models.check(f"hf:{folder}")


def test_biases_in_the_file_and_in_the_config_must_agree(tmp_path):
    from safetensors.torch import load_file, save_file

    from tests.hf_models import make_family

    folder = tmp_path / "q"
    make_family(folder, "qwen2", layers=2)
    models.check(f"hf:{folder}")
    tensors = load_file(folder / hf.WEIGHTS)
    save_file({k: v for k, v in tensors.items() if k != "model.layers.1.self_attn.k_proj.bias"}, folder / hf.WEIGHTS,
              metadata={"format": "pt"})
    with pytest.raises(ModelError, match="no tensor model.layers.1.self_attn.k_proj.bias"):
        models.check(f"hf:{folder}")
    llama = tmp_path / "l"
    make_llama(llama, layers=2)
    extra = load_file(llama / hf.WEIGHTS) | {"model.layers.0.self_attn.q_proj.bias": torch.zeros(32)}
    save_file(extra, llama / hf.WEIGHTS, metadata={"format": "pt"})
    with pytest.raises(ModelError, match="q_proj.bias has no place in tfrun's model.*biases config.json does not"):
        models.check(f"hf:{llama}")


def test_tensor_refusals(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "m"
    make_llama(folder, layers=2, shard_kb=20)
    name = f"hf:{folder}"
    models.check(name)  # intact
    weight_map = json.loads((folder / hf.INDEX).read_text())["weight_map"]
    shard = weight_map["model.layers.1.mlp.up_proj.weight"]
    original = (folder / shard).read_bytes()

    (folder / shard).write_bytes(original[: len(original) // 2])
    with pytest.raises(ModelError, match=f"{shard}: not a complete safetensors file"):
        models.check(name)
    (folder / shard).unlink()
    with pytest.raises(ModelError, match=f"names shard {shard}, which is missing"):
        models.check(name)
    (folder / shard).write_bytes(original)
    tensors = load_file(folder / shard)
    for key, bad, message in (("model.layers.1.mlp.up_proj.weight", torch.zeros(3, 3), "has shape \\[3, 3\\]"),
                              ("model.layers.1.mlp.up_proj.weight", torch.zeros(48, 32, dtype=torch.int64),
                               "has dtype I64, expected a floating-point type")):
        if key in tensors:
            save_file(tensors | {key: bad}, folder / shard, metadata={"format": "pt"})
            with pytest.raises(ModelError, match=message):
                models.check(name)
    save_file(tensors, folder / shard, metadata={"format": "pt"})
    models.check(name)  # intact again
    index = json.loads((folder / hf.INDEX).read_text())
    del index["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    (folder / hf.INDEX).write_text(json.dumps(index))
    with pytest.raises(ModelError, match="no tensor model.layers.1.mlp.up_proj.weight"):
        models.check(name)
