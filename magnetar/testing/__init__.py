"""Helpers for testing and benchmarking Magnetar itself: a local cluster of worker processes."""

from magnetar.testing.cluster import LocalCluster, WorkerProcess, wait_until

__all__ = ["LocalCluster", "WorkerProcess", "wait_until"]
