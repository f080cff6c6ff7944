"""The layout stays what docs/design.md says: import-linter's contracts hold (layers in data-flow order, no torch in
tfplan, torch.distributed.pipelining in one module), every repository path the docs name exists, every Note that
is referred to is defined exactly once, every folder's docstring names its files, and no file grows past 400 lines.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import ROOT, torch_or_skip

PACKAGES = ("tfplan", "tfrun")
CODE = ("tfplan/**/*.py", "tfrun/**/*.py", "tests/**/*.py", "benchmarks/*.py", "examples/*.py")
DOCS = ("README.md", "docs/*.md")
MAX_LINES = 400

# A repository path: one of the top-level folders, then a path (a glob where it has a *).
PATH_RE = re.compile(r"(?<![\w./-])((?:tfplan|tfrun|tests|benchmarks|docs|profiles|examples|\.ci)/"
                     r"(?:[\w./*-]|\{[\w.,-]*\})*)")
# (a path may name a set of files as the shell does: docs/results/run-seed{0,1}.{png,txt})
# A Note is defined in the packages' code at the start of a line (after a comment's # or a docstring's quotes),
# its name followed by a colon or the end of the line; anything else that names it refers to it, also the
# plural form ("Notes" and several bracketed names).
NOTE_DEF_RE = re.compile(r'^[ \t]*(?:#[ \t]*|""")?Note \[([^\]]+)\](?=:|[ \t]*$)', re.M)
NOTE_REF_RE = re.compile(r"Notes? ((?:\[[^\]]+\](?:,? (?:and )?)?)+)")


def _files(patterns) -> list[Path]:
    return sorted({f for p in patterns for f in ROOT.glob(p) if ".venv" not in f.parts})


def _note_name(text: str) -> str:
    """A Note's name as written, line breaks (and a comment's # after them) folded to one space."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text).strip()


def test_import_linter_contracts_hold() -> None:
    torch_or_skip()  # the last contract names a subpackage of torch, so torch is one of the analysed roots
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    proc = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "4 kept, 0 broken" in proc.stdout


def _expand_braces(path: str) -> list[str]:
    """The paths a shell's brace expansion gives, e.g. "a{0,1}.{png,txt}" -> four paths."""
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [out for part in m.group(1).split(",")
            for out in _expand_braces(path[: m.start()] + part + path[m.end():])]


def test_a_brace_set_in_a_docs_path_expands_as_the_shell_does() -> None:
    text = "see docs/results/s{0,1}-{a,b}.png, and docs/results.md."
    assert [m.group(1).rstrip(".,:;") for m in PATH_RE.finditer(text)] == ["docs/results/s{0,1}-{a,b}.png",
                                                                           "docs/results.md"]
    assert _expand_braces("r/s{0,1}-{a,b}.png") == ["r/s0-a.png", "r/s0-b.png", "r/s1-a.png", "r/s1-b.png"]
    assert _expand_braces("r/s.png") == ["r/s.png"]


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    for f in _files(DOCS):
        for m in PATH_RE.finditer(f.read_text()):
            for path in _expand_braces(m.group(1).rstrip(".,:;")):
                found = list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
                if not found:
                    missing.append(f"{f.relative_to(ROOT)}: {path}")
    assert not missing, "\n".join(missing)


def test_every_path_a_docstring_or_comment_names_exists() -> None:
    missing = []
    for f in _files(CODE):
        for m in PATH_RE.finditer(f.read_text()):
            path = m.group(1).rstrip(".,:;'\"`")
            if "*" in path or "{" in path:
                continue  # patterns and placeholders
            if not (ROOT / path).exists() and not (f.parent / path).exists():  # (or relative to the file)
                missing.append(f"{f.relative_to(ROOT)}: {path}")
    assert not missing, "\n".join(missing)


def test_every_note_referred_to_is_defined_exactly_once() -> None:
    defined, referred = defaultdict(list), defaultdict(set)
    for f in _files(CODE + DOCS):
        text, rel = f.read_text(), str(f.relative_to(ROOT))
        if rel.startswith(PACKAGES):
            for m in NOTE_DEF_RE.finditer(text):
                defined[_note_name(m.group(1))].append(rel)
        for m in NOTE_REF_RE.finditer(text):
            for name in re.findall(r"\[([^\]]+)\]", m.group(1)):
                referred[_note_name(name)].add(rel)
    twice = {name: where for name, where in defined.items() if len(where) > 1}
    assert not twice, f"Notes defined more than once: {twice}"
    undefined = {name: sorted(where) for name, where in referred.items() if name not in defined}
    assert not undefined, f"Notes referred to but never defined: {undefined}"
    assert len(defined) > 50  # the check sees the Notes (a broken pattern would find none)


def test_every_folder_docstring_names_its_files_in_reading_order() -> None:
    unnamed = []
    for init in _files(f"{p}/**/__init__.py" for p in PACKAGES):
        folder = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        members = [f.name for f in folder.glob("*.py") if f.name not in ("__init__.py", "__main__.py")]
        members += [d.name + "/" for d in folder.iterdir() if (d / "__init__.py").exists()]
        for name in members:
            if not re.search(rf"(?<![\w/]){re.escape(name)}", doc):
                unnamed.append(f"{init.relative_to(ROOT)}: {name}")
    assert not unnamed, "folder docstrings that do not name a file of the folder:\n" + "\n".join(unnamed)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_top_level_module_but_the_entry_points(package: str) -> None:
    # docs/design.md, "Layout": the package's entry points, its error class and (tfplan) the file I/O every
    # layer uses; (tfrun) the training loop, the library API and the re-timing of recorded runs (above the training
    # loop, whose step it runs), which sit above the folders they use.
    allowed = {"__init__.py", "__main__.py", "errors.py"} | (
        {"fileio.py"} if package == "tfplan" else {"train.py", "library.py", "retime.py"})
    top = {f.name for f in (ROOT / package).glob("*.py")}
    assert top <= allowed, sorted(top - allowed)


def test_no_file_over_400_lines() -> None:
    long = [f"{f.relative_to(ROOT)}: {n}" for f in _files(CODE)
            if (n := len(f.read_text().splitlines())) > MAX_LINES]
    assert not long, "\n".join(long)
