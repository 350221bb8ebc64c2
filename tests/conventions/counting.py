"""State: counts words with incr_counter and returns each word's count so far."""

from pulsar import Function


class CountWords(Function):
    def process(self, input, context):
        words = input.split()
        for word in words:
            context.incr_counter(word, 1)
        return ",".join(f"{word}={context.get_counter(word)}" for word in words)
