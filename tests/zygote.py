"""The fork server behind ``tests.conftest.in_fresh_process`` (``call_in_child``'s children):
started once per path and environment as ``python -c <this source>``, so the start-up hook runs in
it as in any interpreter start; then, per request, a forked child runs the code it was sent as
``python -c code *argv`` would: ``__main__`` as fresh, ``sys.argv`` as ``-c`` sets it, stdin empty,
stdout and stderr into the files named, and the interpreter's own shutdown at the end (atexit,
threads joined, streams flushed, the exit status).

Nothing but ``os``, ``sys`` and ``marshal``, which every interpreter has loaded at start: a child's
``sys.modules`` is what a fresh interpreter's would be. Requests and replies are marshalled on the
server's stdin and stdout: ``(code, argv, stdout_path, stderr_path)`` in; ``"ready"`` once, then the
child's pid and its exit status (as ``subprocess`` gives it) per request out. End of input ends it.
"""

import marshal
import os
import sys


def send(value: str | int) -> None:
    sys.stdout.buffer.write(marshal.dumps(value))
    sys.stdout.buffer.flush()


def serve() -> str:
    """Forks per request; returns, in the child only, the code the child runs."""
    send("ready")
    while True:
        try:
            code, argv, out, err = marshal.load(sys.stdin.buffer)
        except EOFError:
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            for fd, path in ((0, os.devnull), (1, out), (2, err)):
                opened = os.open(path, (os.O_WRONLY | os.O_CREAT) if fd else os.O_RDONLY)
                os.dup2(opened, fd)
                os.close(opened)
            sys.argv = ["-c", *argv]
            return code
        send(pid)
        send(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))


def run(code: str) -> None:
    """``code`` in ``__main__`` as ``-c`` runs it: the server's own names gone first."""
    main = globals()
    for name in [name for name in main if not name.startswith("__")]:
        del main[name]
    main["__doc__"] = None
    exec(compile(code, "<string>", "exec"), main)


if __name__ == "__main__":
    run(serve())
