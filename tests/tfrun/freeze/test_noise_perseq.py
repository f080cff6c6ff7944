"""tfrun.freeze.noise_perseq (Note [per-sequence norms]): the per-sequence |g_i|^2 sums its hooks compute alongside
one backward equal those of explicit per-sequence backward passes, per tensor; a split backward (I of two
micro-batches, then their W in the other order) and tensors frozen in a micro-batch (detached in its forward,
or left out of its backward) count exactly the micro-batches that gave the tensor a gradient; and the estimate
does not depend on how a step's sequences are grouped into micro-batches (the --dp 1 / --dp 2 case; the real
two-replica run is in tests/tfrun/distributed/test_rank.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tfrun.freeze.candidates import candidates  # noqa: E402
from tfrun.freeze.noise import NoiseMeter  # noqa: E402
from tfrun.freeze.noise_perseq import (  # noqa: E402
    STRIDE,
    SequenceNorms,
    SharedInput,
    chosen_rows,
    embedding_sq,
    linear_sq,
    projections,
)
from tfrun.models import MODELS, build_stage, loss_fn  # noqa: E402

B, T = 3, 16


def _stages(dtype=torch.float64) -> dict:
    torch.manual_seed(0)
    return {s: build_stage(MODELS["tiny"], s, 2, 0).to(dtype) for s in (0, 1)}


def _chain(stages: dict, x, params: dict | None = None):
    for s in sorted(stages):
        x = stages[s](x) if not params or s not in params else torch.func.functional_call(stages[s], params[s], (x,))
    return x


def _explicit(stages: dict, x, y) -> dict[tuple[int, str], float]:
    """(stage, tensor) -> sum over the sequences of |gradient of the sequence's mean token loss|^2."""
    named = {(s, n): p for s, m in stages.items() for n, p in m.named_parameters()}
    out = dict.fromkeys(named, 0.0)
    for j in range(x.shape[0]):
        grads = torch.autograd.grad(loss_fn(_chain(stages, x[j:j + 1]), y[j:j + 1]), list(named.values()))
        for key, g in zip(named, grads):
            out[key] += float(g.double().square().sum())
    return out


def _batch(n: int = B, seed: int = 0, t: int = T):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, t), generator=gen), torch.randint(0, 256, (n, t), generator=gen)


@pytest.mark.parametrize("dtype,rel", [(torch.float64, 1e-6), (torch.float32, 1e-4)])
def test_hooks_equal_explicit_per_sequence_backward_passes(dtype, rel) -> None:
    # every tensor kind of the tiny model: embedding, RMSNorm weights, linear weights (both the Gram and the
    # materialised path: T (d_in + d_out) against d_in d_out) and the head. (loss_fn runs in float32, so float64
    # agrees to ~1e-7.)
    stages = _stages(dtype)
    names = {s: [c.name for c in candidates(m)] for s, m in stages.items()}
    norms = SequenceNorms(stages, names, stride=1, sketch=0)  # exact norms (the sketch's are tested below)
    assert all(bool(m.all()) for m in norms.measured.values())  # every tensor of the model has a per-sequence value
    x, y = _batch()
    expected = _explicit(stages, x, y)  # (before the hooks are active)
    norms.active = True
    loss_fn(_chain(stages, x), y).backward()
    for s, stage_names in names.items():
        for i, name in enumerate(stage_names):
            value, sequences, rows = norms.take(s, i)
            assert sequences == rows == B
            assert float(value) == pytest.approx(expected[(s, name)], rel=rel), (s, name)
    norms.close()


def test_linear_bias_gram_path_and_padding_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    for t in (2, 64):  # 2 x 70 < 1200: Gram matrices; 64 x 70 > 1200: materialised
        x = SharedInput(torch.randn(3, t, 40, generator=gen, dtype=torch.float64))
        x.readers = 2  # two layers read it: the second reuses the first's Gram matrix (t = 2)
        for _ in range(2):
            go = torch.randn(3, t, 30, generator=gen, dtype=torch.float64)
            weight, bias = linear_sq(x, go, bias=True)
            explicit = sum(float((go[i].T @ x.x[i]).square().sum()) for i in range(3))
            assert float(weight) == pytest.approx(explicit, rel=1e-12)
            assert float(bias) == pytest.approx(float(go.sum(1).square().sum()), rel=1e-12)
        assert (x.gram is not None) == (t == 2)
    ids = torch.tensor([[1, 2, 1, 0], [3, 3, 0, 0]])
    go = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64)
    rows = torch.zeros(2, 6, 5, dtype=torch.float64)
    for i in range(2):
        for t in range(4):
            if ids[i, t] != 0:  # padding_idx 0 gets no gradient
                rows[i, ids[i, t]] += go[i, t]
    assert float(embedding_sq(ids, go, 6, 0)) == pytest.approx(float(rows.square().sum()), rel=1e-12)


