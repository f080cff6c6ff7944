"""The gradient noise scale by its definition, at fixed weights: the reference the pipeline's estimators are
checked against (tests/tfrun/freeze/test_noise_reference.py, benchmarks/noise_reference.py).

Note [exact noise scale]: with g_j the gradient of sequence j's mean token loss (j = 1..N, N independent random
windows of the training data) and g the mean of the g_j,
    tr(Sigma_seq) = sum_j |g_j - g|^2 / (N - 1)        (unbiased)
    |G|^2        = |g|^2 - tr(Sigma_seq) / N          (unbiased: E|g|^2 = |G|^2 + tr(Sigma_seq) / N)
and B = seq_len x tr(Sigma_seq) / |G|^2 in tokens, per stage over its tensors, as tfrun.freeze.noise counts it
(a micro-batch of b sequences is b x seq_len tokens). Plain loops, one backward per sequence, float64 sums.
`pipeline_estimate` feeds the same weights' micro-batches to the pipeline's own NoiseMeter, step after step, as a
rank does (every micro-batch's backward reaches the hooks, .grad holds their mean), without changing the weights:
`pipeline_raw` measures the steps, `smooth` runs each estimator over what they measured.
"""

from __future__ import annotations

import torch
from torch import nn

from tfrun.config.train_config import DEFAULT_NOISE_MEASURE
from tfrun.freeze.candidates import candidates
from tfrun.freeze.noise import NoiseMeter, noise_scale
from tfrun.freeze.noise_estimators import TensorNoise


def _chain(stages: dict[int, nn.Module], x: torch.Tensor) -> torch.Tensor:
    for s in sorted(stages):
        x = stages[s](x)
    return x


