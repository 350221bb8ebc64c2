"""The default SerDe must behave exactly like Pulsar's IdentitySerDe; custom SerDes load."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pulsar.functions.serde import IdentitySerDe, PickleSerDe

from magnetar.instance.exceptions import SerDeError
from magnetar.instance.serde import FastIdentitySerDe, load_serde
from tests.conftest import EXAMPLES

FAST = FastIdentitySerDe()
PULSAR = IdentitySerDe()

# Text a payload may hold that one of int(), float() or complex() accepts, or nearly does.
NUMBER_WORDS = ["inf", "Inf", "INFINITY", "Infinity", "nan", "NaN", "-nan", "+inf", "j", "J"]
NUMBER_WORDS += ["nanj", "infj", "1j", "-J", "(1+2j)", "1_000", "1__0", "0x1f", "1e5", ".5"]
NUMBER_WORDS += ["in", "na", "Name", "jam", "Index", "e5", "", " ", "\t\n"]
NUMBER_WORDS += ["\u0661\u0662\u0663", "\u0663.\u0665"]  # Arabic-Indic digits: int() takes them

numbers_as_text = st.one_of(
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.floats().map(repr),
    st.complex_numbers(allow_nan=True, allow_infinity=True).map(str),
    st.complex_numbers().map(lambda c: str(c).strip("()")),
    st.sampled_from(NUMBER_WORDS),
)
padding = st.sampled_from(["", " ", "  ", "\t", "\n", "\r\n", "\u3000", "\xa0", "_", "x"])
padded = st.tuples(padding, numbers_as_text, padding).map("".join)
letter_led = st.tuples(
    st.sampled_from(["i", "I", "n", "N", "j", "J", "a", "Z", "é", "ж", "inf", "nan", "Infinity"]),
    st.text(alphabet="0123456789.+-_eEjJinfatyINFATY ()", max_size=8),
).map("".join)
textish = st.one_of(numbers_as_text, padded, letter_led, st.text(max_size=20))


def same(payload: bytes) -> None:
    fast, pulsar = FAST.deserialize(payload), PULSAR.deserialize(payload)
    # repr: nan != nan, and repr also tells 1 from 1.0 from True and '1' from b'1'.
    assert repr(fast) == repr(pulsar)
    assert type(fast) is type(pulsar)


@settings(max_examples=400)
@given(st.binary(max_size=40))
@example(b"")
@example(b"\xff\xfe")
@example(b"\xed\xa0\x80")  # an encoded surrogate: not valid UTF-8
@example(b"12\x00")
def test_deserialize_arbitrary_bytes_like_identity_serde(payload: bytes) -> None:
    same(payload)


@settings(max_examples=600)
@given(textish)
@example("inf")
@example("nan")
@example("j")
@example("Infinity")
@example("  42  ")
@example(" -1.5e3\n")
@example("\t1+2j ")
@example("hello")
@example("12:30")
@example('{"amount": 3}')
@example("1,000")
@example("(1+2j)\x1f")
def test_deserialize_text_like_identity_serde(text: str) -> None:
    same(text.encode())


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"42", 42),
        (b" 7 ", 7),
        (b"1.5", 1.5),
        (b"inf", float("inf")),
        (b"1+2j", 1 + 2j),
        (b"j", 1j),
        (b"hello", "hello"),
        (b"", ""),
        (b"\xff", b"\xff"),
    ],
)
def test_deserialize_values(payload: bytes, expected: Any) -> None:
    value = FAST.deserialize(payload)
    assert value == expected
    assert type(value) is type(expected)


def test_deserialize_nan() -> None:
    value = FAST.deserialize(b"nan")
    assert isinstance(value, float)
    assert math.isnan(value)


@settings(max_examples=300)
@given(
    st.one_of(
        st.text(),
        st.binary(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.complex_numbers(allow_nan=True, allow_infinity=True),
    )
)
def test_serialize_like_identity_serde(value: Any) -> None:
    try:
        expected = PULSAR.serialize(value)
    except UnicodeEncodeError:  # lone surrogates cannot be sent by either
        with pytest.raises(UnicodeEncodeError):
            FAST.serialize(value)
        return
    assert FAST.serialize(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("héllo", "héllo".encode()), (b"\x00\xff", b"\x00\xff"), (12, b"12"), (0.5, b"0.5")],
)
def test_serialize_values(value: Any, expected: bytes) -> None:
    assert FAST.serialize(value) == expected


@pytest.mark.parametrize("value", [{"a": 1}, [1, 2], True, None, bytearray(b"x")])
def test_serialize_other_types_raises_serde_error(value: Any) -> None:
    with pytest.raises(SerDeError) as caught:
        FAST.serialize(value)
    message = str(caught.value)
    assert f"cannot serialize a value of type {type(value).__name__}" in message
    assert "outputSerdeClassName" in message


# --- load_serde ----------------------------------------------------------------------------


def test_default_is_the_fast_identity_serde() -> None:
    assert type(load_serde(None)) is FastIdentitySerDe
    assert type(load_serde("")) is FastIdentitySerDe


@pytest.mark.parametrize("name", ["serde.IdentitySerDe", "pulsar.functions.serde.IdentitySerDe"])
def test_identity_serde_by_name_is_the_fast_one(name: str) -> None:
    assert type(load_serde(name)) is FastIdentitySerDe


@pytest.mark.parametrize("name", ["serde.PickleSerDe", "pulsar.functions.serde.PickleSerDe"])
def test_pickle_serde_round_trips(name: str) -> None:
    serde = load_serde(name)
    assert isinstance(serde, PickleSerDe)
    value = {"id": 1, "tags": ["a", "b"], "price": 9.5, "raw": b"\x00"}
    payload = serde.serialize(value)
    assert isinstance(payload, bytes)
    assert serde.deserialize(payload) == value


def test_custom_serde_from_the_search_path() -> None:
    serde = load_serde("json_serde.JsonSerDe", [EXAMPLES])
    assert type(serde).__name__ == "JsonSerDe"
    assert serde.serialize({"b": 2, "a": 1}) == b'{"a": 1, "b": 2}'
    assert serde.deserialize(b'{"amount": 3}') == {"amount": 3}


def test_unknown_serde_class_is_named() -> None:
    with pytest.raises(SerDeError) as caught:
        load_serde("json_serde.YamlSerDe", [EXAMPLES])
    message = str(caught.value)
    assert message.startswith("cannot load SerDe class 'json_serde.YamlSerDe': ")
    assert "has no class or function 'YamlSerDe'" in message
    assert "JsonSerDe" in message


def test_unknown_serde_module_is_named() -> None:
    with pytest.raises(SerDeError) as caught:
        load_serde("no_such_serde_mod.MySerDe")
    message = str(caught.value)
    assert "cannot load SerDe class 'no_such_serde_mod.MySerDe'" in message
    assert "no module named 'no_such_serde_mod'" in message


def test_serde_name_without_a_module() -> None:
    with pytest.raises(SerDeError, match="'MySerDe' must be a dotted name"):
        load_serde("MySerDe")


def test_serde_that_is_not_a_class() -> None:
    with pytest.raises(SerDeError, match=r"SerDe 'json\.dumps' is not a class"):
        load_serde("json.dumps")


def test_serde_class_without_serialize() -> None:
    with pytest.raises(SerDeError, match="must define serialize\\(\\) and deserialize\\(\\)"):
        load_serde("collections.OrderedDict")
