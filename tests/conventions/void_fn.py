"""A function that returns nothing: no output message."""

from pulsar import Function


class Void(Function):
    def process(self, input, context):
        context.incr_counter("seen", 1)
