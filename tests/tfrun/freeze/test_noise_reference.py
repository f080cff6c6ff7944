"""The pipeline's noise scale against its definition (a smaller version of benchmarks/noise_reference.py): at the
tiny model's initial weights, the exact per-stage noise scale from 192 sequences' own gradients (tfrun.freeze.
noise_reference Note [exact noise scale]) and what the pipeline's NoiseMeter measures at the same weights over
12 steps, with every estimator and both --noise-measure values, within a factor 1.3 (issue 36)."""

from __future__ import annotations

import statistics

from tests.conftest import torch_or_skip

SEQUENCES, STEPS, M, MB_SIZE, SEQ = 192, 12, 4, 4, 64


def test_every_estimator_lands_within_a_factor_1_3_of_the_definition() -> None:
    torch = torch_or_skip()
    from tfrun.config.train_config import NOISE_ESTIMATORS, NOISE_MEASURES
    from tfrun.data import Batches, encode, load_corpus, split_tokens
    from tfrun.freeze.noise_reference import exact, pipeline_estimate
    from tfrun.models import MODELS, build_stage, loss_fn

    torch.manual_seed(0)
    stages = {s: build_stage(MODELS["tiny"], s, 2, 0) for s in (0, 1)}
    tokens = split_tokens(encode(load_corpus(None)))[0]
    x, y = Batches(tokens, global_batch=SEQUENCES, seq_len=SEQ, seed=12345).batch_at(0)
    reference = exact(stages, loss_fn, x, y)
    assert set(reference) == {0, 1} and all(100 < v < 1000 for v in reference.values()), reference
    trails = pipeline_estimate(stages, loss_fn, Batches(tokens, global_batch=M * MB_SIZE, seq_len=SEQ, seed=7),
                               steps=STEPS, num_microbatches=M, estimators=NOISE_ESTIMATORS, measures=NOISE_MEASURES)
    for (measure, estimator), trail in trails.items():
        for s, expected in reference.items():
            measured = statistics.median(row[s] for row in trail)  # as summary.json reports it
            assert 1 / 1.3 <= measured / expected <= 1.3, (measure, estimator, s, measured, expected)
