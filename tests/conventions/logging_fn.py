"""Logging: one line per input through the context's logger (to --log-topic)."""

from pulsar import Function


class Log(Function):
    def process(self, input, context):
        context.get_logger().info("saw %s", input)
        return input
