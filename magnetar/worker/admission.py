"""Admission: what is valid and what is too much, decided in one place, so that no single
request or package stops the cluster.

* Names: tenant, namespace and function name follow Pulsar's naming rule (NamedEntity:
  letters, digits and ``-=:._``) and ``max_name_length``.
* Numbers: in range, with Pulsar's reasons where Pulsar has them
  (FunctionConfigUtils.doCommonChecks, ResourceConfigUtils.validate); ``parallelism`` at most
  ``max_parallelism``; Java's int and long ranges where Pulsar's fields are ints and longs.
* Capacity: the functions' parallelism together stays within ``max_instances_per_worker``
  times the live workers, and each tenant's within ``max_instances_per_tenant``, so one tenant
  cannot take the capacity the others register into.
* URL bindings: each binding's host within ``url_binding_hosts`` (``magnetar.instance.
  url_hosts``; the instance checks again what each name resolves to, at every request).
* Packages: a ``.zip`` or ``.whl`` is checked by its directory against the archive limits
  (``magnetar.instance.archive``; the instance enforces them again while unpacking).

The REST API consults it on register and update (before the code is stored); the leader on
every change it writes, whichever path the change arrived by; and the leader again before it
schedules, so a record that passed none of these (written by an older version, or before a
limit was lowered) is skipped with a logged reason instead of stopping the scheduling of all
the others.
"""

from __future__ import annotations

import io
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from magnetar.instance.archive import DEFAULT_ARCHIVE_LIMITS, ArchiveLimits, check_archive
from magnetar.instance.config import FunctionConfig
from magnetar.instance.exceptions import FunctionLoadError, InvalidFunctionConfigError
from magnetar.instance.url_hosts import PUBLIC_HOSTS, UrlHostRefusedError, UrlHostRule
from magnetar.worker.config import WorkerConfig
from magnetar.worker.exceptions import AdmissionError, PackageError
from magnetar.worker.metadata import FunctionRecord
from magnetar.worker.packages import PackageRef

__all__ = ["MAX_TIMEOUT_MS", "Admission", "AdmissionLimits", "is_named_entity"]

_NAMED_ENTITY = re.compile(r"[-=:.\w]+", re.ASCII)
"""Pulsar's NamedEntity (Java's ``\\w`` is ASCII): letters, digits, '_', '-', '=', ':', '.'."""
_JAVA_INT = 2**31 - 1
_JAVA_LONG = 2**63 - 1
_REMEMBERED = 100_000
"""Records whose scheduled parallelism is remembered, before the memory is cleared."""
MAX_TIMEOUT_MS = 24 * 3600 * 1000
"""Longest ``timeoutMs``: a day (a timer of more cannot even be set on some platforms)."""


def is_named_entity(name: str) -> bool:
    """Whether ``name`` is a tenant, namespace or function name by Pulsar's naming rule."""
    return _NAMED_ENTITY.fullmatch(name) is not None


@dataclass(frozen=True)
class AdmissionLimits:
    """The limits admission holds requests to (the worker's settings of the same names)."""

    max_parallelism: int = 100
    max_instances_per_worker: int = 100
    max_instances_per_tenant: int = 100
    max_name_length: int = 64
    archive: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS
    url_hosts: UrlHostRule = PUBLIC_HOSTS

    @classmethod
    def of(cls, config: WorkerConfig) -> AdmissionLimits:
        """The limits ``config`` sets."""
        return cls(
            max_parallelism=config.max_parallelism,
            max_instances_per_worker=config.max_instances_per_worker,
            max_instances_per_tenant=config.max_instances_per_tenant,
            max_name_length=config.max_name_length,
            archive=ArchiveLimits(
                max_unpacked_bytes=config.max_package_unpacked_bytes,
                max_entries=config.max_package_entries,
                max_compression_ratio=config.max_package_compression_ratio,
            ),
            url_hosts=UrlHostRule(config.url_binding_hosts),
        )


