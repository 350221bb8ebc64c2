"""Function state: a journal topic on the broker materialized in RocksDB. Lands with the
state-store issue; until then instances use :class:`magnetar.instance.UnconfiguredStateStore`."""
