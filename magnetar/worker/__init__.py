"""Control plane: metadata, membership and leader, scheduler, assignments, runtime manager,
REST admin API. Lands with the worker-cluster issue."""
