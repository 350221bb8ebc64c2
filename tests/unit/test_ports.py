"""`magnetar standalone` takes the README's ports when free, others when not."""

from __future__ import annotations

import socket

from magnetar.broker import find_free_port
from magnetar.cli.worker import pick_port


def test_a_free_preferred_port_is_taken() -> None:
    port = find_free_port()

    assert pick_port(port) == port


def test_a_taken_preferred_port_gives_another_free_one() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]

        picked = pick_port(taken)

        assert picked != taken
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", picked))  # free indeed
