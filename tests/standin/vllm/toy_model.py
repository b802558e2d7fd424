"""A toy target of the tests' toy patches (tests/toys.py), not a module of vLLM: the machinery
is tested on these, so that no machinery test depends on a real patch."""


class Greeter:
    def greet(self, name):
        return f"helo, {name}"  # the toy bug: toys.GREETING corrects it
