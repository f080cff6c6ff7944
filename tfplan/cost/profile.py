"""Profiles: per-stage (or per-layer) action times in milliseconds, as versioned JSON.

Format (docs/formats.md has the full reference)::

    {"schema_version": 2, "name": "...", "source": {...}, "p2p_ms": 0.0, "dispatch_ms": 0.0,
     "step_overhead_ms": 0.0, "quality": {...},
     "stages": [{"forward_ms": 1.0, "backward_ms": 2.0, "backward_frozen_ms": 1.0,
                 "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "backward_weight_frozen_ms": 0.0,
                 "tail_ms": 0.0}, ...]}

Version 1 (no dispatch_ms, quality or tail_ms) still loads, with those at 0 / absent. Version 3 adds the
optional "noise" section (tfplan.cost.goodput: per stage or layer, the gradient noise scale and |G|^2 share, and
the micro-batch shape they were measured at); versions 1 and 2 load without it. Version 4 (issue 45) lets the
noise section name its learning model (`learning_model`, `adam_beta1`, `update_share`: tfplan.cost.goodput Note
[learning models]); a version-3 section names none and is read as mccandlish, the model it was made for.

Instead of "stages", a profile may give "layers" (same fields plus an optional "name"); tfplan then splits
the layers into the schedule's stage count, contiguously and balanced by time (Note [layer partition]).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfplan.cost import goodput
from tfplan.cost import layers as layer_split
from tfplan.cost.goodput import NoiseModel
from tfplan.errors import TfplanError
from tfplan.fileio import field_name, read_json

SCHEMA_VERSION = 4
READS_VERSIONS = (1, 2, 3, 4)
COST_FIELDS = (
    "forward_ms",
    "backward_ms",
    "backward_frozen_ms",
    "backward_input_ms",
    "backward_weight_ms",
    "backward_weight_frozen_ms",
)
OPTIONAL_COST_FIELDS = ("tail_ms", "grad_bytes")  # default 0 (and absent from version-1 files)
QUALITY_KEYS = {"steps": int, "spread": dict, "max_spread": float, "replay_gap": float, "warnings": list}


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCost:
    """Times of one stage's (or one layer's) actions for one micro-batch, in milliseconds."""

    forward_ms: float
    """F: forward."""
    backward_ms: float
    """B: full backward (input and weight gradients), nothing frozen."""
    backward_frozen_ms: float
    """B with every trainable parameter frozen (input-gradient work only; 0 on the first stage)."""
    backward_input_ms: float
    """I: input-gradient half of a split backward."""
    backward_weight_ms: float
    """W: weight-gradient half of a split backward, nothing frozen."""
    backward_weight_frozen_ms: float
    """W with every parameter frozen (near 0)."""
    tail_ms: float = 0.0
    """Work after its rank's last action attributable to this stage (its optimizer step; measured: the rank's
    time from its last action's end to its optimizer's end, split over its stages by parameter count). A
    rank's tail is the sum over its stages; the step ends when the slowest rank has finished its tail."""
    grad_bytes: float = 0.0
    """Bytes of this stage's gradients that data parallelism reduces across replicas each step (0: unknown;
    tfplan.cost.dataparallel adds the reduction to the tail)."""
    name: str = ""
    """Optional label (layer profiles: 'embed', 'block3', 'head')."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name} if self.name else {}
        return out | {f: getattr(self, f) for f in COST_FIELDS + OPTIONAL_COST_FIELDS}


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """A validated profile."""

    name: str
    """Human-readable name."""
    source: dict[str, Any] = field(default_factory=dict)
    """Free-form provenance: kind (measured/analytic/hand), device, torch version, date, formula."""
    p2p_ms: float = 0.0
    """Latency added on every edge between two stages on different ranks (ms)."""
    dispatch_ms: float = 0.0
    """Fixed runtime cost of every action (the executor's bookkeeping and communication calls between two
    compute actions of a rank), ms; the DAG adds it to every action's duration."""
    step_overhead_ms: float = 0.0
    """Time per step outside the DAG's actions and the ranks' optimizer tails (the step's start and final
    barrier), added to predicted step times."""
    dp: int = 1
    """The data-parallel degree whose gradient reduction the tails already include (a measured `--dp 2` run:
    2); tfplan.cost.dataparallel models other degrees from it."""
    quality: dict[str, Any] | None = None
    """How far to trust a measured profile: timed steps, per (stage, kind) relative spread ((p75 - p25) /
    median), the largest spread, the replay gap ((measured step - replayed step) / measured step) and the
    warnings raised; None for hand and analytic profiles."""
    stages: tuple[StageCost, ...] | None = None
    """Per-stage costs, or None when the profile is per layer."""
    layers: tuple[StageCost, ...] | None = None
    """Per-layer costs, or None when the profile is per stage."""
    noise: NoiseModel | None = None
    """Per stage (or layer, like the costs), the gradient noise scale and |G|^2 share (tfplan.cost.goodput), or None
    when not measured or given."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "source": self.source,
            "p2p_ms": self.p2p_ms,
            "dispatch_ms": self.dispatch_ms,
            "step_overhead_ms": self.step_overhead_ms,
        }
        if self.dp != 1:
            out["dp"] = self.dp
        if self.quality is not None:
            out["quality"] = self.quality
        key, items = ("stages", self.stages) if self.stages is not None else ("layers", self.layers)
        out[key] = [c.to_dict() for c in items or ()]
        if self.noise is not None:
            out["noise"] = self.noise.to_dict()
        return out

    def content_hash(self) -> str:
        """sha256 of the canonical JSON (sorted keys), so a plan names exactly the profile it came from."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    def stage_costs(self, num_stages: int, layers_per_stage: Sequence[int] | None = None) -> tuple[StageCost, ...]:
        """Costs of each of the schedule's stages.

        Args:
            num_stages: the schedule's stage count S.
            layers_per_stage: for a per-layer profile, an explicit split (len S, sums to the layer count);
                None balances the split by time.

        Raises:
            TfplanError: a per-stage profile with a different stage count, or a bad split.
        """
        counts = self.layer_counts(num_stages, layers_per_stage)
        if counts is None:
            return self.stages
        assert self.layers is not None
        return layer_split.partition_layers(self.layers, num_stages, counts)

    def layer_counts(self, num_stages: int, layers_per_stage: Sequence[int] | None = None) -> list[int] | None:
        """Layers per stage of the split `stage_costs` makes (None for a per-stage profile, after checking its
        stage count)."""
        if self.stages is not None:
            if layers_per_stage is not None:
                raise TfplanError(f"profile {self.name!r} is per stage; --layers-per-stage needs a per-layer profile")
            if len(self.stages) != num_stages:
                raise TfplanError(
                    f"profile {self.name!r} has {len(self.stages)} stages but the schedule has {num_stages}; "
                    f"use a profile with {num_stages} stages or a per-layer profile"
                )
            return None
        assert self.layers is not None
        if len(self.layers) < num_stages:
            raise TfplanError(f"profile has {len(self.layers)} layers, fewer than the {num_stages} stages asked for")
        if layers_per_stage:
            return layer_split.check_split(layers_per_stage, num_stages, len(self.layers))
        return layer_split.balanced_split([c.forward_ms + c.backward_ms for c in self.layers], num_stages)

    def stage_noise(self, num_stages: int, layers_per_stage: Sequence[int] | None = None) -> NoiseModel | None:
        """The noise model per schedule stage (the per-layer one summed like the costs), or None."""
        if self.noise is None:
            return None
        return self.noise.for_stages(self.layer_counts(num_stages, layers_per_stage))


