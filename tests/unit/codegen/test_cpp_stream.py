"""Streamed outputs (cpp.STREAM_MIN, cpp_prelude.STAGED store_stream, design 093): a float32
graph output of at least STREAM_MIN bytes that no node reads is stored with non-temporal stores
a chunk at a time; the chunk copy is exact at every alignment and length, and compiled kernels
that stream give eager's values (rows not a multiple of 16 lanes, several threads, training)."""
import ctypes
import subprocess

import pytest
import torch

from ember.codegen import cpp
from ember.codegen.cpp_prelude import PRELUDE, STAGED
from ember.runtime.build import FLAGS, LIBS

SRC = PRELUDE + STAGED + """
extern "C" void st_stream(const float* a, float* out, int64_t n) {
    ember::store_stream(a, out, n);
    ember::stream_fence();
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    (d / "k.cpp").write_text(SRC)
    subprocess.run(["g++", *FLAGS, str(d / "k.cpp"), "-o", str(d / "k.so"), *LIBS], check=True,
                   capture_output=True, text=True)
    return ctypes.CDLL(str(d / "k.so"))


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 47, 255, 256])
def test_store_stream_copies_exactly_at_every_alignment(lib, n):
    """Every float offset of a line (the aligned middle streamed, head and tail plain): the n
    values land bit for bit (nan payloads, -0.0, denormals) and nothing around them moves."""
    src = torch.randint(-2**31, 2**31, (n,), dtype=torch.int64).to(torch.int32).view(torch.float32)
    for off in range(16):
        out = torch.full((n + 48,), -7.0)
        lib.st_stream(ctypes.c_void_p(src.data_ptr()), ctypes.c_void_p(out[off:].data_ptr()),
                      ctypes.c_int64(n))
        assert torch.equal(out[off:off + n].view(torch.int32), src.view(torch.int32))
        assert (out[:off] == -7.0).all() and (out[off + n:] == -7.0).all()


def _sources(tmp_path):
    return "".join(p.read_text() for p in (tmp_path / "dump").rglob("*kernels.cpp"))


def _compiled(tmp_path, monkeypatch, fn):
    import ember
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))     # compiled, not loaded
    return ember.compile(fn, options={"speed_check": False})


@pytest.mark.parametrize("threads", [1, 2])
def test_a_big_output_is_streamed_and_exact(tmp_path, monkeypatch, threads):
    """[3001, 1051] floats (12.6 MB, rows of 1051: chunks start at every alignment) of
    x * 1.5 + b: streamed, and bit-equal to eager (one rounding per op either way)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        def f(x, b):
            return x * 1.5 + b
        x, b = torch.randn(3001, 1051), torch.randn(1051)
        assert x.numel() * 4 >= cpp.STREAM_MIN
        got = _compiled(tmp_path, monkeypatch, f)(x, b)
        assert torch.equal(got, f(x, b))
    finally:
        torch.set_num_threads(old)
    src = _sources(tmp_path)
    assert "ember::store_stream(" in src and "ember::stream_fence();" in src, src


def test_outputs_read_in_the_graph_or_small_are_not_streamed(tmp_path, monkeypatch):
    """A big output a later kernel reads (relu's, read by the scan kept alone) and a small
    output (the slice's) store in the cache (the scan's own output, written by its own loops,
    is not looked at)."""
    def f(x):
        y = torch.relu(x)
        return y, y.cumsum(1), x[:64] * 2.0
    x = torch.randn(4096, 1024)
    got, want = _compiled(tmp_path, monkeypatch, f)(x), f(x)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    src = _sources(tmp_path)
    body = {k: src[src.index(f'void {k}('):].split("\n}\n")[0] for k in ("kernel0", "kernel2")}
    assert "buf0 = kernel0(arg0)" in "".join(p.read_text() for p in (tmp_path / "dump").rglob(
        "*schedule.py")), "relu's kernel changed: the test no longer checks a read output"
    assert not any("ember::store_stream(" in b for b in body.values()), body


def test_batchnorm_training_streams_and_matches_eager(tmp_path, monkeypatch):
    """BatchNorm1d training on [4096, 768]: the forward's output and the backward's input
    gradient are streamed; output, running stats and gradients match eager."""
    torch.manual_seed(0)
    m = torch.nn.BatchNorm1d(768)
    import copy
    ref = copy.deepcopy(m)
    c = _compiled(tmp_path, monkeypatch, m)
    x = torch.randn(4096, 768) * 3 + 1
    g = torch.randn(4096, 768)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    outs = [c(xs[0]), ref(xs[1])]
    for o in outs:
        o.backward(g)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-4, atol=1e-4)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    torch.testing.assert_close(m.running_var, ref.running_var)
    assert _sources(tmp_path).count("ember::store_stream(") == 2
