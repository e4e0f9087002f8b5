"""Backend cache (backends/backend_cache.py): a warm start loads the backend's product instead of
rerunning aot → codegen; same values and grads as the cold run and eager; anything that changes
the product misses; a corrupt entry recompiles."""
import copy
import json
import operator
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import ember
from ember.backends import backend_cache

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_BACKEND_CACHE", "1")
    return tmp_path


def _counts():
    return ember.stats()["counts"]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.ln = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = self.ln(y.mean((2, 3)))
        return self.fc(y).softmax(-1), y


# ---- a new process ------------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import json, sys, torch, ember
    sys.path.insert(0, sys.argv[2])
    from tests.unit.backends.test_backend_cache import Net
    torch.manual_seed(0)
    m, x = Net(), torch.randn(2, 3, 6, 6)
    train = sys.argv[1] == "train"
    m.train(train)
    m.requires_grad_(sys.argv[1] != "frozen")
    c = ember.compile(m, options={"freeze": False} if sys.argv[1] == "infer" else {})
    outs = []
    for _ in range(2):
        with torch.set_grad_enabled(train):
            out = c(x)
        outs.append([o.detach() for o in out])
        if train:
            (out[0][:, 0].sum() + out[1].pow(2).sum()).backward()
    grads = [p.grad for p in m.parameters()] if train else []
    if sys.argv[1] == "frozen":                     # a weight changed: refolded, not stale
        with torch.no_grad():
            m.conv.weight.mul_(0.5)
            outs.append(list(c(x)))
    torch.save({"outs": outs, "grads": grads, "buffers": list(m.buffers())}, sys.argv[3])
    print(json.dumps(ember.stats()))
