"""Public API: decorator forms, validation errors, in-place module compilation, pickling."""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import ember


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2))


def test_public_names():
    for name in ["compile", "explain", "reset", "disable", "allow_in_graph", "list_backends",
                 "register_backend", "get_backend", "Unsupported", "backend", "mark_dynamic",
                 "mark_static", "set_stance", "error_on_graph_break", "nested_compile_region",
                 "save_cache_artifacts", "load_cache_artifacts", "RecompileError"]:
        assert hasattr(ember, name), name
    assert {"eager", "aot_eager", "ember"} <= set(ember.list_backends())
    assert callable(ember.backend)


@pytest.mark.parametrize("form", ["call", "bare_decorator", "decorator_with_args"])
def test_function_forms(form):
    def f(x):
        """doc"""
        return x * 2 + 1

    if form == "call":
        g = ember.compile(f, backend="eager")
    elif form == "bare_decorator":
        g = ember.compile(f)
    else:
        g = ember.compile(backend="eager", fullgraph=False)(f)
    x = torch.randn(5)
    torch.testing.assert_close(g(x), f(x))
    assert g.__name__ == "f" and g.__doc__ == "doc" and g.__wrapped__ is f


def test_bad_backend_lists_valid_names():
    with pytest.raises(ValueError, match="valid backends: .*aot_eager.*eager.*ember"):
        ember.compile(lambda x: x, backend="no-such-backend")
    with pytest.raises(ValueError, match="valid backends"):
        ember.get_backend("nope")


def test_bad_mode_and_options():
    with pytest.raises(ValueError, match="valid modes: default, reduce-overhead, max-autotune"):
        ember.compile(lambda x: x, mode="fastest")
    with pytest.raises(ValueError, match="dynamic"):
        ember.compile(lambda x: x, dynamic="yes")
    with pytest.raises(TypeError, match="options must be a dict"):
        ember.compile(lambda x: x, options=[1])
    with pytest.raises(TypeError, match="nn.Module or a callable"):
        ember.compile(42)


def test_scripted_module_rejected():
    scripted = torch.jit.script(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="TorchScript"):
        ember.compile(scripted)


def test_module_compiled_in_place():
    m = _net()
    keys = list(m.state_dict().keys())
    out = ember.compile(m, backend="eager")
    assert out is m and type(m) is torch.nn.Sequential
    assert list(m.state_dict().keys()) == keys
    assert m._compiled_call_impl is not None
    with pytest.raises(ValueError, match="already compiled"):
        ember.compile(m)


def test_module_values_hooks_and_modes_match_eager():
    ref, m = _net(), ember.compile(_net(), backend="eager")
    seen = []
    m.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    x = torch.randn(6, 4)
    torch.testing.assert_close(m(x), ref(x))
    assert seen == [torch.Size([6, 2])]
    m.eval(), ref.eval()
    torch.testing.assert_close(m(x), ref(x))
    torch.testing.assert_close(m[1].running_mean, ref[1].running_mean)


RUNS = []


def _counting(gm, example_inputs):
    """A backend whose compiled graphs count their runs (registered by name, so it pickles)."""
    def run(*args):
        RUNS.append(1)
        return gm.forward(*args)
    return run


ember.register_backend("test-counting", _counting)


