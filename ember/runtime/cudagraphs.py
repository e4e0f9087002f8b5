"""Stage 7, runtime: CUDA graphs for mode="reduce-overhead".

`cudagraphify(fn, example_inputs=None)` wraps a compiled graph callable. The first
`warmup` calls run it normally (on a side stream, so lazy init and autotuning happen outside the
capture); the next call copies its inputs into static buffers, captures one `torch.cuda.CUDAGraph`
and from then on every call copies inputs in, replays and returns clones of the static outputs
(so a later replay cannot overwrite what the caller holds). Graphs with CPU tensors, non-tensor
inputs or inputs whose shape/stride/dtype changes are not captured: `cudagraph_skip_reason`
names why, it is logged once under EMBER_LOGS=perf, and the plain callable runs.

Consumes: callable(*tensors) -> tuple of tensors. Produces: a callable with the same convention.
"""
from __future__ import annotations

import threading

import torch

from ..logging import get_logger

perf_log = get_logger("perf")


def _spec(t):
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


def cudagraph_skip_reason(inputs) -> str | None:
    """Why these inputs cannot be replayed by a CUDA graph (None when they can)."""
    if not torch.cuda.is_available():
        return "CUDA is not available"
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            return f"input {i} is a {type(x).__name__}, not a tensor"
        if x.device.type != "cuda":
            return f"input {i} is on {x.device}"
    return None


class CUDAGraphRunner:
    def __init__(self, fn, warmup: int = 2):
        self.fn, self.warmup = fn, warmup
        self.calls = 0
        self.graph = None
        self.specs = None
        self.static_in: list = []
        self.static_out = None
        self.skip: str | None = None
        self.lock = threading.Lock()
        for attr in ("ember_stats", "ember_wrapper", "ember_triton_source"):
            if hasattr(fn, attr):
                setattr(self, attr, getattr(fn, attr))

    def _give_up(self, reason):
        if self.skip is None:
            perf_log.info("cudagraphs skipped: %s", reason)
        self.skip = reason

    def __call__(self, *args):
        if self.skip is not None:
            return self.fn(*args)
        reason = cudagraph_skip_reason(args)
        if reason is not None:
            self._give_up(reason)
            return self.fn(*args)
        specs = [_spec(a) for a in args]
        if self.specs is None:
            self.specs = specs
        elif specs != self.specs:
            self._give_up("input shapes/strides changed (dynamic shapes)")
            return self.fn(*args)
        with self.lock:
            if self.graph is None:
                if self.calls < self.warmup:
                    self.calls += 1
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        out = self.fn(*args)
                    torch.cuda.current_stream().wait_stream(s)
                    return out
                self._capture(args)
        for dst, src in zip(self.static_in, args):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        self.graph.replay()
        return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in self.static_out)

    def _capture(self, args):
        self.static_in = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype,
                                              device=a.device).copy_(a) for a in args]
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.static_out = self.fn(*self.static_in)
        self.graph = g


def cudagraphify(fn, example_inputs=None, warmup: int = 2):
    """CUDA-graph `fn` when it can be; otherwise return `fn` (reason on `.cudagraph_skip`)."""
    if example_inputs is not None and not isinstance(example_inputs, (list, tuple)):
        example_inputs = getattr(example_inputs, "example_inputs", None)
    if example_inputs is not None:
        reason = cudagraph_skip_reason(example_inputs)
        if reason is not None:
            perf_log.info("cudagraphs skipped: %s", reason)
            try:
                fn.cudagraph_skip = reason
            except AttributeError:  # pragma: no cover
                pass
            return fn
    return CUDAGraphRunner(fn, warmup)
