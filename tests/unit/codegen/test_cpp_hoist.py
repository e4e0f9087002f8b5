"""C++ codegen: loads the simd loop does not move are hoisted before it (#23)."""
import re
import subprocess

import torch

from ember.loopir.nodes import ComputedBuffer, InputBuffer, Pointwise, Reduction
from ember.loopir.ops import ops
from ember.runtime.build import CXX, FLAGS

from .test_cpp import _compile


def _scaled_softmax(h, n, d):
    """Swin v2's attention softmax: softmax(x * exp(min(scale[h], log 100)) + bias) over the
    last dim of x [h, n, d]; scale [h] is read at an index the row loop does not move."""
    x = InputBuffer("arg0", torch.float32, (h, n, d), (n * d, d, 1), position=0)
    s = InputBuffer("arg1", torch.float32, (h,), (1,), position=1)
    b = InputBuffer("arg2", torch.float32, (n, d), (d, 1), position=2)
    xl, sl, bl = x.loader(), s.loader(), b.loader()

    def logit(i, r):
        scale = ops.exp(ops.minimum(sl([i[0]]), ops.constant(4.605170185988092, torch.float32)))
        return ops.add(ops.mul(xl([i[0], i[1], r]), scale), bl([i[1], r]))
    mx = ComputedBuffer("buf0", torch.float32, (h, n, 1), (n, 1, 1), body=Reduction(
        (h, n, 1), (d,), "max", torch.float32, torch.float32, lambda i, r: logit(i, r[0])))
    sm = ComputedBuffer("buf1", torch.float32, (h, n, 1), (n, 1, 1), body=Reduction(
        (h, n, 1), (d,), "sum", torch.float32, torch.float32,
        lambda i, r: ops.exp(ops.sub(logit(i, r[0]), mx.loader()([i[0], i[1], 0])))))
    out = ComputedBuffer("buf2", torch.float32, (h, n, d), (n * d, d, 1), body=Pointwise(
        (h, n, d), torch.float32, lambda i: ops.truediv(
            ops.exp(ops.sub(logit(i[:2], i[2]), mx.loader()([i[0], i[1], 0]))),
            sm.loader()([i[0], i[1], 0]))))
    return [mx, sm, out], [x, s, b]


def test_invariant_load_hoisted_and_loops_vectorize(tmp_path, monkeypatch):
    """The per-head scale load and its min/exp sit before each simd loop, not in it (in it,
    g++ reloaded the load in the loop latch and did not vectorize the storing loop: "control
    flow in loop"); every simd loop of the kernel vectorizes (g++'s own report); values match
    eager, with NaN and +-inf in the scale and in x."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    h, n, d = 3, 5, 67                  # odd row: SIMD tails
    nodes, inputs = _scaled_softmax(h, n, d)
    steps, src, fns, sigs = _compile(nodes, inputs)
    assert len(steps) == 1
    kernel = src[src.index('extern "C"'):]
    loops = kernel.split("#pragma omp simd")[1:]
    assert len(loops) >= 2, kernel
    for body in loops:
        assert "arg1[" not in body.split("}")[0] and "ember::minimum" not in body.split("}")[0], kernel
    assert kernel.count("arg1[v0]") >= 2, kernel            # loaded before each row loop
    t = torch.randn(h, n, d)
    t[0, 1, 3] = float("nan")
    t[1, 2, :4] = float("inf")
    scale = torch.tensor([0.3, float("inf"), float("nan")])
    bias = torch.randn(n, d)
    res = torch.empty(h, n, d)
    args = {"arg0": t, "arg1": scale, "arg2": bias, "buf2": res}
    fns[steps[0].name](*[args[a].data_ptr() for a in sigs[steps[0].name]])
    exp = torch.softmax(t * scale.clamp(max=4.605170185988092).exp().view(h, 1, 1) + bias, -1)
    torch.testing.assert_close(res, exp, equal_nan=True)
    cpp = tmp_path / "k.cpp"
    cpp.write_text(src)
    report = subprocess.run([CXX, *FLAGS, "-fopt-info-vec-optimized", str(cpp), "-o",
                             str(tmp_path / "k.so")], capture_output=True, text=True).stderr
    done = {int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", report)}
    lines = src.split("\n")
    pragmas = [i + 1 for i, line in enumerate(lines) if "#pragma omp simd" in line]
    for p in pragmas:           # g++ reports a loop at a statement of its body
        end = next((q for q in pragmas if q > p), len(lines))
        assert any(p < ln < end for ln in done), (p, report)

