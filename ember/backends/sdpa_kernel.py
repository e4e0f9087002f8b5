"""Backend "ember": inference attention on ember's own fused CPU kernel (codegen/sdpa_cpp.py).

`use_kernel` rewrites each `F.scaled_dot_product_attention` call of a torch-level CPU graph whose
inputs need no gradient into `torch.ops.ember.sdpa_infer(q, k, v, mask, scale, causal)` where
the shape rule `kernel_wins` says the kernel beats ATen's flash kernel (docs/design/085-small-
attention-kernel.md, benchmarks/sdpa_kernel_ab.py). aot traces the op through its fake kernel
and the kernel backend runs it as an extern. One kernel per head dims, mask and causality (sizes
and strides are its arguments, a short key length is compiled in) serves every layer; its build
starts at the rewrite, in the background, and the op's first call waits for it (disk cache).

Taken: float32 q, k, v of 4 static dims with as many key/value heads as query heads, head dims
multiples of 16 up to 64, a float32 additive or a bool mask (True keeps) of up to 4 dims that
broadcasts to the scores, or `is_causal` (or neither), dropout 0, and only where eager's own sdpa would run its fused
kernel (`eager_fuses`). Everything else stays on sdpa (ATen's flash kernel, as eager).
Off: options={"attention": "as_written"} (or False), as for the other attention rewrites.
"""
from __future__ import annotations

import ctypes
import functools
import math
from typing import Optional

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import Tensor

from ..aot.attention import eager_fuses
from ..codegen import sdpa_cpp
from ..logging import get_logger
from ..lower.rules import RULES
from ..lower.rules_data import extern_functional
from ..runtime import build as rt_build
from .attention import enabled
from .freeze import copy_module

perf_log = get_logger("perf")

#: the shape rule's limits (measured: docs/design/085, benchmarks/sdpa_kernel_ab.py)
MAX_HEAD_DIM = 64
MIN_QUERIES = 48
MAX_KEYS = 2048
#: least B·H·Lq·Lk·D: the op's call costs ~20 us more than flash's (custom-op dispatch, sizes)
MIN_WORK = 1 << 22


def kernel_wins(bh: int, lq: int, lk: int, d: int, dv: int) -> bool:
    """The rule: whether ember's kernel runs attention of these sizes (bh: batch x heads)
    faster than flash."""
    return d % 16 == 0 and dv % 16 == 0 and d <= MAX_HEAD_DIM and dv <= MAX_HEAD_DIM and \
        lq >= MIN_QUERIES and lk <= MAX_KEYS and bh * lq * lk * d >= MIN_WORK


def _sizes(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]):
    """sdpa_fwd's int64 size and stride array (codegen.sdpa_cpp.SIZES)."""
    B, H, LQ, _ = q.shape
    ms = [0, 0, 0, 0]                   # a broadcast dim (missing or of size 1): stride 0
    if mask is not None:
        for i, (n, st) in enumerate(zip(mask.shape, mask.stride()), 4 - mask.dim()):
            ms[i] = st if n != 1 else 0
    vals = (B, H, LQ, k.shape[2], *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *ms)
    return (ctypes.c_int64 * len(vals))(*vals)


def _spec(d: int, dv: int, lk: int, mask: Optional[Tensor], causal: bool) -> sdpa_cpp.SdpaSpec:
    kind = "" if mask is None else "bool" if mask.dtype == torch.bool else "float"
    return sdpa_cpp.SdpaSpec(d, dv, kind, causal, lk if lk <= sdpa_cpp.FIXED_LK else 0)


@functools.lru_cache(None)
def _build(spec: sdpa_cpp.SdpaSpec):
    """The kernel's build, started (the graph's compile goes on meanwhile); a Future."""
    return rt_build.build_async(sdpa_cpp.source(spec), flags=rt_build.FMA_FLAGS)


@functools.lru_cache(None)
def _kernel(spec: sdpa_cpp.SdpaSpec):
    lib = ctypes.CDLL(str(_build(spec).result()))
    fn = lib.sdpa_fwd
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_float]
    fn.restype = None
    return fn, lib


