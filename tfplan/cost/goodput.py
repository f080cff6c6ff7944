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

Note [learning models]: how a stage's kept share of the batch turns into progress, by name (a profile's noise
section records which, `learning_model`; docs/cost-model.md says what was measured and why the default):
  mccandlish  the formula above: w_s = the stage's |G|^2 share, progress w_s e(k B, N_s), e(b, N) = b / (b + N)
              (McCandlish et al.'s efficiency at the best step size for each batch, for SGD).
  momentum    the same with Adam's first moment averaging the gradient noise of about (1 + b1) / (1 - b1) steps
              (19 at b1 = 0.9): N_s (1 - b1) / (1 + b1) in place of N_s.
  adam        Adam's first-order progress: a step moves each scalar by about lr m / sqrt(v), whose mean is
              lr G_i / sqrt(G_i^2 + sigma_i^2 / b) (the noise sits in v; m's averages out), so a stage of n
              scalars with |G|^2 and noise scale N makes lr sqrt(n) |G| / sqrt(1 + N / b) a step: progress
              u_s sqrt(e(k B, N_s)) with u_s the stage's share of sqrt(n) |G| (`update_share`).
Each is concave in the kept share k, so the goodput LP (tfplan.solve.fastlp.goodput) cuts it as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfplan.errors import TfplanError
from tfplan.fileio import field_name

SOURCES = ("measured", "given")
LEARNING_MODELS = ("mccandlish", "momentum", "adam")
"""Note [learning models]."""
DEFAULT_LEARNING_MODEL = "adam"
"""The model a measured noise section names unless told otherwise (docs/cost-model.md, "Which learning model")."""
ADAM_BETA1 = 0.9


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
    learning_model: str = "mccandlish"
    """Which model turns a kept share into progress (Note [learning models]). A section that names none (a
    profile before schema 4) is mccandlish, the model it was made for; what tfrun measures and a user gives
    name DEFAULT_LEARNING_MODEL (`measured`, `given_model`)."""
    adam_beta1: float = ADAM_BETA1
    """momentum: Adam's first-moment factor (the run's --adam-betas)."""
    update_share: tuple[float, ...] | None = None
    """adam: per stage (or layer), its share of sqrt(n) |G| summed over its tensors (n scalars each), summing to
    1; None for the other models."""

    def to_dict(self) -> dict[str, Any]:
        out = {"noise_scale_tokens": list(self.noise_scale_tokens), "grad_sq_share": list(self.grad_sq_share),
               "microbatch_tokens": self.microbatch_tokens, "source": self.source,
               "learning_model": self.learning_model}
        if self.learning_model == "momentum":
            out["adam_beta1"] = self.adam_beta1
        if self.update_share is not None:
            out["update_share"] = list(self.update_share)
        return out | ({"note": self.note} if self.note else {})

    def terms(self) -> list[tuple[float, float, float]]:
        """Per stage (weight, noise scale in tokens, power): progress weight x e(kept, noise)^power (Note
        [learning models])."""
        if self.learning_model == "adam":
            assert self.update_share is not None, "the adam model needs update_share"
            return [(u, n, 0.5) for u, n in zip(self.update_share, self.noise_scale_tokens)]
        scale = (1 - self.adam_beta1) / (1 + self.adam_beta1) if self.learning_model == "momentum" else 1.0
        return [(w, n * scale, 1.0) for w, n in zip(self.grad_sq_share, self.noise_scale_tokens)]

    def for_stages(self, counts: Sequence[int] | None) -> NoiseModel:
        """A per-layer model summed into stages of `counts` contiguous layers (None: already per stage): a
        stage's |G|^2 share is its layers' sum, its noise scale their tr(Sigma) over their |G|^2."""
        if counts is None:
            return self
        scales, shares, updates, start = [], [], [], 0
        for count in counts:
            w = self.grad_sq_share[start:start + count]
            n = self.noise_scale_tokens[start:start + count]
            total = math.fsum(w)
            shares.append(total)
            scales.append(math.fsum(a * b for a, b in zip(w, n)) / total if total > 0 else 0.0)
            if self.update_share is not None:
                updates.append(math.fsum(self.update_share[start:start + count]))
            start += count
        return NoiseModel(noise_scale_tokens=tuple(scales), grad_sq_share=tuple(shares),
                          microbatch_tokens=self.microbatch_tokens, source=self.source, note=self.note,
                          learning_model=self.learning_model, adam_beta1=self.adam_beta1,
                          update_share=tuple(updates) if self.update_share is not None else None)


def measured(noise_scale_tokens: Sequence[float], grad_sq_share: Sequence[float], microbatch_tokens: int,
             update_share: Sequence[float] | None = None, *, learning_model: str = DEFAULT_LEARNING_MODEL,
             adam_beta1: float = ADAM_BETA1, note: str = "") -> NoiseModel:
    """A noise section measured by tfrun (its summary's or the online mode's figures) under `learning_model`; the
    adam model needs update shares and falls back to mccandlish without them (a run made before they were
    measured)."""
    model = learning_model if learning_model != "adam" or update_share else "mccandlish"
    return NoiseModel(noise_scale_tokens=tuple(noise_scale_tokens), grad_sq_share=tuple(grad_sq_share),
                      microbatch_tokens=microbatch_tokens, source="measured", note=note, learning_model=model,
                      adam_beta1=adam_beta1, update_share=tuple(update_share) if update_share else None)


def given_model(count: int, shares: Sequence[float] | None = None) -> dict[str, Any]:
    """The learning-model fields of a noise section a user gives (`--noise-scale`): the default model, and for
    adam update shares equal to the |G|^2 shares (`shares`, else equal), as nothing measured them."""
    shares = list(shares) if shares is not None else [1.0 / count] * count
    total = math.fsum(shares)
    out: dict[str, Any] = {"learning_model": DEFAULT_LEARNING_MODEL}
    if DEFAULT_LEARNING_MODEL == "adam" and total > 0:
        out["update_share"] = [x / total for x in shares]
    return out


def with_learning_model(noise: NoiseModel, name: str) -> NoiseModel:
    """The noise section read under another learning model (`--learning-model`).

    Raises:
        TfplanError: an unknown name, or adam for a section without update shares (measured before them).
    """
    import dataclasses

    if name not in LEARNING_MODELS:
        raise TfplanError(f"--learning-model must be one of {', '.join(LEARNING_MODELS)}, got {name!r}")
    if name == "adam" and noise.update_share is None:
        raise TfplanError("--learning-model adam: the profile's noise section has no update_share (measured before "
                          "it was recorded): measure the profile again (tfplan profile)")
    return dataclasses.replace(noise, learning_model=name)


def from_dict(obj: Any, count: int, microbatch_tokens: int | None) -> NoiseModel:
    """Validate a profile's `noise` section for `count` stages (or layers). `microbatch_tokens`: the profile's
    own micro-batch shape in tokens when its source says so (None: unknown), which the section must match.

    Raises:
        TfplanError: naming the field (noise.<field>).
    """
    if not isinstance(obj, dict):
        raise TfplanError("noise: must be an object")
    known = {"noise_scale_tokens", "grad_sq_share", "microbatch_tokens", "source", "note", "learning_model",
             "adam_beta1", "update_share"}
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
    model = obj.get("learning_model", "mccandlish")  # (schema 3 sections name none: the model they were made for)
    if model not in LEARNING_MODELS:
        raise TfplanError(f"noise.learning_model: must be one of {', '.join(LEARNING_MODELS)}, got {model!r}")
    beta1 = obj.get("adam_beta1", ADAM_BETA1)
    if isinstance(beta1, bool) or not isinstance(beta1, (int, float)) or not 0 <= beta1 < 1:
        raise TfplanError(f"noise.adam_beta1: must be a number in [0, 1), got {beta1!r}")
    updates = None
    if "update_share" in obj:
        updates = _numbers(obj["update_share"], "noise.update_share", count)
        if abs(math.fsum(updates) - 1.0) > 1e-6:
            raise TfplanError(f"noise.update_share: must sum to 1, got {math.fsum(updates):.6g}")
    if model == "adam" and updates is None:
        raise TfplanError("noise.update_share: the adam learning model needs it (each stage's share of "
                          "sqrt(n) |G|: tfplan.cost.goodput Note [learning models])")
    return NoiseModel(noise_scale_tokens=scales, grad_sq_share=shares, microbatch_tokens=tokens,
                      source=obj["source"], note=note, learning_model=model, adam_beta1=float(beta1),
                      update_share=updates)


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
    """P(r): the predicted progress of one step whose stages freeze mean ratios `means` (Notes [goodput model],
    [learning models])."""
    return math.fsum(w * efficiency((1.0 - r) * batch_tokens, n) ** p for r, (w, n, p) in zip(means, noise.terms()))


def stage_value(term: tuple[float, float, float], mean: float, batch_tokens: float) -> tuple[float, float]:
    """(e^p, d(e^p)/dm) of one stage's term (weight, noise, power) at mean ratio m (the weight left out), for the
    goodput LP's cuts: e = e((1 - m) B, N), de/dm = -B N / ((1 - m) B + N)^2; a noiseless stage (1, 0)."""
    _, noise, power = term
    if noise <= 0:
        return 1.0, 0.0
    kept = (1.0 - mean) * batch_tokens
    e = kept / (kept + noise)
    slope = -(batch_tokens / (kept + noise)) * (noise / (kept + noise))  # (no square: N up to 1e308 stays finite)
    if power == 1.0:
        return e, slope
    e = max(e, 1e-300)  # (m = 1: the slope of e^p is -infinity for p < 1; the cap keeps m below where it matters)
    return e ** power, power * e ** (power - 1) * slope


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


def _finite(value: Any) -> bool:
    """No NaN or infinity anywhere in a parsed JSON value."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return all(_finite(v) for v in value) if isinstance(value, list) else True


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
    if not _finite(solve):  # (its record is printed back as it was read: NaN made `tfplan show --json` not JSON)
        raise TfplanError("goodput.solve: must hold finite numbers only")
    return plan_goodput(objective, noise, float(batch), means, planned_ms, no_freeze_ms, solve)
