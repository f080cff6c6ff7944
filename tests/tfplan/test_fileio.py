"""tfplan.fileio.json_text: readable JSON, the same text as its plain recursive definition."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tfplan.fileio import json_text


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
