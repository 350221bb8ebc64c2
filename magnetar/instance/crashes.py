"""Which message killed an instance process, found across its restarts.

The worker reads what the dead process had in user code (``in_flight``). One message alone is
the one it died on: a death of that message, and each death is a failure of it (retried, then
dead-lettered, see ``FailureHandler.crashed``). Several at once (an async function's pending
invocations, a JavaScript chunk) are suspects: the next process runs each of them with nothing
else in user code, so that a death there names one message. A message once died on runs alone
from then on, its retries too, so its deaths keep being counted until it is dead-lettered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from magnetar.instance.in_flight import MAX_IN_FLIGHT, InFlight, message_key

__all__ = ["SUSPECT", "EarlierCrashes", "blame"]

SUSPECT = 0
"""The deaths of a message that was in user code with others when its process died."""

_REMEMBERED = 2 * MAX_IN_FLIGHT


def blame(deaths: dict[str, int], in_flight: Sequence[InFlight]) -> str:
    """Count a process's death against what it had in user code (``deaths``: message key ->
    deaths, kept by the worker across the instance's processes); what the status says of it."""
    if not in_flight:
        return ""
    if len(in_flight) == 1:
        (message,) = in_flight
        count = deaths.pop(message.key, SUSPECT) + 1
        _remember(deaths, message.key, count)
        return (
            f" while the function processed {message.description} (death {count} on that message)"
        )
    for message in in_flight:
        if message.key not in deaths:
            _remember(deaths, message.key, SUSPECT)
    return (
        f" while the function had {len(in_flight)} messages in user code, the oldest"
        f" {in_flight[0].description}; they run one at a time now, to find the one it died on"
    )


def _remember(deaths: dict[str, int], key: str, count: int) -> None:
    if len(deaths) >= _REMEMBERED:  # the oldest entry goes
        deaths.pop(next(iter(deaths)))
    deaths[key] = count


class EarlierCrashes:
    """The instance's side: the messages its earlier processes died with."""

    def __init__(self, deaths: Mapping[str, int] | None = None) -> None:
        deaths = deaths or {}
        self._unhandled = {key: count for key, count in deaths.items() if count > SUSPECT}
        self._alone = frozenset(deaths)

    def __bool__(self) -> bool:
        return bool(self._alone)

    def check(self, topic: str, message_id: Any) -> int | None:
        """None for a message no process died with; otherwise its deaths not yet handled as
        failures (handed out once), and 0 when the message is to run alone now."""
        key = message_key(topic, message_id)
        if key not in self._alone:
            return None
        return self._unhandled.pop(key, 0)
