"""Tables for people: columns padded to the widest cell, numbers right-aligned."""

from __future__ import annotations

import json

import pytest

from magnetar.cli.render import emit_json, table


def test_text_columns_are_left_aligned() -> None:
    text = table(["NAME", "STATUS"], [["exclaim", "Running"], ["fn", "Stopped"]])
    assert text.splitlines() == [
        "NAME     STATUS",
        "exclaim  Running",
        "fn       Stopped",
    ]


def test_number_columns_are_right_aligned_with_separators() -> None:
    text = table(
        ["NAME", "RECEIVED", "LATENCY"],
        [["exclaim", 1234567, 0.5], ["a-much-longer-name", 3, 1234.567]],
    )
    assert text.splitlines() == [
        "NAME                 RECEIVED   LATENCY",
        "exclaim             1,234,567      0.50",
        "a-much-longer-name          3  1,234.57",
    ]


def test_column_width_follows_the_header_when_it_is_widest() -> None:
    text = table(["INSTANCES", "N"], [["x", 1]])
    assert text.splitlines() == ["INSTANCES  N", "x          1"]


def test_mixed_column_is_left_aligned() -> None:
    text = table(["NAME", "VALUE"], [["a", 10], ["b", "n/a"]])
    assert text.splitlines() == ["NAME  VALUE", "a     10", "b     n/a"]


def test_no_trailing_spaces() -> None:
    text = table(["NAME", "NOTE"], [["long-name-here", ""], ["x", "y"]])
    assert all(line == line.rstrip() for line in text.splitlines())
    assert text.splitlines()[1] == "long-name-here"


def test_no_rows_gives_the_header_only() -> None:
    assert table(["NAME", "STATUS"], []) == "NAME  STATUS"


def test_all_lines_have_aligned_columns() -> None:
    rows = [["a", "x" * 7, 5], ["bbbbbb", "y", 123456]]
    lines = table(["ID", "TOPIC", "COUNT"], rows).splitlines()
    starts = {line.index(cell) for line, cell in zip(lines, ["TOPIC", "x" * 7, "y"], strict=True)}
    assert len(starts) == 1
    assert len({len(line) for line in lines}) == 1  # the last column is right-aligned


def test_bool_columns_are_left_aligned_like_text() -> None:
    text = table(["NAME", "RUNNING"], [["a", True], ["b", False]])
    assert text.splitlines() == ["NAME  RUNNING", "a     True", "b     False"]


def test_rows_shorter_than_the_headers_are_rejected() -> None:
    with pytest.raises(ValueError):
        table(["A", "B"], [["only-one"]])


def test_emit_json_is_compact(capsys: pytest.CaptureFixture[str]) -> None:
    emit_json({"name": "fn", "instances": [1, 2]})
    emit_json(["error"], err=True)
    out, err = capsys.readouterr()
    assert out == '{"name":"fn","instances":[1,2]}\n'
    assert json.loads(err) == ["error"]
