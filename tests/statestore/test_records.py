"""The journal's format and the rules of one update, without a broker."""

from __future__ import annotations

import pytest

from magnetar.statestore import InvalidStateUpdateError, StateTooLargeError
from magnetar.statestore.records import (
    CLEAR,
    DELETE,
    INCR,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    PUT,
    apply_op,
    check_amount,
    check_value,
    decode_message,
    encode_message,
    encode_record,
    state_key,
)


def test_a_message_of_records_round_trips() -> None:
    first = encode_record(
        1, b"persistent://public/default/in", (3, 4, -1), [(INCR, b"a", -5), (PUT, b"k", b"\x00v")]
    )
    second = encode_record(
        2, b"", (-1, -1, -1), [(DELETE, "ключ".encode(), None), (CLEAR, b"", None)]
    )
    message = decode_message(encode_message(2**64 - 1, 7, True, [first, second]))
    assert (message.writer_id, message.epoch, message.dedup) == (2**64 - 1, 7, True)
    one, two = message.records
    assert (one.seq, one.source_topic, one.source) == (
        1,
        "persistent://public/default/in",
        (3, 4, -1),
    )
    assert one.ops == [(INCR, b"a", -5), (PUT, b"k", b"\x00v")]
    assert (two.seq, two.source_topic) == (2, "")
    assert two.ops == [(DELETE, "ключ".encode(), None), (CLEAR, b"", None)]


@pytest.mark.parametrize("payload", [b"", b"\x02" + bytes(17), b"\x01" + bytes(17) + b"\x00\x01"])
def test_a_message_that_is_not_a_journal_message_is_refused(payload: bytes) -> None:
    with pytest.raises(ValueError):
        decode_message(payload)


def test_counters_add_wrap_like_a_java_long_and_puts_replace() -> None:
    entry = apply_op(None, INCR, 5)
    assert entry == (True, 5, 0)
    entry = apply_op(entry, INCR, -7)
    assert entry == (True, -2, 1)
    assert apply_op((True, 2**63 - 1, 3), INCR, 1) == (True, -(2**63), 4)
    assert apply_op(entry, PUT, b"v") == (False, b"v", 2)
    # a key holding a value that is counted becomes a counter from the amount
    assert apply_op((False, b"v", 2), INCR, 3) == (True, 3, 3)
    assert apply_op(entry, DELETE, None) is None


def test_bad_keys_amounts_and_values_are_refused_with_their_reason() -> None:
    with pytest.raises(InvalidStateUpdateError, match="1 to 4096 bytes"):
        state_key("")
    with pytest.raises(InvalidStateUpdateError, match="1 to 4096 bytes"):
        state_key("x" * (MAX_KEY_BYTES + 1))
    with pytest.raises(InvalidStateUpdateError, match="must be a str"):
        state_key(5)
    with pytest.raises(InvalidStateUpdateError, match=r"must be an integer, got float 1\.5"):
        check_amount("k", 1.5)
    with pytest.raises(InvalidStateUpdateError, match="must be an integer, got bool"):
        check_amount("k", True)
    with pytest.raises(InvalidStateUpdateError, match="does not fit a signed 64-bit"):
        check_amount("k", 2**63)
    with pytest.raises(
        StateTooLargeError, match="1,048,577 bytes, more than the limit of 1,048,576"
    ):
        check_value("k", bytes(MAX_VALUE_BYTES + 1))
    assert check_value("k", bytes(MAX_VALUE_BYTES)) == bytes(MAX_VALUE_BYTES)
