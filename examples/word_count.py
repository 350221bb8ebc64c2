"""Apache Pulsar's word count: counts every word of every sentence in the function's state.

Query a count with `magnetar functions querystate --name word_count --key WORD`.
"""
from pulsar import Function


class WordCountFunction(Function):
    def process(self, input, context):
        for word in input.split():
            context.incr_counter(word, 1)
        return None
