"""The start-up hang of the old watcher, on real vLLM: the first DeepSeek-V4 import while another thread imports wrapt.

Run with a vLLM venv's python and the shim on PYTHONPATH, from outside the repository:
    cd /tmp && PYTHONPATH=<checkout> <venv>/bin/python <checkout>/docs/evidence/import-lock-hang.py
A hang ends after 60 s with faulthandler's dump of both threads and exit 1. Measured 2026-12-01 on vLLM
0.25.0 (CPU): the watcher that activated inside find_spec (commit 91cfbdc) hung 3 of 3 runs; the loader
that activates in exec_module finished 3 of 3, in 4.2 to 4.4 s. tests/activation/test_concurrency.py holds the
same scenario on the stand-in.
"""
import faulthandler, sys, threading, time, importlib.util
faulthandler.dump_traceback_later(60, exit=True)
import vllm, vllm.models  # noqa: vLLM itself is imported; its DeepSeek-V4 package is not yet
inside = threading.Event()

class SlowWrapt:  # the second thread holds wrapt's module lock for 0.5 s while importing it
    def find_spec(self, name, path=None, target=None):
        if name != "wrapt" or threading.current_thread().name != "second":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        real = spec.loader.exec_module
        def exec_module(module):
            inside.set(); time.sleep(0.5); real(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, SlowWrapt())
barrier = threading.Barrier(2)
def second():
    barrier.wait()
    import wrapt  # noqa
t = threading.Thread(target=second, name="second")
t.start()
barrier.wait()
inside.wait(5)
start = time.time()
import vllm.models.deepseek_v4.attention  # noqa
t.join()
import dspark_hotfix
print("done", round(time.time() - start, 1), [r["state"] for r in dspark_hotfix.status()["patches"]][:3])