class ExactNoise:
    """Note [exact noise scale] accumulated over sequences added in any number of calls, with its own sampling
    error: sequence j (in the order added) falls into bucket j % `buckets`, and the delete-one-bucket jackknife
    over the buckets gives the standard error of B. Where B is many sequences, |G|^2 is the small difference
    |g|^2 - tr / N and a few hundred sequences leave B uncertain (blocks of 512 sequences gave 6,289-8,630 tokens
    at one set of weights: docs/cost-model.md, "Which noise estimator" 6): a reference is only as good as this
    error says, so benchmarks/noise_reference.py adds sequences until it is small. Memory: `buckets` float64
    copies of the parameters."""

    def __init__(self, stages: dict[int, nn.Module], loss_fn, buckets: int = 16) -> None:
        assert buckets >= 2, buckets
        self.stages, self.loss_fn, self.buckets = stages, loss_fn, buckets
        self.params = {s: [p for p in m.parameters() if p.requires_grad] for s, m in stages.items()}
        self.sums = {s: [[torch.zeros_like(p, dtype=torch.float64) for p in ps] for _ in range(buckets)]
                     for s, ps in self.params.items()}
        """Stage -> bucket -> per tensor, the sum of its sequences' gradients."""
        self.sq = {s: [0.0] * buckets for s in stages}
        """Stage -> bucket -> the sum of its sequences' |g_j|^2."""
        self.counts = [0] * buckets
        self.seq_len = 0
        self.peak = {s: 0.0 for s in stages}
        """Stage -> the largest one sequence's |g_j|^2 (how heavy the tail is: peak_share)."""

    @property
    def sequences(self) -> int:
        return sum(self.counts)

    def add(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One backward per sequence of `inputs` (N x seq_len tokens); .grad is left empty."""
        n, seq_len = inputs.shape
        assert self.seq_len in (0, seq_len), f"sequences of {seq_len} tokens added to ones of {self.seq_len}"
        self.seq_len = seq_len
        for j in range(n):
            bucket = self.sequences % self.buckets
            for ps in self.params.values():
                for p in ps:
                    p.grad = None
            self.loss_fn(_chain(self.stages, inputs[j:j + 1]), targets[j:j + 1]).backward()
            for s, ps in self.params.items():
                mine = 0.0
                for acc, p in zip(self.sums[s][bucket], ps):
                    if p.grad is not None:
                        g = p.grad.double()
                        acc += g
                        mine += float(g.square().sum())
                self.sq[s][bucket] += mine
                self.peak[s] = max(self.peak[s], mine)
            self.counts[bucket] += 1
        for ps in self.params.values():
            for p in ps:
                p.grad = None

    def peak_share(self, stage: int) -> float:
        """The largest one sequence's share of the sum of |g_j|^2 on `stage`: near 1 / N for light tails; a share
        many times that means one sequence moves tr(Sigma), and so B, by as much (a heavy tail: the reference then
        converges slowly, and its jackknife error, which no bucket without the sequence sees, understates it)."""
        total = sum(self.sq[stage])
        return self.peak[stage] / total if total > 0 else 0.0

    def _scale(self, n: int, total_sq: float, sq: float) -> float | None:
        """B in tokens from N sequences, |sum of their gradients|^2 and the sum of their |g_j|^2."""
        mean_sq = total_sq / n ** 2
        trace = (sq - n * mean_sq) / (n - 1)
        scale = noise_scale(mean_sq - trace / n, trace)
        return None if scale is None else self.seq_len * scale

    def scales(self) -> dict[int, tuple[float, float | None]]:
        """Stage -> (B in tokens, its jackknife standard error in tokens, None when a leave-one-out value has no
        positive |G|^2); a stage whose |G|^2 estimate is not positive is left out. Needs two sequences."""
        n = self.sequences
        assert n >= 2, "two sequences at least"
        out = {}
        for s in self.stages:
            buckets = [b for b in range(self.buckets) if self.counts[b]]
            # |sum over all|^2 and its leave-one-bucket-out values from the dot products of the bucket sums
            dot = {}
            for a in buckets:
                for b in buckets:
                    if a <= b:
                        dot[a, b] = dot[b, a] = sum(float((x * y).sum())
                                                    for x, y in zip(self.sums[s][a], self.sums[s][b]))
            total_sq = sum(dot[a, b] for a in buckets for b in buckets)
            full = self._scale(n, total_sq, sum(self.sq[s]))
            if full is None:
                continue
            left_out = []
            for b in buckets:
                if n - self.counts[b] < 2:
                    break
                without = total_sq - 2 * sum(dot[a, b] for a in buckets) + dot[b, b]
                left_out.append(self._scale(n - self.counts[b], without, sum(self.sq[s]) - self.sq[s][b]))
            error = None
            if len(left_out) == len(buckets) >= 2 and None not in left_out:
                k, mean = len(left_out), sum(left_out) / len(left_out)
                error = ((k - 1) / k * sum((v - mean) ** 2 for v in left_out)) ** 0.5
            out[s] = (full, error)
        return out


def exact(stages: dict[int, nn.Module], loss_fn, inputs: torch.Tensor, targets: torch.Tensor) -> dict[int, float]:
    """Stage -> B in tokens (Note [exact noise scale]) from the N sequences of `inputs` (N x seq_len tokens) and
    `targets`; a stage whose |G|^2 estimate is not positive is left out."""
    reference = ExactNoise(stages, loss_fn, buckets=2)
    reference.add(inputs, targets)
    return {s: b for s, (b, _) in reference.scales().items()}


Raw = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""One stage's step estimates as NoiseMeter.raw holds them: per tensor |G|^2, tr(Sigma) and whether usable."""


def pipeline_estimate(stages: dict[int, nn.Module], loss_fn, batches, *, steps: int, num_microbatches: int,
                      estimators: tuple[str, ...], window: int = 8,
                      measures: tuple[str, ...] = (DEFAULT_NOISE_MEASURE,)
                      ) -> dict[tuple[str, str], list[dict[int, float | None]]]:
    """(measure, estimator) -> per measured step, stage -> the pipeline's NoiseMeter estimate (tokens), at these
    fixed weights: `steps` batches of `batches` (tfrun.data.Batches), each as `num_microbatches` micro-batches. One
    meter per measure, all fed by the same backward passes, and each estimator smoothing its step estimates; a
    measure is the estimator's small batch
    (tfrun.freeze.noise Note [noise measure]), or `sequence-exact`: per-sequence norms without the linear layers'
    sketch (tfrun.freeze.noise_perseq Note [sketched norms]), to tell the sketch's error from the estimator's."""
    raws = pipeline_raw(stages, loss_fn, batches, steps=range(steps), num_microbatches=num_microbatches,
                        measures=measures)
    return smooth(raws, estimators, window)


def pipeline_raw(stages: dict[int, nn.Module], loss_fn, batches, *, steps, num_microbatches: int,
                 measures: tuple[str, ...] = (DEFAULT_NOISE_MEASURE,)) -> dict[str, list[dict[int, Raw]]]:
    """measure -> per step of `steps` (an iterable of step numbers), stage -> the NoiseMeter's step estimates
    (before any smoothing) at these fixed weights. A step's estimates depend on its own batch and number alone,
    so a stream that differs from another at one step needs only that step measured (tests/tfrun/freeze/
    test_noise_spike.py)."""
    meters = {}  # one meter (hooks, norms) per measure, all fed by the same backward passes
    for measure in measures:
        meter = NoiseMeter(stages, {s: candidates(m) for s, m in stages.items()}, num_microbatches=num_microbatches,
                           microbatch_tokens=batches.global_batch // num_microbatches * batches.seq_len,
                           every=1, measure=measure.removesuffix("-exact"))
        if measure.endswith("-exact"):
            meter.sequences.sketch = 0
        meters[measure] = meter
    params = [p for m in stages.values() for p in m.parameters()]
    out: dict[str, list[dict[int, Raw]]] = {measure: [] for measure in meters}
    current = [0]  # the micro-batch in backward, as a pipeline stage tells it (noise_perseq)
    for meter in meters.values():
        if meter.sequences is not None:
            meter.sequences.microbatch_of.update({s: lambda: current[0] for s in stages})
    try:
        for step in steps:
            x, y = batches.batch_at(step)
            for meter in meters.values():
                meter.begin_step(step)
            for k, (xs, ys) in enumerate(zip(x.chunk(num_microbatches), y.chunk(num_microbatches))):
                current[0] = k
                loss_fn(_chain(stages, xs), ys).backward()  # the hooks see each micro-batch's own gradient
            for p in params:  # .grad = their mean, as the runtime's scale_grads leaves it
                if p.grad is not None:
                    p.grad /= num_microbatches
            for measure, meter in meters.items():
                meter.after_reduce(stages)
                out[measure].append(dict(meter.raw))
            for p in params:
                p.grad = None
    finally:
        for meter in meters.values():
            meter.close()
    return out


def smooth(raws: dict[str, list[dict[int, Raw]]], estimators: tuple[str, ...], window: int = 8
           ) -> dict[tuple[str, str], list[dict[int, float | None]]]:
    """(measure, estimator) -> per step, stage -> the noise scale (tokens) each estimator makes of `raws`'s step
    estimates in order (pipeline_raw), as the meter's own smoother would."""
    out: dict[tuple[str, str], list] = {}
    for measure, steps in raws.items():
        stages = sorted(steps[0]) if steps else []
        for estimator in estimators:
            smoothers = {s: TensorNoise(estimator, len(steps[0][s][0]), window) for s in stages}
            trail = out[measure, estimator] = []
            for step in steps:
                estimates = {}
                for s, smoother in smoothers.items():
                    smoother.add(*step[s])
                    if (value := smoother.stage()) is not None:
                        estimates[s] = value
                trail.append({s: noise_scale(*estimates[s]) if s in estimates else None for s in stages})
    return out
