"""Triton backend on CPU through Triton's interpreter (TRITON_INTERPRET=1), vs eager.

Kernel level: pointwise (layouts, broadcast, tails), reductions (inner/outer, persistent/looped,
every reduction type), var_mean, softmax, LayerNorm; model level: MLP and a nanoGPT block,
forward and backward, via ember.compile(options={"cpu_codegen": "triton"}). Each test also
checks the graphs really ran as Triton kernels (counts in STATS). Tensors stay small: the
interpreter runs each program in numpy.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import types  # noqa: E402
import warnings  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402
from ember.aot import trace_aten  # noqa: E402
from ember.codegen import triton_kernel as tcg  # noqa: E402
from ember.codegen import triton_launch  # noqa: E402
from ember.decomp import get_decompositions  # noqa: E402
from ember.errors import Unsupported  # noqa: E402
from ember.backends.ember import STATS, compile_aten_graph  # noqa: E402

TRITON = {"cpu_codegen": "triton"}
LOOPED = {"cpu_codegen": "triton", "triton.max_persistent": 8, "triton.rblock": 8}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 0/0 in masked-off lanes
        yield


def compile_fn(fn, *args, options=TRITON):
    gm = trace_aten(fn, args, decompositions=get_decompositions())
    consts = list(gm.meta.get("constants") or [])
    STATS.clear()
    compiled = compile_aten_graph(gm, list(args) + consts, options=dict(options))
    return (lambda *a: compiled(*a, *consts)), compiled


def check(fn, *args, options=TRITON, atol=1e-5, rtol=1e-5, kernels=None, persistent=None,
          looped=None):
    run, compiled = compile_fn(fn, *args, options=options)
    got = run(*args)
    ref = fn(*args)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(got) >= len(refs)
    for g, r in zip(got, refs):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, r.shape, g.dtype, r.dtype)
        if r.dtype in (torch.bfloat16, torch.float16):
            torch.testing.assert_close(g.float(), r.float(), atol=2e-2, rtol=2e-2)
        else:
            torch.testing.assert_close(g, r, atol=atol, rtol=rtol, equal_nan=True)
    stats = compiled.ember_stats
    assert stats["backend"] == "triton"
    if kernels is not None:
        assert stats["kernels"] == kernels, stats
    if persistent is not None:
        assert stats["persistent"] == persistent, stats
    if looped is not None:
        assert stats["looped"] == looped, stats
    return compiled


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# --- pointwise -----------------------------------------------------------------------------

def chain(x, y):
    return torch.sigmoid(x * y + 1.5) - torch.tanh(x) / (y.abs() + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_pointwise_chain_one_kernel(dtype):
    c = check(chain, randn(33, 20, dtype=dtype), randn(33, 20, dtype=dtype, seed=1), kernels=1)
    src = c.ember_triton_source
    assert "xmask = xindex < 660" in src and "tl.arange(0, XBLOCK)" in src


@pytest.mark.parametrize("kind", ["broadcast", "transposed", "sliced", "size1", "scalar"])
def test_pointwise_layouts(kind):
    a, b = randn(33, 20), randn(33, 20, seed=1)
    if kind == "broadcast":
        b = b[:1]
    elif kind == "transposed":
        a = a.t().contiguous().t()
        b = randn(20, 33, seed=1).t()
    elif kind == "sliced":
        a = randn(40, 50)[3:36, 5:45:2]
    elif kind == "size1":
        a, b = randn(1, 20), randn(33, 1, seed=1)
    elif kind == "scalar":
        b = randn((), seed=1)
    check(chain, a, b, kernels=1)


def test_transposed_output_decodes_store_order():
    # eager keeps x.t()'s layout: output (33, 20) with strides (1, 33); xindex's fastest digit
    # must be the store's unit-stride dim so the writes are coalesced
    c = check(lambda v: v.t() * 2, randn(20, 33), kernels=1)
    src = c.ember_triton_source
    assert "v0 = xindex % 33" in src and "tl.store(buf0 + (v0 + (33 * v1))" in src, src


def test_pointwise_tail_and_ops():
    x = randn(1000) * 3   # not a multiple of the block: the tail is masked

    def fn(v):
        return (torch.exp(v) + torch.log(v.abs() + 1) + torch.sqrt(v.abs()) + torch.erf(v)
                + torch.relu(v) + torch.floor(v) + torch.round(v) + torch.sign(v)
                + torch.where(v > 0, v, -v) + torch.clamp(v, -1, 1) + torch.rsqrt(v.abs() + 1)
                + torch.trunc(v) + torch.remainder(v, 1.5) + v ** 3 + torch.maximum(v, -v)
                + torch.expm1(v * 0.1) + torch.log1p(v.abs()) + torch.sin(v) + torch.cos(v))
    check(fn, x, kernels=1, atol=2e-5, rtol=2e-5)


def test_integer_and_bool_ops():
    a = torch.arange(-50, 50, dtype=torch.int64)
    b = torch.full((100,), 7, dtype=torch.int64) - (torch.arange(100) % 3) * 5

    def fn(x, y):
        return (torch.div(x, y, rounding_mode="floor"), torch.remainder(x, y), x * y + 3,
                (x > 0) & (y > 0), torch.div(x, y, rounding_mode="trunc"), x.to(torch.float32) / 3)
    check(fn, a, b)


def test_nan_propagation():
    x = torch.tensor([1.0, float("nan"), -2.0, float("inf")] * 8)
    check(lambda v: (torch.maximum(v, torch.zeros_like(v)), v.isnan(), v.isinf(), v.isfinite()), x)
    check(lambda v: (v.view(4, 8).amax(1), v.view(4, 8).argmax(1)), x)


# --- reductions ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["persistent", "looped"])
@pytest.mark.parametrize("dim", [1, 0], ids=["inner", "outer"])
def test_sum_inner_outer(mode, dim):
    x = randn(24, 37)
    opts = TRITON if mode == "persistent" else LOOPED
    check(lambda v: v.sum(dim), x, options=opts, kernels=1,
          persistent=int(mode == "persistent"), looped=int(mode == "looped"))


def test_column_reduction_hint():
    c = check(lambda v: v.sum(0), randn(100, 24), looped=1, persistent=0, atol=1e-5)
    (ln,) = c.ember_launchers.values()
    assert ln.ks.hint == "outer" and ln.best.RBLOCK <= 8 and ln.best.XBLOCK >= 24
    c = check(lambda v: v.sum(1), randn(24, 100), persistent=1)
    assert next(iter(c.ember_launchers.values())).ks.hint == "inner"


def test_long_row_is_looped_by_default():
    x = randn(3, 2500)   # rows > 1024 → looped reduction with RBLOCK 512
    c = check(lambda v: (v.sum(1), v.amax(1)), x, looped=1, persistent=0, atol=1e-4)
    assert "for roffset in range(0, 2500, RBLOCK):" in c.ember_triton_source


@pytest.mark.parametrize("options", [TRITON, LOOPED], ids=["persistent", "looped"])
def test_reduction_types(options):
    x = randn(12, 30)
    x[3, 7] = 5.0
    x[3, 20] = 5.0      # tie: first index wins
    b = x > 0.5
    check(lambda v, m: (v.amax(1), v.amin(0), v.argmax(1), v.argmin(0), (v * 0.1 + 1).prod(1),
                        m.any(1), v.sum(), v.mean(0, keepdim=True), v.argmax()),
          x, b, options=options)


@pytest.mark.parametrize("options", [TRITON, LOOPED], ids=["persistent", "looped"])
def test_var_mean(options):
    x = randn(10, 40) * 3 + 5
    check(lambda v: torch.var_mean(v, 1), x, options=options, atol=1e-4)
    check(lambda v: torch.var_mean(v, 0, correction=0), x, options=options, atol=1e-4)


@pytest.mark.parametrize("welford", [True, False])
def test_welford_var_mean_and_layer_norm(welford):
    # looped rows: var_mean's sum and sum of squared deviations become one Welford pass
    opts = {**LOOPED, "triton.welford": welford}
    x = randn(6, 50) + 1000.0     # large offset: a naive sum-of-squares would cancel
    c = check(lambda v: torch.var_mean(v, 1, correction=0), x, options=opts, atol=1e-3)
    assert c.ember_stats["welford"] == int(welford)
    assert ("tl.reduce((wmean" in c.ember_triton_source) == welford
    got = c(x)
    ref = torch.var_mean(x.double(), 1, correction=0)
    torch.testing.assert_close(got[0].double(), ref[0], atol=2e-4, rtol=1e-3)
    w, b = randn(50, seed=1), randn(50, seed=2)
    c = check(lambda v, g, h: F.layer_norm(v, (50,), g, h), randn(6, 50) * 3, w, b, options=opts,
              atol=1e-4)
    assert c.ember_stats["welford"] == int(welford)
    c = check(lambda v: torch.var_mean(v, 1), randn(3, 2000), atol=1e-4)  # default: > 1024
    assert c.ember_stats["welford"] == 1 and c.ember_stats["looped"] == 1


def test_reduction_multiple_dims_and_epilogue():
    x = randn(4, 6, 10)
    check(lambda v: (v.sum((0, 2)), torch.relu(v.amax(-1)) * 2 + 1), x)


@pytest.mark.parametrize("options", [TRITON, LOOPED], ids=["persistent", "looped"])
def test_softmax_one_kernel(options):
    x = randn(17, 40)
    check(lambda v: torch.softmax(v, -1), x, options=options, kernels=1)
    check(lambda v: torch.log_softmax(v, 0), x, options=options, atol=1e-5)


def test_persistent_softmax_reuses_the_row():
    c = check(lambda v: torch.softmax(v, -1), randn(17, 40), kernels=1, persistent=1)
    src = c.ember_triton_source
    assert src.count("tl.load(") == 1 and "debug_barrier" not in src, src
    # exp(x - max) stays in registers: its store is dead (no later step reads it)
    assert c.ember_stats["elided_stores"] == 1 and src.count("    tl.store(") == 1, src
    c = check(lambda v: torch.softmax(v, -1), randn(17, 40), options=LOOPED, looped=1)
    assert c.ember_triton_source.count("for roffset") >= 3


EDGE = {
    "scalar_out": (lambda a: a.sum() * 2 + a.mean(), (randn(7, 5),)),
    "zero_d": (lambda a: a * 2 + 1, (randn(()),)),
    "empty": (lambda a: (a * 2, a.sum(1)), (randn(0, 5),)),
    "empty_row": (lambda a: a.sum(1), (randn(5, 0),)),
    "int": (lambda a: (a.sum(1), a.amax(0), a.argmin(1)), (torch.randint(-9, 9, (6, 7)),)),
    "fp16": (lambda a: (a * 2).sum(1), (randn(6, 30, dtype=torch.float16),)),
    "bool": (lambda a: (a > 0, (a > 0).sum(1)), (randn(6, 7),)),
    "outer_long": (lambda a: a.sum(0), (randn(2100, 3),)),
    "extern_conv": (lambda a, w: F.relu(F.conv2d(a, w)), (randn(1, 2, 6, 6), randn(3, 2, 3, 3))),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, (randn(10, 4), torch.tensor([[1, 9], [0, 3]]))),
}


@pytest.mark.parametrize("options", [TRITON, LOOPED], ids=["persistent", "looped"])
@pytest.mark.parametrize("case", list(EDGE))
def test_edge_cases(case, options):
    fn, args = EDGE[case]
    check(fn, *args, options=options)


@pytest.mark.parametrize("options", [TRITON, LOOPED], ids=["persistent", "looped"])
def test_layer_norm_forward(options):
    x, w, b = randn(16, 48), randn(48, seed=1), randn(48, seed=2)
    check(lambda v, g, h: F.gelu(F.layer_norm(v, (48,), g, h)), x, w, b, options=options,
          atol=2e-5)


@pytest.mark.parametrize("options", [TRITON, LOOPED], ids=["persistent", "looped"])
def test_layer_norm_backward(options):
    x = randn(8, 32).requires_grad_()
    w, b = randn(32, seed=1).requires_grad_(), randn(32, seed=2).requires_grad_()
    gy = randn(8, 32, seed=3)

    def fn(v, g, h, dy):
        y = F.layer_norm(v, (32,), g, h)
        return torch.autograd.grad(y, (v, g, h), dy)
    ref = fn(x, w, b, gy)
    f = ember.compile(lambda v, g, h: F.layer_norm(v, (32,), g, h), options=options)
    STATS.clear()
    y = f(x, w, b)
    got = torch.autograd.grad(y, (x, w, b), gy)
    for g_, r in zip(got, ref):
        torch.testing.assert_close(g_, r, atol=1e-5, rtol=1e-5)
    assert len(STATS) == 2 and all(s["backend"] == "triton" for s in STATS), STATS


def test_gather_cat_pad():
    x = randn(6, 10)
    idx = torch.tensor([[0, 3, 9], [1, 1, 2], [5, 4, 3], [0, 0, 0], [9, 8, 7], [2, 2, 2]])
    check(lambda v, i: (torch.gather(v, 1, i), torch.cat([v, v * 2], 1),
                        F.pad(v, (2, 1)), v[:, 2:7].t() * 3), x, idx)


# --- selection, index dtype, autotune ------------------------------------------------------

def test_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    gm = trace_aten(lambda v: v + 1, (randn(4),))
    with pytest.raises(Unsupported, match="TRITON_INTERPRET=1"):
        compile_aten_graph(gm, [randn(4)], options=TRITON)


def test_device_selection():
    gm = types.SimpleNamespace(meta={"device": torch.device("cpu")})
    assert not triton_launch.selected(gm, [randn(2)], {})
    assert triton_launch.selected(gm, [randn(2)], TRITON)
    mixed = types.SimpleNamespace(meta={"device": torch.device("cuda")})
    with pytest.raises(triton_launch.MixedDevices, match="mixes devices"):
        triton_launch.selected(mixed, [randn(2)], {})
    assert triton_launch.selected(mixed, [], {})


def test_index_dtype_selection():
    class B:
        def __init__(self, n):
            self.n = n

        def storage_numel(self):
            return self.n
    small = types.SimpleNamespace(outer=(1000,), stages=[])
    assert tcg.index_dtype(small, {"a": B(1000)}, ["a"]) == "tl.int32"
    assert tcg.index_dtype(small, {"a": B(2 ** 31)}, ["a"]) == "tl.int64"
    big = types.SimpleNamespace(outer=(2 ** 20,), stages=[types.SimpleNamespace(inner=(4096,))])
    assert tcg.index_dtype(big, {"a": B(10)}, ["a"]) == "tl.int64"


def test_int64_indices_in_generated_source():
    # compiled, never run: a 2**31-element reduction needs 64-bit index math
    big = 2 ** 31 + 16
    _, c = compile_fn(lambda v: v.expand(big).sum(), randn(1))
    src = c.ember_triton_source
    assert "tl.program_id(0).to(tl.int64)" in src and "rbase.to(tl.int64)" in src, src
    _, c = compile_fn(lambda v: v.sum(), randn(64))
    assert "int64" not in c.ember_triton_source


def test_heuristic_configs():
    pw = types.SimpleNamespace(kind="pointwise", xnumel=100, rnumel=1, persistent=False)
    cfgs = triton_launch.heuristic_configs(pw)
    assert 2 <= len(cfgs) <= 6 and cfgs[0].XBLOCK == 128
    red = types.SimpleNamespace(kind="reduction", xnumel=64, rnumel=300, persistent=True)
    assert all(c.RBLOCK == 512 for c in triton_launch.heuristic_configs(red))
    loop = types.SimpleNamespace(kind="reduction", xnumel=4, rnumel=5000, persistent=False)
    cfgs = triton_launch.heuristic_configs(loop)
    assert 2 <= len(cfgs) <= 6 and all(c.RBLOCK <= 2048 for c in cfgs)


def test_autotune_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    x = randn(8, 40)
    opts = {**TRITON, "triton.autotune": True}
    c = check(lambda v: torch.softmax(v, -1) * 2, x, options=opts)
    (ln,) = c.ember_launchers.values()
    assert ln.tuned_from_cache is False and ln.best in ln.configs
    assert len(list((tmp_path / "triton" / "autotune").glob("*.json"))) == 1
    c2 = check(lambda v: torch.softmax(v, -1) * 2, x, options=opts)
    (ln2,) = c2.ember_launchers.values()
    assert ln2.tuned_from_cache is True and ln2.best == ln.best


def test_in_place_kernel_autotune_does_not_clobber(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    # (x + 1) dies at the next kernel, which may write into it in place
    check(lambda v: (torch.exp(v + 1).sum(0), torch.exp(v + 1) * 2),
          randn(6, 9), options={**TRITON, "triton.autotune": True})


# --- models --------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(F.gelu(self.fc1(x)))))


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, n_embd=16, n_head=2):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def train_check(make, x, atol=1e-4):
    torch.manual_seed(0)
    ref_m = make()
    m = make()
    m.load_state_dict(ref_m.state_dict())
    ember.compile(m, options=TRITON)
    STATS.clear()
    out = m(x)
    ref = ref_m(x)
    torch.testing.assert_close(out, ref, atol=atol, rtol=atol)
    out.square().mean().backward()
    ref.square().mean().backward()
    for (n, p), (_, q) in zip(m.named_parameters(), ref_m.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=atol, rtol=atol, msg=n)
    assert len(STATS) >= 2 and all(s["backend"] == "triton" for s in STATS), STATS
    assert sum(s["kernels"] for s in STATS) > 0 and not any(s["fallbacks"] for s in STATS), STATS


def test_mlp_train():
    train_check(MLP, randn(8, 16))


def test_cnn_batchnorm_train():
    def make():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 5),
                             nn.LogSoftmax(-1))
    train_check(make, randn(4, 3, 8, 8))


def test_nanogpt_block_train():
    train_check(Block, randn(2, 8, 16), atol=2e-4)


# --- GPU ---------------------------------------------------------------------------------

GPU_SCRIPT = r"""
import sys, torch, ember
sys.path.insert(0, {here!r})
from test_triton_kernels import Block, MLP, randn
from ember.backends.ember import STATS
for make, x in ((MLP, randn(64, 16)), (Block, randn(4, 32, 16))):
    torch.manual_seed(0)
    ref_m, m = make().cuda(), make().cuda()
    m.load_state_dict(ref_m.state_dict())
    ember.compile(m)
    x = x.cuda()
    out, ref = m(x), ref_m(x)
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-3)
    out.square().mean().backward(); ref.square().mean().backward()
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-3)
    assert all(s["backend"] == "triton" and s["device"] == "cuda" for s in STATS), STATS
with torch.no_grad():
    ref_m = Block().cuda().eval()
    m = Block().cuda().eval()
    m.load_state_dict(ref_m.state_dict())
    ember.compile(m, options={{"mode": "reduce-overhead", "triton.autotune": True}})
    for i in range(5):
        x = randn(4, 32, 16, seed=i).cuda()
        torch.testing.assert_close(m(x), ref_m(x), atol=1e-3, rtol=1e-3)
print("GPU OK")
"""


@pytest.mark.gpu
def test_gpu_models_and_reduce_overhead():  # pragma: no cover - needs CUDA
    # a fresh process without TRITON_INTERPRET, so kernels are compiled for the GPU
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", GPU_SCRIPT.format(here=here)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "GPU OK" in r.stdout, r.stdout + r.stderr
