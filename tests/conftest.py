"""Shared test setup: bugs must not hide behind the eager fallback, so EMBER_STRICT=1."""
import os

import pytest

os.environ.setdefault("EMBER_STRICT", "1")
# the speed check (backends/speed.py) may run a graph eagerly from its second call on, which
# would let a kernel bug hide behind eager PyTorch: tests see the kernels; its own tests turn it on
os.environ.setdefault("EMBER_SPEED_CHECK", "0")
# a warm backend cache (backends/backend_cache.py) would skip the stages a test means to run, and
# a suite run would then depend on the one before it: its own tests turn it on
os.environ.setdefault("EMBER_BACKEND_CACHE", "0")
# Triton reads TRITON_INTERPRET when a @triton.jit function is defined; anything collected before
# tests/unit/triton_backend may import triton (torch.compile does), so on a machine without a GPU the
# interpreter is switched on here, before any test module is imported.
if not os.path.exists("/dev/nvidia0") and not os.environ.get("CUDA_VISIBLE_DEVICES"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_ember():
    import ember
    ember.reset()
    yield
