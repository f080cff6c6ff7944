"""The `tfplan` app as the CLI tests drive it, through typer's CliRunner: `run` (any exit, but never a
traceback or an exception escaping a command), `ok` (exit 0), and the toy profiles' arguments."""

from __future__ import annotations

from typer.testing import CliRunner

from tests.conftest import PROFILES
from tfplan.cli.app import app

UNIFORM = str(PROFILES / "toy-uniform-4.json")
HETERO = str(PROFILES / "toy-hetero-4.json")
TOY = ["--profile", UNIFORM, "--schedule", "1f1b", "--microbatches", "8"]


def run(*args: str):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stdout + result.stderr
    if result.exit_code == 0:
        assert result.exception is None, result.exception
    else:  # a clean exit (typer.Exit), not an exception escaping the command
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def ok(*args: str):
    result = run(*args)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result
