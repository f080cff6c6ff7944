"""tfrun.cli.train_options: every `tfrun train` option declared once. Its flag, its TOML key (tfrun.cli.config_file)
and the setting it makes agree; every setting a user makes is some option's; defaults agree with TrainConfig's;
`--help` shows the panels."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from tests.conftest import torch_or_skip

torch_or_skip()
from tfrun.cli import config_file, setup, train_options  # noqa: E402
from tfrun.cli.app import app  # noqa: E402
from tfrun.config.train_config import TrainConfig  # noqa: E402

DERIVED = {"order", "num_stages", "num_microbatches", "stage_to_rank", "schedule_name", "ratios", "predicted_step_ms",
           "plan_profile", "plan_hash", "prediction_note", "model_hash", "resume_step", "data_hash", "token_cache",
           "retime", "microbatch_size", "fixed_weights", "time_noise_steps"}
"""TrainConfig fields no option sets directly: the plan's and the checks' (microbatch_size comes through
setup.train_config's own argument, with --global-batch)."""


SETUP_DEFAULTS = {"warmup_steps"}
"""Options whose default setup.train_config resolves once the plan is read (setup.warmup_steps)."""


def _command():
    import typer.main

    return typer.main.get_command(app).commands["train"]


def test_every_option_sets_a_config_field_or_a_setup_argument():
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    setup_args = set(inspect.signature(setup.train_config).parameters) - {"options"}
    for o in train_options.OPTIONS:
        if o.setting is not None:
            assert o.setting in fields or o.setting in setup_args, o.name
    settings = {o.setting for o in train_options.OPTIONS}
    assert set(fields) - DERIVED <= settings, sorted(set(fields) - DERIVED - settings)
    assert len(settings) == len(train_options.OPTIONS)  # one option per setting


def test_the_commands_flags_and_toml_keys_are_the_tables():
    command = _command()
    params = [p for p in command.params if p.param_type_name == "option" and p.name != "help"]
    assert [p.name for p in params] == [o.name for o in train_options.OPTIONS]
    for p, o in zip(params, train_options.OPTIONS):
        assert o.flag in p.opts and (o.short is None or o.short in p.opts), o.name
        assert p.default == o.default, o.name
    assert set(config_file.options(command)) == {o.flag[2:] for o in train_options.OPTIONS} - set(config_file.SKIPPED)


def test_defaults_agree_with_the_configs():
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for o in train_options.OPTIONS:
        field = fields.get(o.setting)
        if field is None or o.convert is not None or field.default is dataclasses.MISSING:
            continue
        if o.name in SETUP_DEFAULTS:  # None: setup resolves it (with the plan in hand)
            assert o.default is None, o.name
            continue
        assert o.default == field.default, o.name


@pytest.mark.parametrize("panel", train_options.PANELS)
def test_help_shows_the_panels(panel):
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["train", "--help"], terminal_width=120)
    assert result.exit_code == 0 and panel in result.output
