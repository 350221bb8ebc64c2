"""An instance in a process of its own: the entry point localrun and the worker's process
runtime start, and what it reports back.

Running on the process's main thread lets ``timeoutMs`` interrupt a runaway invocation;
SIGTERM and SIGINT stop the instance gracefully. Reports go through a multiprocessing queue:
a ``MetricsSnapshot`` every ``metrics_interval_s`` and an ``InstanceExit`` last.

A process may connect to the broker before it knows which instance it will run (the worker
keeps such warm processes ready) and hand that client to ``run_instance_process``.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pulsar

    from magnetar.statestore import StateOptions

__all__ = ["InstanceExit", "InstanceProcessSpec", "run_instance_process"]


@dataclass(frozen=True)
class InstanceProcessSpec:
    """Everything an instance process needs (picklable)."""

    config_json: str
    """The FunctionConfig as JSON."""
    broker_url: str
    """Pulsar service URL."""
    instance_id: int
    """Index of the instance among the function's instances."""
    log_level: int = logging.INFO
    """Level of the process log."""
    worker_id: str = ""
    """The worker running the instance (in its status)."""
    function_version: str = ""
    """Version of the function, as the context reports it."""
    metrics_interval_s: float = 1.0
    """How often a MetricsSnapshot is reported."""
    state: StateOptions | None = None
    """Where the instance keeps its state; None runs it without a state store."""


@dataclass(frozen=True)
class InstanceExit:
    """The last report of an instance process; ``error`` is empty after a clean stop."""

    instance_id: int
    error: str


def run_instance_process(
    spec: InstanceProcessSpec, reports: Any, client: pulsar.Client | None = None
) -> None:
    """Run one instance until SIGTERM/SIGINT; ``reports`` is a multiprocessing queue.

    ``client``: a client this process created earlier for ``spec.broker_url`` (a warm
    process); None creates one. Either way the instance owns it and closes it at the end.
    """
    from magnetar.client import create_client
    from magnetar.instance.config import FunctionConfig, ProcessingGuarantees
    from magnetar.instance.instance import FunctionInstance, InstanceOptions

    logging.basicConfig(
        level=spec.log_level,
        format=f"%(asctime)s [instance {spec.instance_id}] %(levelname)s %(name)s: %(message)s",
    )
    config = FunctionConfig.model_validate_json(spec.config_json)
    if client is None:
        client = create_client(spec.broker_url)
    options = InstanceOptions(
        instance_id=spec.instance_id,
        metrics_interval_s=spec.metrics_interval_s,
        worker_id=spec.worker_id,
        function_version=spec.function_version,
    )
    state = None
    if spec.state is not None:
        from magnetar.statestore import JournaledStateStore

        state = JournaledStateStore(
            client,
            config.fqfn,
            spec.state,
            effectively_once=config.processing_guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE,
        )
    instance = FunctionInstance(config, client, options, state=state, on_metrics=reports.put)

    def stop(signum: int, frame: Any) -> None:
        instance.stop(drain=True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    error = ""
    try:
        instance.run()
    except Exception as failure:
        error = f"{type(failure).__name__}: {failure}"
    finally:
        if state is not None:
            state.close()
        client.close()
        reports.put(InstanceExit(spec.instance_id, error))