def _roundtrip(kind, m):
    if kind == "pickle":
        return pickle.loads(pickle.dumps(m))
    if kind == "deepcopy":
        return copy.deepcopy(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_state_dict_save_load_of_compiled_module(tmp_path):
    m = ember.compile(_net(), backend="eager")
    m.eval()
    x = torch.randn(3, 4)
    torch.save(m.state_dict(), tmp_path / "sd.pt")
    fresh = _net()
    fresh.load_state_dict(torch.load(tmp_path / "sd.pt"))
    fresh.eval()
    torch.testing.assert_close(fresh(x), m(x))


@pytest.mark.parametrize("kind", ["pickle", "deepcopy", "torch.save"])
def test_copies_of_compiled_module_stay_compiled(kind):
    m = ember.compile(_net(), backend="test-counting", dynamic=False, recompile_limit=3)
    x = torch.randn(3, 4)
    expected = m(x)
    c = _roundtrip(kind, m)
    assert type(c) is torch.nn.Sequential
    assert list(c.state_dict()) == list(m.state_dict())
    call = c._compiled_call_impl
    assert isinstance(call, ember.api.CompiledCall) and call.module is c
    s = call.settings
    assert (s.backend_name, s.dynamic, s.recompile_limit) == ("test-counting", False, 3)
    ember.reset()                              # the copy compiles for itself, from scratch
    RUNS.clear()
    torch.testing.assert_close(c(x), expected)
    assert ember.stats()["counts"]["graphs"] == 1 and len(RUNS) == 1
    # its own parameters: a change to the copy shows in the copy only, as in eager
    with torch.no_grad():
        c[0].weight.add_(1.0)
    eager = copy.deepcopy(c)
    eager._compiled_call_impl = None
    torch.testing.assert_close(c(x), eager(x))
    torch.testing.assert_close(m(x), expected)  # the original still works, unchanged
    assert len(RUNS) == 3 and ember.stats()["counts"].get("eager_calls", 0) == 0


def test_module_pickled_with_a_backend_unknown_where_it_loads_loads_uncompiled():
    from ember.backends import registry
    ember.register_backend("test-gone", _counting)
    m = ember.compile(_net(), backend="test-gone")
    data = pickle.dumps(m)
    registry._USER.pop("test-gone")
    registry._RESOLVED.pop("test-gone", None)
    with pytest.warns(UserWarning, match="loads uncompiled: unknown backend 'test-gone'"):
        loaded = pickle.loads(data)
    assert loaded._compiled_call_impl is None
    x = torch.randn(3, 4)
    torch.testing.assert_close(loaded(x), m(x))


def test_pickled_module_with_unpicklable_backend_saves_uncompiled():
    m = ember.compile(_net(), backend=lambda gm, example_inputs: gm.forward)
    x = torch.randn(3, 4)
    expected = m(x)
    with pytest.warns(UserWarning, match="saved uncompiled.*lambda") as record:
        data = pickle.dumps(m)
        pickle.dumps(m)
    assert len(record) == 1
    loaded = pickle.loads(data)
    assert loaded._compiled_call_impl is None
    torch.testing.assert_close(loaded(x), expected)
    assert isinstance(copy.deepcopy(m)._compiled_call_impl, ember.api.CompiledCall)  # no pickling


def test_register_backend_and_get_backend_protocol():
    calls = []

    def mine(gm, example_inputs):
        calls.append(len(example_inputs))
        return gm.forward

    ember.register_backend("test-mine", mine)
    assert "test-mine" in ember.list_backends()
    gm = torch.fx.symbolic_trace(lambda x: x.relu() + 1)
    fn = ember.get_backend("test-mine")(gm, [torch.randn(3)])
    x = torch.randn(3)
    torch.testing.assert_close(fn(x), x.relu() + 1)
    assert calls == [1]


def test_backend_compile_error_falls_back_loudly(monkeypatch):
    def broken(gm, example_inputs):
        raise RuntimeError("boom in codegen")

    ember.register_backend("test-broken", broken)
    gm = torch.fx.symbolic_trace(lambda x: x * 3)
    monkeypatch.setenv("EMBER_STRICT", "0")
    with pytest.warns(UserWarning, match="test-broken.*boom in codegen.*eagerly"):
        fn = ember.get_backend("test-broken")(gm, [torch.randn(2)])
    x = torch.randn(2)
    torch.testing.assert_close(fn(x), x * 3)
    monkeypatch.setenv("EMBER_STRICT", "1")
    with pytest.raises(RuntimeError, match="boom"):
        ember.get_backend("test-broken")(gm, [torch.randn(2)])


def test_disable_marks_function():
    def f(x):
        return x + 1

    g = ember.disable(f)
    assert ember.compile(g) is g
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 2.0))


def test_mode_and_options_reach_backends_that_take_them():
    got = []

    def with_opts(gm, example_inputs, options=None):
        got.append(options)
        return gm.forward

    def plain(gm, example_inputs):
        return gm.forward

    f = ember.compile(lambda x: x + 1, backend=with_opts, mode="max-autotune", options={"k": 1})
    torch.testing.assert_close(f(torch.ones(2)), torch.full((2,), 2.0))
    assert got == [{"k": 1, "mode": "max-autotune"}]
    g = ember.compile(lambda x: x * 2, backend=plain, mode="reduce-overhead")  # mode alone is fine
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(ValueError, match="takes no options"):
        ember.compile(lambda x: x, backend=plain, options={"k": 1})
    h = ember.compile(lambda x: x - 1, backend="eager", mode="max-autotune")  # built-ins drop it
    torch.testing.assert_close(h(torch.ones(2)), torch.zeros(2))


