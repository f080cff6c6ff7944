"""Actions in torch's grammar: parse/format round trip, bad strings, DualPipeV overlapped cells."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfplan.errors import TfplanError
from tfplan.schedule.actions import FREEZABLE, KINDS, Action, parse_action, parse_cell


@settings(max_examples=50, deadline=None)
@given(stage=st.integers(0, 10_000), kind=st.sampled_from(KINDS), mb=st.integers(0, 10_000))
def test_format_parse_round_trip(stage: int, kind: str, mb: int) -> None:
    a = Action(stage, kind, mb)
    text = str(a)
    assert text == f"{stage}{kind}{mb}"
    assert parse_action(text) == a
    assert parse_cell(text) == [a]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2F0", Action(2, "F", 0)),
        ("0B7", Action(0, "B", 7)),
        ("5I3", Action(5, "I", 3)),
        ("5W3", Action(5, "W", 3)),
        ("12F345", Action(12, "F", 345)),
        (" 1W2 ", Action(1, "W", 2)),  # CSV cells may carry spaces
    ],
)
def test_parse_examples(text: str, expected: Action) -> None:
    assert parse_action(text) == expected
    assert (expected.stage, expected.kind, expected.mb) == tuple(parse_action(text))


@pytest.mark.parametrize(
    "text",
    ["", "F0", "2F", "2X0", "2f0", "-1F0", "2F-1", "2FB0", "2 F0", "2F0x", "(0F1;1B0)", "SEND_F", "0RECV_F1", "1.5F0"],
)
def test_bad_action_strings_are_user_errors(text: str) -> None:
    with pytest.raises(TfplanError, match="not a compute action in torch's grammar") as info:
        parse_action(text)
    assert isinstance(info.value, ValueError)  # the package's error is a ValueError
    assert repr(text) in str(info.value)  # names the offending text


def test_overlapped_dualpipev_cell_is_read_as_its_two_actions_in_order() -> None:
    assert parse_cell("(0F7;7B3)OVERLAP_F_B") == [Action(0, "F", 7), Action(7, "B", 3)]
    assert parse_cell(" ( 3F1 ; 4B0 ) OVERLAP_F_B ") == [Action(3, "F", 1), Action(4, "B", 0)]
    # The backward may come first in a cell too: order is preserved as written.
    assert parse_cell("(1B2;1F5)OVERLAP_F_B") == [Action(1, "B", 2), Action(1, "F", 5)]


def test_overlapped_cell_with_a_bad_part_is_rejected() -> None:
    with pytest.raises(TfplanError, match="'7X3'"):
        parse_cell("(0F7;7X3)OVERLAP_F_B")


@pytest.mark.parametrize("text", ["", "   ", "\t"])
def test_empty_cell_is_a_bubble(text: str) -> None:
    assert parse_cell(text) == []


def test_freezable_kinds_are_b_and_w() -> None:
    assert FREEZABLE == {"B", "W"}
    assert set(KINDS) == {"F", "B", "I", "W"}
