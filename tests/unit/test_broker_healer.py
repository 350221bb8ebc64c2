"""The healer's reading of pulsar-lite's log: which connections ended without their clean-up."""

from __future__ import annotations

from magnetar.broker_healer import LeakDetector

RESET = "Connection reset by peer (os error 104)"
SERVER_CNX = "[2026-11-25T03:43:58Z ERROR pulsar_lite::broker::service::server_cnx]"
MAIN = "[2026-11-25T03:43:59Z ERROR pulsar_lite]"


def connection_error(peer: str, error: str = RESET) -> str:
    return f"{MAIN} Connection error from {peer}: {error}\n"


def test_a_reset_met_while_reading_is_a_connection_left_behind() -> None:
    assert LeakDetector().feed(connection_error("127.0.0.1:45526")) == "127.0.0.1:45526"


def test_a_reset_met_while_writing_was_cleaned_up() -> None:
    detector = LeakDetector()
    assert detector.feed(f"{SERVER_CNX} Error sending message batch to client: {RESET}") is None
    assert detector.feed(connection_error("127.0.0.1:55774")) is None
    # the clean-up accounted for one connection only
    assert detector.feed(connection_error("127.0.0.1:55775")) == "127.0.0.1:55775"


def test_command_and_keep_alive_errors_were_cleaned_up_too() -> None:
    detector = LeakDetector()
    refused = "Consumer 7 already exists"
    detector.feed(f"{SERVER_CNX} Error handling command: {refused}")
    detector.feed(f"{SERVER_CNX} Error during keep-alive processing: Broken pipe (os error 32)")
    assert detector.feed(connection_error("127.0.0.1:1", "Broken pipe (os error 32)")) is None
    assert detector.feed(connection_error("127.0.0.1:2", refused)) is None


def test_interleaved_connections_still_show_the_one_left_behind() -> None:
    detector = LeakDetector()
    # A cleans up (its error first), B is left behind; their final lines come in any order
    detector.feed(f"{SERVER_CNX} Error sending message batch to client: {RESET}")
    found = [detector.feed(connection_error(peer)) for peer in ("10.0.0.2:2", "10.0.0.1:1")]
    assert found.count(None) == 1 and len([f for f in found if f]) == 1


def test_other_lines_are_ignored() -> None:
    detector = LeakDetector()
    for line in (
        "[2026-11-25T03:42:47Z INFO  pulsar_lite] Connection closed from 127.0.0.1:41830",
        "[2026-11-25T03:31:57Z WARN  pulsar_lite::broker::service::persistent::"
        "persistent_subscription] No dispatcher found for subscription 'reader-9247e82161'",
        "",
    ):
        assert detector.feed(line) is None
