"""PyTorch's Inductor tests (../shared/peer-tests/pytorch/inductor/) as a conformance target.

Three configurations of the same pytest run over the file's CPU classes:
  inductor  the file as it is: Dynamo + Inductor (the reference; slow on 2 cores)
  dynamo    Dynamo's capture, every Inductor compile redirected to ember's backend
            (`compile_fx` that `check_model` calls, `torch.compile` / `torch._dynamo.optimize`
            with the default or "inductor" backend)
  ember     ember's own capture and backend (`torch._dynamo.optimize` / `torch.compile`
            become `ember.compile`)
The redirection is installed by this module as a pytest plugin, inside the test process only.

Each test gets one class per configuration:
  pass          passed; for dynamo/ember also: ember compiled >= 1 graph, Inductor nothing
                (and, for ember, Dynamo captured nothing)
  pass_no_ember passed without ember compiling a graph (or with Inductor/Dynamo doing it)
  wrong         a value / dtype / shape / stride mismatch against eager (the worst class)
  unsupported   ember refused loudly (ember.Unsupported)
  crash         an exception from inside ember that is not Unsupported; or the process died
                (signal) or hung (timeout): the runner restarts after the test
  fail / error  another assertion / exception (the test's own, Dynamo's, torch's)
  skip
  pass_no_compile  (reference only) passed with Inductor compiling nothing: not counted
Tests whose source asserts Inductor internals (generated code, kernel counts, metrics, AOTI,
config effects; INTERNAL_TOKENS + INTERNALS) are flagged `internals` and counted apart.

Counting (../shared/peer-tests/README.md): the denominator is the tests that pass under the
reference and are not internals; the rate is the share of them in class `pass`.

    python -m tests.peer.inductor_runner --config dynamo            # run, diff vs expected
    python -m tests.peer.inductor_runner --config ember --update    # rewrite that column
    python -m tests.peer.inductor_runner --config inductor --shard 1/4 --update  # reference
    python -m tests.peer.inductor_runner --report                   # pass rates, lists
"""
from __future__ import annotations

import argparse
import faulthandler
import inspect
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER_FILE = (ROOT.parent / "shared" / "peer-tests" / "pytorch" / "inductor"
             / "test_torchinductor.py")
if not PEER_FILE.exists():       # a worktree next to main: shared/ is beside the main checkout
    PEER_FILE = Path("/work/shared/peer-tests/pytorch/inductor/test_torchinductor.py")
EXPECTED = Path(__file__).with_name("expected_inductor.json")
CONFIGS = ("inductor", "dynamo", "ember")
TIMEOUT_S = {"inductor": 600, "dynamo": 240, "ember": 240}

# source text that marks a test as asserting Inductor's internals rather than values
INTERNAL_TOKENS = (
    "_and_get_code", "run_and_get_cpp_code", "run_and_get_triton_code", "FileCheck",
    "metrics.", "generated_kernel_count", "aoti", "AOTI", "compile_fx_inner", "count_bytes",
    "GraphLowering", "assertExpectedInline", "CompileCounter", "code_hash",
    "_inductor.lowering", "ir_pre_fusion", "get_kernel_count",
    "assertGeneratedKernelCountEqual", "_run_and_assert_no_indirect_indexing",
    "inductor_wrapper_call", "frame_count", "counters[",
)
# tests the token scan does not see; each with the internal it asserts
INTERNALS: dict[str, str] = {
    "test_inner_fn_str_and_stride": "a scheduler-init hook (add_scheduler_init_hook) must run",
}


# ---------------------------------------------------------------------------------------------
# the plugin (runs inside the pytest process)

class _Peer:
    config = os.environ.get("EMBER_PEER_CONFIG", "inductor")
    out = os.environ.get("EMBER_PEER_OUT")
    ember_graphs = 0
    inductor_compiles = 0
    excinfo = None
    outcome = None


def _count_ember():
    import ember

    def peer_ember_backend(gm, example_inputs, **kwargs):
        _Peer.ember_graphs += 1
        return ember.backend(gm, example_inputs, **kwargs)
    # ember.compile treats it like ember's own backend (symbolic graphs, options)
    peer_ember_backend.ember_backend_name = "ember"
    return peer_ember_backend


