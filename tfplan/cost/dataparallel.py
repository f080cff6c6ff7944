"""Data parallelism in the model of the step: each pipeline rank's gradient reduction across replicas.

With D replicas of the pipeline, every rank reduces its stages' gradients across the D replicas once per
step, after its last action (tfrun does it there, not overlapped with the backward: docs/design.md). In the
DAG that is part of the rank's tail (tfplan.step.dag Note [rank tails]): the step ends when the slowest rank has
finished its actions, its reduction and its optimizer. A ring all-reduce of N bytes over D replicas moves
2 (D - 1) / D x N bytes through each replica's link in 2 (D - 1) messages:

    allreduce_ms = 2 (D - 1) / D x N / bandwidth + 2 (D - 1) x latency

`with_dp` adds that to each stage's tail from its `grad_bytes` (a profile measured at D' replicas already
holds D' in its tails and `dp` field: the difference is added). The link is a named one (tfplan.cost.hardware:
'nvlink', 'pcie', 'ib' of the profile's GPU, or a generation such as 'ib-ndr'), or 'GBPS:LATENCY_US'.
"""

from __future__ import annotations

import dataclasses
import math

from tfplan.cost.hardware import LinkSpec, get_link
from tfplan.cost.profile import Profile
from tfplan.errors import TfplanError


def allreduce_ms(nbytes: float, dp: int, link: LinkSpec) -> float:
    """Ring all-reduce time of `nbytes` over `dp` replicas (ms; 0 for one replica).

    >>> round(allreduce_ms(1e9, 8, LinkSpec(name="x", gb_per_s=50.0, latency_us=15.0)), 3)
    35.21
    """
    if dp <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (dp - 1) / dp * nbytes / (link.gb_per_s * 1e9) * 1e3 + 2 * (dp - 1) * link.latency_us / 1e3


def parse_link(text: str, profile: Profile) -> LinkSpec:
    """A link from the command line: 'GBPS:LATENCY_US', or a name resolved against the profile's GPU.

    Raises:
        TfplanError: a malformed spec, or a generic name for a profile that names no GPU.
    """
    if ":" in text:
        try:
            gbps, latency = (float(x) for x in text.split(":"))
        except ValueError:
            raise TfplanError(f"--dp-link {text!r}: give a name (ib, nvlink, ib-ndr, ...) or GBPS:LATENCY_US") from None
        if not (0 < gbps < math.inf and 0 <= latency < math.inf):  # (NaN too)
            raise TfplanError(f"--dp-link {text!r}: bandwidth must be finite and > 0, latency finite and >= 0")
        return LinkSpec(name=text, gb_per_s=gbps, latency_us=latency)
    gpu = profile.source.get("gpu")
    if gpu is None and text in ("nvlink", "pcie", "ib", "infiniband"):
        raise TfplanError(f"--dp-link {text}: profile {profile.name!r} names no GPU; give a generation (ib-ndr, "
                          "nvlink4, ...) or GBPS:LATENCY_US")
    return get_link(text, gpu or "h100")


def with_dp(profile: Profile, dp: int, link: LinkSpec | None) -> Profile:
    """The profile with each stage's tail holding its gradient reduction at `dp` replicas.

    Raises:
        TfplanError: dp < 1, or dp above the profile's without a link or without gradient sizes.
    """
    if dp < 1:
        raise TfplanError(f"--dp must be >= 1, got {dp}")
    if dp == profile.dp:
        return profile
    if link is None:
        raise TfplanError(f"--dp needs --dp-link (the link between replicas): profile {profile.name!r} was measured "
                          f"at {profile.dp} replica(s), so --dp {profile.dp} needs none")
    costs = profile.stages if profile.stages is not None else profile.layers
    if not any(c.grad_bytes > 0 for c in costs):
        raise TfplanError(f"profile {profile.name!r} has no grad_bytes: its gradient reduction cannot be modelled")
    extra = [allreduce_ms(c.grad_bytes, dp, link) - allreduce_ms(c.grad_bytes, profile.dp, link) for c in costs]
    scaled = tuple(dataclasses.replace(c, tail_ms=max(0.0, c.tail_ms + x)) for c, x in zip(costs, extra))
    source = profile.source | {"dp": {"replicas": dp, "link": link.name, "link_gb_per_s": link.gb_per_s,
                                      "link_latency_us": link.latency_us, "from_dp": profile.dp}}
    field = "stages" if profile.stages is not None else "layers"
    return dataclasses.replace(profile, name=f"{profile.name}-dp{dp}", source=source, dp=dp, **{field: scaled})
