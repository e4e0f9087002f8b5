"""pytest plugin for PyTorch's own Dynamo tests (../shared/peer-tests/pytorch/dynamo/).

Loaded by tests/peer/dynamo_runner.py as `-p tests.peer.dynamo_plugin` in a pytest process of its
own; EMBER_PEER_MODE says what it does:
  reference - records each test's outcome with real torch.compile (and how many graphs Dynamo
              compiled in it);
  ember     - first redirects Dynamo's user entry points to ember, in this test process only
              (torch.compile, torch._dynamo.optimize / optimize_assert / reset / disable /
              allow_in_graph / mark_dynamic / mark_static, the torch.compiler equivalents, and the
              backend names CompileCounterWithBackend looks up), then records each outcome with
              the graphs ember compiled, the graphs Dynamo compiled (must stay 0) and ember's
              'runs eagerly' messages.
One JSON line per test goes to EMBER_PEER_OUT (appended as each test ends, so a killed process
keeps what it ran). A test that runs longer than EMBER_PEER_TIMEOUT seconds is interrupted.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import traceback

import pytest
import torch

MODE = os.environ.get("EMBER_PEER_MODE", "reference")
OUT = os.environ.get("EMBER_PEER_OUT")
TIMEOUT = float(os.environ.get("EMBER_PEER_TIMEOUT", "120"))

_dynamo_graphs = [0]        # graphs Dynamo handed to a backend in the current test
_ember_graphs = [0]         # graphs ember compiled before the last ember.reset() in the test


class PeerTimeout(Exception):
    pass


# ---- redirection (ember mode) ---------------------------------------------------------------
# Dynamo's backend names and what ember runs for them; a callable backend (CompileCounter,
# EagerAndRecordGraphs, a test's own function) is handed ember's graphs as it is.
_BACKENDS = {"eager": "eager", "aot_eager": "aot_eager", "aot_eager_decomp_partition": "aot_eager",
             "inductor": "ember", "aot_inductor": "ember", "cudagraphs": "ember"}


def _ember_backend(backend):
    import ember
    if isinstance(backend, str):
        return ember.get_backend(_BACKENDS.get(backend, "eager"))
    if backend is None:
        return "ember"

    # Dynamo's test backends handle symbolic graphs: tell ember so (its rule keeps automatic
    # dynamic off for user callables that may not); the counters still see every graph
    @functools.wraps(backend, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    def peer_backend(gm, example_inputs):
        return backend(gm, example_inputs)
    peer_backend.ember_backend_name = "eager"
    return peer_backend


class EmberOptimizedModule(torch.nn.Module):
    """What torch.compile(module) returns under redirection: like Dynamo's OptimizedModule, a
    wrapper whose call goes through the compiled `module(...)` (hooks included) while the module
    itself stays eager, so a test comparing `mod(x)` with `opt_mod(x)` compares eager with ember.
    Attributes other than the wrapper's own are read from `_orig_mod`."""

    def __init__(self, mod, compile_kwargs, request=None):
        import ember
        super().__init__()
        self._orig_mod = mod
        self.__dict__["_request"] = request       # torch.compile's arguments, for pickling

        def module_call(*args, **kwargs):
            return mod(*args, **kwargs)
        self.__dict__["_ember_call"] = ember.compile(module_call, **compile_kwargs)

    def __reduce__(self):
        return (_rebuild, (self._orig_mod, self.__dict__["_request"]))

    def forward(self, *args, **kwargs):
        return self.__dict__["_ember_call"](*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_modules"]["_orig_mod"], name)

    def __setattr__(self, name, value):
        # as OptimizedModule: writes go to the wrapped module (opt_mod.step += 1)
        if name == "_orig_mod" or "_orig_mod" not in self.__dict__.get("_modules", {}):
            return super().__setattr__(name, value)
        return setattr(self._orig_mod, name, value)


def _compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None,
             options=None, disable=False, **_ignored):
    import ember
    kwargs = dict(backend=_ember_backend(backend), fullgraph=bool(fullgraph), dynamic=dynamic)
    if model is None:
        return lambda m: _compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                                  disable=disable)
    if disable:
        return model
    if isinstance(model, torch.nn.Module):
        return EmberOptimizedModule(model, kwargs, dict(fullgraph=fullgraph, dynamic=dynamic,
                                                        backend=backend))
    return ember.compile(model, **kwargs)


def _rebuild(mod, request):
    return _compile(mod, **(request or {}))


class _Optimize:
    """torch._dynamo.optimize(backend, nopython=...) as a decorator (the context-manager form
    compiles nothing in this redirection: it is refused by the test then)."""

    def __init__(self, backend="inductor", *, nopython=False, dynamic=None, disable=False, **_):
        self.kw = dict(backend=backend, fullgraph=nopython, dynamic=dynamic, disable=disable)

    def __call__(self, fn):
        return _compile(fn, **self.kw)


def _optimize_assert(backend="inductor", *, dynamic=None, **_):
    return _Optimize(backend, nopython=True, dynamic=dynamic)


def _reset(real):
    def reset():
        import ember
        _ember_graphs[0] += ember.stats()["counts"].get("graphs", 0)
        ember.reset()
        real()
    return reset


def _disable(fn=None, recursive=True, **_):
    import ember
    if fn is None:
        return lambda f: _disable(f, recursive)
    return ember.disable(fn)