def split_profile(profile: Profile, num_stages: int, layers_per_stage: Sequence[int] | None = None) -> Profile:
    """A per-layer profile as a per-stage one (stage costs from `stage_costs`), recording the split."""
    if profile.layers is None:
        raise TfplanError(f"profile {profile.name!r} is already per stage")
    stages = profile.stage_costs(num_stages, layers_per_stage)
    noise = profile.stage_noise(num_stages, layers_per_stage)
    split = [s.name for s in stages]
    return Profile(
        name=f"{profile.name}-{num_stages}stages",
        source=profile.source | {"split": split, "split_rule": "given" if layers_per_stage else "balanced by time"},
        p2p_ms=profile.p2p_ms,
        dispatch_ms=profile.dispatch_ms,
        step_overhead_ms=profile.step_overhead_ms,
        quality=profile.quality,
        dp=profile.dp,
        stages=stages,
        noise=noise,
    )


# ---------------------------------------------------------------------------------------------------------
# JSON reading and validation


MAX_NUMBER = 1e15
"""The largest number a profile may hold (ms, bytes, parameters): far above any real one (1e15 ms is 30,000 years
of one action), and low enough that a million actions' sums and the LP's coefficients stay finite and within
GLOP's range (a stage of 1e200 ms failed inside GLOP, 1e308 overflowed the simulator's sums)."""


