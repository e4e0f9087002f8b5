"""Column reductions with staged row tiles (cpp_column_reduction.py _row_tiles, design 068): a sum whose one input
is read transposed (contiguous along the output's last dim, strided along the reduced dim) and
whose other inputs run along the reduced dim is vectorized across output columns, the row inputs
copied ROW_TILE rows at a time into a small tile; values against eager at ragged and odd sizes."""
import pytest
import torch

import ember
from tests.unit.lower.helpers import check_grads


def _kernels(tmp_path, pattern="*kernels.cpp"):
    return "\n".join(p.read_text() for p in sorted((tmp_path / "debug").rglob(pattern)))


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def tsum(a, x):
    return (a * x.transpose(1, 2)).sum(-1)


def _compiled(fn):
    return ember.compile(fn, dynamic=False, options={"speed_check": False})


# C columns (16-wide blocks: 40 and 127 leave ragged ones), L rows (35: a ragged last tile;
# 4100: a cascaded float-in-double sum, tiles inside its blocks)
@pytest.mark.parametrize("c,l", [(40, 35), (64, 48), (127, 33), (128, 64), (48, 4100)])
def test_transposed_sum_tiles_row_loads(dirs, c, l):
    a, x = torch.randn(3, c, l), torch.randn(3, l, c)
    got = _compiled(tsum)(a, x)
    torch.testing.assert_close(got, tsum(a, x), atol=1e-4, rtol=1e-5)
    k = _kernels(dirs)
    assert "ember::transpose_tile(" in k, k


def test_transposed_sum_float64_and_grads(dirs):
    a = torch.randn(2, 32, 40, dtype=torch.float64)
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    torch.testing.assert_close(_compiled(tsum)(a, x), tsum(a, x))
    assert "double tile" in _kernels(dirs)
    check_grads(lambda a, x, w: tsum(a, x) * w, torch.randn(2, 32, 40), torch.randn(2, 40, 32),
                torch.randn(32))


def test_noncontiguous_inputs(dirs):
    # a is a transposed view (its "row" load strides too), x a slice with a row stride of 80
    base = torch.randn(2, 50, 32)
    a = base.transpose(1, 2)[..., :48]
    x = torch.randn(2, 48, 80)[..., 8:40]
    torch.testing.assert_close(_compiled(tsum)(a, x), tsum(a, x), atol=1e-4, rtol=1e-5)


def test_two_transposed_inputs_and_epilogue(dirs):
    # two row loads staged in one stage, two transposed loads, a pointwise epilogue
    a, b = torch.randn(2, 33, 40), torch.randn(2, 33, 40)
    x, y = torch.randn(2, 40, 33), torch.randn(2, 40, 33)

    def f(a, b, x, y):
        return ((a * x.transpose(1, 2) + b.exp() * y.transpose(1, 2)).sum(-1)).tanh()
    torch.testing.assert_close(_compiled(f)(a, b, x, y), f(a, b, x, y), atol=1e-4, rtol=1e-5)
    assert _kernels(dirs).count("alignas(64) float tile") == 2


def test_plain_and_padded_rows_stay_row_form(dirs):
    # no transposed load: a plain row sum keeps the row form; a row load under a mask (a pad
    # of the reduced dim) is not staged (its index may be out of bounds): the kernel keeps
    # the row form, where the transposed load (xt, strided along the row) is the one staged
    # (cpp_row_staging.py, design 077) and the masked row load is read in place
    x = torch.randn(4, 64, 96)
    torch.testing.assert_close(_compiled(lambda t: (t * 2).sum(-1))(x), (x * 2).sum(-1))
    assert "tile" not in _kernels(dirs)
    a, xt = torch.randn(2, 32, 40), torch.randn(2, 44, 32)

    def f(a, xt):
        return (torch.nn.functional.pad(a, (2, 2)) * xt.transpose(1, 2)).sum(-1)
    torch.testing.assert_close(_compiled(f)(a, xt), f(a, xt), atol=1e-4, rtol=1e-5)
    k = _kernels(dirs)
    assert "ember::transpose_tile(arg0" not in k and "ember::transpose_tile(arg1" in k, k


def test_dynamic_sizes_values(dirs):
    # symbolic L: a's row stride along C is symbolic, so not staged; values still match
    f = ember.compile(tsum, dynamic=True, options={"speed_check": False})
    for l in (37, 50):
        a, x = torch.randn(2, 32, l), torch.randn(2, l, 32)
        torch.testing.assert_close(f(a, x), tsum(a, x), atol=1e-4, rtol=1e-5)
