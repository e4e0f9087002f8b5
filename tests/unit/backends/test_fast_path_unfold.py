"""nn.MultiheadAttention / nn.TransformerEncoderLayer inference fast paths written out as their
parts (ember/backends/attention.py, unfold_fast_paths).

Values vs eager (which runs the fast-path op itself) at atol=rtol=1e-4 in float32 (the parts
sum GEMMs, softmax and norms in another order than the op's own kernels: rounding only), 1e-10
in float64. Counts: the fast-path ops no longer run as fallback externs, and in a frozen graph
the parts' linears are MKL-packed."""
import copy

import pytest
import torch
import torch.nn as nn

import ember
from ember.backends import prepack
from ember.backends.ember import STATS

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}
E, H = 64, 4
FAST = ("_native_multi_head_attention", "_transformer_encoder_layer_fwd")


class SelfAttention(nn.Module):
    def __init__(self, cross=False, weights=False):
        super().__init__()
        self.lin = nn.Linear(E, E)
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)
        self.cross, self.weights = cross, weights

    def forward(self, x, mem=None):
        y = self.lin(x)
        kv = mem if self.cross else y
        out, w = self.attn(y, kv, kv, need_weights=False)
        return (out * 2 + y, w) if self.weights else out * 2 + y


def fast_externs():
    return sum(f in name for s in STATS for name in s.get("fallbacks", ()) for f in FAST)


def run(m, *args, dtype=torch.float32, **options):
    """Compile a copy of eval-mode `m` (dtype), call it under no_grad; (compiled, eager, the
    fast-path externs it ran)."""
    m = m.to(dtype).eval()
    ref = copy.deepcopy(m)
    args = [a.to(dtype) for a in args]
    cm = ember.compile(m, options={"speed_check": False, **options})
    STATS.clear()
    with torch.no_grad():
        got, want = cm(*args), ref(*args)
    return got, want, fast_externs()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cross", [False, True])
def test_multihead_attention_fast_path(cross, dtype):
    torch.manual_seed(0)
    x, mem = torch.randn(2, 10, E), torch.randn(2, 7, E)
    got, want, n = run(SelfAttention(cross), x, mem, dtype=dtype)
    torch.testing.assert_close(got, want, **TOL[dtype])
    assert n == 0


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_fast_path(norm_first, activation):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 96, batch_first=True, norm_first=norm_first,
                                       activation=activation)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    got, want, n = run(enc, torch.randn(3, 12, E))
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert n == 0


def test_as_written_weights_read_and_masks_keep_the_op():
    """options attention="as_written" keeps the op; so does a mask. Weights returned with
    need_weights=False are None in the graph too (as in eager), so that op is written out."""
    torch.manual_seed(0)
    x = torch.randn(2, 10, E)
    got, want, n = run(SelfAttention(), x, attention="as_written")
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert n == 1
    (got, w), (want, _), n = run(SelfAttention(weights=True), x)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert w is None and n == 0
    layer = nn.TransformerEncoderLayer(E, H, 96, batch_first=True).eval()
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[1, 7:] = True

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x, src_key_padding_mask=mask)
    got, want, n = run(Masked(), x)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert n == 1


def test_frozen_parts_pack_their_linears(monkeypatch):
    """Frozen (weights without grad), the in- and out-projections and the feed-forward
    linears of an encoder layer are MKL-packed: 4 packed linears per layer."""
    if not torch.backends.mkl.is_available():
        pytest.skip("no MKL")
    monkeypatch.setattr(prepack, "MIN_WEIGHT", 1 << 12)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 96, batch_first=True)
    for p in layer.parameters():
        p.requires_grad_(False)
    before = ember.stats()["counts"].get("prepacked_linears", 0)
    got, want, n = run(layer, torch.randn(2, 10, E), freeze=True)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert n == 0
    assert ember.stats()["counts"].get("prepacked_linears", 0) - before == 4


def test_fast_path_weights_are_none_as_in_eager():
    """need_weights=False: the fast-path op returns (out, None) eagerly; the traced value is None
    too (the meta kernel gives a tensor), so a branch on `w is None` takes eager's side, in one
    graph."""
    attn = nn.MultiheadAttention(E, H, batch_first=True).eval()

    def f(x):
        out, w = attn(x, x, x, need_weights=False)
        return (out + 1 if w is None else out - 1), w is None

    x = torch.randn(2, 7, E)
    ember.reset()
    with torch.no_grad():
        got, want = ember.compile(f)(x), f(x)
    assert got[1] is True and want[1] is True
    torch.testing.assert_close(got[0], want[0], **TOL[torch.float32])
    assert ember.stats()["counts"]["graphs"] == 1
