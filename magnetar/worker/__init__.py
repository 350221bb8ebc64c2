"""Control plane: a cluster of workers sharing nothing but Pulsar topics.

``metadata`` (the function metadata topic as a replicated state machine), ``membership``
(heartbeats and leader election on a Failover subscription), ``leader`` (terms, fencing,
scheduling), ``scheduler``, ``assignments``, ``packages`` (function code on the broker),
``runtime`` / ``runtime_manager`` (running instances), ``reconciler`` (this worker's share),
``functions`` (changes through the leader) and ``rest`` (the admin API). ``service`` is the
composition root; only the CLI imports it.
"""