def _install(config: str) -> None:
    import torch
    import torch._dynamo
    import torch._inductor.compile_fx as cfx

    for name in ("compile_fx", "compile_fx_inner"):
        real = getattr(cfx, name)

        def counted(*a, _real=real, **k):
            _Peer.inductor_compiles += 1
            return _real(*a, **k)
        setattr(cfx, name, counted)
    if config == "inductor":
        return
    import ember
    backend = _count_ember()
    cfx.compile_fx = lambda gm, ex, *a, **k: backend(gm, ex)   # what check_model calls
    real_compile, real_optimize = torch.compile, torch._dynamo.optimize
    real_assert = torch._dynamo.optimize_assert

    def is_default(b):
        return b is None or b == "inductor"

    if config == "dynamo":
        def compile_(model=None, *, backend_=None, **kw):
            b = kw.pop("backend", "inductor")
            if is_default(b):
                b = backend
                kw.pop("mode", None)
                kw.pop("options", None)
            return real_compile(model, backend=b, **kw) if model is not None else \
                real_compile(backend=b, **kw)

        def optimize(*a, **kw):
            b = kw.pop("backend", a[0] if a else "inductor")
            return real_optimize(backend if is_default(b) else b, *a[1:], **kw)

        def optimize_assert(*a, **kw):
            b = kw.pop("backend", a[0] if a else "inductor")
            return real_assert(backend if is_default(b) else b, *a[1:], **kw)
    else:
        def compile_(model=None, *, backend_=None, **kw):
            b = kw.pop("backend", "inductor")
            args = dict(backend=backend if is_default(b) else b,
                        fullgraph=kw.pop("fullgraph", False), dynamic=kw.pop("dynamic", None))
            def one(m):     # torch.compile leaves a module as it is: compile a call of it
                if isinstance(m, torch.nn.Module):
                    return ember.compile(lambda *a, **k: m(*a, **k), **args)
                return ember.compile(m, **args)
            return one if model is None else one(model)

        def optimize(*a, nopython=False, **kw):
            b = kw.pop("backend", a[0] if a else "inductor")
            b = backend if is_default(b) else b
            return lambda fn: ember.compile(fn, backend=b, fullgraph=bool(nopython),
                                            dynamic=kw.get("dynamic"))

        def optimize_assert(*a, **kw):
            return optimize(*a, nopython=True, **kw)
    torch.compile = compile_
    torch._dynamo.optimize, torch._dynamo.optimize_assert = optimize, optimize_assert


def _exc_chain(exc):
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return seen


def _classify(rep_outcome, exc) -> tuple[str, str]:
    if rep_outcome == "passed":
        return "pass", ""
    if rep_outcome == "skipped":
        return "skip", ""
    if exc is None:
        return "error", "no exception recorded"
    from ember.errors import Unsupported
    chain = _exc_chain(exc)
    line = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if any(isinstance(e, Unsupported) for e in chain):
        u = next(e for e in chain if isinstance(e, Unsupported))
        return "unsupported", f"Unsupported: {str(u).splitlines()[0]}"[:300]
    if isinstance(exc, AssertionError):
        msg = str(exc)
        keys = ("not close", "not equal", "do not match", "mismatch", "strides_equal")
        tb = "".join(traceback.format_tb(exc.__traceback__))
        if any(k in msg for k in keys) or "strides_equal" in tb:
            return "wrong", line[:300]
        return "fail", line[:300]
    for e in chain:
        frames = traceback.extract_tb(e.__traceback__)
        if any("/ember/" in f.filename for f in frames):
            f = [f for f in frames if "/ember/" in f.filename][-1]
            inner = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            return "crash", f"{inner} at {f.filename.split('/ember/')[-1]}:{f.lineno}"[:300]
    return "error", line[:300]


def _source_of(fn) -> str:
    # copy_tests wraps each test in `new_test(self, value=value)` and replaces its __dict__
    # (so __wrapped__ is gone): the template method is the default argument
    while True:
        inner = getattr(fn, "__wrapped__", None)
        defaults = getattr(fn, "__defaults__", None) or ()
        if inner is None and defaults and getattr(defaults[-1], "__name__", None) == fn.__name__:
            inner = defaults[-1]
        if inner is None:
            break
        fn = inner
    try:
        return inspect.getsource(fn)
    except (TypeError, OSError):
        return ""


