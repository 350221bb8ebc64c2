"""Apache's class convention: a pulsar.Function subclass (--classname class_function.Exclaim)."""

from pulsar import Function


class Exclaim(Function):
    def process(self, input, context):
        return input + "!"
