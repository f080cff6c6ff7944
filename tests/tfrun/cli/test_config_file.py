"""`tfrun train --config run.toml` (tfrun.cli.config_file): options by long name, command-line flags over the file
over the resumed run's OUT/config.toml over the defaults (Note [config precedence]); the resolved configuration
written into the run folder reads back as the same settings. Bad files: tests/bad_inputs (manifest.json)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import BAD_INPUTS, torch_or_skip

PLAN = BAD_INPUTS / "valid-plan.json"


def _train(args: list[str], monkeypatch):
    """Run `tfrun train ARGS` in-process up to the launch; returns (exit code, stderr, the TrainConfig)."""
    torch_or_skip()
    from typer.testing import CliRunner

    from tfrun.cli.app import app
    from tfrun.distributed import launch

    seen = {}

    def capture(config):
        seen["config"] = config
        raise SystemExit(0)

    monkeypatch.setattr(launch, "launch", capture)
    result = CliRunner().invoke(app, ["train", *args])
    return result.exit_code, result.stderr, seen.get("config")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_file_sets_options_and_flags_override_it(tmp_path, monkeypatch) -> None:
    toml = _write(tmp_path / "run.toml", f'plan = "{PLAN}"\nlr = 2e-5\nlr-schedule = "cosine"\n'
                                         'lr-warmup-steps = 3\nsteps = 12\nclip-grad-norm = 1\n'
                                         'adam-betas = [0.9, 0.95]\nforce = true\nquiet = true\n'
                                         'max-freeze-ratio = 0.5\n')  # (one number where a list is taken)
    code, err, config = _train(["--config", str(toml), "--steps", "20", "--out", str(tmp_path / "run")], monkeypatch)
    assert code == 0, err
    assert 'max-freeze-ratio = "0.5"' in (tmp_path / "run" / "config.toml").read_text()
    assert (config.lr, config.lr_schedule, config.lr_warmup_steps) == (2e-5, "cosine", 3)
    assert config.steps == 20 and config.clip_grad_norm == 1.0 and config.adam_betas == [0.9, 0.95]
    resolved = (tmp_path / "run" / "config.toml").read_text()
    assert "steps = 20" in resolved and 'lr-schedule = "cosine"' in resolved and "config =" not in resolved
    # the resolved file is itself a configuration file: the same settings again
    code, err, again = _train(["--config", str(tmp_path / "run" / "config.toml"), "--out", str(tmp_path / "two")],
                              monkeypatch)
    assert code == 0, err
    assert again.steps == 20 and again.lr == 2e-5 and again.adam_betas == [0.9, 0.95]


def test_a_resume_starts_from_the_runs_resolved_configuration(tmp_path, monkeypatch) -> None:
    from tfrun.cli import config_file

    out = tmp_path / "run"
    out.mkdir()
    _write(out / config_file.RESOLVED, f'plan = "{PLAN}"\nsteps = 9\nlr = 0.001\nforce = true\nout = "elsewhere"\n')
    toml = _write(tmp_path / "over.toml", "lr = 0.002\n")
    ctx = _context()
    config_file.on_resume(ctx, None, str(out))
    assert ctx.default_map["steps"] == 9 and "out" not in ctx.default_map  # the run's folder is where it is
    config_file.on_config(ctx, None, str(toml))
    assert ctx.default_map["lr"] == 0.002  # --config's file over the resumed run's
    config_file.raise_errors(ctx)


def _context():
    """The train command's click context, as the eager callbacks see it."""
    import typer.main

    from tfrun.cli.app import app

    command = typer.main.get_command(app).commands["train"]
    return command.make_context("train", [], resilient_parsing=True)


@pytest.mark.parametrize("text,expected", [
    ("lr-shedule = 'cosine'\n", "unknown option 'lr-shedule' (did you mean 'lr-schedule'?)"),
    ("lr = 'fast'\n", "lr: must be a number, got \"fast\""),
    ("steps = 1.5\n", "steps: must be an integer, got 1.5"),
    ("quiet = 1\n", "quiet: must be true or false, got 1"),
    ("lr = \n", "not TOML"),
])
def test_bad_files_are_one_line_naming_the_key(text: str, expected: str, tmp_path, monkeypatch) -> None:
    toml = _write(tmp_path / "bad.toml", text)
    code, err, config = _train(["--config", str(toml), "--plan", str(PLAN), "--out", str(tmp_path / "run")],
                               monkeypatch)
    assert code == 1 and config is None
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], err
    assert not (tmp_path / "run").exists()


def test_a_resume_on_other_data_drops_the_resumed_data_settings(tmp_path, monkeypatch) -> None:
    """Note [resumed data]: the resumed run's --tokenizer and --token-dtype come with its --data only. (The
    checks of data and checkpoint are tfrun.cli.setup's, stubbed here; a real resume on the token cache:
    tests/tfrun/test_hf_train.py.)"""
    from tfrun.cli import config_file, setup

    monkeypatch.setattr(setup, "_checked", lambda config, token_cache_dir=None: config)
    out = tmp_path / "run"
    out.mkdir()
    _write(out / config_file.RESOLVED, f'plan = "{PLAN}"\nforce = true\ndata = "docs.txt"\n'
                                       'tokenizer = "tokenizer.json"\ntoken-dtype = "uint32"\n')
    code, err, same = _train(["--resume", str(out)], monkeypatch)
    assert code == 0, err
    assert (same.data_path, same.tokenizer_path, same.token_dtype) == ("docs.txt", "tokenizer.json", "uint32")
    code, err, other = _train(["--resume", str(out), "--data", "ids.bin"], monkeypatch)
    assert code == 0, err
    assert (other.data_path, other.tokenizer_path, other.token_dtype) == ("ids.bin", None, "uint16")
    assert "tokenizer" not in (out / config_file.RESOLVED).read_text()  # the resolved file says what ran
    code, err, kept = _train(["--resume", str(out), "--data", "more.txt", "--tokenizer", "t2.json"], monkeypatch)
    assert code == 0, err
    assert (kept.tokenizer_path, kept.token_dtype) == ("t2.json", "uint16")