def test_sketched_norms_are_unbiased_with_a_projection_per_sequence_shared_by_the_readers() -> None:
    # Note [sketched norms]: at t = 64, k = 4 the sketch (4 x (30 + 40) a token) is cheaper than the exact norms
    # (min(64 x 70, 30 x 40)), so it is used; over 3,000 draws its mean is the exact value (a single draw's
    # relative variance is at most 2 / k = 0.5, so the mean's standard error is below 1.3%). Each sequence has
    # its own projection (a seed each, drawn alike on any device), and a second reader reuses the first's sketch.
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 64, 40, generator=gen, dtype=torch.float64)
    go = torch.randn(3, 64, 30, generator=gen, dtype=torch.float64) * torch.linspace(0.1, 2, 30, dtype=torch.float64)
    exact = sum(float((go[i].T @ x[i]).square().sum()) for i in range(3))
    draws = [float(linear_sq(SharedInput(x, [3 * d, 3 * d + 1, 3 * d + 2]), go, bias=False, sketch=4)[0])
             for d in range(3000)]
    assert len(set(draws)) > 2900 and max(abs(d / exact - 1) for d in draws) > 0.1  # random, not exact
    assert sum(draws) / len(draws) == pytest.approx(exact, rel=0.04)
    p = projections([5, 6, 5], 40, 4)
    assert p.shape == (3, 40, 4) and torch.equal(p[0], p[2]) and not torch.equal(p[0], p[1])
    shared = SharedInput(x, [21, 22, 23])
    shared.readers = 2
    first = linear_sq(shared, go, bias=False, sketch=4)[0]
    assert shared.sketch is not None and shared.gram is None
    assert float(linear_sq(shared, go, bias=False, sketch=4)[0]) == float(first) == draws[7]
    assert float(linear_sq(SharedInput(x), go, bias=False, sketch=0)[0]) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("stride", [1, 2])
