"""Generated kernels that g++ 12 must vectorize: compiled again with -fopt-info-vec-missed, no
kernel loop may be left out for want of a vector type. A bool mask read through a `bool*` next
to float lanes was ("no vectype"): masked_fill(mask, -inf) + softmax ran scalar, 0.5x eager."""
import subprocess

import torch

import ember
from ember.runtime.build import CXX, FLAGS


def test_bool_mask_with_float_math_vectorizes(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.randn(2, 3, 64, 64)
    mask = torch.ones(64, 64, dtype=torch.bool).triu(1)
    mask[5, :] = True                                   # a fully masked row: NaN like eager

    def f(t, m):
        return torch.softmax((t * 0.125).masked_fill(m, float("-inf")), -1), m.logical_not()
    got = ember.compile(f, options={"speed_check": False})(x, mask)
    for g, r in zip(got, f(x, mask)):
        torch.testing.assert_close(g, r, equal_nan=True)
    (src,) = list((tmp_path / "debug").rglob("05_kernels.cpp"))
    text = src.read_text()
    first = text[:text.index('extern "C" void kernel')].count("\n") + 1
    out = subprocess.run([CXX, *FLAGS, "-fopt-info-vec-missed", str(src), "-o",
                          str(tmp_path / "k.so")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    missed = [line for line in out.stderr.splitlines() if "no vectype" in line
              and int(line.split(":")[1]) >= first]
    assert not missed, "\n".join(missed) + "\n" + text[text.index('extern "C" void kernel'):]
