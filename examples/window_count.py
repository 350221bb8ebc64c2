"""A window function: how many inputs each window held. With a windowConfig, ``process``
receives the list of a window's values, as Apache Pulsar's Java window functions do."""


def process(inputs):
    return str(len(inputs))
