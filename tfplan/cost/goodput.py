"""What freezing costs in learning: statistical efficiency and goodput (METHOD.md section 9).

Note [goodput model]: freezing stage s in a share r_s of a step's micro-batches (its mean freeze ratio)
averages its parameters' gradient over (1 - r_s) B tokens instead of B, the step's batch (all replicas).
With the best step size, one step with batch b makes progress proportional to b / (b + N), N the gradient
noise scale in tokens (McCandlish et al. 2018): the statistical efficiency of the batch. A plan's predicted
progress per step is
    P(r) = sum_s w_s (1 - r_s) B / ((1 - r_s) B + N_s),
w_s the stage's share of |G|^2 (of the progress it carries), and its goodput, progress per second, P(r) / T(r)
with T the predicted step time. We report both relative to no freezing on the same profile:
    efficiency = P(r) / P(0)        goodput = efficiency x T(0) / T(r)    (1.0 = unfrozen).
Freezing pays when goodput > 1. Where (1 - r) B stays well above N_s freezing is nearly free; where B is
below N_s it costs almost linearly. With every N_s = 0 the efficiency is 1 and goodput is the speedup. It
is a hypothesis (Adam is not SGD, stages are not independent), judged against measured equal-time gaps in
docs/results.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfplan.errors import TfplanError
from tfplan.fileio import field_name

SOURCES = ("measured", "given")


@dataclass(frozen=True, kw_only=True, slots=True)
class NoiseModel:
    """A profile's noise section: per stage (or per layer), the noise scale and share of |G|^2."""

    noise_scale_tokens: tuple[float, ...]
    """Gradient noise scale B_noise = tr(Sigma) / |G|^2, in tokens."""
    grad_sq_share: tuple[float, ...]
    """Share of |G|^2 (of the progress the step makes), summing to 1."""
    microbatch_tokens: int
    """Tokens of one micro-batch of one replica, the shape the profile was measured at: a job's step batch
    is dp x M x this."""
    source: str
    """"measured" (tfrun, the two-batch estimator) or "given" (by the user, e.g. an analytic profile)."""
    note: str = ""
    """How it was measured or where it comes from."""

    def to_dict(self) -> dict[str, Any]:
        out = {"noise_scale_tokens": list(self.noise_scale_tokens), "grad_sq_share": list(self.grad_sq_share),
               "microbatch_tokens": self.microbatch_tokens, "source": self.source}
        return out | ({"note": self.note} if self.note else {})

    def for_stages(self, counts: Sequence[int] | None) -> NoiseModel:
        """A per-layer model summed into stages of `counts` contiguous layers (None: already per stage): a
        stage's |G|^2 share is its layers' sum, its noise scale their tr(Sigma) over their |G|^2."""
        if counts is None:
            return self
        scales, shares, start = [], [], 0
        for count in counts:
            w = self.grad_sq_share[start:start + count]
            n = self.noise_scale_tokens[start:start + count]
            total = math.fsum(w)
            shares.append(total)
            scales.append(math.fsum(a * b for a, b in zip(w, n)) / total if total > 0 else 0.0)
            start += count
        return NoiseModel(noise_scale_tokens=tuple(scales), grad_sq_share=tuple(shares),
                          microbatch_tokens=self.microbatch_tokens, source=self.source, note=self.note)


def from_dict(obj: Any, count: int, microbatch_tokens: int | None) -> NoiseModel:
    """Validate a profile's `noise` section for `count` stages (or layers). `microbatch_tokens`: the profile's
    own micro-batch shape in tokens when its source says so (None: unknown), which the section must match.

    Raises:
        TfplanError: naming the field (noise.<field>).
    """
    if not isinstance(obj, dict):
        raise TfplanError("noise: must be an object")
    known = {"noise_scale_tokens", "grad_sq_share", "microbatch_tokens", "source", "note"}
    for key in sorted(set(obj) - known):
        raise TfplanError(f"noise.{field_name(key)}: unknown field (known: {', '.join(sorted(known))})")
    for key in ("noise_scale_tokens", "grad_sq_share", "microbatch_tokens", "source"):
        if key not in obj:
            raise TfplanError(f"noise.{key}: missing required field")
    scales = _numbers(obj["noise_scale_tokens"], "noise.noise_scale_tokens", count)
    shares = _numbers(obj["grad_sq_share"], "noise.grad_sq_share", count)
    if abs(math.fsum(shares) - 1.0) > 1e-6:
        raise TfplanError(f"noise.grad_sq_share: must sum to 1, got {math.fsum(shares):.6g}")
    tokens = obj["microbatch_tokens"]
    if type(tokens) is not int or tokens < 1:
        raise TfplanError(f"noise.microbatch_tokens: must be an integer >= 1, got {tokens!r}")
    if microbatch_tokens is not None and tokens != microbatch_tokens:
        raise TfplanError(f"noise.microbatch_tokens: measured for micro-batches of {tokens} tokens, but the "
                          f"profile's stage times are for {microbatch_tokens}: measure both at one batch shape")
    if obj["source"] not in SOURCES:
        raise TfplanError(f"noise.source: must be one of {', '.join(SOURCES)}, got {obj['source']!r}")
    note = obj.get("note", "")
    if not isinstance(note, str):
        raise TfplanError("noise.note: must be a string")
    return NoiseModel(noise_scale_tokens=scales, grad_sq_share=shares, microbatch_tokens=tokens,
                      source=obj["source"], note=note)


