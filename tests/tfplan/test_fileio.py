"""tfplan.fileio: json_text (readable JSON, the same text as its plain recursive definition), read_json's numbers, and
writes that replace all their files or none."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfplan.errors import TfplanError
from tfplan.fileio import check_output, json_text, read_json, write_files_atomic


def _reference(obj, width: int = 110, indent: str = "") -> str:
    """json_text's definition, written plainly (each level dumps its whole subtree again)."""
    flat = json.dumps(obj)
    if not isinstance(obj, (list, dict)) or not obj or len(flat) + len(indent) <= width:
        return flat
    values = obj.values() if isinstance(obj, dict) else obj
    if not any(isinstance(x, (list, dict)) for x in values):
        return flat
    inner = indent + " "
    if isinstance(obj, list):
        return "[\n" + ",\n".join(inner + _reference(x, width, inner) for x in obj) + "\n" + indent + "]"
    items = [f"{inner}{json.dumps(k)}: {_reference(v, width, inner)}" for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=6) | st.dictionaries(st.text(max_size=6), kids,
                                                                                          max_size=5), max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from([0, 10, 40, 110]))
def test_json_text_is_its_definition_and_parses_back(obj, width: int) -> None:
    text = json_text(obj, width)
    assert text == _reference(obj, width)
    assert json.loads(text) == json.loads(json.dumps(obj))


def test_a_dict_with_int_keys_keeps_its_one_line_form() -> None:
    obj = {1: [1, [2]], 2: {"a": [1]}}
    assert json_text(obj, 5) == _reference(obj, 5) and json_text(obj) == json.dumps(obj)


def test_read_json_reads_an_integer_too_long_for_a_float_as_infinite(tmp_path) -> None:
    # 10**400 would raise OverflowError in every float() of the number checks, and over 4,300 digits int()
    # itself refuses: an infinity of its sign, which they name as not finite.
    path = tmp_path / "big.json"
    path.write_text('{"a": 1' + "0" * 400 + ', "b": -' + "9" * 5000 + ', "c": 12}')
    assert read_json(path, "profile") == {"a": float("inf"), "b": float("-inf"), "c": 12}


def test_write_files_atomic_replaces_all_or_none(tmp_path) -> None:
    plan, csv_file = tmp_path / "p.json", tmp_path / "p.csv"
    write_files_atomic([(plan, b"old plan"), (csv_file, b"old csv")])
    blocked = tmp_path / "q.csv"
    blocked.mkdir()  # the second target cannot be written: the first keeps what it had
    (tmp_path / "q.json").write_bytes(b"kept")
    with pytest.raises(TfplanError, match=r"cannot write .*q\.csv: it is a folder"):
        write_files_atomic([(tmp_path / "q.json", b"new"), (blocked, b"new")])
    assert (tmp_path / "q.json").read_bytes() == b"kept"
    write_files_atomic([(plan, b"new plan"), (csv_file, b"new csv")])
    assert (plan.read_bytes(), csv_file.read_bytes()) == (b"new plan", b"new csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv", "p.json", "q.csv", "q.json"]  # no temp files


def test_check_output_refuses_folders_missing_folders_and_inputs(tmp_path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text("{}")
    check_output(tmp_path / "plan.json", (profile, None))
    for path, message in [(tmp_path, "it is a folder"), (".", "it is a folder"),
                          (tmp_path / "no" / "plan.json", "folder .* does not exist"),
                          (profile, "it is also an input of this command")]:
        with pytest.raises(TfplanError, match=message):
            check_output(path, (profile,))
