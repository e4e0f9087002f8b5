"""Programs from PyTorch's Inductor tests (shared/peer-tests, issue #27) that ember got wrong,
end to end through both captures: ember.compile and torch.compile(backend=ember.backend).
Exact dtypes, values against eager, and at least one ember graph compiled."""
import functools

import pytest
import torch
from torch.testing import make_tensor

import ember
from ember.backends.ember import STATS


def _both(fn, *args, atol=0.0, rtol=0.0):
    ref = fn(*args)
    for name in ("ember", "dynamo"):
        ember.reset()
        torch._dynamo.reset()
        STATS.clear()
        compiled = ember.compile(fn) if name == "ember" else torch.compile(
            fn, backend=ember.backend)
        got = compiled(*args)
        assert STATS, f"{name}: no ember graph compiled"
        refs, gots = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
        for g, r in zip(gots, refs):
            assert g.dtype == r.dtype and g.shape == r.shape and g.stride() == r.stride(), name
            torch.testing.assert_close(g, r, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("dtype", (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64))
def test_pow_int(dtype):
    # test_pow_int: eager wraps around in the integer type
    make_arg = functools.partial(make_tensor, dtype=dtype, device="cpu", requires_grad=False)
    torch.manual_seed(0)
    x, y = make_arg(16, 16), make_arg(16, 16, high=torch.iinfo(dtype).max)
    _both(lambda x, y: (torch.pow(x, 0x57), torch.pow(x, y)), x, y)


def test_as_strided_channels_last():
    aten = torch.ops.aten

    def fn(x):
        return (aten.as_strided(x, (8, 384, 2, 20, 12), (153600, 1, 61440, 384, 7680), 0),
                aten.as_strided(x + 1, (8, 384, 2, 20, 12), (153600, 1, 61440, 384, 7680), 0) + 2)
    _both(fn, torch.randn(8, 384, 20, 20).to(memory_format=torch.channels_last))


def test_cat_of_loops_and_extern_kernel():
    # the output layout is part of the result: the test asserts eager's strides
    torch.manual_seed(0)
    conv, pool = torch.nn.Conv2d(64, 5, 1), torch.nn.MaxPool2d(2)

    def fn(x, y):
        return torch.cat([conv(x), pool(y)], 1)
    inputs = (torch.randn([1, 64, 16, 16]).to(memory_format=torch.channels_last),
              torch.randn([1, 64, 32, 32]).to(memory_format=torch.channels_last))
    with torch.no_grad():
        _both(fn, *inputs, atol=1e-5, rtol=1e-5)
    _both(fn, *inputs, atol=1e-5, rtol=1e-5)


def test_dynamo_autocast_region_falls_back_loudly():
    # test_weight_norm_bwd: Dynamo's graph holds _enter_autocast markers and relies on the
    # dispatcher for the casts; ember traced on meta tensors without them (fp16 x fp32 addmm
    # at run time, or an fp32 result where eager computes fp16). Now a loud fallback.
    x, w = torch.randn(4, 8), torch.randn(8, 3)

    def fn(x, w):
        with torch.amp.autocast(device_type="cpu", dtype=torch.bfloat16):
            return x @ w
    ref = fn(x, w)
    torch._dynamo.reset()
    # EMBER_STRICT=1 in tests: the fallback's reason is raised
    with pytest.raises(Exception, match="autocast region in a graph from another capture"):
        torch.compile(fn, backend=ember.backend)(x, w)
    ember.reset()
    STATS.clear()
    got = ember.compile(fn)(x, w)          # ember's capture writes the casts: compiled
    assert STATS and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), atol=1e-2, rtol=1e-2)