def internals_of(test_id: str, module) -> str:
    """Why test `Class::name` counts as asserting Inductor internals ("" if it does not)."""
    cls_name, name = test_id.split("::")
    base = name[:-len("_cpu")] if name.endswith("_cpu") else name
    if base in INTERNALS:
        return INTERNALS[base]
    src = _source_of(getattr(getattr(module, cls_name, None), name, None))
    return ",".join(t for t in INTERNAL_TOKENS if t in src)


def _scan_internals(ids) -> dict:
    import importlib
    sys.path.insert(0, str(PEER_FILE.parent))
    try:
        module = importlib.import_module(PEER_FILE.stem)
    finally:
        sys.path.pop(0)
    return {t: internals_of(t, module) for t in ids}


def _write(rec: dict) -> None:
    if _Peer.out:
        with open(_Peer.out, "a") as f:
            f.write(json.dumps(rec) + "\n")


def pytest_configure(config):
    if os.environ.get("EMBER_PEER_CONFIG"):
        _install(_Peer.config)


def pytest_runtest_logstart(nodeid, location):
    _Peer.ember_graphs = _Peer.inductor_compiles = 0
    _Peer.excinfo, _Peer.outcome = None, None
    _Peer.start = time.time()
    _write({"id": nodeid, "event": "start"})
    faulthandler.dump_traceback_later(TIMEOUT_S[_Peer.config], exit=True)


def pytest_runtest_makereport(item, call):
    if call.when == "setup" and call.excinfo is not None and not call.excinfo.errisinstance(
            __import__("unittest").SkipTest):
        _Peer.outcome, _Peer.excinfo = "failed", call.excinfo.value
    if call.when == "call":
        if call.excinfo is None:
            _Peer.outcome = "passed"
        else:
            import unittest
            import _pytest.outcomes
            skipped = call.excinfo.errisinstance((unittest.SkipTest, _pytest.outcomes.Skipped))
            _Peer.outcome = "skipped" if skipped else "failed"
            _Peer.excinfo = call.excinfo.value


def pytest_runtest_logfinish(nodeid, location):
    faulthandler.cancel_dump_traceback_later()


def pytest_runtest_teardown(item, nextitem):
    outcome = _Peer.outcome or "skipped"
    cls, why = _classify(outcome, _Peer.excinfo)
    if cls == "pass" and _Peer.config != "inductor":
        import torch._dynamo.utils
        if _Peer.ember_graphs == 0 or _Peer.inductor_compiles:
            cls, why = "pass_no_ember", (f"ember graphs {_Peer.ember_graphs}, inductor "
                                         f"compiles {_Peer.inductor_compiles}")
    _write({"id": item.nodeid, "event": "end", "class": cls, "why": why,
            "ember_graphs": _Peer.ember_graphs,
            "inductor_compiles": _Peer.inductor_compiles,
            "seconds": round(time.time() - _Peer.start, 2)})


# ---------------------------------------------------------------------------------------------
# the driver

def _short(nodeid: str) -> str:
    return nodeid.split("test_torchinductor.py::", 1)[-1]


def _collect(python: str) -> list[str]:
    out = subprocess.run([python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          str(PEER_FILE)], capture_output=True, text=True, cwd=ROOT).stdout
    return [_short(ln) for ln in out.splitlines() if "::" in ln]


def run_config(config: str, ids: list[str], out: Path, python: str = sys.executable,
               quiet: bool = True) -> dict[str, dict]:
    """Run `ids` under `config` in a pytest subprocess that writes one JSON line per test;
    when the process dies (SIGFPE, timeout) the test it was in is recorded as a crash and the
    rest run in a fresh process."""
    env = dict(os.environ, EMBER_PEER_CONFIG=config, EMBER_PEER_OUT=str(out), EMBER_STRICT="1",
               EMBER_SPEED_CHECK="0", PYTHONPATH=str(ROOT))
    env.pop("PYTEST_XDIST_WORKER", None)
    done: dict[str, dict] = {}
    todo = list(ids)
    out.unlink(missing_ok=True)
    while todo:
        offset = out.stat().st_size if out.exists() else 0    # this process's records follow
        args = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                "tests.peer.inductor_runner", "--rootdir", str(PEER_FILE.parent)]
        args += [f"{PEER_FILE}::{t}" for t in todo]
        proc = subprocess.run(args, env=env, cwd=ROOT, capture_output=quiet, text=True)
        started = None
        for ln in (out.read_text()[offset:].splitlines() if out.exists() else []):
            rec = json.loads(ln)
            t = _short(rec["id"])
            if rec["event"] == "start":
                started = t
            else:
                done[t] = rec
                started = None
        if started is not None:
            tail = (proc.stderr or "")[-300:].strip().splitlines()
            done[started] = {"class": "crash",
                             "why": f"process died, rc {proc.returncode}: "
                                    f"{tail[-1] if tail else ''}"[:300]}
        remaining = [t for t in todo if t not in done]
        if remaining == todo or started is None:
            for t in remaining:          # not collected / not run: record, do not loop
                done[t] = {"class": "error", "why": "not run"}
            break
        todo = remaining
    return done


