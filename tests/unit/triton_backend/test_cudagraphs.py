"""ember.runtime.cudagraphs: the CPU-side fallbacks (always) and capture/replay (GPU only)."""
import pytest
import torch

from ember.runtime.cudagraphs import CUDAGraphRunner, cudagraph_skip_reason, cudagraphify


def fn(x, y):
    return (x * y + 1,)


def test_cpu_inputs_are_not_captured():
    x, y = torch.randn(4), torch.randn(4)
    out = cudagraphify(fn, [x, y])
    assert out is fn and out.__name__ == "fn"
    assert fn.cudagraph_skip in ("CUDA is not available", "input 0 is on cpu")
    r = CUDAGraphRunner(fn)
    torch.testing.assert_close(r(x, y)[0], x * y + 1)
    assert r.skip is not None and r.graph is None
    torch.testing.assert_close(r(x, y)[0], x * y + 1)


def test_skip_reasons():
    if torch.cuda.is_available():  # pragma: no cover
        assert "not a tensor" in cudagraph_skip_reason([3])
        assert "cpu" in cudagraph_skip_reason([torch.randn(2)])
    else:
        assert cudagraph_skip_reason([torch.randn(2)]) == "CUDA is not available"


@pytest.mark.gpu
def test_capture_replay_and_dynamic_fallback():  # pragma: no cover - needs CUDA
    x, y = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    r = CUDAGraphRunner(fn, warmup=2)
    outs = [r(x, y)[0] for _ in range(4)]
    assert r.graph is not None
    for o in outs:
        torch.testing.assert_close(o, x * y + 1)
    x2 = torch.randn(64, device="cuda")
    first = r(x2, y)[0]
    second = r(x, y)[0]            # replay must not overwrite what the caller holds
    torch.testing.assert_close(first, x2 * y + 1)
    torch.testing.assert_close(second, x * y + 1)
    big = torch.randn(128, device="cuda")
    torch.testing.assert_close(r(big, big)[0], big * big + 1)
    assert r.skip == "input shapes/strides changed (dynamic shapes)"