class Admission:
    """Checks functions, their changes and their packages against ``AdmissionLimits``; a
    refusal is an ``AdmissionError`` (400) whose reason names the rule or the limit."""

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        self._lock = threading.Lock()
        self._parallelism: dict[str, tuple[int, int | str]] = {}
        """fqfn -> (record version, its parallelism or why it is not scheduled)."""

    # --- one request ---------------------------------------------------------------------

    def check_names(self, tenant: str, namespace: str, name: str) -> None:
        """Each name follows Pulsar's naming rule and ``max_name_length``."""
        for what, value in (("Tenant", tenant), ("Namespace", namespace), ("Function", name)):
            if not isinstance(value, str) or not value:
                raise AdmissionError(f"{what} name is not provided")
            if len(value) > self.limits.max_name_length:
                raise AdmissionError(
                    f"{what} name is {len(value)} characters long, more than the limit of "
                    f"{self.limits.max_name_length} (max_name_length)"
                )
            if not is_named_entity(value):
                raise AdmissionError(
                    f"{what} name {value!r} is invalid: a name holds only letters, digits and "
                    "the characters - = : . _ (Pulsar's naming rule)"
                )

    def check_config(self, config: Mapping[str, Any]) -> FunctionConfig:
        """The config, parsed, with its names and numbers in range."""
        if not isinstance(config, Mapping):
            raise AdmissionError("the function's config must be a JSON object")
        _check_pulsar_numbers(config)
        parsed = FunctionConfig.parse(dict(config))
        self.check_names(parsed.tenant, parsed.namespace, parsed.name or "")
        if parsed.parallelism > self.limits.max_parallelism:
            raise AdmissionError(
                f"Function parallelism {_shown(parsed.parallelism)} is more than the limit of "
                f"{self.limits.max_parallelism} instances per function (max_parallelism)"
            )
        _check_ranges(parsed)
        self._check_url_hosts(parsed)
        return parsed

    def _check_url_hosts(self, config: FunctionConfig) -> None:
        """Each URL binding's host within the worker's ``url_binding_hosts``."""
        for index, binding in enumerate(config.url_bindings):
            try:
                self.limits.url_hosts.check_binding(urlsplit(binding.url).hostname or "")
            except UrlHostRefusedError as error:
                raise AdmissionError(
                    f"urlBindings[{index}] ({binding.alias}, {binding.url}): {error}; the "
                    "worker's operator decides where URL bindings may point"
                ) from None

    def check_capacity(
        self,
        fqfn: str,
        parallelism: int,
        current: FunctionRecord | None,
        functions: Mapping[str, FunctionRecord],
        workers: int,
    ) -> None:
        """Refuse to take the function's tenant past ``max_instances_per_tenant`` instances,
        or the cluster past ``max_instances_per_worker`` x ``workers``; a change that does not
        add instances to ``current`` always passes."""
        if current is not None and parallelism <= self._scheduled(current):
            return
        name = fqfn.rsplit("/", 1)[-1]
        tenant = fqfn.split("/", 1)[0]
        others = in_tenant = 0  # the instances of every other function, and of the tenant's
        for other, record in functions.items():
            if other != fqfn:
                instances = self._scheduled(record)
                others += instances
                in_tenant += instances if other.split("/", 1)[0] == tenant else 0
        tenant_limit = self.limits.max_instances_per_tenant
        if in_tenant + parallelism > tenant_limit:
            raise AdmissionError(
                f"Function {name} would take tenant {tenant} to {in_tenant + parallelism} "
                f"instances, more than the limit of {tenant_limit} per tenant "
                "(max_instances_per_tenant)"
            )
        workers = max(workers, 1)
        limit = self.limits.max_instances_per_worker * workers
        if others + parallelism > limit:
            raise AdmissionError(
                f"Function {name} would take the cluster to "
                f"{others + parallelism} instances, more than the limit of {limit}: "
                f"{self.limits.max_instances_per_worker} per worker (max_instances_per_worker) "
                f"x {workers} live worker{'s' if workers != 1 else ''}"
            )

    def check_package(self, content: bytes, filename: str) -> None:
        """A ``.zip`` or ``.whl`` package's directory against the archive limits."""
        if not filename.endswith((".zip", ".whl")):
            return
        try:
            check_archive(io.BytesIO(content), self.limits.archive)
        except FunctionLoadError as error:
            raise AdmissionError(str(error)) from None

    # --- what the leader writes and schedules ---------------------------------------------

    def check_change(
        self,
        fqfn: str,
        config: Any,
        package: Any,
        current: FunctionRecord | None,
        functions: Mapping[str, FunctionRecord],
        workers: int,
    ) -> None:
        """A register (``current`` None) or update, as the leader is about to write it."""
        parts = fqfn.split("/") if isinstance(fqfn, str) else []
        if len(parts) != 3:
            raise AdmissionError(f"{fqfn!r} is not a function name as tenant/namespace/name")
        self.check_names(*parts)
        if config is None:
            raise AdmissionError("Function config is not provided")
        parsed = self.check_config(config)
        if parsed.fqfn != fqfn:
            raise AdmissionError(f"the config names function {parsed.fqfn}, not {fqfn}")
        if package is None and current is None:
            raise AdmissionError("Function Package is not provided")
        if package is not None:
            try:
                PackageRef.from_json(package if isinstance(package, Mapping) else {})
            except PackageError as error:
                raise AdmissionError(str(error)) from None
        self.check_capacity(fqfn, parsed.parallelism, current, functions, workers)

    def scheduled_parallelism(self, record: FunctionRecord) -> int:
        """How many instances of ``record`` the leader schedules; AdmissionError says why
        none (a config that is invalid, or past a limit)."""
        found = self._parallelism_of(record)
        if isinstance(found, str):
            raise AdmissionError(found)
        return found

    def _scheduled(self, record: FunctionRecord) -> int:
        found = self._parallelism_of(record)
        return 0 if isinstance(found, str) else found

    def _parallelism_of(self, record: FunctionRecord) -> int | str:
        # remembered per record version: the leader asks for every function at every step
        with self._lock:
            known = self._parallelism.get(record.fqfn)
        if known is not None and known[0] == record.version:
            return known[1]
        found: int | str
        try:
            parsed = self.check_config(record.config)
            self.check_names(*record.fqfn.split("/"))
            found = parsed.parallelism
        except (AdmissionError, InvalidFunctionConfigError) as error:
            found = str(error)
        except TypeError:
            found = "the function's name is not tenant/namespace/name"
        with self._lock:
            if len(self._parallelism) >= _REMEMBERED:
                self._parallelism.clear()  # deleted functions' entries go too
            self._parallelism[record.fqfn] = (record.version, found)
        return found


