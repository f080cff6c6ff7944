"""The gradient noise scale by its definition, at fixed weights: the reference the pipeline's estimators are
checked against (tests/tfrun/freeze/test_noise_reference.py, benchmarks/noise_reference.py).

Note [exact noise scale]: with g_j the gradient of sequence j's mean token loss (j = 1..N, N independent random
windows of the training data) and g the mean of the g_j,
    tr(Sigma_seq) = sum_j |g_j - g|^2 / (N - 1)        (unbiased)
    |G|^2        = |g|^2 - tr(Sigma_seq) / N          (unbiased: E|g|^2 = |G|^2 + tr(Sigma_seq) / N)
and B = seq_len x tr(Sigma_seq) / |G|^2 in tokens, per stage over its tensors, as tfrun.freeze.noise counts it
(a micro-batch of b sequences is b x seq_len tokens). Plain loops, one backward per sequence, float64 sums.
`pipeline_estimate` feeds the same weights' micro-batches to the pipeline's own NoiseMeter, step after step, as a
rank does (every micro-batch's backward reaches the hooks, .grad holds their mean), without changing the weights.
"""

from __future__ import annotations

import torch
from torch import nn

from tfrun.config.train_config import DEFAULT_NOISE_MEASURE
from tfrun.freeze.candidates import candidates
from tfrun.freeze.noise import NoiseMeter, noise_scale


def _chain(stages: dict[int, nn.Module], x: torch.Tensor) -> torch.Tensor:
    for s in sorted(stages):
        x = stages[s](x)
    return x


def exact(stages: dict[int, nn.Module], loss_fn, inputs: torch.Tensor, targets: torch.Tensor) -> dict[int, float]:
    """Stage -> B in tokens (Note [exact noise scale]) from the N sequences of `inputs` (N x seq_len tokens) and
    `targets`; a stage whose |G|^2 estimate is not positive is left out."""
    params = {s: [p for p in m.parameters() if p.requires_grad] for s, m in stages.items()}
    total = {s: [torch.zeros_like(p, dtype=torch.float64) for p in ps] for s, ps in params.items()}
    sq = {s: 0.0 for s in stages}
    n, seq_len = inputs.shape
    for j in range(n):
        for ps in params.values():
            for p in ps:
                p.grad = None
        loss_fn(_chain(stages, inputs[j:j + 1]), targets[j:j + 1]).backward()
        for s, ps in params.items():
            for acc, p in zip(total[s], ps):
                g = p.grad.double() if p.grad is not None else torch.zeros_like(acc)
                acc += g
                sq[s] += float(g.square().sum())
    out = {}
    for s in stages:
        mean_sq = sum(float((acc / n).square().sum()) for acc in total[s])
        trace = (sq[s] - n * mean_sq) / (n - 1)
        gsq = mean_sq - trace / n
        scale = noise_scale(gsq, trace)
        if scale is not None:
            out[s] = seq_len * scale
    for ps in params.values():
        for p in ps:
            p.grad = None
    return out


def pipeline_estimate(stages: dict[int, nn.Module], loss_fn, batches, *, steps: int, num_microbatches: int,
                      estimators: tuple[str, ...], window: int = 8,
                      measures: tuple[str, ...] = (DEFAULT_NOISE_MEASURE,)
                      ) -> dict[tuple[str, str], list[dict[int, float | None]]]:
    """(measure, estimator) -> per measured step, stage -> the pipeline's NoiseMeter estimate (tokens), at these
    fixed weights: `steps` batches of `batches` (tfrun.data.Batches), each as `num_microbatches` micro-batches. One
    meter per pair, all fed by the same backward passes; a measure is the estimator's small batch
    (tfrun.freeze.noise Note [noise measure])."""
    meters = {(measure, e): NoiseMeter(stages, {s: candidates(m) for s, m in stages.items()},
                                       num_microbatches=num_microbatches,
                                       microbatch_tokens=batches.global_batch // num_microbatches * batches.seq_len,
                                       every=1, estimator=e, window=window, measure=measure)
              for measure in measures for e in estimators}
    params = [p for m in stages.values() for p in m.parameters()]
    out: dict[tuple[str, str], list] = {key: [] for key in meters}
    current = [0]  # the micro-batch in backward, as a pipeline stage tells it (noise_perseq)
    for meter in meters.values():
        if meter.sequences is not None:
            meter.sequences.microbatch_of.update({s: lambda: current[0] for s in stages})
    try:
        for step in range(steps):
            x, y = batches.batch_at(step)
            for meter in meters.values():
                meter.begin_step(step)
            for k, (xs, ys) in enumerate(zip(x.chunk(num_microbatches), y.chunk(num_microbatches))):
                current[0] = k
                loss_fn(_chain(stages, xs), ys).backward()  # the hooks see each micro-batch's own gradient
            for p in params:  # .grad = their mean, as the runtime's scale_grads leaves it
                if p.grad is not None:
                    p.grad /= num_microbatches
            for key, meter in meters.items():
                meter.after_reduce(stages)
                estimates = meter.stage_estimates()
                out[key].append({s: noise_scale(*estimates[s]) if s in estimates else None for s in stages})
            for p in params:
                p.grad = None
    finally:
        for meter in meters.values():
            meter.close()
    return out
