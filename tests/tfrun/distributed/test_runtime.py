"""The executor against a single-process reference (gloo, spawned ranks, tiny model, one step).

With nothing frozen the loss and every gradient equal a 1-process run on the same micro-batches; with a
plan, exactly the planned (stage, micro-batch) pairs skip their frozen parameters' weight gradients: each
gradient equals the sum over the micro-batches in which its stage did not freeze it. Every schedule kind
(full backward, interleaved, split I/W, V placement, DualPipeV) and both freeze methods. With --clip-grad-norm
(tfrun.optim.clipping) the clipped gradients equal torch.nn.utils.clip_grad_norm_ on the whole model, on 1, 2
(and 4 stages on 2 ranks) and 3 ranks; with replicas: tests/tfrun/distributed/test_rank.py.
"""

from __future__ import annotations

import socket

import pytest

from tests.conftest import torch_or_skip

CASES_2 = [
    ("gpipe", 2, 1, 4, "none", "detach"),
    ("1f1b", 2, 1, 4, "none", "detach"),
    ("1f1b", 2, 1, 4, "mix", "detach"),
    ("1f1b", 2, 1, 4, "mix", "grad"),
    ("gpipe", 2, 1, 3, "all", "detach"),
    ("interleaved-1f1b", 2, 2, 4, "mix", "detach"),
    ("interleaved-1f1b", 2, 2, 4, "mix", "grad"),
    ("looped-bfs", 2, 2, 3, "mix", "detach"),
    ("interleaved-zb", 2, 2, 4, "none", "detach"),
    ("interleaved-zb", 2, 1, 4, "mix", "detach"),
    ("interleaved-zb", 2, 2, 4, "mix", "grad"),
    ("zbv", 2, 2, 4, "mix", "detach"),
    ("zbv", 2, 2, 3, "all", "grad"),
    ("dualpipev", 2, 2, 4, "mix", "detach"),
    ("1f1b", 2, 1, 4, "mix", "detach", "rescale"),
    ("zbv", 2, 2, 4, "mix", "grad", "rescale"),
    # --clip-grad-norm over every stage (tfrun.optim.clipping), frozen and unfrozen, each schedule family
    ("gpipe", 2, 1, 4, "none", "detach", "clip"),
    ("1f1b", 2, 1, 4, "mix", "detach", "clip"),
    ("interleaved-1f1b", 2, 2, 4, "mix", "grad", "clip"),
    ("looped-bfs", 2, 2, 3, "none", "detach", "clip"),
    ("interleaved-zb", 2, 2, 4, "mix", "detach", "clip"),
    ("zbv", 2, 2, 4, "none", "grad", "clip"),
    ("dualpipev", 2, 2, 4, "mix", "detach", "rescale", "clip"),
]
CASES_1 = [  # one stage: the whole model on one rank
    ("1f1b", 1, 1, 4, "mix", "detach", "clip"),
]
CASES_3 = [
    ("1f1b", 3, 1, 5, "mix", "detach"),
    ("interleaved-zb", 3, 1, 4, "mix", "grad"),
    ("1f1b", 3, 1, 5, "mix", "detach", "clip"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cases, world, tmp_path_factory):
    torch_or_skip()
    from tests import pipeline_harness, rank_processes

    out = tmp_path_factory.mktemp(f"pipe{world}")
    rank_processes.start(pipeline_harness.worker, (world, _free_port(), cases, str(out)), world)
    return out


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    return _run(CASES_2, 2, tmp_path_factory)


@pytest.fixture(scope="module")
def three_rank_results(tmp_path_factory):
    return _run(CASES_3, 3, tmp_path_factory)


@pytest.fixture(scope="module")
def one_rank_results(tmp_path_factory):
    return _run(CASES_1, 1, tmp_path_factory)


def _check(out, index: int, case: tuple, world: int) -> None:
    import torch

    from tests import pipeline_harness

    ref, ref_losses = pipeline_harness.reference(*case[:5], rescale="rescale" in case[6:], clip="clip" in case[6:])
    grads, losses = {}, []
    for r in range(world):
        saved = torch.load(out / f"case{index}-rank{r}.pt")
        grads.update(saved["grads"])
        losses += saved["losses"]
    assert sorted(losses) == pytest.approx(sorted(ref_losses), rel=1e-6)
    assert set(grads) == set(ref)
    for name, expected in ref.items():
        got = grads[name] if grads[name] is not None else torch.zeros_like(expected)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7, msg=f"{case}: gradient of {name}")


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES_2)), ids=["-".join(map(str, c)) for c in CASES_2])
def test_two_ranks_match_single_process(two_rank_results, index):
    _check(two_rank_results, index, CASES_2[index], 2)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES_3)), ids=["-".join(map(str, c)) for c in CASES_3])
def test_three_ranks_match_single_process(three_rank_results, index):
    _check(three_rank_results, index, CASES_3[index], 3)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES_1)), ids=["-".join(map(str, c)) for c in CASES_1])
def test_one_rank_matches_single_process(one_rank_results, index):
    _check(one_rank_results, index, CASES_1[index], 1)


def test_mixed_plan_really_differs_from_unfrozen():
    """Guards the test above against vacuity: the mixed plan's reference is not the unfrozen one."""
    torch_or_skip()
    import torch

    from tests import pipeline_harness

    mixed, _ = pipeline_harness.reference("1f1b", 2, 1, 4, "mix")
    plain, _ = pipeline_harness.reference("1f1b", 2, 1, 4, "none")
    rescaled, _ = pipeline_harness.reference("1f1b", 2, 1, 4, "mix", rescale=True)
    assert any(not torch.equal(mixed[n], plain[n]) for n in plain)
    assert any(not torch.equal(mixed[n], rescaled[n]) for n in plain)
