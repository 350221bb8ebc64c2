"""Splits each sentence into words and publishes every word to the output topic."""
from pulsar import Function


class WordSplitFunction(Function):
    def process(self, input, context):
        for word in input.split():
            context.publish(context.get_output_topic(), word)
        return None
