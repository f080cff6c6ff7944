"""`tfrun profile`: measure a profile inside the pipeline (times differ from isolated micro-benchmarks).

Four short runs of the same stages on the same ranks, for any schedule tfrun runs:
  primary-none      the profiled schedule, nothing frozen    -> F, its backward kind(s), p2p, dispatch,
                                                                 ranks' tails, step overhead, quality
  primary-all       the same, everything frozen               -> its backward kind(s), frozen
  counterpart-none  the other backward style, nothing frozen  -> the backward kinds the schedule does not run
  counterpart-all   the same, everything frozen
A full-backward schedule (GPipe, 1F1B, interleaved 1F1B, looped BFS) takes I and W from its split
counterpart, torch's InterleavedZeroBubble with the same ranks and stages per rank; a split schedule
(interleaved ZB, ZBV, DualPipeV) takes B from interleaved 1F1B with the same ranks and stages per rank (a
stage's compute time does not depend on which rank holds it). So the plan for a zero-bubble schedule is
solved against F, I and W measured under that schedule itself.

With `repeat` > 1 the four runs are repeated and the most consistent set kept (smallest largest spread plus
replay gap of its primary run); every candidate's score is recorded in the profile's source.

The primary-none run also measures each stage's gradient noise scale (tfrun.freeze.noise), which the profile's
noise section records: at the model's initialisation, or at the weights of `init_from` (the noise scale grows as
the loss falls, so profile a fine-tuning job from its checkpoint) on the run's data.

Note [hook-free timings]: a step that measures the noise scale runs the meter's hooks and per-sequence norms
alongside the backward, which slows the backward by about a fifth and leaves the forward as it is (tiny model,
1F1B, 2 ranks, 24-step runs alternating: B 48.8 / 56.7 ms measuring every step against 40.5 / 45.6 ms not, F
21.1 / 25.6 against 21.3 / 23.9 ms; docs/benchmarks.md, "Prediction at the machine's speed"). The primary-none
run measured the noise on every step, so until 2026-12-06 the profile's unfrozen backward kinds carried the
hooks while its frozen ones (from the `all` runs, which measure nothing) did not: freezing looked ~20% more
profitable than it is, and a run's backwards then ran at 0.82-0.92 of its forwards' speed against the profile.
So primary-none runs twice the steps, measures the noise on the even ones (as many measured steps as before)
and times only the odd ones (TrainConfig.time_noise_steps: their actions, spans and step times).

Note [profile at fixed weights]: every measuring run steps its optimizer at learning rate 0 (TrainConfig
fixed_weights): the optimizer's time is in the profile, and the weights stay at the initialisation or at
`init_from`'s, where the noise section says it was measured. Trained at the default learning rate instead, the
20 steps of a run from a random initialisation move the noise scale several-fold while it is measured: on a
held-out case (benchmarks/noise_reference.py --case heldout --via-profile: an HF LLaMA of other widths, heads
and depth on networkx's sources) the profile read stage 0 at 4.6x and stage 1 at 0.43x the exact value at the
weights it names (docs/cost-model.md, "Which noise estimator" 7).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tfplan.cost import profile as profile_mod
from tfplan.report import summary as summary_format
from tfplan.schedule import schedules
from tfrun.config.train_config import TrainConfig
from tfrun.errors import TfrunError

RUNS = (  # name, counterpart?, freeze
    ("primary-none", False, "none"),
    ("primary-all", False, "all"),
    ("counterpart-none", True, "none"),
    ("counterpart-all", True, "all"),
)
DEFAULT_STEPS = 20
"""Steps per measuring run (the first 2 untimed; the noise run twice as many: Note [hook-free timings]).
Chosen by measurement: docs/benchmarks.md, "Profile stability"."""


def measure(
    *, model: str, num_ranks: int, num_microbatches: int, schedule: str, stages_per_rank: int | None, steps: int,
    microbatch_size: int, seq_len: int, threads: int, seed: int, work_dir: str | None, repeat: int = 1,
    dp: int = 1, init_from: str | None = None, data_path: str | None = None, precision: str = "auto",
) -> profile_mod.Profile:
    """Run the measuring jobs (4 x repeat) and combine the most consistent set into one profile."""
    from tfrun.distributed.launch import launch
    from tfrun.distributed.runtime import check_torch

    check_torch()
    from tfrun import models

    models.check(model)  # an hf:DIR checkpoint is complete before any measuring run starts
    from tfrun.data import tokenfile

    if models.model_config(model).vocab_size < 256 and not tokenfile.is_token_file(data_path):
        raise TfrunError(f"model {model}: profiling feeds byte-level text (ids < 256), the model's vocabulary has "
                         f"{models.model_config(model).vocab_size}; pass a .bin token file as --data")
    model = models.absolute(model)
    if repeat < 1 or steps < 3:
        raise TfrunError(f"--repeat must be >= 1 and --steps >= 3, got {repeat} and {steps}")
    spec = schedules.get_spec(schedule)
    v = spec.default_stages_per_rank if stages_per_rank is None else stages_per_rank
    primary = schedules.generate(spec.name, num_ranks, num_microbatches, v)
    split = any(a.kind in "IW" for row in primary.order for a in row)
    counterpart = schedules.generate("interleaved-1f1b" if split else "interleaved-zb", num_ranks, num_microbatches, v)
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="tfrun-profile-"))
    candidates = []
    for k in range(repeat):
        folder = root / f"repeat{k}" if repeat > 1 else root
        for name, use_counterpart, freeze in RUNS:
            sched = counterpart if use_counterpart else primary
            noisy = name == "primary-none"  # Note [hook-free timings]
            config = TrainConfig(
                order=[[str(a) for a in row] for row in sched.order], num_stages=sched.num_stages,
                num_microbatches=num_microbatches, stage_to_rank=list(sched.stage_to_rank),
                schedule_name=sched.name, freeze=freeze, model=model, steps=2 * steps if noisy else steps, seed=seed,
                out_dir=str(folder / name), microbatch_size=microbatch_size, seq_len=seq_len, threads=threads,
                eval_batches=1, quiet=True, timing_warmup_steps=2, dp=dp, init_from=init_from, data_path=data_path,
                noise_every=2 if noisy else 0, time_noise_steps=not noisy, model_hash=models.model_hash(model),
                precision=precision, fixed_weights=True,
            )
            config.check()
            if launch(config) is not None:
                raise TfrunError(f"profiling stopped by a signal during run {name} ({folder / name})")
        prof = combine(folder, model=model, schedule=primary.name, num_stages=primary.num_stages, split=split,
                       microbatch_tokens=microbatch_size * seq_len, init_from=init_from)
        candidates.append((score(prof), str(folder), prof))
    best = min(candidates, key=lambda c: c[0])
    if repeat == 1:
        return best[2]
    source = best[2].source | {"repeats": [{"dir": d, "score": s} for s, d, _ in candidates], "kept": best[1]}
    return profile_mod.Profile(**{**_fields(best[2]), "source": source})


def score(prof: profile_mod.Profile) -> float:
    """Inconsistency of a measured profile: its largest spread plus the absolute replay gap."""
    q = prof.quality or {}
    return q.get("max_spread", 0.0) + abs(q.get("replay_gap", 0.0))


def _fields(prof: profile_mod.Profile) -> dict:
    return {f: getattr(prof, f) for f in prof.__dataclass_fields__}


def combine(root: Path, *, model: str, schedule: str, num_stages: int, split: bool, microbatch_tokens: int = 0,
            init_from: str | None = None) -> profile_mod.Profile:
    """One profile from the four runs (which run gives which field: module docstring)."""
    profiles = {name: profile_mod.load(root / name / "profile.json") for name, *_ in RUNS}
    summaries = {name: summary_format.load(root / name / "summary.json") for name, *_ in RUNS}
    full_src = "counterpart" if split else "primary"
    split_src = "primary" if split else "counterpart"

    def got(run: str, stage: int, field: str) -> float:
        prof = profiles[run]
        if field not in prof.source["measured_fields"][str(stage)]:
            raise TfrunError(f"profiling run {run} measured no {field} on stage {stage} (see {root / run})")
        return getattr(prof.stages[stage], field)

    stages = []
    for s in range(num_stages):
        backward = got(f"{full_src}-none", s, "backward_ms")
        weight = got(f"{split_src}-none", s, "backward_weight_ms")
        stages.append(profile_mod.StageCost(
            forward_ms=got("primary-none", s, "forward_ms"),
            backward_ms=backward,
            backward_frozen_ms=min(got(f"{full_src}-all", s, "backward_frozen_ms"), backward),
            backward_input_ms=got(f"{split_src}-none", s, "backward_input_ms"),
            backward_weight_ms=weight,
            backward_weight_frozen_ms=min(got(f"{split_src}-all", s, "backward_weight_frozen_ms"), weight),
            tail_ms=profiles["primary-none"].stages[s].tail_ms,
            grad_bytes=profiles["primary-none"].stages[s].grad_bytes,
            name=f"stage {s}",
        ))
    base = profiles["primary-none"]
    source = {k: v for k, v in base.source.items() if k not in ("measured_fields", "other_fields", "freeze")}
    source |= {
        "runs": {name: {"schedule": summaries[name]["schedule"], "freeze": summaries[name]["freeze"],
                        "step_time_ms": summaries[name]["step_time_ms"]} for name, *_ in RUNS},
        "note": f"F, p2p, dispatch, tails, step overhead from run primary-none ({schedule}); "
                f"{'I and W' if split else 'B'} from primary-none, frozen from primary-all; "
                f"{'B' if split else 'I and W'} from counterpart-none, frozen from counterpart-all; medians over "
                "every micro-batch of the timed steps",
    }
    quality = dict(base.quality or {})
    warnings = list(quality.get("warnings", []))
    for name in ("primary-all", "counterpart-none", "counterpart-all"):
        warnings += [f"{name}: {w}" for w in (profiles[name].quality or {}).get("warnings", [])
                     if "replayed step" not in w]  # the replay gap that matters is the profiled schedule's
    quality["warnings"] = warnings
    return profile_mod.Profile(
        name=f"measured-{model}-{schedule}-{num_stages}stages", source=source, p2p_ms=base.p2p_ms,
        dispatch_ms=base.dispatch_ms, step_overhead_ms=base.step_overhead_ms, quality=quality, stages=tuple(stages),
        dp=base.dp, noise=_noise(summaries["primary-none"], microbatch_tokens, init_from),
    )


def _noise(summary: dict, microbatch_tokens: int, init_from: str | None):
    """The profile's noise section from the primary run's summary (tfrun.freeze.noise), or None when some stage had no
    positive estimate."""
    from tfplan.cost import goodput

    scales, shares = summary.get("noise_scale_tokens"), summary.get("grad_sq_share")
    if not scales or shares is None or any(x is None or x < 0 for x in scales) or microbatch_tokens < 1:
        return None
    where = f"the weights of {init_from}" if init_from else "the initialisation"
    return goodput.measured(scales, shares, microbatch_tokens, summary.get("update_share"),
                            note=f"two-batch estimator (tfrun.freeze.noise), small batch one "
                           f"{summary.get('noise_measure', 'microbatch')} (Note [noise measure]), "
                           f"{summary.get('noise_estimator', 'ema')} "
                           f"smoothing (tfrun.freeze.noise_estimators), median over the "
                           f"{summary.get('noise_steps')} steps of run primary-none at {where} (learning rate 0: "
                           f"Note [profile at fixed weights])")
