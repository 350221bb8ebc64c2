"""This worker's share of the assignment, turned into running instances.

Whenever the assignment or a function changes, the instances assigned here are worked out
(skipping stopped ones), their code fetched from the package store, and the runtime
manager told what should run. Changes are coalesced: a burst of records is one pass.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Protocol

from magnetar.instance.exceptions import InvalidFunctionConfigError
from magnetar.worker.assignments import AssignmentManager
from magnetar.worker.exceptions import PackageError
from magnetar.worker.function_auth import FunctionAccess, FunctionAuthData
from magnetar.worker.metadata import MetadataManager
from magnetar.worker.model import parse_instance_key
from magnetar.worker.packages import PackageRef, PackageStore
from magnetar.worker.runtime import InstanceSpec

__all__ = ["InstanceReconciler"]

log = logging.getLogger(__name__)

_RETRY_S = 1.0


class _Applier(Protocol):
    def apply(self, desired: dict[str, InstanceSpec]) -> None: ...


class InstanceReconciler:
    """Keeps the runtime manager running exactly this worker's assigned instances."""

    def __init__(
        self,
        worker_id: str,
        metadata: MetadataManager,
        assignments: AssignmentManager,
        packages: PackageStore,
        runtime: _Applier,
        access: FunctionAccess | None = None,
    ) -> None:
        """``access``: each function's broker credentials and publish policy (none, and
        anywhere, when None)."""
        self._worker_id = worker_id
        self._access = access
        self._metadata = metadata
        self._assignments = assignments
        self._packages = packages
        self._runtime = runtime
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    def notify(self, *_: object) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(2.0)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                complete = self._reconcile()
            except Exception:
                log.exception("reconciling this worker's instances failed; retrying")
                complete = False
            if not complete:
                self._stop.wait(_RETRY_S)
                self._wake.set()

    def _reconcile(self) -> bool:
        """Apply the desired set; False when some instance could not be prepared yet."""
        record = self._assignments.current
        if record is None:
            return True
        desired: dict[str, InstanceSpec] = {}
        complete = True
        for key, worker_id in record.assignment.items():
            if worker_id != self._worker_id:
                continue
            fqfn, instance_id = parse_instance_key(key)
            function = self._metadata.get(fqfn)
            if function is None or instance_id in function.stopped:
                continue
            if function.package is None:
                log.error("function %s has no code package; not started", fqfn)
                continue
            try:
                path = self._packages.fetch(PackageRef.from_json(function.package))
            except PackageError as error:
                log.warning("cannot fetch the code of %s yet: %s", fqfn, error)
                complete = False
                continue
            try:
                config = function.function_config()
            except InvalidFunctionConfigError as error:  # one bad record stops no other
                log.error("function %s is not started: %s", fqfn, error)
                continue
            # the code field (py, or js for JavaScript) names the fetched file on this disk
            config = config.model_copy(update={"js" if config.is_javascript else "py": str(path)})
            spec = InstanceSpec(fqfn, instance_id, config, function.config_version)
            if self._access is not None:
                try:
                    auth = FunctionAuthData.from_json(function.auth_data, self._access.seal)
                except ValueError as error:
                    log.error("function %s is not started: its credentials: %s", fqfn, error)
                    continue
                spec = replace(
                    spec,
                    connection=self._access.connection(auth),
                    publish_policy=self._access.publish_policy(auth),
                    role=self._access.role(auth),
                )
            desired[key] = spec
        self._runtime.apply(desired)
        return complete
