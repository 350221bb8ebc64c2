"""A user exception for every input."""

from pulsar import Function


class Raise(Function):
    def process(self, input, context):
        raise ValueError("no thanks: " + input)
