"""The function metadata topic as a replicated state machine.

Every worker replays the topic in order and applies the same rule, so all reach the same
state: a record of a term below the highest term seen is discarded (it comes from a deposed
leader), and so is a record whose version is not newer than the function's current one. An
empty value is a delete. Only the leader writes, and a new leader first writes a *term
marker*: the first marker of a term makes its writer the term's owner, so a deposed
leader's later records, and those of a rival that picked the same term, are discarded by
everyone alike.

Besides functions the topic carries *entries* of other kinds (tenants and namespaces, see
``tenancy``): JSON values keyed by name, versioned and fenced by the same rules, so a
namespace check and a function registration are decided in one order on every worker.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pulsar

from magnetar.instance.config import FunctionConfig
from magnetar.worker.cluster_key import RecordSeal
from magnetar.worker.exceptions import NotLeaderError
from magnetar.worker.tailer import ReplicatedState

__all__ = ["FunctionRecord", "MetadataManager"]

log = logging.getLogger(__name__)

_TERM_MARKER = "__term__"
_FUNCTION = "function"

Entry = dict[str, Any]
"""The JSON value of a non-function entry (a tenant's info, a namespace's policies)."""


@dataclass(frozen=True)
class FunctionRecord:
    """A registered function: its config, code package and per-instance run state."""

    fqfn: str
    config: dict[str, Any]
    """FunctionConfig in Pulsar's JSON field names (``py`` holds the package's file name)."""
    package: dict[str, Any] | None
    """The code package reference (``PackageRef.to_json()``)."""
    stopped: frozenset[int] = frozenset()
    """Instances stopped by the user."""
    version: int = 0
    config_version: int = 0
    """The version that last changed the config or code: instances restart when it moves."""
    term: int = 0
    create_time_ms: int = 0
    update_time_ms: int = 0
    auth_data: dict[str, Any] | None = None
    """The submitter's credentials (``FunctionAuthData.to_json()``), with authentication on;
    never shown with the config."""

    def function_config(self) -> FunctionConfig:
        return FunctionConfig.parse(self.config)

    def to_json(self) -> dict[str, Any]:
        return {
            "fqfn": self.fqfn,
            "config": self.config,
            "package": self.package,
            "stopped": sorted(self.stopped),
            "version": self.version,
            "configVersion": self.config_version,
            "term": self.term,
            "createTimeMs": self.create_time_ms,
            "updateTimeMs": self.update_time_ms,
            "authData": self.auth_data,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FunctionRecord:
        return cls(
            fqfn=data["fqfn"],
            config=data["config"],
            package=data.get("package"),
            stopped=frozenset(data.get("stopped", ())),
            version=int(data.get("version", 0)),
            config_version=int(data.get("configVersion", 0)),
            term=int(data.get("term", 0)),
            create_time_ms=int(data.get("createTimeMs", 0)),
            update_time_ms=int(data.get("updateTimeMs", 0)),
            auth_data=data.get("authData"),
        )


@dataclass
class _State:
    functions: dict[str, FunctionRecord] = field(default_factory=dict)
    entries: dict[str, dict[str, Entry]] = field(default_factory=dict)
    """Kind -> key -> value."""
    versions: dict[str, int] = field(default_factory=dict)  # deleted ones too
    writers: dict[str, int] = field(default_factory=dict)
    """The term of the record that set each version."""
    highest_term: int = 0
    term_owner: str = ""


def _version_key(kind: str, key: str) -> str:
    """Where a record's version is kept: a function by its FQFN, an entry by kind and key."""
    return key if kind == _FUNCTION else f"{kind}:{key}"


