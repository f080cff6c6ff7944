"""The README's fine-tuning tour end to end on 2 gloo ranks: a random tied Qwen2-family checkpoint, its tokenizer
with a chat template and chat data made by examples/chat_checkpoint.py; `tfrun train` on the chat rows (loss on
the answers) keeps the tie, its loss falls, and `tfrun export` writes a tied Qwen2 folder that transformers loads
(model and tokenizer) with our weights and our token ids. transformers is the reference (dev extra)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip
from tests.tfrun.test_train import _losses, _plan

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    torch_or_skip()
    pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
    from tests import shared_ranks

    root = tmp_path_factory.mktemp("tour")
    made = subprocess.run([sys.executable, str(ROOT / "examples" / "chat_checkpoint.py"), "--out", str(root / "ckpt")],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    out = root / "runs" / "chat-ft"
    proc = shared_ranks.run_one(["tfrun", "train", "--plan", str(_plan(root, m=4)), "--model", f"hf:{root / 'ckpt'}",
                                 "--tokenizer", str(root / "ckpt" / "tokenizer.json"), "--data",
                                 str(root / "ckpt" / "chats.jsonl"), "--microbatch-size", "2", "--seq-len", "128",
                                 "--lr", "3e-3", "--steps", "8", "--quiet", "--out", str(out)], root / "harness")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, out


def test_training_on_chat_rows_keeps_the_tie_and_learns(tour):
    root, out = tour
    losses = _losses(out)
    assert losses[-1] < losses[0] - 0.1, losses
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tied_copies_agree"] is True
    meta = json.loads(Path(json.loads((out / "run_config.json").read_text())["token_cache"]).with_suffix(".json")
                      .read_text())
    assert meta["masked"] and 0 < meta["counted_tokens"] < meta["num_tokens"]
    assert meta["chat_template"].endswith("tokenizer_config.json")  # found beside --tokenizer


def test_the_export_loads_in_transformers_tied_with_our_weights_and_tokens(tour, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from typer.testing import CliRunner

    from tfrun.cli.app import app
    from tfrun.data import tokenized
    from tfrun.models import hf
    from tfrun.records.export import merged_weights

    root, out = tour
    result = CliRunner().invoke(app, ["export", str(out), "--hf", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    theirs = dict(model.named_parameters())
    for name, tensor in merged_weights(out, 2, 8).items():
        assert torch.equal(theirs[hf.hf_name(name)], tensor), name
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    first = json.loads((root / "ckpt" / "chats.jsonl").read_text().splitlines()[0])["messages"]
    ids = tok.apply_chat_template(first, tokenize=True, return_dict=True)["input_ids"]
    cache = json.loads((out / "run_config.json").read_text())["token_cache"]
    stream = tokenized.open_entry(Path(cache), tokenized.cache_meta(Path(cache)))
    assert list(stream.ids[: len(ids)]) == list(ids)  # the run trained on transformers' tokens
