"""`tfrun retime`: the ranks run again the work of several recorded runs, side by side, and time it.

Note [paired time]: a run's losses are exact for its seed, but its time axis is not: this VM's speed drifts by up
to 18% between runs an hour apart, more than the gaps between methods at equal time. So the time axis is
measured again, for every run at once, in one launch: each run's recorded steps (frozen_sets.jsonl: what every
(stage, micro-batch) action froze; which steps measured the noise scale or timed their actions, from
metrics.jsonl) are replayed in short blocks, the runs alternating block by block (A B C, then B C A, ...), so a
slow spell of the machine lands on every run alike. Only one step in each window of `sample_every` is replayed,
and it stands for its window: the step is drawn at random in the window, afresh in every repeat and the same
for every run (a fixed step would always be the one that measures the noise scale, every 5th, or never the one
that runs a baseline's check, every 10th: a cost paid one step in K is billed K times or never), so that each
repeat's time is an unbiased sample of the run's. The whole is repeated `repeats` times; their spread is the
instrument's own, sampling included.

What a replayed step runs is what the run's step ran: the same model and schedule, the batch of that step, the
recorded frozen sets (tfrun.freeze.replay), the noise measurement and action timing where the run had them, the
gradient reduction, norm and clipping, a baseline's statistics (APF, AutoFreeze) and the optimizer, at learning
rate 0 so that the weights stay those of the start: the step's cost is taken not to depend on the weights'
values. Not replayed: what a run does between steps (the online mode's solves, metrics, checkpoints); tfrun
compare adds each run's own measured time between steps (wall_ms - step_time_ms), which is small beside its
steps. Output: OUT/retime.json (tfrun.records.compare reads it: `tfrun compare --paired`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tfplan.fileio import write_text_atomic
from tfrun.config.train_config import TrainConfig
from tfrun.data import Batches, rank_tokens, split_tokens
from tfrun.distributed.rank import build_rank, replica_rows
from tfrun.errors import TfrunError
from tfrun.freeze import baselines
from tfrun.freeze.replay import ReplayFreezer
from tfrun.records import frozen_sets
from tfrun.train import optimizer_step, pick_device

SCHEMA_VERSION = 1
SAME = ("model", "microbatch_size", "seq_len", "num_microbatches", "order", "stage_to_rank", "dp", "freeze_method",
        "noise_measure", "precision")
"""Settings every replayed run must share with the baseline, --force or not: one launch of ranks runs them all."""
SEED = 0
"""Of the sampled steps' draws (Note [paired time])."""


def sampled_steps(steps: int, every: int, repeats: int, seed: int = SEED) -> list[list[int]]:
    """Per repeat, one step drawn in each window [w every, (w + 1) every) of a run of `steps` steps (the last
    window may be shorter); the same draws for every run of that length (Note [paired time]).

    >>> sampled_steps(25, 10, 2)
    [[8, 17, 22], [2, 15, 22]]
    """
    rng = random.Random(seed)
    draws = [[rng.random() for _ in range(0, steps, every)] for _ in range(repeats)]
    return [[w * every + int(u * min(every, steps - w * every)) for w, u in enumerate(row)] for row in draws]


def retime(runs: list[str], *, baseline: str | None, out: str, sample_every: int, block: int, repeats: int,
           force: bool = False) -> dict:
    """`tfrun retime` on the launcher's side: check the runs, write OUT/retime_spec.json, launch the ranks (they run
    `run`) and return retime.json's content. A user mistake is one TfrunError line."""
    from tfrun.distributed.launch import launch
    from tfrun.records import compare

    assert sample_every >= 1 and block >= 1 and repeats >= 1
    loaded, base = compare.load_comparable(runs, baseline, force, "retime")
    if base not in loaded:
        loaded.append(base)
    folder = Path(out)
    if any(folder.resolve() == Path(run.dir).resolve() for run in loaded) or (folder / "metrics.jsonl").exists():
        raise TfrunError(f"--out {out} is a run's folder: retime writes its own (run_config.json, retime.json)")
    nearest = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not nearest.is_dir():  # (mkdir's FileExistsError or NotADirectoryError was a traceback)
        raise TfrunError(f"--out {out}: {nearest} is a file, not a folder")
    spec_runs = []
    for run in loaded:
        for key in SAME:
            if run.config.get(key) != base.config.get(key):
                raise TfrunError(f"{run.dir} differs from the baseline in {key}: runs replayed on one launch of "
                                 "ranks must share it")
        recorded = frozen_sets.load(run.dir)  # each rank reads it; a missing or malformed one fails here
        numbers = [row["step"] for row in run.steps]
        if numbers != list(range(len(numbers))):
            raise TfrunError(f"{run.dir}: metrics.jsonl's steps are not 0, 1, 2, ...: not one whole run")
        chosen = sampled_steps(len(numbers), sample_every, repeats)
        missing = sorted({n for row in chosen for n in row} - set(recorded.steps))
        if missing:
            raise TfrunError(f"{run.dir}: frozen_sets.jsonl has no step {missing[0]} (a run resumed from one "
                             "written before tfrun recorded its frozen sets?): it cannot be replayed")
        spec_runs.append({"dir": run.dir, "steps": chosen,
                          "noise_steps": [row["step"] for row in run.steps if "noise_scale_tokens" in row],
                          "timed_steps": [row["step"] for row in run.steps if row.get("timed")]})
    spec = {"baseline": base.dir, "sample_every": sample_every, "block": block, "repeats": repeats,
            "runs": spec_runs}
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "retime_spec.json"
    write_text_atomic(spec_path, json.dumps(spec, indent=1) + "\n")
    config = dataclasses.replace(TrainConfig.load(Path(base.dir) / "run_config.json"), out_dir=str(folder),
                                 retime=str(spec_path.resolve()), resume=False, resume_step=None, init_from=None,
                                 quiet=True, tensorboard=False)
    launch(config)
    return json.loads((folder / "retime.json").read_text())


