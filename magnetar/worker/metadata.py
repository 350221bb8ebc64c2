"""The function metadata topic as a replicated state machine.

Every worker replays the topic in order and applies the same rule, so all reach the same
state: a record of a term below the highest term seen is discarded (it comes from a deposed
leader), and so is a record whose version is not newer than the function's current one. An
empty value is a delete. Only the leader writes, and a new leader first writes a *term
marker*: the first marker of a term makes its writer the term's owner, so a deposed
leader's later records, and those of a rival that picked the same term, are discarded by
everyone alike.
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
from magnetar.worker.exceptions import NotLeaderError
from magnetar.worker.tailer import ReplicatedState

__all__ = ["FunctionRecord", "MetadataManager"]

log = logging.getLogger(__name__)

_TERM_MARKER = "__term__"


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
        )


@dataclass
class _State:
    functions: dict[str, FunctionRecord] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)  # deleted functions too
    highest_term: int = 0
    term_owner: str = ""


class MetadataManager(ReplicatedState):
    """Replays the metadata topic; the leader also writes it."""

    def __init__(
        self, client: pulsar.Client, topic: str, on_change: Callable[[], None] | None = None
    ) -> None:
        super().__init__(client, topic, "metadata")
        self._on_change = on_change
        self._state = _State()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()

    # --- reads --------------------------------------------------------------------------

    def functions(self) -> dict[str, FunctionRecord]:
        with self._lock:
            return dict(self._state.functions)

    def get(self, fqfn: str) -> FunctionRecord | None:
        with self._lock:
            return self._state.functions.get(fqfn)

    @property
    def highest_term(self) -> int:
        with self._lock:
            return self._state.highest_term

    def term_owner(self) -> tuple[int, str]:
        """The highest term and the leader that owns it."""
        with self._lock:
            return self._state.highest_term, self._state.term_owner

    def version_of(self, fqfn: str) -> int:
        """The function's latest version, counting deletes."""
        with self._lock:
            return self._state.versions.get(fqfn, 0)

    def wait_for_version(self, fqfn: str, version: int, timeout: float) -> bool:
        """Wait until this worker has applied ``version`` (or later) of ``fqfn``."""
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
            now = int(time.time() * 1000)
            properties = {
                "type": "function",
                "fqfn": fqfn,
                "term": str(term),
                "leader": leader_id,
                "version": str(version),
            }
            if proposed is None:
                self._publish(b"", properties, timeout)
            else:
                code_changed = current is None or (proposed.config, proposed.package) != (
                    current.config,
                    current.package,
                )
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
                self._publish(json.dumps(record.to_json()).encode(), properties, timeout)
            applied = self.get(fqfn)
            accepted = self.version_of(fqfn) == version and (
                applied is None
                if proposed is None
                else applied is not None and applied.term == term
            )
            if not accepted:
                raise NotLeaderError(f"the write of {fqfn} was superseded by a newer leader")
            return applied

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
            if properties.get("type") == _TERM_MARKER:
                return
            fqfn = properties["fqfn"]
            version = int(properties["version"])
            if version <= state.versions.get(fqfn, 0):
                return
            state.versions[fqfn] = version
            data = message.data()
            if data:
                state.functions[fqfn] = FunctionRecord.from_json(json.loads(data))
            else:
                state.functions.pop(fqfn, None)
        if self._on_change is not None:
            self._on_change()
