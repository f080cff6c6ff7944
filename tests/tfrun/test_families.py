"""The Qwen2, Qwen3 and Mistral families end to end on 2 gloo ranks (Note [families] in tfrun.models.shape): for a
small random checkpoint of each, saved by transformers, `tfrun train --model hf:DIR` makes the same losses as a
plain transformers + torch loop on the same batches (its first loss is transformers' on that batch), its measured
profile names the checkpoint, and `tfrun export` writes a folder that `from_pretrained` loads with the trained
weights and the loop's loss. transformers is the reference (dev extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip
from tests.tfrun.test_train import FAST, _losses, _plan

pytestmark = pytest.mark.slow

FAMILIES = ("qwen2", "qwen3", "mistral")
STEPS, LR, M = 3, "1e-2", 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch_or_skip()
    pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
    from tests import shared_ranks
    from tests.hf_models import make_family

    root = tmp_path_factory.mktemp("families")
    plan = _plan(root, m=M)
    commands = []
    for family in FAMILIES:
        make_family(root / family, family, seed=3, scale=5.0)
        commands.append((["tfrun", "train", "--plan", str(plan), "--freeze", "none", "--model",
                          f"hf:{root / family}", "--steps", str(STEPS), "--lr", LR, "--eval-batches", "1", "--out",
                          str(root / "runs" / family), *FAST], {}))
    results = shared_ranks.run(commands, 2, root / "harness")
    for family, proc in zip(FAMILIES, results):
        assert proc.returncode == 0, (family, proc.stderr[-3000:])
    return root


def _reference_losses(folder: Path, steps: int) -> tuple[list[float], object, tuple]:
    """The same training in a plain loop: transformers' model, tfrun's batches (tfrun.data: the same sequences in
    the same order), the step's loss the mean of its micro-batches' mean token losses, AdamW without decay."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from tfrun.data import Batches, rank_tokens, split_microbatches, split_tokens

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(LR), weight_decay=0.0)
    train, _ = split_tokens(rank_tokens(None, token_cache=None, token_dtype="uint16"))
    batches = Batches(train, global_batch=2 * M, seq_len=32, seed=0)
    losses = []
    for step in range(steps + 1):
        x, y = batches.batch_at(step)
        if step == steps:  # the batch after training: the exported model's loss is checked on it
            return losses, model, (x, y)
        total = 0.0
        for xm, ym in zip(split_microbatches(x, M), split_microbatches(y, M)):
            loss = F.cross_entropy(model(xm).logits.float().flatten(0, 1), ym.flatten())
            (loss / M).backward()
            total += loss.item() / M
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("family", FAMILIES)
def test_training_equals_a_transformers_loop_and_the_export_loads(trained, family, tmp_path):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from tfrun.cli.app import app
    from tfrun.models import hf
    from tfrun.records.export import merged_weights

    out = trained / "runs" / family
    expected, reference, (x, y) = _reference_losses(trained / family, STEPS)
    ours = _losses(out)
    assert ours[0] == pytest.approx(expected[0], abs=1e-5)  # the first loss: transformers' on the same batch
    assert ours == pytest.approx(expected, abs=1e-5) and ours[-1] < ours[0]
    profile = json.loads((out / "profile.json").read_text())
    assert profile["source"]["model"] == f"hf:{(trained / family).resolve()}" and profile["stages"]

    result = CliRunner().invoke(app, ["export", str(out), "--hf", str(tmp_path / "exported")])
    assert result.exit_code == 0, result.output
    raw = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert raw["model_type"] == family
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", dtype=torch.float32).eval()
    theirs = dict(loaded.named_parameters())
    for name, tensor in merged_weights(out, 2, STEPS).items():
        assert torch.equal(theirs[hf.hf_name(name)], tensor), name
    with torch.no_grad():
        exported = F.cross_entropy(loaded(x).logits.flatten(0, 1), y.flatten()).item()
        looped = F.cross_entropy(reference.eval()(x).logits.flatten(0, 1), y.flatten()).item()
    assert exported == pytest.approx(looped, abs=1e-5)
