"""Apache's native function convention: a module whose process(input) runs (--classname
native_module)."""


def process(input):
    return input + "!"
