"""Every module's doctests run (they are examples of use; a stale one misleads)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tfplan

MODULES = [f"tfplan.{m.name}" for m in pkgutil.iter_modules(tfplan.__path__) if m.name != "__main__"]
try:
    import torch  # noqa: F401

    import tfrun

    MODULES += [m.name for m in pkgutil.walk_packages(tfrun.__path__, "tfrun.") if not m.name.endswith("__main__")]
except ImportError:  # tfrun needs torch; tfplan's doctests still run
    pass


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctests failed in {name}"