def load_expected() -> dict:
    return json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}


def save_expected(data: dict) -> None:
    EXPECTED.write_text(json.dumps(dict(sorted(data.items())), indent=1, sort_keys=True) + "\n")


def report(data: dict) -> str:
    lines = []
    ref_pass = [t for t, r in data.items() if r.get("inductor") == "pass" and not r.get("internals")]
    internals = sorted(t for t, r in data.items() if r.get("internals"))
    lines.append(f"{len(data)} tests; {len(internals)} assert Inductor internals (apart); "
                 f"{len(ref_pass)} others pass under Inductor (the denominator)")
    for config in ("dynamo", "ember"):
        classes: dict[str, list[str]] = {}
        for t in ref_pass:
            classes.setdefault(data[t].get(config, "not run"), []).append(t)
        n = len(classes.get("pass", []))
        lines.append(f"{config}: {n}/{len(ref_pass)} = {100.0 * n / max(1, len(ref_pass)):.1f}%  "
                     + ", ".join(f"{c} {len(v)}" for c, v in sorted(classes.items())))
        for c in ("wrong", "crash", "unsupported", "fail", "error", "pass_no_ember"):
            for t in sorted(classes.get(c, [])):
                lines.append(f"    {c:12s} {t}: {data[t].get(config + '_why', '')}")
    lines.append("internals: " + ", ".join(f"{t} [{data[t]['internals']}]" for t in internals))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=CONFIGS)
    p.add_argument("--shard", default="1/1", help="i/n: every n-th test from the i-th")
    p.add_argument("-k", default=None, help="substrings (comma-separated) of the test ids to run")
    p.add_argument("--update", action="store_true", help="write the results to the expected file")
    p.add_argument("--report", action="store_true", help="print pass rates from the expected file")
    p.add_argument("--out", default=None, help="JSON-lines scratch file")
    p.add_argument("--results", default=None, help="also write this run's results (JSON) here")
    p.add_argument("--merge", nargs="*", default=None,
                   help="results files of shards to fold into the expected file (with --config)")
    a = p.parse_args(argv)
    if a.report or not a.config:
        print(report(load_expected()))
        return 0
    if a.merge is not None:
        results = {}
        for f in a.merge:
            results.update(json.loads(Path(f).read_text()))
        return _apply(a.config, results, update=True)
    ids = _collect(sys.executable)
    if a.k:
        ids = [t for t in ids if any(k in t for k in a.k.split(","))]
    i, n = (int(x) for x in a.shard.split("/"))
    ids = ids[i - 1::n]
    out = Path(a.out or f"/tmp/ember-peer-{a.config}-{os.getpid()}.jsonl")
    results = run_config(a.config, ids, out)
    if a.results:
        Path(a.results).write_text(json.dumps(results, indent=1))
    return _apply(a.config, results, a.update)


def _apply(config: str, results: dict, update: bool) -> int:
    data = load_expected()
    internals = _scan_internals(results) if update else {}
    changed = 0
    for t, rec in sorted(results.items()):
        if rec.get("why") == "not run":        # a run stopped early: keep what is there
            continue
        if config == "inductor" and rec["class"] == "pass" and not rec.get("inductor_compiles"):
            rec = dict(rec, **{"class": "pass_no_compile", "why": "Inductor compiled nothing"})
        row = data.get(t, {})
        old = row.get(config)
        if old != rec["class"]:
            changed += 1
            print(f"{t}: {old} -> {rec['class']}  {rec.get('why', '')}")
        if update:
            row[config] = rec["class"]
            row[config + "_why"] = rec.get("why", "")
            row["internals"] = internals[t]
            data[t] = row
    print(f"{len(results)} run, {changed} differ from {EXPECTED.name}")
    if update:
        save_expected(data)
    return 1 if changed and not update else 0


if __name__ == "__main__":
    sys.exit(main())
