"""Tied embeddings kept tied across pipeline stages (tfrun.distributed.tied Note [tied embeddings across stages]):
a tied checkpoint trained on 2, 3 and 4 stages, at dp 2, and on the V schedule that puts both copies on one rank,
with clipping on, makes the losses and weights of the single-process run, where the two are one parameter (1e-6),
and the losses of a transformers + torch loop (1e-5: another implementation's float32 rounding, which Adam's
normalised steps amplify in the weights of tiny gradients); its two
copies end bit-identical, also under freezing; checkpoints store the matrix once, a resume continues bit for bit,
and the export comes back tied. transformers is the second reference (dev extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip
from tests.tfrun.test_train import _losses, _plan

pytestmark = pytest.mark.slow

STEPS, LR, CLIP, M, MB, SEQ = 4, "2e-3", "0.5", 4, 2, 32
COMMON = ["--steps", str(STEPS), "--lr", LR, "--clip-grad-norm", CLIP, "--microbatch-size", str(MB), "--seq-len",
          str(SEQ), "--quiet", "--eval-batches", "1"]  # (no test reads an eval loss)
RUNS = {  # name -> (world size, plan's (schedule, ranks), extra options)
    "s1": (1, ("1f1b", 1), ["--freeze", "none"]),  # the single-process reference: one tied parameter
    "s2": (2, ("1f1b", 2), ["--freeze", "none", "--checkpoint-every", "2"]),
    "s2-frozen": (2, ("1f1b", 2), ["--freeze", "plan"]),
    "zbv": (2, ("zbv", 2), ["--freeze", "none"]),  # 4 stages; rank 0 holds stages 0 and 3: both copies
    "s3": (3, ("1f1b", 3), ["--freeze", "none"]),
    "s4": (4, ("1f1b", 4), ["--freeze", "none"]),
    "s2-dp2": (4, ("1f1b", 2), ["--freeze", "none", "--dp", "2", "--global-batch", str(MB * M)]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch_or_skip()
    pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
    from tests import shared_ranks
    from tests.hf_models import make_llama

    root = tmp_path_factory.mktemp("tied")
    make_llama(root / "ckpt", tied=True, vocab=300, layers=4, seed=1, scale=3.0)
    by_world: dict[int, list] = {}
    for name, (world, (schedule, ranks), extra) in RUNS.items():
        plan = _plan(root, schedule=schedule, ranks=ranks, m=M)
        by_world.setdefault(world, []).append((name, ["tfrun", "train", "--plan", str(plan), "--model",
                                                      f"hf:{root / 'ckpt'}", "--out", str(root / name), *COMMON,
                                                      *extra]))
    for world, jobs in sorted(by_world.items()):
        results = shared_ranks.run([(argv, {}) for _, argv in jobs], world, root / f"harness{world}")
        for (name, _), proc in zip(jobs, results):
            assert proc.returncode == 0, (name, proc.stderr[-3000:])
    return root


def _reference(folder: Path) -> tuple[list[float], dict]:
    """The single-process loop: transformers' tied model (one parameter), tfrun's batches, the mean of the
    micro-batches' mean token losses, the norm clipped over the whole model, AdamW without decay."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    from tfrun.data import Batches, rank_tokens, split_microbatches, split_tokens

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(LR), weight_decay=0.0)
    train, _ = split_tokens(rank_tokens(None, token_cache=None, token_dtype="uint16"))
    batches = Batches(train, global_batch=MB * M, seq_len=SEQ, seed=0)
    losses = []
    for step in range(STEPS):
        x, y = batches.batch_at(step)
        total = 0.0
        for xm, ym in zip(split_microbatches(x, M), split_microbatches(y, M)):
            loss = F.cross_entropy(model(xm).logits.float().flatten(0, 1), ym.flatten())
            (loss / M).backward()
            total += loss.item() / M
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(CLIP))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses, {name: p.detach() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def reference(runs):
    return _reference(runs / "ckpt")


def _exported(run: Path, out: Path) -> tuple[dict, dict]:
    from transformers import LlamaForCausalLM
    from typer.testing import CliRunner

    from tfrun.cli.app import app

    result = CliRunner().invoke(app, ["export", str(run), "--hf", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    model = LlamaForCausalLM.from_pretrained(out)
    return config, {name: p.detach() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def single(runs, tmp_path_factory):
    """The single-process run's losses and exported weights."""
    return _losses(runs / "s1"), _exported(runs / "s1", tmp_path_factory.mktemp("s1") / "hf")[1]


@pytest.mark.parametrize("name", ["s1", "s2", "zbv", "s3", "s4", "s2-dp2"])
def test_pipeline_equals_the_single_process_reference(runs, single, reference, name, tmp_path):
    import torch

    one_losses, one_weights = single
    losses = reference[0]
    assert _losses(runs / name) == pytest.approx(one_losses, abs=1e-6)
    assert _losses(runs / name) == pytest.approx(losses, abs=1e-5)
    summary = json.loads((runs / name / "summary.json").read_text())
    assert summary.get("tied_copies_agree", True) is True and (name == "s1") == ("tied_copies_agree" not in summary)
    config, exported = _exported(runs / name, tmp_path / "hf")
    assert config["tie_word_embeddings"] is True and "lm_head.weight" not in exported  # stored once
    assert set(exported) == set(reference[1]) == set(one_weights)
    # Two replicas average their gradients ((g_a + g_b) / 2) where one process sums them, a rounding that Adam's
    # normalisation amplifies where a gradient is near zero: 3.0e-6 at most after 4 steps in a fresh environment of
    # 2026-12-07 (o_proj of layer 2), against 1e-6 without data parallelism
    atol = 1e-5 if name.endswith("dp2") else 1e-6
    for key, value in one_weights.items():
        assert torch.allclose(exported[key], value, rtol=0, atol=atol), (key, (exported[key] - value).abs().max())


def test_freezing_keeps_the_copies_identical_and_checkpoints_store_the_matrix_once(runs):
    import torch

    frozen = json.loads((runs / "s2-frozen" / "summary.json").read_text())
    assert frozen["tied_copies_agree"] is True and max(frozen["realised_freeze_ratio"]) > 0.5
    last = torch.load(runs / "s2" / "checkpoints" / f"step{STEPS:07d}" / "rank1.pt", weights_only=False)
    first = torch.load(runs / "s2" / "checkpoints" / f"step{STEPS:07d}" / "rank0.pt", weights_only=False)
    assert "head.weight" not in last["models"][1] and "embed.weight" in first["models"][0]
    # the head's AdamW state is not stored either: rank 1's optimizer holds one tensor's state fewer than its
    # parameters
    params = sum(len(g["params"]) for g in last["optimizer"]["param_groups"])
    assert len(last["optimizer"]["state"]) == params - 1


def test_a_resume_restores_the_copy_and_continues_bit_for_bit(runs, tmp_path):
    import shutil

    from tests import shared_ranks

    part = tmp_path / "part"
    shutil.copytree(runs / "s2", part)
    shutil.rmtree(part / "checkpoints" / f"step{STEPS:07d}")
    (part / "checkpoints" / "latest.json").write_text(json.dumps({"step": 2, "world_size": 2}))
    plan = runs / f"plan-1f1b-2-{M}.json"  # the run's own (a resume keeps its plan)
    proc = shared_ranks.run_one(["tfrun", "train", "--plan", str(plan), "--model", f"hf:{runs / 'ckpt'}", "--out",
                                 str(part), "--resume", str(part), *COMMON, "--freeze", "none"], tmp_path / "h")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _losses(part) == _losses(runs / "s2")  # bitwise
    assert json.loads((part / "summary.json").read_text())["tied_copies_agree"] is True
