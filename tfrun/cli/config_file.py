"""`tfrun train --config run.toml`: every option of `tfrun train` by its long name, in a TOML file; and the
resolved configuration a run writes into its folder (OUT/config.toml), which `--resume OUT` reads back.

Note [config precedence]: a flag on the command line wins over --config's file, which wins over the resumed
run's OUT/config.toml, which wins over the option's default. The files are read by eager click callbacks that
set the command's default map before the other options are parsed (so a flag given explicitly always wins); a
file that cannot be used is kept as an error and raised by the command as one line (exit 1), after parsing.

Note [resumed data]: --data, --tokenizer and --token-dtype describe one data source together. A resume that
names other data (on the command line or in --config) does not inherit the resumed run's --tokenizer or
--token-dtype: a text run resumed on its own token cache (a .bin) must not carry the tokenizer that made it.

    # run.toml
    lr = 2e-5
    lr-schedule = "cosine"
    lr-warmup-steps = 100
    clip-grad-norm = 1.0
    adam-betas = [0.9, 0.95]        # options that take a comma-separated list also take a TOML array
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from pathlib import Path
from typing import Any

from tfrun.errors import TfrunError

RESOLVED = "config.toml"
"""The resolved configuration a run writes into its folder."""
SKIPPED = ("config", "resume")
DATA_GROUP = ("tokenizer", "token_dtype", "chat_template", "chat_loss")
"""Options that describe --data (Note [resumed data]): taken from a resumed run's file only with its --data."""
"""Options a configuration file does not set (the file itself; which run to resume is the command's)."""


def options(command) -> dict[str, Any]:
    """The (typer) command's options by long name without dashes (`lr-schedule`). Typer carries its own copy of
    click, so parameters are told apart by what they say they are, not by their classes."""
    out = {}
    for param in command.params:
        if param.param_type_name == "option":
            long = next((o for o in param.opts if o.startswith("--")), None)
            if long is not None and long[2:] not in SKIPPED:
                out[long[2:]] = param
    return out


def read(path: str | Path, command) -> dict[str, Any]:
    """A TOML file's settings as the command's defaults: parameter name -> value.

    Raises:
        TfrunError: a missing or unreadable file, not TOML, an unknown option (named, with the nearest one), or
            a value of the wrong type (named).
    """
    path = Path(path)
    try:
        obj = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise TfrunError(f"--config {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TfrunError(f"--config {path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise TfrunError(f"--config {path}: not TOML ({exc})") from None
    known = options(command)
    out = {}
    for key, value in obj.items():
        param = known.get(key)
        if param is None:
            near = difflib.get_close_matches(key, list(known) + list(SKIPPED), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TfrunError(f"--config {path}: unknown option {key!r}{hint}")
        out[param.name] = _value(value, param, f"--config {path}: {key}")
    return out


def _value(value: Any, param, where: str) -> Any:
    """A TOML value checked against the option's type (a comma-separated list option also takes an array)."""
    kind = _kind(param)
    if getattr(param, "is_flag", False) or kind == "boolean":
        if isinstance(value, bool):
            return value
        raise TfrunError(f"{where}: must be true or false, got {json.dumps(value)}")
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TfrunError(f"{where}: must be an integer, got {json.dumps(value)}")
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TfrunError(f"{where}: must be a number, got {json.dumps(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]  # one number where a text option takes a list of them (max-freeze-ratio = 0.5)
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value):
        return ",".join(repr(float(v)) if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, str):
        return value
    raise TfrunError(f"{where}: must be a string, got {json.dumps(value)}")


def _kind(param) -> str:
    """An option's value type in click's words ("boolean", "integer", "float", "text"): click's own type where the
    option has one, else (typer 0.2x's own click) the annotation typer keeps."""
    if getattr(param, "type", None) is not None:
        return param.type.name
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
    return {bool: "boolean", int: "integer", float: "float"}.get(annotation, "text")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        assert math.isfinite(value), value  # the config's checks refuse NaN and infinities
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def resolved_text(ctx) -> str:
    """The command's resolved options (command line over files over defaults) as TOML, by long name; options
    left unset (None) are left out.

    Raises:
        TfrunError: a float option that is not finite (TOML would hold it, but no setting takes it)."""
    lines = ["# The resolved configuration of this run (`tfrun train --config` reads it; `--resume` starts",
             "# from it, command-line flags overriding it). Written before the ranks started."]
    for key, param in options(ctx.command).items():
        value = ctx.params.get(param.name)
        if isinstance(value, float) and not math.isfinite(value):  # (an option its own check let through)
            raise TfrunError(f"--{key} must be a finite number, got {value}")
        if value is not None:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _defaults(ctx) -> None:
    """The default map from the files read so far (Note [config precedence]): --config's over the resumed run's."""
    files = ctx.meta.get("tfrun.config_files", {})
    merged = {**files.get("resume", {}), **files.get("config", {})}
    ctx.default_map = {**(ctx.default_map or {}), **merged}


def _keep(ctx, which: str, load) -> None:
    try:
        ctx.meta.setdefault("tfrun.config_files", {})[which] = load()
    except TfrunError as exc:
        ctx.meta.setdefault("tfrun.config_errors", []).append(exc)
    _defaults(ctx)


def on_config(ctx, param, value: str | None) -> str | None:
    """--config FILE (eager): its settings become the command's defaults."""
    if value is not None:
        _keep(ctx, "config", lambda: read(value, ctx.command))
    return value


def on_resume(ctx, param, value: str | None) -> str | None:
    """--resume DIR (eager): the run's resolved configuration, when it wrote one, becomes the defaults."""
    if value is not None and (Path(value) / RESOLVED).is_file():  # (its --out is the folder resumed, wherever it is)
        _keep(ctx, "resume", lambda: {k: v for k, v in read(Path(value) / RESOLVED, ctx.command).items()
                                      if k != "out"})
    elif value is not None and not (Path(value) / "checkpoints").is_dir():  # (not "--plan is required")
        what = "no such folder" if not Path(value).exists() else "not a folder" if not Path(value).is_dir() else \
            f"no {RESOLVED}, no checkpoints folder"
        ctx.meta.setdefault("tfrun.config_errors", []).append(TfrunError(f"--resume {value}: no checkpoint there "
                                                                         f"({what})"))
    return value


def resumed_data_settings(ctx) -> dict[str, Any]:
    """The data options to reset (parameter name -> its default) because the resumed run's file set them but
    --data comes from elsewhere (Note [resumed data]); empty when the run keeps the resumed run's data."""
    files = ctx.meta.get("tfrun.config_files", {})
    resumed, given = files.get("resume", {}), files.get("config", {})
    from_files = ctx.get_parameter_source("data").name in ("DEFAULT_MAP", "DEFAULT")
    if not resumed or (from_files and "data" not in given):  # not resuming, or the resumed run's own data
        return {}
    params = {p.name: p for p in ctx.command.params}
    return {name: params[name].default for name in DATA_GROUP
            if name in resumed and name not in given and ctx.get_parameter_source(name).name == "DEFAULT_MAP"}


def raise_errors(ctx) -> None:
    """The first problem with a configuration file, raised inside the command (one line, exit 1)."""
    errors = ctx.meta.get("tfrun.config_errors")
    if errors:
        raise errors[0]
