"""`tfplan profile` (tfplan.cli.runs): analytic profiles per stage and per layer, planned on, and bad names."""

from __future__ import annotations

import json

from tests.tfplan.cli.runner import ok, run
from tfplan.cost import profile


def test_profile_analytic_per_stage_and_per_layer(tmp_path) -> None:
    out = tmp_path / "p.json"
    ok("profile", "--analytic", "--model", "llama3-8b", "--gpu", "h200", "--stages", "4", "--stages-per-rank", "2",
       "--microbatch-size", "1", "--seq-len", "2048", "-o", out)
    prof = profile.load(out)
    assert len(prof.stages) == 8 and prof.source["kind"] == "analytic" and prof.stages[0].backward_frozen_ms == 0
    layers = tmp_path / "layers.json"
    ok("profile", "--analytic", "--model", "llama3.2-1b", "--gpu", "a100", "--per-layer", "-o", layers)
    assert len(profile.load(layers).layers) == 16 + 2  # embedding, 16 blocks, head
    # A per-layer profile plans on any rank count; --layers-per-stage splits it explicitly.
    data = json.loads(ok("solve", "-p", layers, "-s", "1f1b", "-m", "8", "--ranks", "3", "--json").stdout)
    assert data["num_stages"] == 3
    split = json.loads(ok("solve", "-p", layers, "-s", "1f1b", "-m", "4", "--ranks", "2",
                          "--layers-per-stage", "9,9", "--json").stdout)
    assert split["num_stages"] == 2


def test_profile_analytic_bad_names(tmp_path) -> None:
    for args, message in ((["--model", "gpt5"], "known"), (["--gpu", "tpu"], "known"),
                          (["--model", "llama3-8b", "--mfu", "1.5"], "mfu"), ([], "--analytic needs --model")):
        result = run("profile", "--analytic", *args, "-o", tmp_path / "p.json")
        assert result.exit_code == 1 and result.stderr.startswith("error: "), result.stderr
        assert message in result.stderr
    assert list(tmp_path.iterdir()) == []
