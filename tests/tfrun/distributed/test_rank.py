"""Rank assembly and data parallelism x pipeline parallelism on CPU (gloo): 2 replicas x 2 pipeline ranks
against 1 x 2 with twice the micro-batch, a single-process reference, and two "nodes" on one host."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip

# With the recipe's global clipping and weight decay (tfrun.optim): the norm spans both stages and replicas.
CLIP, DECAY = 1.0, 0.1
FAST = ["--seq-len", "32", "--quiet", "--steps", "5", "--lr", "1e-3", "--checkpoint-every", "5",
        "--clip-grad-norm", str(CLIP), "--weight-decay", str(DECAY), "--noise-every", "1",
        "--noise-measure", "sequence", "--eval-batches", "1"]  # (no test reads an eval loss)


def test_each_microbatch_is_the_same_sequences_whatever_the_replicas():
    torch = torch_or_skip()
    from tfrun.distributed.rank import replica_rows

    x = torch.arange(24).view(24, 1)  # global batch of 24 sequences, 4 micro-batches
    for dp in (1, 2, 3, 6):
        parts = [replica_rows(x, 4, dp, d) for d in range(dp)]
        for i in range(4):  # micro-batch i of every replica together = rows [6i, 6i + 6)
            rows = sorted(int(v) for d in range(dp) for v in parts[d].view(4, -1)[i])
            assert rows == list(range(6 * i, 6 * i + 6))


def _plan(tmp_path: Path) -> Path:
    from tfplan.cost import profile
    from tfplan.plan import plan
    from tfplan.schedule import schedules
    from tfplan.solve import solver
    from tfplan.step import dag

    prof = profile.uniform(2, name="unit")
    d = dag.build(schedules.generate("1f1b", 2, 4), prof)
    path = tmp_path / "plan.json"
    # cap 0.5: at 0.9 stage 1's tensors can be reached by one micro-batch a step, whose sequences may be too few
    # for an estimate at --dp 2 (noise_perseq Note [sequence subset]); 0.5 leaves every step an estimate
    plan.write(plan.make_plan(d, solver.solve(d, 0.5), [0.5, 0.5], prof), path)
    return path


def _args(out: Path, plan: Path, dp: int, mb: int) -> list[str]:
    return ["train", "--plan", str(plan), "--dp", str(dp), "--microbatch-size", str(mb), "--out", str(out), *FAST]


def _train(out: Path, plan: Path, dp: int, mb: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfrun", *_args(out, plan, dp, mb)], capture_output=True, text=True,
                          timeout=400)


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)]


def _noise(out: Path) -> list[list[float | None]]:
    return [json.loads(line)["noise_scale_tokens"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if "noise_scale_tokens" in json.loads(line)]


def _params(out: Path, ranks: int = 2) -> dict:
    import torch

    return {(s, n): t for r in range(ranks) for s, state in
            torch.load(out / "checkpoints" / "step0000005" / f"rank{r}.pt", weights_only=False)["models"].items()
            for n, t in state.items()}


def _reference(plan: Path, mb: int, steps: int = 5) -> dict:
    """One process, the whole model: the same batches, micro-batches and frozen sets (detached in the forward),
    the loss of each micro-batch divided by M, torch.nn.utils.clip_grad_norm_ at CLIP, AdamW with DECAY on
    tensors of two or more dimensions."""
    import torch

    from tfplan.plan import plan as plan_mod
    from tfrun.data import Batches, encode, load_corpus, split_tokens
    from tfrun.freeze.candidates import candidates
    from tfrun.freeze.freezing import Freezer
    from tfrun.models import MODELS, build_stage, loss_fn

    p = plan_mod.load(plan)
    m, cfg = p.schedule.num_microbatches, MODELS["tiny"]
    torch.set_num_threads(1)
    full = build_stage(cfg, 0, 1, 0)
    metas = {s: build_stage(cfg, s, 2, 0, device="meta") for s in range(2)}
    ratios = {(a.stage, a.mb): r for a, r in zip(p.dag.actions, p.ratios) if r > 0}
    freezer = Freezer({s: candidates(mod) for s, mod in metas.items()}, ratios, num_microbatches=m, seed=0)
    owner = {n: s for s, mod in metas.items() for n, _ in mod.named_parameters()}
    opt = torch.optim.AdamW([{"params": [p for p in full.parameters() if p.ndim >= 2], "weight_decay": DECAY},
                             {"params": [p for p in full.parameters() if p.ndim < 2], "weight_decay": 0.0}], lr=1e-3)
    train, _ = split_tokens(encode(load_corpus(None)))
    batches = Batches(train, global_batch=m * mb, seq_len=32, seed=0)
    params = dict(full.named_parameters())
    for step in range(steps):
        x, y = batches.batch_at(step)
        for j, (xs, ys) in enumerate(zip(x.chunk(m), y.chunk(m))):
            frozen = {n for n in params if n in freezer.selection(step, owner[n], j).names}
            out = torch.func.functional_call(full, {n: params[n].detach() for n in frozen}, (xs,))
            if out.requires_grad:  # else every parameter is frozen in this micro-batch
                (loss_fn(out, ys) / m).backward()
        torch.nn.utils.clip_grad_norm_(full.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: t.detach().clone() for n, t in full.named_parameters()}


@pytest.fixture(scope="module")
def dp2_run(tmp_path_factory) -> tuple[Path, Path]:
    """(plan, output folder) of one 5-step run of 2 replicas x 2 pipeline ranks (4 processes)."""
    torch_or_skip()
    tmp = tmp_path_factory.mktemp("dp2")
    plan = _plan(tmp)
    proc = _train(tmp / "dp2", plan, 2, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return plan, tmp / "dp2"


@pytest.mark.slow
def test_two_replicas_train_like_one_pipeline_with_twice_the_microbatch(dp2_run, tmp_path):
    from tests import shared_ranks

    plan, two = dp2_run  # launched for real: dp x ranks processes
    one = tmp_path / "dp1"  # one plain pipeline, on spawned ranks (tests/shared_ranks.py: no torchrun processes)
    proc = shared_ranks.run_one(["tfrun", *_args(one, plan, 1, 4)], tmp_path / "harness")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _losses(two) == pytest.approx(_losses(one), rel=1e-4)
    # Per-sequence noise scales (tfrun.freeze.noise Note [noise measure]) depend on the step's sequences only, not
    # on their grouping into replicas' micro-batches: equal at every measured step, frozen tensors and all (issue
    # 36 asks for 25% after the first five steps of a 30-step run; per micro-batch they differed up to 1.64x
    # there, docs/cost-model.md).
    noise_two, noise_one = _noise(two), _noise(one)
    assert len(noise_two) == len(noise_one) == 5 and None not in noise_one[-1]
    for a, b in zip(noise_two, noise_one):  # (None: |G|^2 not positive yet, in both)
        assert [x is None for x in a] == [y is None for y in b], (noise_two, noise_one)
        assert [x for x in a if x is not None] == pytest.approx([y for y in b if y is not None], rel=1e-3)
    summary = json.loads((two / "summary.json").read_text())
    assert summary["replicas_froze_alike"] is True and summary["dp"] == 2
    assert json.loads((two / "profile.json").read_text())["dp"] == 2
    # Only replica 0 times its actions (ActionTimer.measured): mixing both replicas' records gave a negative
    # dispatch cost, which the profile loader refuses.
    from tfplan.cost import profile as profile_mod

    assert profile_mod.load(str(two / "profile.json")).dispatch_ms >= 0.0
    a, b = _params(two), _params(one)
    assert a.keys() == b.keys()
    for key in a:
        _close(a[key], b[key])
    reference = _reference(plan, 4)
    for (_, name), t in b.items():
        _close(t, reference[name])


def _close(a, b, lr: float = 1e-3, steps: int = 5) -> None:
    """Equal up to float summation order. AdamW turns a gradient that is ~0 (an embedding row of a byte seen
    once) into a step of +-lr whose sign that order decides, so a few elements may differ by up to lr per step;
    all others agree to 1e-4 relative."""
    close = (a - b).abs() <= 1e-5 + 1e-4 * b.abs()
    assert close.float().mean() >= 0.999, f"{int((~close).sum())} of {close.numel()} elements differ"
    assert float((a - b).abs().max()) <= 2 * lr * steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_one_host_train_like_one(dp2_run, tmp_path):
    plan, single = dp2_run
    port, out = _free_port(), tmp_path / "nodes"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
         "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", "tfrun-test", "-m", "tfrun", "train", "--plan", str(plan), "--dp", "2", "--microbatch-size",
         "2", "--out", str(out), *FAST], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=400)
        assert p.returncode == 0, err[-3000:]
    assert _losses(out) == _losses(single)
