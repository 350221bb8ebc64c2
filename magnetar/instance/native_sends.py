"""The instance's sends through pulsar-client's C API, where make built ``_output_sends``.

At full speed an instance spends about 40 us of its thread on a message, and 12 of them in
pulsar-client's ``Producer.send_async``: ten argument checks in Python, then a call into the
C++ binding for the builder, the content, each property and the send. ``_output_sends``
(C, native/output_sends) takes the same arguments and sends in one call, in 6 us. Its
``flush_async`` sends the open batch with the GIL released, so the instance's thread flushes
these producers itself, where the binding's would deadlock (see ``batch_flusher``): on a
light stream that is one thread less to wake for every message.

``send_recorded`` sends the same way, and records the outcome in a ``Ledger`` on the client's
I/O thread, without the GIL: a chunk's callback in Python had that thread take the GIL and
create and destroy a thread state (a 16 KiB frame stack mapped and unmapped) for every chunk,
every message on a light stream. The instance's thread takes the outcomes.

It reaches the producer's C++ object through pybind11's conduit (``_pybind11_conduit_v1_``,
the interface pybind11 offers other bindings) from the ``_producer`` the Python producer
wraps, and the library's C API through the loaded binding. Its callbacks get no message id,
so only the instance's own chunk callbacks use it. A send it does not take (see the C
source), a send with a user's callback, and every send where the extension did not build or
does not fit the installed client go through pulsar-client as before.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from magnetar.instance.schemas import PASSED_THROUGH

__all__ = ["native_ledger", "native_sender"]

log = logging.getLogger(__name__)

Sender: type[_output_sends.Sender] | None
Ledger: type[_output_sends.Ledger] | None
try:
    from magnetar.instance import _output_sends

    Sender, Ledger = _output_sends.Sender, _output_sends.Ledger
except ModuleNotFoundError:  # not built: no C compiler where make ran
    Sender = Ledger = None
except ImportError as error:  # a client library without the C API it calls
    log.warning("instances send through pulsar-client's Python producer: %s", error)
    Sender = Ledger = None


@functools.cache
def _declined(reason: str) -> None:
    """Warn once a reason: a binding that declines one producer declines them all."""
    log.warning("instances send through pulsar-client's Python producer: %s", reason)


def native_sender(producer: Any) -> _output_sends.Sender | None:
    """A ``Sender`` for ``producer``, whose ``send_async(content, callback, **fields)``
    sends as the producer's would (the callback is given no message id) or returns
    ``NotImplemented``; None where the extension is not built, or the producer's schema does
    not pass bytes through unchanged (skipping its ``encode`` would change what is sent)."""
    if Sender is None or type(getattr(producer, "_schema", None)) not in PASSED_THROUGH:
        return None
    try:
        return Sender(producer)
    except Exception as error:  # e.g. a client whose binding has no conduit
        _declined(str(error))
        return None


def native_ledger() -> _output_sends.Ledger | None:
    """A ``Ledger`` for ``Sender.send_recorded``'s outcomes; None where not built."""
    return None if Ledger is None else Ledger()