""")


def _eager(mode):
    torch.manual_seed(0)
    m, x = Net(), torch.randn(2, 3, 6, 6)
    train = mode == "train"
    m.train(train)
    outs = []
    for _ in range(2):
        with torch.set_grad_enabled(train):
            out = m(x)
        outs.append([o.detach() for o in out])
        if train:
            (out[0][:, 0].sum() + out[1].pow(2).sum()).backward()
    if mode == "frozen":
        with torch.no_grad():
            m.conv.weight.mul_(0.5)
            outs.append(list(m(x)))
    return {"outs": outs, "grads": [p.grad for p in m.parameters()] if train else [],
            "buffers": list(m.buffers())}


def _child(mode, cache, out):
    env = dict(os.environ, EMBER_CACHE_DIR=str(cache), EMBER_BACKEND_CACHE="1",
               EMBER_STRICT="1", EMBER_SPEED_CHECK="0", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", CHILD, mode, str(REPO), str(out)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), torch.load(out)


@pytest.mark.parametrize("mode", ["infer", "train", "frozen"])
def test_warm_start_in_a_new_process(tmp_path, mode):
    """frozen: the captured graph is not cached (its weights' values are folded in); the
    main graph, which takes the folded constants as inputs, is, and so is freezing's plan (the
    constant graph, the main graph's key): the warm process folds and loads, nothing else.
    infer: an inference graph not frozen (options freeze=False)."""
    cold_stats, cold = _child(mode, tmp_path / "cache", tmp_path / "cold.pt")
    warm_stats, warm = _child(mode, tmp_path / "cache", tmp_path / "warm.pt")
    if mode == "frozen":
        for stats in (cold_stats, warm_stats):
            assert stats["counts"].get("frozen_graphs") == 1, stats
            assert stats["counts"].get("refolds") == 1, stats
            assert stats["counts"].get("backend_cache_bypassed") == 1, stats
    assert cold_stats["counts"].get("backend_cache_stores") == (2 if mode == "frozen" else 1)
    assert "backend_cache_stores" not in warm_stats["counts"]
    assert warm_stats["counts"].get("backend_cache_hits") == 1
    assert "backend_cache_misses" not in warm_stats["counts"]
    # the stages after capture did not run in the warm process
    assert "aot" not in warm_stats["compile_seconds"]
    assert "codegen" not in warm_stats["compile_seconds"]
    ref = _eager(mode)
    for key in ("outs", "grads", "buffers"):
        for a, b, r in zip(torch.utils._pytree.tree_leaves(cold[key]),
                           torch.utils._pytree.tree_leaves(warm[key]),
                           torch.utils._pytree.tree_leaves(ref[key])):
            assert torch.equal(a, b), key         # the same kernels: the same bits
            torch.testing.assert_close(b, r, rtol=1e-4, atol=1e-4)   # fp32 reduction order
    if mode == "train":
        assert len(warm["grads"]) == 8 and all(g is not None for g in warm["grads"])


# ---- in one process: ember.reset() drops everything but the disk ------------------------------
def _compile_and_run(fn, *args, **kw):
    ember.reset()
    out = ember.compile(fn, **kw)(*args)
    return out, _counts()


def _f(x, y):
    return torch.nn.functional.layer_norm(x @ y, (y.shape[1],)).relu() * 2


def test_hit_after_reset_and_misses_on_what_changes_the_product(cache_dir):
    x, y = torch.randn(8, 16), torch.randn(16, 32)
    ref = _f(x, y)
    out, c = _compile_and_run(_f, x, y)
    assert c.get("backend_cache_stores") == 1 and c.get("backend_cache_misses") == 1
    out, c = _compile_and_run(_f, x, y)
    assert c.get("backend_cache_hits") == 1 and "backend_cache_stores" not in c
    torch.testing.assert_close(out, ref)
    variants = [((x.t().contiguous().t(), y), {}),              # another stride
                ((x.double(), y.double()), {}),                 # another dtype
                ((x[:4], y), {}),                               # another shape
                ((x, y), {"options": {"fusion": False}})]       # another option
    for args, kw in variants:
        out, c = _compile_and_run(_f, *args, **kw)
        assert c.get("backend_cache_misses") == 1 and "backend_cache_hits" not in c, kw
        torch.testing.assert_close(out, _f(*args))
    with torch.no_grad():                                       # another grad mode
        out, c = _compile_and_run(_f, x, y.requires_grad_())
    assert c.get("backend_cache_misses") == 1
    # another graph
    out, c = _compile_and_run(lambda a, b: torch.nn.functional.layer_norm(a @ b, (32,)).relu() * 3,
                              x, y.detach())
    assert c.get("backend_cache_misses") == 1
    torch.testing.assert_close(out, _f(x, y.detach()) * 1.5)


def test_switched_off(cache_dir, monkeypatch):
    x, y = torch.randn(8, 16), torch.randn(16, 32)
    _compile_and_run(_f, x, y)
    _, c = _compile_and_run(_f, x, y, options={"backend_cache": False})
    assert not any(k.startswith("backend_cache") for k in c)
    monkeypatch.setenv("EMBER_BACKEND_CACHE", "0")
    _, c = _compile_and_run(_f, x, y)
    assert not any(k.startswith("backend_cache") for k in c)


def test_corrupt_or_truncated_entry_recompiles(cache_dir):
    x, y = torch.randn(8, 16), torch.randn(16, 32)
    _compile_and_run(_f, x, y)
    (entry,) = (cache_dir / "backend").rglob("*.pkl")
    good = entry.read_bytes()
    for bad in (good[:-7] + b"garbage", good[:40], b"", good[:65] + b"\x80\x05junk"):
        entry.write_bytes(bad)
        with pytest.warns(UserWarning, match="unreadable"):
            out, c = _compile_and_run(_f, x, y)
        assert c.get("backend_cache_misses") == 1 and c.get("backend_cache_stores") == 1
        torch.testing.assert_close(out, _f(x, y))
    # the forward's graph-cache entry gone: the backend entry is a miss, not a crash
    for f in (cache_dir / "graphs").rglob("*.json"):
        f.unlink()
    out, c = _compile_and_run(_f, x, y)
    assert c.get("backend_cache_misses") == 1
    torch.testing.assert_close(out, _f(x, y))


# ---- what is never cached -----------------------------------------------------------------------
def _key(fn, args, options=None):
    gm = fx.symbolic_trace(fn)
    return backend_cache.key_of(gm, list(args), options or {})


@torch.library.custom_op("ember_test_cache::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


def test_what_is_never_cached(cache_dir):
    x = torch.randn(4, 4)
    assert _key(lambda a: a.sin() + 1, [x]) is not None
    assert _key(lambda a: a.sin() + 1, [x]) == _key(lambda a: a.sin() + 1, [x])
    assert _key(lambda a: a.sin() + 2, [x]) != _key(lambda a: a.sin() + 1, [x])
    assert _key(lambda a: torch.nn.functional.dropout(a, 0.5, True), [x]) is None   # random
    assert _key(lambda a: torch.ops.ember_test_cache.twice(a), [x]) is None   # custom op
    assert _key(lambda a: a + 1, [torch.randn(4, 4, dtype=torch.complex64)]) is None
    assert _key(lambda a: a.sin(), [x], {"hook": lambda: 0}) is None   # not a plain option
    m = torch.nn.Linear(4, 4)
    gm = fx.symbolic_trace(m)                  # holds its weight (get_attr)
    assert backend_cache.key_of(gm, [x], {}) is None

    class Fn(torch.autograd.Function):        # user autograd.Function
        @staticmethod
        def forward(ctx, a):
            return a * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3
    from torch._higher_order_ops.flex_attention import flex_attention
    assert not backend_cache._own_code(Fn.apply) and not backend_cache._own_code(flex_attention)
    assert all(backend_cache._own_code(f) for f in (torch.relu, torch.Tensor.view, torch._C._nn.linear,
                                                    torch.nn.functional.gelu, operator.add))


def test_frozen_graph_caches_its_main_graph_not_its_weights(cache_dir):
    """The captured graph of a frozen call is not cached (the weights' values would be folded
    into its product); its main graph, which takes the folded weights as inputs, is: a second
    model with other weights reuses it and computes with its own weights."""
    base = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval().requires_grad_(False)
    x = torch.randn(2, 8)
    with torch.no_grad():
        for scale in (1.0, 2.0):    # other weights, the same key if it were cached
            m = copy.deepcopy(base)
            m[0].weight.mul_(scale)
            out, c = _compile_and_run(m, x)
            assert c.get("frozen_graphs") == 1 and c.get("backend_cache_bypassed") == 1
            if scale == 1:                  # the main graph and freezing's plan
                assert c.get("backend_cache_stores") == 2, c
            else:
                assert c.get("backend_cache_hits") == 1 and "backend_cache_stores" not in c, c
            torch.testing.assert_close(out, m.forward(x))


def test_own_custom_ops_are_cached_user_callables_are_not():
    conv_add = torch.ops.ember.conv2d_add.default       # ember's code only
    assert backend_cache._own_code(conv_add)
    assert backend_cache._own_code(torch.ops.mkldnn._convolution_pointwise.default)
    assert not backend_cache._own_code(torch.ops.ember.tensor_hook.default)   # calls user hooks
    assert not backend_cache._own_code(torch.ops.ember_test_cache.twice.default)
