"""User metrics (``context.record_metric``) as Apache Pulsar reports them: in stats as
``user_metric_<name>_sum`` and ``user_metric_<name>_count``, on Prometheus as a summary."""

from __future__ import annotations

from magnetar.instance.metrics import InstanceMetrics
from magnetar.worker.rest.metrics import prometheus_text


def test_user_metrics_are_reported_as_sum_and_count() -> None:
    metrics = InstanceMetrics(instance_id=0)
    for value in (3.0, 5.0, 10.0):
        metrics.record_user_metric("latency", value)
    metrics.record_user_metric("hits", 1.0)
    snapshot = metrics.snapshot(running=True)
    assert snapshot.stats()["metrics"]["userMetrics"] == {
        "user_metric_hits_sum": 1.0,
        "user_metric_hits_count": 1.0,
        "user_metric_latency_sum": 18.0,
        "user_metric_latency_count": 3.0,
    }
    lines = prometheus_text({"public/default/f:0": snapshot}).splitlines()
    labels = (
        'tenant="public",namespace="public/default",name="f",instance_id="0",'
        'fqfn="public/default/f"'
    )
    assert "# TYPE pulsar_function_user_metric_latency summary" in lines
    assert f"pulsar_function_user_metric_latency_sum{{{labels}}} 18.0" in lines
    assert f"pulsar_function_user_metric_latency_count{{{labels}}} 3" in lines
