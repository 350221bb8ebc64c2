"""A plain function, no class: Apache Pulsar's native_exclamation_function."""


def process(input):
    return "%s!" % input
