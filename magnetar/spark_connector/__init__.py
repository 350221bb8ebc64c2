"""PySpark Python Data Source ``pulsar`` and function replay. Lands with the Spark issue."""
