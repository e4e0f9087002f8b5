"""OpInfo conformance: PyTorch's OpInfo database through ember backends vs eager.

One expected-failure table, opinfo_xfail.json ({backend: {case key: reason}}). A case is
"<op>[.<variant>]|<dtype>|fwd|bwd" and passes when all its first MAX_SAMPLES samples match eager.
- a failure not in the table fails the test (a regression);
- a table entry that now passes fails the test too (remove it: the table must stay true);
- EMBER_COLLECT_XFAIL=1 rewrites the table entries of the cases that ran from their results.
The default run covers FAST_OPS in float32 through aot_eager; the full sweep (every op_db
entry, float32 and float64, aot_eager and ember) is marked slow:
    pytest -m slow tests/conformance
"""
import json
import os
import threading
from pathlib import Path

import pytest
import torch

from ember.testing.opinfo import run_case, select_ops, supported_dtypes
from ember.testing.opinfo_report import FAST_OPS

XFAIL_PATH = Path(__file__).with_name("opinfo_xfail.json")
MAX_SAMPLES = 3
COLLECT = os.environ.get("EMBER_COLLECT_XFAIL") == "1"
_lock = threading.Lock()


def _load():
    return json.loads(XFAIL_PATH.read_text()) if XFAIL_PATH.exists() else {}


XFAIL = _load()
_collected: dict = {}


def _cases(names, dtypes, backends):
    out = []
    for o in select_ops(names):
        for d in supported_dtypes(o, dtypes):
            for kind in ("fwd", "bwd"):
                for b in backends:
                    key = f"{o.name}{'.' + o.variant_test_name if o.variant_test_name else ''}" \
                          f"|{str(d).replace('torch.', '')}|{kind}"
                    out.append(pytest.param(o, d, kind, b, id=f"{b}:{key}"))
    return out


def _check(opinfo, dtype, kind, backend):
    res = run_case(opinfo, dtype, kind, backend, max_samples=MAX_SAMPLES)
    table = XFAIL.get(backend, {})
    if COLLECT:
        with _lock:
            _collected.setdefault(backend, {})[res.key] = res
        if res.status == "skip":
            pytest.skip(res.reason)
        return
    if res.status == "skip":
        pytest.skip(res.reason)
    expected = table.get(res.key)
    if res.status == "fail" and expected is None:
        pytest.fail(f"{res.key}: {res.passed}/{res.samples} samples pass: {res.reason}")
    if res.status == "pass" and expected is not None:
        pytest.fail(f"{res.key} passes now but is in {XFAIL_PATH.name} ({expected!r}); "
                    "remove it (EMBER_COLLECT_XFAIL=1 rewrites the table)")
    if res.status == "fail":
        pytest.xfail(expected)


@pytest.fixture(scope="module", autouse=True)
def _write_table():
    yield
    if not COLLECT or not _collected:
        return
    table = _load()
    for backend, results in _collected.items():
        entries = table.setdefault(backend, {})
        for key, res in results.items():
            if res.status == "fail":
                entries[key] = res.reason
            else:
                entries.pop(key, None)
        table[backend] = dict(sorted(entries.items()))
    XFAIL_PATH.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("opinfo,dtype,kind,backend", _cases(FAST_OPS, [torch.float32], ["aot_eager"]))
def test_fast(opinfo, dtype, kind, backend):
    _check(opinfo, dtype, kind, backend)


def _slow_cases():
    if os.environ.get("EMBER_OPINFO_FULL", "1") == "0":
        return []
    backends = os.environ.get("EMBER_OPINFO_BACKENDS", "aot_eager,ember").split(",")
    return _cases(None, [torch.float32, torch.float64], backends)


@pytest.mark.slow
@pytest.mark.parametrize("opinfo,dtype,kind,backend", _slow_cases())
def test_full(opinfo, dtype, kind, backend):
    _check(opinfo, dtype, kind, backend)
