"""Carrying state over from Magnetar 0.1.0's journal names, which were not one per function.

0.1.0 joined a function's tenant, namespace and name with '-' unescaped, so ``a/b-c`` and
``a-b/c`` shared one journal; names are escaped now (``journal.journal_topic``). A function
whose name did not change (no character but letters, digits, '_' and '.') keeps its journal.
For one whose name changed, its old journal is copied, message by message, into its new one,
once: only while the new journal is empty, and only when no other function maps to the same
old name (then whose record is whose cannot be told, and the report names them).

Run it with every worker stopped (``magnetar worker upgrade-state``): a running instance
would write to a journal while it is copied.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import pulsar

from magnetar.client import open_reader
from magnetar.positions import position
from magnetar.statestore.exceptions import StateJournalError
from magnetar.statestore.journal import (
    DEFAULT_NAMESPACE,
    journal_topic,
    last_message_id,
    unescaped_journal_topic,
)

__all__ = ["CarryOver", "carry_over_journals"]

log = logging.getLogger(__name__)

_READ_TIMEOUT_MS = 10_000


@dataclass
class CarryOver:
    """What ``carry_over_journals`` did."""

    copied: dict[str, int] = field(default_factory=dict)
    """Function -> journal messages copied into its new journal."""
    ambiguous: dict[str, list[str]] = field(default_factory=dict)
    """Old journal -> the functions that shared it, none of which was given its records."""
    kept: list[str] = field(default_factory=list)
    """Functions whose new journal held records already (carried over before, or written)."""


def carry_over_journals(
    client: pulsar.Client, functions: Iterable[str], namespace: str = DEFAULT_NAMESPACE
) -> CarryOver:
    """Copy each of ``functions``' (fqfns) 0.1.0 journal into its new one, as the module
    says; journals in the system namespace ``namespace``."""
    report = CarryOver()
    sharing: dict[str, list[str]] = defaultdict(list)
    for fqfn in sorted(set(functions)):
        sharing[unescaped_journal_topic(fqfn, namespace)].append(fqfn)
    for old, fqfns in sharing.items():
        renamed = [f for f in fqfns if journal_topic(f, namespace) != old]
        if not renamed:
            continue
        if len(fqfns) > 1:
            report.ambiguous[old] = fqfns
            continue
        fqfn = fqfns[0]
        new = journal_topic(fqfn, namespace)
        if last_message_id(client, new) is not None:
            report.kept.append(fqfn)
            continue
        copied = _copy(client, old, new)
        if copied:
            report.copied[fqfn] = copied
    return report


def _copy(client: pulsar.Client, source: str, target: str) -> int:
    """Every message of ``source`` sent to ``target``, in order; how many."""
    last = last_message_id(client, source)
    if last is None:
        return 0
    end = position(last)
    reader = open_reader(client, source, pulsar.MessageId.earliest)
    producer = client.create_producer(target, batching_enabled=False)
    count = 0
    try:
        while True:
            try:
                message = reader.read_next(_READ_TIMEOUT_MS)
            except pulsar.Timeout:
                raise StateJournalError(
                    f"reading {source} stopped before its last message: {target} holds the "
                    f"first {count} only; {source} is unchanged"
                ) from None
            producer.send(message.data(), properties=message.properties())
            count += 1
            if position(message.message_id()) >= end:
                break
    finally:
        producer.close()
        reader.close()
    log.info("carried %d journal messages over from %s to %s", count, source, target)
    return count