def _inner_dense(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _out(q: Tensor, dv: int) -> Tensor:
    """[B, H, LQ, DV] stored as [B, LQ, H, DV] (flash's layout: transpose(1, 2) is free)."""
    B, H, LQ, _ = q.shape
    return q.new_empty((B, LQ, H, dv)).transpose(1, 2)


@torch.library.custom_op("ember::sdpa_infer", mutates_args=())
def sdpa_infer(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float,
               causal: bool = False) -> Tensor:
    q, k, v = map(_inner_dense, (q, k, v))
    if mask is not None and mask.dim() and mask.size(-1) > 1:    # (a broadcast column: stride 0)
        mask = _inner_dense(mask)
    fn, _ = _kernel(_spec(q.shape[3], v.shape[3], k.shape[2], mask, causal))
    out, sizes = _out(q, v.shape[3]), _sizes(q, k, v, mask)
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), None if mask is None else mask.data_ptr(),
       out.data_ptr(), ctypes.addressof(sizes), scale)
    return out


@sdpa_infer.register_fake
def _(q, k, v, mask, scale, causal=False):
    return _out(q, v.shape[3])


RULES[torch.ops.ember.sdpa_infer.default] = extern_functional     # an extern, not a fallback


def _val(n):
    return n.meta.get("example_value") if isinstance(n, fx.Node) else None


def _static(t) -> bool:
    return all(isinstance(s, int) for s in t.shape)


def _args(n: fx.Node) -> dict | None:
    """sdpa's arguments by name, or None when `n` is not a call this kernel takes."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    if n.op != "call_function" or n.target is not F.scaled_dot_product_attention or \
            len(n.args) > len(names) or set(n.kwargs) - set(names):
        return None
    a = dict(zip(names, n.args)) | dict(n.kwargs)
    q, k, v, m = (_val(a.get(x)) for x in names[:4])
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.dtype == torch.float32 and
               t.device.type in ("cpu", "meta") and not t.requires_grad and _static(t)
               for t in (q, k, v)):
        return None
    if a.get("dropout_p", 0.0) != 0.0 or a.get("is_causal", False) not in (False, True) or \
            a.get("attn_mask") is not None and not (
                isinstance(m, torch.Tensor) and m.dtype in (torch.float32, torch.bool) and
                m.dim() <= 4 and
                not m.requires_grad and _static(m)):
        return None
    (B, H, LQ, D), (LK, DV) = q.shape, (k.shape[2], v.shape[3])
    if k.shape != (B, H, LK, D) or v.shape[:3] != (B, H, LK) or \
            not kernel_wins(B * H, LQ, LK, D, DV) or \
            not isinstance(a.get("scale"), (float, int, type(None))):
        return None
    if m is not None:
        try:
            torch.broadcast_shapes(m.shape, (B, H, LQ, LK))
        except RuntimeError:
            return None
        if len(torch.broadcast_shapes(m.shape, (B, H, LQ, LK))) != 4:
            return None
    if a.get("is_causal") and m is not None or \
            not eager_fuses(q, k, v, m, 0.0, bool(a.get("is_causal")), a.get("scale")):
        return None
    a["scale"] = 1.0 / math.sqrt(D) if a.get("scale") is None else float(a["scale"])
    return a


def use_kernel(gm: fx.GraphModule, example_inputs, options: dict) -> fx.GraphModule:
    """`gm`, or a copy with each sdpa call the kernel takes (module docstring) on it."""
    if not enabled(options) or any(isinstance(x, torch.Tensor) and x.device.type != "cpu"
                                   for x in example_inputs) or \
            not any(_args(n) for n in gm.graph.nodes):
        return gm
    gm = copy_module(gm)
    done = 0
    for n in list(gm.graph.nodes):
        a = _args(n)
        if a is None:
            continue
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(torch.ops.ember.sdpa_infer.default,
                                         (a["query"], a["key"], a["value"], a.get("attn_mask"),
                                          a["scale"], bool(a.get("is_causal"))))
        new.meta = dict(n.meta)
        _build(_spec(_val(a["query"]).shape[3], _val(a["value"]).shape[3], _val(a["key"]).shape[2],
                     _val(a.get("attn_mask")), bool(a.get("is_causal"))))
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
        done += 1
    gm.recompile()
    perf_log.info("attention: %d sdpa call(s) on ember's fused inference kernel", done)
    return gm