class MetadataManager(ReplicatedState):
    """Replays the metadata topic; the leader also writes it.

    ``entries`` are the entries every worker starts with (the default tenant and namespaces),
    at version 0: a written record replaces or deletes them like any other."""

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        on_change: Callable[[], None] | None = None,
        entries: dict[str, dict[str, Entry]] | None = None,
        seal: RecordSeal | None = None,
    ) -> None:
        super().__init__(client, topic, "metadata", seal)
        self._on_change = on_change
        self._state = _State(
            entries={kind: dict(values) for kind, values in (entries or {}).items()}
        )
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()

    # --- reads --------------------------------------------------------------------------

    def functions(self) -> dict[str, FunctionRecord]:
        with self._lock:
            return dict(self._state.functions)

    def get(self, fqfn: str) -> FunctionRecord | None:
        with self._lock:
            return self._state.functions.get(fqfn)

    def entries(self, kind: str) -> dict[str, Entry]:
        """The entries of one kind (``tenant``, ``namespace``), by key."""
        with self._lock:
            return dict(self._state.entries.get(kind, {}))

    @property
    def highest_term(self) -> int:
        with self._lock:
            return self._state.highest_term

    def term_owner(self) -> tuple[int, str]:
        """The highest term and the leader that owns it."""
        with self._lock:
            return self._state.highest_term, self._state.term_owner

    def version_of(self, fqfn: str) -> int:
        """The function's latest version, counting deletes (an entry's: ``entry_key``)."""
        with self._lock:
            return self._state.versions.get(fqfn, 0)

    @staticmethod
    def entry_key(kind: str, key: str) -> str:
        """What ``version_of`` and ``wait_for_version`` take for an entry."""
        return _version_key(kind, key)

    def wait_for_version(self, fqfn: str, version: int, timeout: float) -> bool:
        """Wait until this worker has applied ``version`` (or later) of ``fqfn`` (or of an
        entry, named by ``entry_key``)."""
        deadline = time.monotonic() + timeout
        while self.version_of(fqfn) < version:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # --- writes (leader only) -----------------------------------------------------------

    def mark_term(self, term: int, leader_id: str, timeout: float) -> bool:
        """Claim ``term`` for ``leader_id`` before anything else it writes; False when
        another leader owns it (or a newer one) by now."""
        self._publish(b"", {"type": _TERM_MARKER, "term": str(term), "leader": leader_id}, timeout)
        return self.term_owner() == (term, leader_id)

    def write(
        self,
        term: int,
        leader_id: str,
        fqfn: str,
        change: Callable[[FunctionRecord | None], FunctionRecord | None],
        timeout: float,
    ) -> FunctionRecord | None:
        """Apply ``change`` to the function's current record and replicate the result.

        ``change`` may raise to refuse (e.g. the function already exists); it returns the new
        record, or None to delete. Writes are serialized, so concurrent requests see each
        other. Returns the record as applied (None for a delete).
        """
        with self._write_lock:
            current = self.get(fqfn)
            proposed = change(current)
            version = self.version_of(fqfn) + 1
            value = b""
            if proposed is not None:
                now = int(time.time() * 1000)
                # new credentials restart the instances too: they connect with them
                code_changed = current is None or (
                    proposed.config,
                    proposed.package,
                    proposed.auth_data,
                ) != (current.config, current.package, current.auth_data)
                record = replace(
                    proposed,
                    version=version,
                    term=term,
                    update_time_ms=now,
                    create_time_ms=current.create_time_ms if current else now,
                    config_version=(
                        version if code_changed or current is None else current.config_version
                    ),
                )
                value = json.dumps(record.to_json()).encode()
            self._replicate(term, leader_id, _FUNCTION, fqfn, version, value, timeout)
            return self.get(fqfn)

    def write_entry(
        self,
        term: int,
        leader_id: str,
        kind: str,
        key: str,
        change: Callable[[Entry | None], Entry | None],
        timeout: float,
    ) -> Entry | None:
        """``write`` for an entry: ``change`` maps the current value (None: absent) to the
        new one (None: delete), or raises to refuse; it runs while writes are serialized, so
        what it reads of this state stays true until the result is applied."""
        with self._write_lock:
            proposed = change(self.entries(kind).get(key))
            version = self.version_of(_version_key(kind, key)) + 1
            value = b"" if proposed is None else json.dumps(proposed).encode()
            self._replicate(term, leader_id, kind, key, version, value, timeout)
            return self.entries(kind).get(key)

    def _replicate(
        self,
        term: int,
        leader_id: str,
        kind: str,
        key: str,
        version: int,
        value: bytes,
        timeout: float,
    ) -> None:
        """Publish one record and check that this worker applied it as written."""
        identity = {"fqfn": key} if kind == _FUNCTION else {"key": key}
        properties = {
            "type": kind,
            **identity,
            "term": str(term),
            "leader": leader_id,
            "version": str(version),
        }
        self._publish(value, properties, timeout)
        version_key = _version_key(kind, key)
        with self._lock:
            accepted = (
                self._state.versions.get(version_key, 0) == version
                and self._state.writers.get(version_key) == term
            )
        if not accepted:
            raise NotLeaderError(f"the write of {key} was superseded by a newer leader")

    # --- replay -------------------------------------------------------------------------

    def _apply(self, message: Any) -> None:
        properties = message.properties()
        term = int(properties.get("term", 0))
        leader = properties.get("leader", "")
        with self._lock:
            state = self._state
            if term < state.highest_term or (
                term == state.highest_term and state.term_owner not in ("", leader)
            ):
                log.info(
                    "ignoring a metadata record of %s for term %d (term %d is %s's)",
                    leader,
                    term,
                    state.highest_term,
                    state.term_owner,
                )
                return
            if term > state.highest_term:
                state.highest_term, state.term_owner = term, leader
            kind = properties.get("type", _FUNCTION)
            if kind == _TERM_MARKER:
                return
            key = properties["fqfn"] if kind == _FUNCTION else properties["key"]
            version_key = _version_key(kind, key)
            version = int(properties["version"])
            if version <= state.versions.get(version_key, 0):
                return
            state.versions[version_key] = version
            state.writers[version_key] = term
            data = message.data()
            if kind == _FUNCTION:
                if data:
                    state.functions[key] = FunctionRecord.from_json(json.loads(data))
                else:
                    state.functions.pop(key, None)
            elif data:
                state.entries.setdefault(kind, {})[key] = json.loads(data)
            else:
                state.entries.get(kind, {}).pop(key, None)
        if self._on_change is not None:
            self._on_change()
