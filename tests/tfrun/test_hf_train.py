"""Fine-tuning end to end on 2 gloo ranks: `tfrun train --model hf:DIR` (a random LLaMA saved by transformers)
on jsonl documents through a BPE tokenizer trained here; the loss falls; `tfrun export` writes a folder that
transformers loads with exactly the trained weights; the cached token stream, given back as a `.bin` file,
resumes the mid-run checkpoint with the same losses. Two short runs share one checkpoint, tokenizer and corpus."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip
from tests.tfrun.test_train import FAST, _losses, _plan

pytestmark = pytest.mark.slow


def _run(args: list[str], work: Path) -> subprocess.CompletedProcess:
    """`tfrun ARGS` on spawned ranks (tests/shared_ranks.py: tfrun's CLI, launcher and worker without torchrun's
    processes, whose start-up costs more than these runs; real launches are tested in tests/tfrun/test_train.py)."""
    from tests import shared_ranks

    return shared_ranks.run_one(["tfrun", *args], work)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch_or_skip()
    pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
    from tests.hf_models import make_llama
    from tests.tokenizer_fixture import corpus_documents, train_tokenizer, write_jsonl

    root = tmp_path_factory.mktemp("finetune")
    make_llama(root / "ckpt", tied=True, vocab=320, layers=4, seed=1)
    tok = train_tokenizer(root / "tokenizer.json")
    data = write_jsonl(root / "docs.jsonl", corpus_documents()[:200])
    args = ["train", "--plan", str(_plan(root)), "--model", f"hf:{root / 'ckpt'}", "--lr", "3e-3", *FAST]
    out = root / "runs" / "a"
    proc = _run([*args, "--tokenizer", str(tok), "--data", str(data), "--steps", "6", "--checkpoint-every", "3",
                 "--out", str(out)], root / "harness-a")
    assert proc.returncode == 0, proc.stderr
    return root, args, tok, data, out


def test_loss_falls_and_the_run_records_the_checkpoint(setup):
    root, _, _, _, out = setup
    losses = _losses(out)
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.05, losses
    config = json.loads((out / "run_config.json").read_text())
    assert config["model"] == f"hf:{(root / 'ckpt').resolve()}" and config["model_hash"].startswith("sha256:")
    assert config["token_cache"].startswith(str(root / "runs" / "token-cache"))
    profile = json.loads((out / "profile.json").read_text())
    assert profile["source"]["model_hash"] == config["model_hash"] and profile["source"]["dtype"] == "float32"


def test_export_loads_in_transformers_with_the_trained_weights(setup):
    import torch
    from transformers import LlamaForCausalLM
    from typer.testing import CliRunner

    from tfrun.cli.app import app
    from tfrun.models import hf
    from tfrun.records.export import merged_weights

    root, _, _, _, out = setup
    result = CliRunner().invoke(app, ["export", str(out), "--hf", str(root / "exported")])
    assert result.exit_code == 0, result.stderr
    assert "untied" not in result.stderr  # a tied model trained on two stages stays tied (Note [exported ties])
    assert json.loads((root / "exported" / "config.json").read_text())["tie_word_embeddings"] is True
    loaded = dict(LlamaForCausalLM.from_pretrained(root / "exported").named_parameters())
    original = dict(LlamaForCausalLM.from_pretrained(root / "ckpt").named_parameters())
    ours = merged_weights(out, 2, 6)
    assert "head.weight" not in ours  # stored once, as the embedding
    assert {hf.hf_name(n) for n in ours} == set(loaded)
    for name, tensor in ours.items():
        assert torch.equal(loaded[hf.hf_name(name)], tensor), name
    assert not torch.equal(loaded["model.layers.0.mlp.up_proj.weight"], original["model.layers.0.mlp.up_proj.weight"])


def test_resume_from_the_cached_stream_as_a_bin_file_continues_the_same_losses(setup):
    """The tokenized stream given back as a .bin file is the same data (its identity is the token stream's), so
    resuming the tokenized run's mid-run checkpoint on it continues bit for bit: the .bin trains exactly as
    the tokenized text did, and a resume is exact. (A second run reading the cache without tokenizing again:
    tests/tfrun/data/test_sources.py.)"""
    root, args, _, _, out = setup
    token_file = json.loads((out / "run_config.json").read_text())["token_cache"]
    part = root / "runs" / "b"
    shutil.copytree(out, part)
    shutil.rmtree(part / "checkpoints" / "step0000006")
    (part / "checkpoints" / "latest.json").write_text(json.dumps({"step": 3, "world_size": 2}))
    proc = _run([*args, "--data", token_file, "--token-dtype", "uint16", "--steps", "6", "--resume", str(part)],
                root / "harness-b")
    assert proc.returncode == 0, proc.stderr
    assert _losses(part) == _losses(out)  # bitwise