def _bad_inputs():
    """(call, error type, what the message must list) for each public function of ember."""
    t = torch.randn(2, 3)
    return [
        (lambda: ember.compile(lambda x: x, backend=3), TypeError, "valid names: .*aot_eager"),
        (lambda: ember.compile(lambda x: x, backend="nope"), ValueError, "valid backends: "),
        (lambda: ember.compile(lambda x: x, mode=None), ValueError, "valid modes: default"),
        (lambda: ember.compile(lambda x: x, fullgraph="yes"), TypeError, "True or False"),
        (lambda: ember.compile(lambda x: x, dynamic=2), ValueError, "None, True or False"),
        (lambda: ember.compile(lambda x: x, options="fast"), TypeError, "must be a dict"),
        (lambda: ember.compile(lambda x: x, options={"fuson": False}), ValueError,
         r"unknown option\(s\) \['fuson'\] for backend 'ember'; valid options: fusion, "),
        (lambda: ember.compile(lambda x: x, backend="aot_eager", options={"fusion": False}),
         ValueError, "valid options: partitioner, ddp_split"),
        (lambda: ember.compile(lambda x: x, recompile_limit=0), ValueError, "positive int"),
        (lambda: ember.compile(lambda x: x, recompile_limit=2.5), TypeError, "positive int"),
        (lambda: ember.compile(3), TypeError, "nn.Module or a callable"),
        (lambda: ember.explain(3), TypeError, "function or an nn.Module"),
        (lambda: ember.disable(3), TypeError, "expects a function"),
        (lambda: ember.allow_in_graph(3), TypeError, "expects a function"),
        (lambda: ember.allow_in_graph(torch.nn.Linear(2, 2)), TypeError, "expects a function"),
        (lambda: ember.mark_dynamic([1], 0), TypeError, "torch.Tensor"),
        (lambda: ember.mark_dynamic(t, 5), ValueError, r"valid: -2 \.\. 1"),
        (lambda: ember.mark_dynamic(t, 1.0), TypeError, "int or a list of ints"),
        (lambda: ember.mark_static(t, [0, 9]), ValueError, r"valid: -2 \.\. 1"),
        (lambda: ember.mark_static(torch.nn.Linear(2, 2)), TypeError, "torch.Tensor"),
        (lambda: ember.set_stance("eager"), ValueError, "valid stances: default, force_eager"),
        (lambda: ember.set_stance(1), TypeError, "one of default, force_eager"),
        (lambda: ember.error_on_graph_break(1), TypeError, "True or False"),
        (lambda: ember.nested_compile_region("f"), TypeError, "Python function, an nn.Module"),
        (lambda: ember.load_cache_artifacts(None), TypeError, "expects bytes"),
        (lambda: ember.load_cache_artifacts(b"junk"), ValueError, "not an ember cache artifact"),
        (lambda: ember.get_backend(None), TypeError, "one of .*eager"),
        (lambda: ember.get_backend("nope"), ValueError, "valid backends: "),
        (lambda: ember.register_backend(None, lambda gm, ex: gm), TypeError, "must be a str"),
        (lambda: ember.register_backend("", lambda gm, ex: gm), ValueError, "non-empty"),
        (lambda: ember.register_backend("x", 3), TypeError, "must be callable"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_inputs())))
def test_public_functions_reject_bad_input_listing_what_is_valid(i):
    call, exc, listing = _bad_inputs()[i]
    with pytest.raises(exc, match=listing):
        call()


def test_every_public_function_is_covered_by_the_bad_input_table():
    import inspect
    src = inspect.getsource(_bad_inputs)
    takes_args = [n for n in ember.__all__ if callable(getattr(ember, n)) and
                  not isinstance(getattr(ember, n), type) and n not in ("backend",) and
                  inspect.signature(getattr(ember, n)).parameters]
    assert sorted(n for n in takes_args if f"ember.{n}(" not in src) == []


def test_torch_saved_compiled_module_loads_compiled_in_a_new_process(tmp_path, monkeypatch):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    m = ember.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                          torch.nn.Linear(16, 4)), backend="ember")
    x = torch.randn(5, 8)
    torch.save({"model": m, "x": x, "out": m(x).detach()}, tmp_path / "m.pt")
    script = f"""
import json, torch, ember
d = torch.load({str(tmp_path / 'm.pt')!r}, weights_only=False)
m = d["model"]
assert isinstance(m._compiled_call_impl, ember.api.CompiledCall)
torch.testing.assert_close(m(d["x"]), d["out"])
print(json.dumps(ember.stats()["counts"]))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(root), EMBER_STRICT="1"),
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert counts["graphs"] == 1 and counts["graph_cache_hits"] == 1   # compiled, from disk