def _allow_in_graph(fn):
    import ember
    try:
        return ember.allow_in_graph(fn)
    except TypeError:
        return fn


def _marking(ember_fn, real):
    def mark(t, index=None, *args, **kwargs):
        if isinstance(t, torch.Tensor) and index is not None:
            ember_fn(t, index)
        return real(t, index, *args, **kwargs)
    return mark


def _redirect() -> None:
    import torch._dynamo
    import torch._dynamo.backends.registry as dyn_registry
    import torch._dynamo.testing
    import torch.compiler

    import ember
    real_lookup = dyn_registry.lookup_backend

    def lookup_backend(name):
        # CompileCounterWithBackend("eager"/"aot_eager"/"inductor") compiles ember's graph
        if isinstance(name, str) and name in _BACKENDS:
            return ember.get_backend(_BACKENDS[name])
        return real_lookup(name)

    reset = _reset(torch._dynamo.reset)
    patches = {
        torch: {"compile": _compile},
        torch._dynamo: {"optimize": _Optimize, "optimize_assert": _optimize_assert,
                        "reset": reset, "disable": _disable, "allow_in_graph": _allow_in_graph,
                        "mark_dynamic": _marking(ember.mark_dynamic, torch._dynamo.mark_dynamic),
                        "mark_static": _marking(ember.mark_static, torch._dynamo.mark_static)},
        torch._dynamo.testing: {"optimize_assert": _optimize_assert, "reset": reset},
        torch.compiler: {"reset": reset, "disable": _disable, "allow_in_graph": _allow_in_graph},
        dyn_registry: {"lookup_backend": lookup_backend},
    }
    for mod, attrs in patches.items():
        for name, value in attrs.items():
            setattr(mod, name, value)


def _count_dynamo_graphs() -> None:
    from torch._dynamo.output_graph import OutputGraph
    real = OutputGraph.call_user_compiler

    def call_user_compiler(self, *args, **kwargs):
        _dynamo_graphs[0] += 1
        return real(self, *args, **kwargs)
    OutputGraph.call_user_compiler = call_user_compiler


def pytest_configure(config):
    _count_dynamo_graphs()
    if MODE == "ember":
        _redirect()


# ---- recording ------------------------------------------------------------------------------
_state: dict = {}


def _eager_messages() -> list:
    from ember.capture import breaks
    return breaks.EAGER


def _graphs_now() -> int:
    import ember
    return _ember_graphs[0] + ember.stats()["counts"].get("graphs", 0)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _dynamo_graphs[0] = 0
    _ember_graphs[0] = 0
    _state.clear()
    _state.update(failures=[], eager_start=len(_eager_messages()) if MODE == "ember" else 0)
    if MODE == "ember":
        import ember
        ember.reset()


def _on_alarm(signum, frame):
    raise PeerTimeout(f"test ran longer than {TIMEOUT:.0f} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, TIMEOUT)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    # graphs are read before teardown's reset: the patched reset adds them to _ember_graphs
    if MODE == "ember":
        _state["graphs"] = _graphs_now()
        _state["eager"] = _eager_messages()[_state["eager_start"]:]


def _frames(excinfo) -> list:
    """(filename, lineno, line) of each traceback entry, innermost last."""
    out = []
    for entry in traceback.extract_tb(excinfo.tb):
        out.append((entry.filename, entry.lineno, (entry.line or "").strip()))
    return out


def _chain(exc) -> list:
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _describe(excinfo) -> dict:
    exc = excinfo.value
    chain = _chain(exc)
    frames = _frames(excinfo)
    # the test file's (or Dynamo's testing helper's) innermost line: what was being asserted
    own = [f for f in frames if "peer-tests" in f[0] or f[0].endswith("_dynamo/testing.py")]
    return {"exc": type(exc).__name__, "msg": str(exc)[:400],
            "chain": [f"{type(e).__module__}.{type(e).__name__}" for e in chain],
            "test_line": own[-1][2] if own else "",
            "in_ember": any("/ember/" in f[0] for f in frames),
            "innermost": f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""}


def pytest_runtest_makereport(item, call):
    if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        _state.setdefault("failures", []).append(dict(when=call.when, **_describe(call.excinfo)))


def pytest_runtest_logreport(report):
    if report.when == "setup":
        _state["outcome"] = "skipped" if report.skipped else ("error" if report.failed else None)
        _state["nodeid"] = report.nodeid
    elif report.when == "call":
        if report.skipped:
            _state["outcome"] = "skipped"
        else:
            _state["outcome"] = "passed" if report.passed else "failed"
    elif report.when == "teardown":
        if report.failed and _state.get("outcome") == "passed":
            _state["outcome"] = "failed"
        _write(report.nodeid)


def _write(nodeid: str) -> None:
    if not OUT:
        return
    row = {"id": nodeid.split("/")[-1], "mode": MODE, "outcome": _state.get("outcome") or "error",
           "dynamo_graphs": _dynamo_graphs[0]}
    if MODE == "ember":
        row["graphs"] = _state.get("graphs", 0)
        row["eager"] = [m.split(" runs eagerly: ", 1)[-1][:300] for m in _state.get("eager", [])]
    failures = _state.get("failures") or []
    if failures:
        row["failure"] = failures[0]
    with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\n")
