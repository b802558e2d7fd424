"""The loader the import watcher hands vLLM's modules, beside other tools that wrap loaders.

Real subprocesses with the stand-in build: each child imports vLLM the way the
tool it mimics does (ddtrace's module watchdog, wrapt's importer, importlib's
lazy loader, an availability check), then reports what the shim decided.
The coexistence tier (tests/coexist) runs the real tools on real vLLM.
"""

from __future__ import annotations

from tests.activation.children import JUDGED
from tests.conftest import STATUS, last_json, run_python, summary_lines
from tests.toys import GREETING, IMPORT, USE


def states(stdout: str) -> dict[str, str]:
    return {name: row["state"] for name, row in last_json(stdout).items()}  # type: ignore[union-attr]


# A finder ahead of the watcher that wraps whatever loader the finders after it give (the watcher's
# proxy), the way ddtrace's ModuleWatchdog does: OUTER_EXEC is the body of its exec_module.
OUTER = """
import importlib.util, sys

class Outer:
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
{create_body}

    def exec_module(self, module):
{exec_body}

class OuterFinder:
    def find_spec(self, name, path=None, target=None):
        if name != "vllm":
            return None
        index = sys.meta_path.index(self)
        for finder in sys.meta_path[index + 1:]:
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = Outer(spec.loader)
                return spec

sys.meta_path.insert(0, OuterFinder())
"""


def outer(exec_body: str, create_body: str = "return self.inner.create_module(spec)") -> str:
    def indent(body: str) -> str:
        return "\n".join(" " * 8 + line for line in body.strip().splitlines())

    return OUTER.format(exec_body=indent(exec_body), create_body=indent(create_body))


def test_a_vllm_spec_found_before_the_import_copies_deepcopies_and_pickles():
    # Availability checks call find_spec("vllm") before vLLM is imported: its loader is the proxy.
    proc = run_python(USE + """
import copy, importlib.util, json, pickle
spec = importlib.util.find_spec("vllm")
copies = [copy.copy(spec), copy.deepcopy(spec), pickle.loads(pickle.dumps(spec)), copy.copy(spec.loader)]
print(json.dumps([type(spec.loader).__name__] + [
    (c.loader if hasattr(c, "loader") else c).get_filename("vllm") == spec.origin for c in copies]))
""" + IMPORT + STATUS)
    assert proc.stdout.splitlines()[0] == '["ActivatingLoader", true, true, true, true]', proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_the_spec_of_a_hooked_module_found_before_its_import_copies_deepcopies_and_pickles():
    # Once vLLM is imported, wrapt's finder gives each hook target not imported yet (here the toy greeting's
    # module, and prometheus_client) its own proxy loader: copies of those specs too, then the imports.
    proc = run_python(USE + f"""
import copy, importlib.util, json, pickle, vllm
for spec in [importlib.util.find_spec("{GREETING.module}"), importlib.util.find_spec("prometheus_client")]:
    copies = [copy.copy(spec), copy.deepcopy(spec), pickle.loads(pickle.dumps(spec)), copy.copy(spec.loader)]
    print(json.dumps([type(spec.loader).__name__] + [
        (c.loader if hasattr(c, "loader") else c).get_filename(spec.name) == spec.origin for c in copies]))
""" + IMPORT + "import prometheus_client\nprint(b'dspark_hotfix_info{' in prometheus_client.generate_latest())\n"
        + STATUS)
    copied = '["_ImportHookChainedLoader", true, true, true, true]'
    assert proc.stdout.splitlines()[:3] == [copied, copied, "True"], proc.stderr  # prometheus_client hooked
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_vllm_executed_from_its_spec_outside_sys_modules_leaves_the_import_after_it_patched():
    # A version probe runs vLLM's package module without importing it: the real import follows.
    proc = run_python(USE + """
import importlib.util as u
s = u.find_spec("vllm")
m = u.module_from_spec(s)
s.loader.exec_module(m)
print(m.__version__)
""" + IMPORT + STATUS)
    assert proc.stdout.splitlines()[0].startswith("0.23.1rc1"), proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr
    assert len(summary_lines(proc.stderr)) == 1, proc.stderr


def test_the_loaders_are_put_back_only_where_they_still_point_at_the_proxy():
    # A loader wrapped around the proxy has its own object in __loader__ and __spec__.loader
    # while the proxy runs: that is the outer loader's to restore, not the proxy's to overwrite.
    proc = run_python(USE + outer("""
self.inner.exec_module(module)
print(module.__loader__ is self, module.__spec__.loader is self)
""") + "import vllm\nprint(type(vllm.__loader__).__name__)\n" + IMPORT + STATUS)
    assert proc.stdout.splitlines()[:2] == ["True True", "Outer"], proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr
    # With nothing wrapped around it, the module keeps vLLM's own loader.
    alone = run_python(USE + "import vllm\n"
                       "print(type(vllm.__loader__).__name__, type(vllm.__spec__.loader).__name__)\n")
    assert alone.stdout.split() == ["SourceFileLoader", "SourceFileLoader"], alone.stderr


def test_a_module_that_refuses_its_loader_assignment_still_imports_patched():
    # A module type whose __loader__ is read-only (the proxy, given at creation): the put-back skips it.
    proc = run_python(USE + outer("self.inner.exec_module(module)", create_body="""
import types

class Refusing(types.ModuleType):
    __loader__ = property(lambda module: module.given)

module = Refusing(spec.name)
module.given = self.inner
return module
""") + "import vllm\nprint(type(vllm).__name__, type(vllm.__loader__).__name__, type(vllm.__spec__.loader).__name__)\n"
        + IMPORT + STATUS)
    assert proc.stdout.splitlines()[0] == "Refusing ActivatingLoader Outer", proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_a_loader_wrapped_around_ours_may_set_get_code_on_it_and_vllms_loader_runs_it():
    # ddtrace's watchdog (ddtrace/internal/module.py) assigns get_code on the loader it wraps, to
    # transform the module's code: the assignment must not fail, and must reach vLLM's loader.
    proc = run_python(USE + outer("""
original = self.inner.get_code
transformed = []

def get_code(fullname):
    transformed.append(fullname)
    return original(fullname)

self.inner.get_code = get_code
self.inner.exec_module(module)
print(transformed)
""") + "import vllm\n" + IMPORT + STATUS)
    assert proc.stdout.splitlines()[0] == "['vllm']", proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_vllm_imported_through_importlibs_lazy_loader_is_patched():
    proc = run_python(USE + """
import importlib.util, sys
spec = importlib.util.find_spec("vllm")
spec.loader = importlib.util.LazyLoader(spec.loader)
module = importlib.util.module_from_spec(spec)
sys.modules["vllm"] = module
spec.loader.exec_module(module)
print(type(module.__loader__).__name__, type(module).__name__)
""" + IMPORT + STATUS)
    assert proc.stdout.splitlines()[0] == "SourceFileLoader module", proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_a_wrapt_post_import_hook_on_vllm_registered_before_the_import_fires_and_vllm_is_patched():
    # wrapt's own finder goes ahead of the watcher and wraps the proxy in its chained loader.
    proc = run_python(USE + """
import wrapt
fired = []
wrapt.register_post_import_hook(lambda module: fired.append(type(module.__loader__).__name__), "vllm")
import vllm
print(fired)
""" + IMPORT + STATUS)
    assert proc.stdout.splitlines()[0] == "['SourceFileLoader']", proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr
