"""Compile a function through trace_aten + decomps + ember.lower and compare with eager."""
import math
import re

import torch

import ember
from ember.aot import trace_aten
from ember.decomp import get_decompositions
from ember.backends.ember import STATS, compile_aten_graph


def compile_fn(fn, *args, decompose=True):
    gm = trace_aten(fn, args, decompositions=get_decompositions() if decompose else None)
    consts = list(gm.meta.get("constants") or [])
    STATS.clear()
    compiled = compile_aten_graph(gm, list(args) + consts)
    stats = dict(STATS[-1])

    def run(*a):
        return compiled(*a, *consts)
    return run, stats


def check(fn, *args, atol=1e-5, rtol=1e-5, kernels=None, max_kernels=None, decompose=True):
    run, stats = compile_fn(fn, *args, decompose=decompose)
    got = run(*args)
    ref = fn(*args)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(got) >= len(refs)
    for g, r in zip(got, refs):
        assert g.shape == r.shape, (g.shape, r.shape)
        assert g.dtype == r.dtype, (g.dtype, r.dtype)
        if r.dtype == torch.bfloat16 or r.dtype == torch.float16:
            torch.testing.assert_close(g.float(), r.float(), atol=max(atol, 2e-2), rtol=max(rtol, 2e-2))
        else:
            torch.testing.assert_close(g, r, atol=atol, rtol=rtol, equal_nan=True)
    if kernels is not None:
        assert stats["kernels"] == kernels, stats
    if max_kernels is not None:
        assert stats["kernels"] <= max_kernels, stats
    return stats


def check_grads(fn, *args):
    """ember.compile(fn)'s input gradients for a random output gradient equal eager's."""
    leaves = [t.detach().clone().requires_grad_(True) for t in args]
    ref_out = fn(*leaves)
    out = torch.randn_like(ref_out)
    ref = torch.autograd.grad(ref_out, leaves, out)
    got = torch.autograd.grad(ember.compile(fn, options={"speed_check": False})(*leaves), leaves, out)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r)


def evaluations(src: str, call: str) -> int:
    """How many times the generated C++ evaluates `call`: the product of the extents of the
    loops open around each occurrence (`for (int64_t v = 0; v < N; ++v)`), summed."""
    total, stack, pending = 0, [], None
    for line in src.splitlines():
        m = re.search(r"for \(int64_t \w+ = \w+; \w+ < (\d+);", line)
        if m:
            pending = int(m.group(1))
        elif line.strip() == "{":
            stack.append(pending or 1)
            pending = None
        elif line.strip() == "}" and stack:
            stack.pop()
        if call in line:
            total += math.prod(stack)
    return total