def _shown(number: float) -> str:
    """A number as a reason shows it: a huge one by its first digits and its length."""
    text = repr(number)
    return text if len(text) <= 30 else f"{text[:12]}... ({len(text)} digits)"


def _given(config: Mapping[str, Any], camel: str, snake: str) -> Any:
    return config.get(camel, config.get(snake))


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_pulsar_numbers(config: Mapping[str, Any]) -> None:
    """Pulsar's own reasons, before parsing gives its generic ones."""
    parallelism = config.get("parallelism")
    if _is_int(parallelism) and parallelism <= 0:
        raise AdmissionError("Function parallelism must be a positive number")
    timeout = _given(config, "timeoutMs", "timeout_ms")
    if _is_int(timeout) and timeout <= 0:
        raise AdmissionError("Function timeout must be a positive number")
    resources = config.get("resources")
    if resources is None:
        return
    if not isinstance(resources, Mapping):
        raise AdmissionError("resources must be a JSON object of cpu, ram and disk")
    for field, kind in (("cpu", "cpu"), ("ram", "ram"), ("disk", "disk")):
        value = resources.get(field)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (field != "cpu" and not _is_int(value)):
            expected = "a number" if field == "cpu" else "a whole number of bytes"
            raise AdmissionError(f"resources.{field} must be {expected}, not {value!r}")
        if not value > 0:
            raise AdmissionError(f"The {kind} allocation for the function must be positive")
        if (isinstance(value, float) and not math.isfinite(value)) or value > _JAVA_LONG:
            raise AdmissionError(f"resources.{field} {_shown(value)} is out of range")


def _check_ranges(config: FunctionConfig) -> None:
    """The numbers Pulsar keeps in Java ints and longs fit them; ``timeoutMs`` at most a day."""
    if config.timeout_ms is not None and config.timeout_ms > MAX_TIMEOUT_MS:
        raise AdmissionError(
            f"Function timeout {_shown(config.timeout_ms)} ms is more than the limit of "
            f"{MAX_TIMEOUT_MS} ms (a day)"
        )
    window = config.window_config
    producer = config.producer_config
    ints: dict[str, int | None] = {
        "maxMessageRetries": config.max_message_retries,
        "maxPendingAsyncRequests": config.max_pending_async_requests,
        "producerConfig.maxPendingMessages": producer.max_pending_messages if producer else None,
        "windowConfig.windowLengthCount": window.window_length_count if window else None,
        "windowConfig.slidingIntervalCount": window.sliding_interval_count if window else None,
    }
    for topic, spec in config.input_specs.items():
        ints[f"inputSpecs[{topic}].receiverQueueSize"] = spec.receiver_queue_size
    longs: dict[str, int | None] = {}
    if window is not None:
        longs = {
            "windowConfig.windowLengthDurationMs": window.window_length_duration_ms,
            "windowConfig.slidingIntervalDurationMs": window.sliding_interval_duration_ms,
            "windowConfig.maxLagMs": window.max_lag_ms,
            "windowConfig.watermarkEmitIntervalMs": window.watermark_emit_interval_ms,
        }
    for fields, bound in ((ints, _JAVA_INT), (longs, _JAVA_LONG)):
        for field, value in fields.items():
            if value is not None and abs(value) > bound:
                raise AdmissionError(f"{field} {_shown(value)} is out of range: at most {bound}")
