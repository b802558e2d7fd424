"""A toy target of the tests' toy stop (tests/toys.py), not a module of vLLM."""


def plan(config, items):
    return list(items)[: -1 if config.compact else None]  # the toy bug: compact drops the last item
