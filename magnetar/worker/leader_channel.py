"""Carrying a metadata change to the leader, from any worker.

Only the leader writes the metadata topic. A change made on the leader is written there;
anywhere else it is posted to the leader's internal path, and the call returns once this
worker has applied the change too (read-your-writes). The leader's refusal comes back with
the status and reason it gave, so a forwarded request answers exactly as a local one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from magnetar.worker.assignments import AssignmentManager
from magnetar.worker.cluster_key import PeerSeal
from magnetar.worker.exceptions import (
    AuthenticationError,
    LeaderUnavailableError,
    NotLeaderError,
    ReplicationTimeoutError,
    RequestRefusedError,
    WorkerError,
)
from magnetar.worker.metadata import MetadataManager

__all__ = ["LeaderChannel"]

_FORWARDED_ERRORS: dict[int, type[WorkerError]] = {
    401: AuthenticationError,
    503: LeaderUnavailableError,
}


class LeaderChannel:
    """Applies changes on the leader, here or over HTTP, and waits for them locally."""

    def __init__(
        self,
        metadata: MetadataManager,
        assignments: AssignmentManager,
        worker_id: str,
        timeout_s: float,
        http: httpx.Client,
        peer_seal: PeerSeal | None = None,
    ) -> None:
        """``http``: the worker's client for other workers (its connections are reused);
        ``peer_seal`` proves to the leader that a forwarded change comes from a worker (None:
        the cluster has no key)."""
        self._http = http
        self._peer_seal = peer_seal or PeerSeal(None, worker_id)
        self._metadata = metadata
        self._assignments = assignments
        self._worker_id = worker_id
        self._timeout = timeout_s

    def submit(
        self,
        write_here: Callable[[], object],
        version_key: str,
        path: str,
        body: dict[str, Any],
        authorization: str | None,
    ) -> None:
        """Run ``write_here`` if this worker leads, else post ``body`` to the leader's
        ``path`` (sealed as this worker's call, and with the caller's Authorization header,
        so the leader checks the same credentials) and wait until ``version_key`` reaches
        the version the leader wrote."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                write_here()
                return
            except NotLeaderError:
                current = self._assignments.current
                leads_elsewhere = current is not None and current.leader.worker_id != (
                    self._worker_id
                )
                if leads_elsewhere or time.monotonic() > deadline:
                    break
                # This worker is the leader on record but still taking over: wait for it.
                time.sleep(0.1)
        version = self._forward(path, body, authorization)
        if not self._metadata.wait_for_version(version_key, version, self._timeout):
            raise ReplicationTimeoutError(
                f"the change to {body.get('fqfn') or body.get('name')} was made but has not "
                f"reached this worker within {self._timeout:.0f}s"
            )

    def _forward(self, path: str, body: dict[str, Any], authorization: str | None) -> int:
        current = self._assignments.current
        if current is None or current.leader.worker_id == "":
            raise LeaderUnavailableError("no leader is known yet; retry in a moment")
        url = current.leader.admin_url.rstrip("/") + path
        content = json.dumps(body).encode()
        headers = {
            "Content-Type": "application/json",
            **self._peer_seal.headers("POST", path, content),
        }
        if authorization:
            headers["Authorization"] = authorization
        try:
            response = self._http.post(url, content=content, headers=headers, timeout=self._timeout)
        except httpx.HTTPError as error:
            raise LeaderUnavailableError(
                f"the leader {current.leader.worker_id} at {current.leader.admin_url} cannot "
                f"be reached: {error}"
            ) from None
        if response.status_code == 200:
            return int(response.json()["version"])
        reason = _reason(response)
        known = _FORWARDED_ERRORS.get(response.status_code)
        if known is not None:
            raise known(reason)
        raise RequestRefusedError(reason, response.status_code)


def _reason(response: httpx.Response) -> str:
    try:
        return str(response.json()["reason"])
    except (ValueError, KeyError, TypeError):
        return f"the leader answered {response.status_code}: {response.text[:200]}"