def _numbers(values: Any, path: str, count: int) -> tuple[float, ...]:
    if not isinstance(values, list) or len(values) != count:
        raise TfplanError(f"{path}: must list {count} numbers (one per stage or layer), got "
                          f"{len(values) if isinstance(values, list) else type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise TfplanError(f"{path}[{i}]: must be a finite number >= 0, got {v!r}")
        out.append(float(v))
    return tuple(out)


def efficiency(kept_tokens: float, noise_tokens: float) -> float:
    """Progress of one step with a batch of `kept_tokens`, relative to an infinite batch: b / (b + N).

    N = 0 (no noise: every sample carries the whole gradient) gives 1 at any batch, the limit as b falls to 0
    included, so that a noiseless stage costs nothing to freeze and a noiseless profile's goodput is its
    speedup (the makespan objective); b / (b + N) alone would drop to 0 at b = 0, a jump no optimum attains.

    >>> efficiency(1000.0, 0.0), efficiency(0.0, 0.0), efficiency(1000.0, 1000.0), efficiency(0.0, 10.0)
    (1.0, 1.0, 0.5, 0.0)
    """
    if noise_tokens <= 0:
        return 1.0
    return kept_tokens / (kept_tokens + noise_tokens)


def progress(means: Sequence[float], batch_tokens: float, noise: NoiseModel) -> float:
    """P(r): the predicted progress of one step whose stages freeze mean ratios `means` (Note [goodput model])."""
    return math.fsum(w * efficiency((1.0 - r) * batch_tokens, n)
                     for r, w, n in zip(means, noise.grad_sq_share, noise.noise_scale_tokens))


@dataclass(frozen=True, kw_only=True, slots=True)
class Goodput:
    """A plan's predicted learning per second, relative to no freezing on the same profile."""

    batch_tokens: float
    """The step's batch B (tokens, all replicas)."""
    efficiency: float
    """P(r) / P(0): progress per step against unfrozen training's."""
    speedup: float
    """T(0) / T(r): steps per second against unfrozen training's."""

    @property
    def goodput(self) -> float:
        """efficiency x speedup: > 1 when freezing pays."""
        return self.efficiency * self.speedup

    def to_dict(self) -> dict[str, float]:
        return {"batch_tokens": self.batch_tokens, "efficiency": self.efficiency, "speedup": self.speedup,
                "goodput": self.goodput}


def evaluate(means: Sequence[float], step_ms: float, no_freeze_ms: float, batch_tokens: float,
             noise: NoiseModel) -> Goodput:
    """A plan's Goodput from its stages' mean ratios and its predicted step time."""
    base = progress([0.0] * len(means), batch_tokens, noise)
    eff = progress(means, batch_tokens, noise) / base if base > 0 else 1.0
    return Goodput(batch_tokens=batch_tokens, efficiency=eff, speedup=no_freeze_ms / step_ms)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanGoodput:
    """What a plan records of the learning model (the plan file's `goodput` section, docs/formats.md)."""

    objective: str
    """What the plan was solved for: makespan or goodput."""
    noise: NoiseModel
    """The noise model per stage it was planned or evaluated with."""
    batch_tokens: float
    """The step's batch B in tokens (dp x M x micro-batch tokens)."""
    value: Goodput
    """The plan's predicted efficiency, speedup and goodput relative to no freezing."""
    solve: dict[str, Any] | None = None
    """The goodput LP's statistics (lp_solves, dinkelbach_steps, wall_s, bound), for --objective goodput."""

    @property
    def pays(self) -> bool:
        """Whether the plan learns faster per second than no freezing."""
        return self.value.goodput > 1.0 + 1e-9

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.objective, "noise": self.noise.to_dict(), "batch_tokens": self.batch_tokens,
                **self.value.to_dict(), "pays": self.pays, "solve": self.solve}


def plan_goodput(objective: str, noise: NoiseModel, batch_tokens: float, means: Sequence[float], planned_ms: float,
                 no_freeze_ms: float, solve: dict[str, Any] | None = None) -> PlanGoodput:
    """A plan's record from its stages' means and predicted step times."""
    return PlanGoodput(objective=objective, noise=noise, batch_tokens=batch_tokens,
                       value=evaluate(means, planned_ms, no_freeze_ms, batch_tokens, noise), solve=solve)


def record_from_dict(obj: Any, num_stages: int, means: Sequence[float], planned_ms: float,
                     no_freeze_ms: float) -> PlanGoodput:
    """Validate a plan's `goodput` section (its figures are recomputed from the plan, not trusted).

    Raises:
        TfplanError: naming the field (goodput.<field>).
    """
    if not isinstance(obj, dict):
        raise TfplanError("goodput: must be an object")
    objective = obj.get("objective")
    if objective not in ("makespan", "goodput"):
        raise TfplanError(f"goodput.objective: must be makespan or goodput, got {objective!r}")
    try:
        noise = from_dict(obj.get("noise"), num_stages, None)
    except TfplanError as exc:
        raise TfplanError(f"goodput.{exc}") from None
    batch = obj.get("batch_tokens")
    if isinstance(batch, bool) or not isinstance(batch, (int, float)) or not math.isfinite(batch) or batch <= 0:
        raise TfplanError(f"goodput.batch_tokens: must be a number > 0, got {batch!r}")
    solve = obj.get("solve")
    if solve is not None and not isinstance(solve, dict):
        raise TfplanError("goodput.solve: must be an object or null")
    return plan_goodput(objective, noise, float(batch), means, planned_ms, no_freeze_ms, solve)
