"""Metrics of the instances on this worker: Prometheus ``/metrics`` and the JSON paths under
``/admin/v2/worker-stats``.

Like a Pulsar worker, each worker reports the instances it runs; scrape every worker for the
whole cluster. Metric names are Apache Pulsar's (``pulsar_function_*``), so its dashboards
work; labels are ``tenant``, ``namespace``, ``name``, ``instance_id`` and ``fqfn``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from magnetar.instance.metrics import USER_METRIC_PREFIX, MetricsSnapshot
from magnetar.worker.model import parse_instance_key
from magnetar.worker.rest.peers import services

__all__ = ["metrics_router", "prometheus_text"]

metrics_router = APIRouter(tags=["worker"])

_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"

# (name, type, help, value of a snapshot)
_SERIES: list[tuple[str, str, str, Any]] = [
    ("up", "gauge", "1 while the instance runs", lambda s: int(s.running)),
    ("received_total", "counter", "Messages received", lambda s: s.received),
    (
        "processed_successfully_total",
        "counter",
        "Messages processed successfully",
        lambda s: s.processed,
    ),
    (
        "user_exceptions_total",
        "counter",
        "Exceptions raised by the function",
        lambda s: s.user_exceptions,
    ),
    (
        "system_exceptions_total",
        "counter",
        "Failures outside the function (serde, sends, crashes)",
        lambda s: s.system_exceptions,
    ),
    (
        "dead_lettered_total",
        "counter",
        "Messages sent to the dead-letter topic after their retries",
        lambda s: s.dead_lettered,
    ),
    ("timers_fired_total", "counter", "Timers fired", lambda s: s.timers_fired),
    (
        "timers_pending",
        "gauge",
        "The function's pending timers (on instance 0)",
        lambda s: s.timers_pending,
    ),
    (
        "timer_lateness_p99_ms",
        "gauge",
        "Lateness of recent timer firings after their due time, p99, ms",
        lambda s: s.timer_lateness_p99_ms,
    ),
    ("restarts_total", "counter", "Restarts of the instance", lambda s: s.num_restarts),
    (
        "avg_process_latency_ms",
        "gauge",
        "Mean time in the function, ms",
        lambda s: s.average_latency_ms,
    ),
    (
        "last_invocation",
        "gauge",
        "When the function last ran, ms since the epoch",
        lambda s: s.last_invocation_ms,
    ),
    (
        "received_total_1min",
        "gauge",
        "Messages received in the last minute",
        lambda s: s.last_minute.received,
    ),
    (
        "processed_successfully_total_1min",
        "gauge",
        "Messages processed successfully in the last minute",
        lambda s: s.last_minute.processed,
    ),
]
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _labels(key: str) -> str:
    fqfn, instance_id = parse_instance_key(key)
    tenant, namespace, name = fqfn.split("/", 2)
    pairs = {
        "tenant": tenant,
        "namespace": f"{tenant}/{namespace}",
        "name": name,
        "instance_id": str(instance_id),
        "fqfn": fqfn,
    }
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(snapshots: dict[str, MetricsSnapshot]) -> str:
    """The Prometheus text exposition of ``snapshots`` (instance key -> snapshot)."""
    ordered = sorted(snapshots.items())
    lines: list[str] = []
    for suffix, kind, description, value in _SERIES:
        metric = f"pulsar_function_{suffix}"
        lines += [f"# HELP {metric} {description}", f"# TYPE {metric} {kind}"]
        lines += [f"{metric}{{{_labels(key)}}} {_number(value(s))}" for key, s in ordered]
    latency = "pulsar_function_process_latency_ms"
    lines += [
        f"# HELP {latency} Time in the function, ms",
        f"# TYPE {latency} summary",
    ]
    lines += [
        f'{latency}{{{_labels(key)},quantile="0.99"}} {_number(s.p99_latency_ms)}'
        for key, s in ordered
    ]
    lines += _user_metrics(ordered)
    return "\n".join(lines) + "\n"


def _user_metrics(ordered: Iterable[tuple[str, MetricsSnapshot]]) -> list[str]:
    """``context.record_metric`` values, one summary (``_sum``, ``_count``) per metric name."""
    by_metric: dict[str, list[str]] = {}
    for key, snapshot in ordered:
        for name, (total, count) in sorted(snapshot.user_metrics.items()):
            metric = "pulsar_function_" + USER_METRIC_PREFIX + _NOT_NAME.sub("_", name)
            by_metric.setdefault(metric, []).extend(
                [
                    f"{metric}_sum{{{_labels(key)}}} {_number(total)}",
                    f"{metric}_count{{{_labels(key)}}} {_number(count)}",
                ]
            )
    lines: list[str] = []
    for metric, samples in by_metric.items():
        lines += [
            f"# HELP {metric} The values the function recorded",
            f"# TYPE {metric} summary",
        ]
        lines += samples
    return lines


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


@metrics_router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    """Prometheus metrics of the instances on this worker."""
    text = prometheus_text(services(request).instances.statuses())
    return PlainTextResponse(text, media_type=_PROMETHEUS)


@metrics_router.get("/admin/v2/worker-stats/functionsmetrics")
def functions_metrics(request: Request) -> list[dict[str, Any]]:
    """Pulsar's WorkerFunctionInstanceStats: each instance on this worker and its stats."""
    statuses = services(request).instances.statuses()
    return [
        {"name": key, "metrics": snapshot.stats()["metrics"]}
        for key, snapshot in sorted(statuses.items())
    ]


@metrics_router.get("/admin/v2/worker-stats/metrics")
def worker_metrics(request: Request) -> list[dict[str, Any]]:
    """Metrics of this worker, in Pulsar's ``Metrics`` shape (dimensions + metrics)."""
    found = services(request)
    statuses = found.instances.statuses()
    current = found.assignments.current
    return [
        {
            "dimensions": {"workerId": found.config.worker_id},
            "metrics": {
                "functions.registered": len(found.metadata.functions()),
                "instances.assigned": len(statuses),
                "instances.running": sum(1 for s in statuses.values() if s.running),
                "worker.isLeader": int(
                    current is not None and current.leader.worker_id == found.config.worker_id
                ),
                "cluster.workers": len(current.workers) if current else 0,
                # the leader's term and its assignment's version, for the console
                "cluster.term": current.term if current else 0,
                "cluster.assignmentVersion": current.version if current else 0,
            },
        }
    ]
