"""Stand-ins for the streaming read-limit API of PySpark 4.2+, so the stream reader also
loads on PySpark 4.0 and 4.1. There Spark calls ``latestOffset()`` without a start or a
limit, so ``maxRecordsPerTrigger`` cannot apply and Trigger.AvailableNow reads everything
in one batch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReadAllAvailable", "ReadLimit", "ReadMaxRows", "SupportsTriggerAvailableNow"]


class ReadLimit:
    """How much one micro-batch may read."""


@dataclass
class ReadAllAvailable(ReadLimit):
    """No limit."""


@dataclass
class ReadMaxRows(ReadLimit):
    """At most ``max_rows`` rows."""

    max_rows: int


class SupportsTriggerAvailableNow:
    """The mixin marking Trigger.AvailableNow support (a no-op before PySpark 4.2)."""