def test_split_backward_and_frozen_microbatches_count_what_reached_each_tensor(stride: int) -> None:
    # Stage 1 of the tiny model as a pipeline stage runs it: I of micro-batches 0 and 1 (input gradients only),
    # then W of 1 and of 0 (torch.distributed.pipelining._backward). layers.3.attn.wq.weight is detached in micro-
    # batch 0's forward, layers.2.attn.wq.weight in micro-batch 1's, and layers.2.mlp.w1.weight left out of
    # micro-batch 1's backward (Note [freeze methods]). With stride 2 the norms come from rows 0 and 2 of
    # micro-batch 0 and row 1 of micro-batch 1 (Note [sequence subset]), where the tensor got a gradient.
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    stage = _stages()[1]
    params = dict(stage.named_parameters())
    names = [c.name for c in candidates(stage)]
    meter = NoiseMeter({1: stage}, {1: candidates(stage)}, num_microbatches=2, microbatch_tokens=B * T, every=1,
                       measure="sequence")
    meter.sequences.stride, meter.sequences.sketch = stride, 0  # exact norms, compared with explicit ones
    current = {"mb": None}
    meter.sequences.microbatch_of[1] = lambda: current["mb"]
    detached = {0: "layers.3.attn.wq.weight", 1: "layers.2.attn.wq.weight"}
    left_out = {1: "layers.2.mlp.w1.weight"}
    backward = {n: [k for k in range(2) if n not in (detached.get(k), left_out.get(k))] for n in names}
    forwards = {n: [k for k in range(2) if n != detached.get(k)] for n in names}
    with_norms = {n: [k for k in forwards[n] if k in backward[n]] for n in names}
    rows = [list(range(B))[chosen_rows(k, B, 0, stride)] for k in range(2)]
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(B, T, 256, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    ys = [_batch(seed=k)[1] for k in range(2)]
    # explicit per-sequence gradients of the micro-batches with norms (computed before the step is measured)
    expected = dict.fromkeys(names, 0.0)
    for k in range(2):
        for j in range(B):
            grads = torch.autograd.grad(loss_fn(stage(xs[k][j:j + 1]), ys[k][j:j + 1]), list(params.values()))
            for n, g in zip(params, grads):
                if k in with_norms[n] and j in rows[k]:
                    expected[n] += float(g.square().sum())
    meter.begin_step(0)
    saved = []
    for k in range(2):
        current["mb"] = k
        loss = loss_fn(torch.func.functional_call(stage, {detached[k]: params[detached[k]].detach()}, (xs[k],)), ys[k])
        weights = [p for n, p in params.items() if k in backward[n]]
        saved.append((stage_backward_input([loss], None, [xs[k]], iter(weights))[1], weights))
    for k in (1, 0):
        current["mb"] = k
        stage_backward_weight(iter(saved[k][1]), saved[k][0])
    reached, seq = meter._sums[1].tensors()[1:]
    assert with_norms["layers.3.attn.wq.weight"] == [1] and with_norms["layers.2.mlp.w1.weight"] == [0]
    for i, n in enumerate(names):
        assert int(reached[i]) == len(backward[n]) and int(seq[2, i]) == len(with_norms[n]), n
        assert int(seq[1, i]) == sum(len(rows[k]) for k in with_norms[n]), n
        assert int(seq[3, i]) == len(with_norms[n]) * B, n
        assert float(seq[0, i]) == pytest.approx(expected[n], rel=1e-6), n
    assert meter.after_reduce({1: stage}) and meter.stage_estimates()[1][0] != 0
    meter.close()


@pytest.mark.parametrize("t", [T, 64])
def test_the_estimate_does_not_depend_on_how_sequences_form_microbatches(t: int, monkeypatch) -> None:
    # One step of 8 sequences as 2 micro-batches of 4 or 4 of 2, with norms from every micro-batch (stride 1): the
    # per-sequence estimates agree to rounding; the micro-batch estimates do not. At t = 64 the linear layers'
    # norms are sketched (Note [sketched norms]), each sequence with its own projection whichever micro-batch
    # holds it. (A replica at --dp 2 runs the same micro-batch indices on half of each one's sequences:
    # tests/tfrun/distributed/test_rank.py.)
    import tfrun.freeze.noise_perseq as perseq

    drawn: list[int] = []
    real = perseq.projections
    monkeypatch.setattr(perseq, "projections", lambda seeds, d, k: drawn.extend(seeds) or real(seeds, d, k))
    stages = _stages(torch.float32)
    x, y = _batch(8, seed=3, t=t)
    out = {}
    for measure in ("sequence", "microbatch"):
        for m in (2, 4):
            meter = NoiseMeter(stages, {s: candidates(mod) for s, mod in stages.items()}, num_microbatches=m,
                               microbatch_tokens=8 // m * t, every=1, measure=measure)
            if meter.sequences is not None:
                meter.sequences.stride = 1
            meter.begin_step(0)
            for xs, ys in zip(x.chunk(m), y.chunk(m)):
                loss_fn(_chain(stages, xs), ys).backward()
            for mod in stages.values():
                for p in mod.parameters():
                    p.grad /= m
            meter.after_reduce(stages)
            out[(measure, m)] = meter.stage_estimates()  # stage -> (|G|^2, tr(Sigma))
            meter.close()
            for mod in stages.values():
                mod.zero_grad(set_to_none=True)
    for s in (0, 1):
        assert out[("sequence", 2)][s] == pytest.approx(out[("sequence", 4)][s], rel=1e-4)
        differ = 1e-2 if t == T else 1e-3
        assert out[("microbatch", 2)][s][1] != pytest.approx(out[("microbatch", 4)][s][1], rel=differ)
    # sketched at t = 64 only: 2 groupings x 17 linear inputs (4 in each of the 4 layers, the head's) x 8
    # sequences, the same seeds in both groupings
    assert len(drawn) == (2 * 17 * 8 if t == 64 else 0)
    assert t == T or sorted(drawn[:136]) == sorted(drawn[136:])


def test_a_tied_tensor_is_measured_per_microbatch() -> None:
    # A 1-stage model with a tied embedding and head (tfrun.models.llama Note [tied embeddings]): the tensor's
    # per-sequence gradient is the sum of two modules' parts, so it has no per-sequence value of its own.
    import dataclasses

    cfg = dataclasses.replace(MODELS["tiny"], n_layers=1, tie_embeddings=True)
    stage = build_stage(cfg, 0, 1, 0)
    names = [c.name for c in candidates(stage)]
    norms = SequenceNorms({0: stage}, {0: names})
    measured = dict(zip(names, norms.measured[0].tolist()))
    assert measured.pop("embed.weight") is False and all(measured.values())
    norms.close()


@pytest.mark.parametrize("stride", [STRIDE, 3])
def test_the_replicas_of_any_dp_choose_the_sequences_one_replica_would(stride: int) -> None:
    # Note [sequence subset]: micro-batch i of p sequences, split in dp replicas of p / dp rows (replica_rows);
    # the rows the replicas choose, put back in place, are those --dp 1 chooses: one in `stride` of the step's
    # sequences over the micro-batches, each micro-batch contributing, shared across the replicas.
    for p in range(1, 13):
        for i in range(3 * stride):
            alone = list(range(p))[chosen_rows(i, p, 0, stride)]
            for dp in (d for d in range(2, p + 1) if p % d == 0):
                rows = p // dp
                parts = [[k * rows + j for j in range(rows)[chosen_rows(i, rows, k, stride)]] for k in range(dp)]
                assert sorted(sum(parts, [])) == alone, (p, i, dp)
                if rows % stride == 0:  # every replica works alike
                    assert len({len(part) for part in parts}) == 1, (p, i, dp)
        chosen = sum(len(list(range(p))[chosen_rows(i, p, 0, stride)]) for i in range(stride))
        assert chosen == p, p  # over `stride` micro-batches, exactly one micro-batch's worth of sequences
