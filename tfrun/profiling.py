"""`tfrun profile`: measure a profile inside the pipeline (times differ from isolated micro-benchmarks).

Four short runs of the same stages on the same ranks:
  A  the full-backward schedule, nothing frozen    -> forward_ms, backward_ms, p2p_ms, step_overhead_ms
  B  the same, everything frozen                   -> backward_frozen_ms
  C  its split I/W counterpart, nothing frozen     -> backward_input_ms, backward_weight_ms
  D  the same, everything frozen                   -> backward_weight_frozen_ms
The split counterpart is torch's InterleavedZeroBubble with the same ranks and stages per rank.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tfplan import profile as profile_mod
from tfplan import schedules
from tfrun.config import TrainConfig
from tfrun.errors import TfrunError

RUNS = (  # name, split schedule?, freeze
    ("full-none", False, "none"),
    ("full-all", False, "all"),
    ("split-none", True, "none"),
    ("split-all", True, "all"),
)


def measure(
    *, model: str, num_ranks: int, num_microbatches: int, schedule: str, stages_per_rank: int, steps: int,
    microbatch_size: int, seq_len: int, threads: int, seed: int, work_dir: str | None,
) -> profile_mod.Profile:
    """Run the four measuring jobs and combine them into one profile."""
    from tfrun.launch import launch
    from tfrun.runtime import check_torch

    check_torch()
    full = schedules.generate(schedule, num_ranks, num_microbatches, stages_per_rank)
    if any(a.kind in "IW" for row in full.order for a in row):
        raise TfrunError(f"--schedule must be a full-backward schedule (F/B), got {schedule}")
    split = schedules.generate("interleaved-zb", num_ranks, num_microbatches, stages_per_rank)
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="tfrun-profile-"))
    for name, use_split, freeze in RUNS:
        sched = split if use_split else full
        config = TrainConfig(
            order=[[str(a) for a in row] for row in sched.order], num_stages=sched.num_stages,
            num_microbatches=num_microbatches, stage_to_rank=list(sched.stage_to_rank),
            schedule_name=sched.name, freeze=freeze, model=model, steps=steps, seed=seed,
            out_dir=str(root / name), microbatch_size=microbatch_size, seq_len=seq_len, threads=threads,
            eval_batches=1, quiet=True, timing_warmup_steps=2,
        )
        config.check()
        launch(config)
    return combine(root, model=model, schedule=full.name, num_stages=full.num_stages)


def combine(root: Path, *, model: str, schedule: str, num_stages: int) -> profile_mod.Profile:
    """One profile from the four runs' timings.json (which run gives which field: module docstring)."""
    timings = {name: json.loads((root / name / "timings.json").read_text()) for name, *_ in RUNS}
    summaries = {name: json.loads((root / name / "summary.json").read_text()) for name, *_ in RUNS}
    base = json.loads((root / "full-none" / "profile.json").read_text())

    def median(run: str, stage: int, kind: str) -> float:
        value = timings[run]["by_stage_kind_ms"].get(f"{stage}{kind}")
        if value is None:
            raise TfrunError(f"profiling run {run} measured no {kind} on stage {stage} (see {root / run})")
        return value

    stages = []
    for s in range(num_stages):
        backward, weight = median("full-none", s, "B"), median("split-none", s, "W")
        stages.append(profile_mod.StageCost(
            forward_ms=median("full-none", s, "F"),
            backward_ms=backward,
            backward_frozen_ms=min(median("full-all", s, "B"), backward),
            backward_input_ms=median("split-none", s, "I"),
            backward_weight_ms=weight,
            backward_weight_frozen_ms=min(median("split-all", s, "W"), weight),
            name=f"stage {s}",
        ))
    source = {k: v for k, v in base["source"].items() if k not in ("measured_fields", "other_fields", "freeze")}
    source |= {
        "runs": {name: {"schedule": summaries[name]["schedule"], "freeze": summaries[name]["freeze"],
                        "step_time_ms": summaries[name]["step_time_ms"]} for name, *_ in RUNS},
        "note": "F, B, p2p and step overhead from run full-none; frozen B from full-all; I and W from "
                "split-none; frozen W from split-all; medians over every micro-batch of the timed steps",
    }
    return profile_mod.Profile(
        name=f"measured-{model}-{schedule}-{num_stages}stages", source=source,
        p2p_ms=timings["full-none"]["p2p_ms"], step_overhead_ms=timings["full-none"]["step_overhead_ms"],
        stages=tuple(stages),
    )