def _number(value: Any, path: str, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TfplanError(f"{path}: must be a number, got {json.dumps(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise TfplanError(f"{path}: must be finite, got {value}")
    if value < 0 or (value == 0 and not allow_zero):
        raise TfplanError(f"{path}: must be {'>=' if allow_zero else '>'} 0, got {value:g}")
    if value > MAX_NUMBER:
        raise TfplanError(f"{path}: must be at most {MAX_NUMBER:g}, got {value:g}")
    return value


def _check_keys(obj: Any, path: str, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise TfplanError(f"{path or 'profile'}: must be an object, got {type(obj).__name__}")
    prefix = f"{path}." if path else ""
    for key in sorted(set(obj) - required - optional):
        raise TfplanError(f"{prefix}{field_name(key)}: unknown field (known: {', '.join(sorted(required | optional))})")
    for key in sorted(required - set(obj)):
        raise TfplanError(f"{prefix}{key}: missing required field")
    return obj


def _cost_from_dict(obj: Any, path: str) -> StageCost:
    _check_keys(obj, path, set(COST_FIELDS), {"name", *OPTIONAL_COST_FIELDS})
    values = {f: _number(obj[f], f"{path}.{f}") for f in COST_FIELDS}
    values |= {f: _number(obj[f], f"{path}.{f}") for f in OPTIONAL_COST_FIELDS if f in obj}
    if values["backward_frozen_ms"] > values["backward_ms"]:
        raise TfplanError(
            f"{path}.backward_frozen_ms: must be <= backward_ms ({values['backward_ms']:g}), "
            f"got {values['backward_frozen_ms']:g}"
        )
    if values["backward_weight_frozen_ms"] > values["backward_weight_ms"]:
        raise TfplanError(
            f"{path}.backward_weight_frozen_ms: must be <= backward_weight_ms ({values['backward_weight_ms']:g}), "
            f"got {values['backward_weight_frozen_ms']:g}"
        )
    name = obj.get("name", "")
    if not isinstance(name, str):
        raise TfplanError(f"{path}.name: must be a string")
    return StageCost(name=name, **values)


def from_dict(obj: Any) -> Profile:
    """Validate a parsed profile JSON object; every error names the field path."""
    top = {"schema_version", "name", "p2p_ms"}
    if not isinstance(obj, dict):
        raise TfplanError(f"profile: must be an object, got {type(obj).__name__}")
    version = obj.get("schema_version")
    if type(version) is not int or version not in READS_VERSIONS:
        raise TfplanError(f"schema_version: must be one of {READS_VERSIONS}, got {json.dumps(version)}")
    new = ({"dispatch_ms", "quality", "dp"} if version >= 2 else set()) | ({"noise"} if version >= 3 else set())
    _check_keys(obj, "", top, {"source", "stages", "layers", "step_overhead_ms", *new})
    if not isinstance(obj["name"], str) or not obj["name"] or not obj["name"].isprintable():
        raise TfplanError("name: must be a non-empty string of printable characters (one line)")
    source = obj.get("source", {})
    if not isinstance(source, dict):
        raise TfplanError("source: must be an object")
    if ("stages" in obj) == ("layers" in obj):
        raise TfplanError("stages: give exactly one of 'stages' (per stage) or 'layers' (per layer)")
    key = "stages" if "stages" in obj else "layers"
    items = obj[key]
    if not isinstance(items, list) or not items:
        raise TfplanError(f"{key}: must be a non-empty list")
    costs = tuple(_cost_from_dict(item, f"{key}[{i}]") for i, item in enumerate(items))
    if not any(c.forward_ms or c.backward_ms for c in costs):
        raise TfplanError(f"{key}: every forward_ms and backward_ms is 0: a step of no time has nothing to plan")
    noise = None
    if "noise" in obj:
        noise = goodput.from_dict(obj["noise"], len(costs), microbatch_tokens(source))
    return Profile(
        name=obj["name"],
        source=source,
        p2p_ms=_number(obj["p2p_ms"], "p2p_ms"),
        dispatch_ms=_number(obj.get("dispatch_ms", 0.0), "dispatch_ms"),
        step_overhead_ms=_number(obj.get("step_overhead_ms", 0.0), "step_overhead_ms"),
        quality=_quality(obj.get("quality")),
        dp=_dp(obj.get("dp", 1)),
        stages=costs if key == "stages" else None,
        layers=costs if key == "layers" else None,
        noise=noise,
    )


def microbatch_tokens(source: dict[str, Any]) -> int | None:
    """Tokens of one micro-batch, when a profile's source says its shape (microbatch_size x seq_len)."""
    size, seq = source.get("microbatch_size"), source.get("seq_len")
    if type(size) is int and type(seq) is int and size > 0 and seq > 0:
        return size * seq
    return None


def _dp(value: Any) -> int:
    if type(value) is not int or value < 1:
        raise TfplanError(f"dp: must be an integer >= 1, got {json.dumps(value)}")
    return value


def _quality(obj: Any) -> dict[str, Any] | None:
    """Validate the optional quality section (keys and types of QUALITY_KEYS, all optional)."""
    if obj is None:
        return None
    _check_keys(obj, "quality", set(), set(QUALITY_KEYS))
    for key, kind in QUALITY_KEYS.items():
        if key not in obj:
            continue
        value = obj[key]
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TfplanError(f"quality.{key}: must be a finite number, got {json.dumps(value)}")
            if key != "replay_gap":  # the replay may exceed the measured step
                _number(value, f"quality.{key}")
        elif not isinstance(value, kind) or isinstance(value, bool):
            raise TfplanError(f"quality.{key}: must be {'an integer' if kind is int else 'a ' + kind.__name__}")
    for name, value in obj.get("spread", {}).items():
        _number(value, f"quality.spread.{name}")
    if not all(isinstance(w, str) for w in obj.get("warnings", [])):
        raise TfplanError("quality.warnings: must be a list of strings")
    return obj


def load(path: str | Path) -> Profile:
    """Read and validate a profile JSON file.

    Raises:
        TfplanError: missing file, invalid JSON or a schema violation (naming the file and field).
    """
    path = Path(path)
    obj = read_json(path, "profile")
    try:
        return from_dict(obj)
    except TfplanError as exc:
        raise TfplanError(f"{path}: {exc}") from None


def uniform(num_stages: int, name: str = "uniform", **costs: float) -> Profile:
    """A hand profile with the same costs on every stage (tests, examples)."""
    defaults = dict(
        forward_ms=1.0,
        backward_ms=2.0,
        backward_frozen_ms=1.0,
        backward_input_ms=1.0,
        backward_weight_ms=1.0,
        backward_weight_frozen_ms=0.0,
    )
    p2p = costs.pop("p2p_ms", 0.0)
    cost = StageCost(**(defaults | costs))
    return Profile(name=name, source={"kind": "hand"}, p2p_ms=p2p, stages=(cost,) * num_stages)
