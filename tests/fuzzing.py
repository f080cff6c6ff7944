"""Hypothesis strategies for fuzzing the JSON loaders: arbitrary JSON values, and valid documents broken in a
few places (a value replaced, a key deleted or added, a list item dropped or repeated), which reach far
deeper into a validator than random JSON does.

    @given(mutated(valid_plan_dict))
    def test_...(obj): ...   # the loader may only raise the package's own error
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
"""Any value json.loads can return (NaN and infinities included: Python's json reads them)."""


def _slots(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in `doc`, depth first."""
    out, stack = [], [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            out.append((node, key))
            stack.append(value)
    return out


@st.composite
def mutated(draw, doc: Any, max_changes: int = 3) -> Any:
    """A deep copy of `doc` with 1 to max_changes random changes."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, max_changes))):
        slots = _slots(doc)
        if not slots:
            return draw(json_values)
        container, key = draw(st.sampled_from(slots))
        op = draw(st.sampled_from(("replace", "replace", "delete", "add", "repeat", "stringify")))
        if op == "replace":
            container[key] = draw(json_values)
        elif op == "delete":
            del container[key]
        elif op == "add":
            if isinstance(container, dict):
                container[draw(st.text(max_size=8))] = draw(json_values)
            else:
                container.insert(key, draw(json_values))
        elif op == "repeat" and isinstance(container, list):
            container.insert(key, copy.deepcopy(container[key]))
        elif op == "stringify":
            container[key] = str(container[key])
    return doc