def run(config: TrainConfig) -> dict | None:
    """Replay the spec's runs on this rank (Note [paired time]); rank 0 writes and returns retime.json's content."""
    spec = json.loads(Path(config.retime).read_text())
    torch.set_num_threads(config.threads)
    dev = pick_device()
    r = build_rank(config, dev, freezer_class=ReplayFreezer)
    r.state.freezing = True  # (the baseline's config says --freeze none; what freezes is the recorded sets)
    r.noise.every = 0  # measured only where each run measured (forced)
    runs = spec["runs"]
    noise_steps, timed_steps = [set(run["noise_steps"]) for run in runs], [set(run["timed_steps"]) for run in runs]
    recorded = [frozen_sets.load(run["dir"]) for run in runs]
    configs = [TrainConfig.load(Path(run["dir"]) / "run_config.json") for run in runs]  # (clipping, rescaling)
    signals = []
    for run_config in configs:
        factory = baselines.signal_factory(run_config)
        signals.append(factory(r.freezer.stage_candidates) if factory is not None else None)
    tokens = split_tokens(rank_tokens(config.data_path, token_cache=config.token_cache,
                                      token_dtype=config.token_dtype))[0]
    batches = Batches(tokens, global_batch=config.global_batch, seq_len=config.seq_len, seed=config.seed)
    has_first, has_last = 0 in r.local, config.num_stages - 1 in r.local
    m = config.num_microbatches
    mismatched = [0]  # (stage, micro-batch) actions whose frozen set was not the record's: every action ran

    def one_step(k: int, step: int) -> float:
        """Run step `step` of run k as it ran; its time in ms (every rank's, bounded by barriers)."""
        x, y = (replica_rows(t, m, r.dp, r.dp_rank) for t in batches.batch_at(step))
        r.state.begin(step)
        r.noise.begin_step(step, force=step in noise_steps[k])
        losses: list = []
        dist.barrier()
        r.timer.enabled = step in timed_steps[k]
        r.timer.begin_step(step)
        t0 = time.perf_counter()
        r.runtime.step(*((x.to(dev),) if has_first else ()),
                       **({"target": y.to(dev), "losses": losses} if has_last else {}))
        finite = all(bool(torch.isfinite(v)) for v in losses) if has_last else None
        r.timer.span("optimizer", optimizer_step, r, configs[k], step, r.noise, 0.0, finite)
        dist.barrier()
        ms = (time.perf_counter() - t0) * 1e3
        r.timer.end_step()
        recorded_sets = recorded[k].steps[step]
        mismatched[0] += sum(r.state.frozen.get((s, mb), frozenset()) != recorded_sets[s][mb]
                             for s in r.local for mb in range(m))
        return ms

    def use(k: int) -> None:
        r.freezer.replay(recorded[k], signals[k])

    block, repeats = int(spec["block"]), int(spec["repeats"])
    for k, run in enumerate(runs):  # warm-up: each run's first sampled step once, untimed
        use(k)
        one_step(k, run["steps"][0][0])
    times: list[list[list[float | None]]] = [[[None] * len(row) for row in run["steps"]] for run in runs]
    started = time.time()
    for repeat in range(repeats):
        longest = max(len(run["steps"][repeat]) for run in runs)
        for b, first in enumerate(range(0, longest, block)):
            order = [(b + repeat + j) % len(runs) for j in range(len(runs))]  # who goes first turns each block
            for k in order:
                use(k)
                chosen = runs[k]["steps"][repeat]
                for i in range(first, min(first + block, len(chosen))):
                    times[k][repeat][i] = one_step(k, chosen[i])
    counts = torch.tensor([mismatched[0]], dtype=torch.int64, device=dev)
    dist.all_reduce(counts)
    if dist.get_rank() != 0:
        return None
    result = {"schema_version": SCHEMA_VERSION, "baseline": spec["baseline"], "sample_every": spec["sample_every"],
              "block": block, "repeats": repeats, "started": started, "seconds": time.time() - started,
              "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
              "mismatched_actions": int(counts.item()),
              "runs": [{"dir": run["dir"], "steps": run["steps"], "step_ms": times[k]} for k, run in enumerate(runs)]}
    write_text_atomic(Path(config.out_dir) / "retime.json", json.dumps(result, indent=1) + "\n")
    return result
