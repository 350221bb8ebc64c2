"""The function's logger: records go to the process log and, with ``logTopic``, to that topic."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from magnetar.instance.config import FunctionConfig

__all__ = ["APACHE_DATE_FORMAT", "APACHE_FORMAT", "LogTopicHandler", "function_logger"]


APACHE_FORMAT = "[%(asctime)s] [%(levelname)s]: %(message)s"
"""The line Apache Pulsar's Python runtime writes to a log topic."""
APACHE_DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"


class LogTopicHandler(logging.Handler):
    """Publishes each record to a topic as Apache Pulsar's Python runtime does (UTF-8 text,
    ``[time] [LEVEL]: message``, a traceback after it), with the properties Pulsar's Java
    runtime adds (``fqn``, ``instance``, ``loglevel``).

    Best effort: a log line that cannot be sent is dropped rather than stalling the
    function, and the handler never raises into user code.
    """

    def __init__(self, producer: Any, fqfn: str, instance_id: int) -> None:
        super().__init__()
        self._producer = producer
        self._properties = {"fqn": fqfn, "instance": str(instance_id)}
        self.setFormatter(logging.Formatter(APACHE_FORMAT, APACHE_DATE_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record).encode()
            properties = {**self._properties, "loglevel": record.levelname}
            self._producer.send_async(text, None, properties=properties)
        except Exception:
            self.handleError(record)


def function_logger(
    config: FunctionConfig, instance_id: int, producer_for: Callable[[str], Any]
) -> logging.Logger:
    """The logger ``context.get_logger()`` returns for this instance."""
    logger = logging.getLogger(f"magnetar.function.{config.fqfn}.{instance_id}")
    logger.setLevel(logging.INFO)
    for handler in [h for h in logger.handlers if isinstance(h, LogTopicHandler)]:
        logger.removeHandler(handler)
    if config.log_topic:
        logger.addHandler(LogTopicHandler(producer_for(config.log_topic), config.fqfn, instance_id))
    return logger
