"""Backend "ember": inference attention on ember's own fused CPU kernel (codegen/sdpa_cpp.py).

`use_kernel` rewrites each `F.scaled_dot_product_attention` call of a torch-level CPU graph whose
inputs need no gradient into `torch.ops.ember.sdpa_infer(q, k, v, mask, scale)` where the shape
rule `kernel_wins` says the kernel beats ATen's flash kernel (docs/design/085-small-attention-
kernel.md, benchmarks/sdpa_kernel_ab.py). aot traces the op through its fake kernel and the
kernel backend runs it as an extern; at its first call per shape and strides the op builds the
kernel (runtime disk cache).

Taken: float32 q, k, v of 4 static dims with as many key/value heads as query heads, head dims
multiples of 16 up to 64, a float32 additive mask of up to 4 dims that broadcasts to the scores
or `is_causal` (or neither), dropout 0, and only where eager's own sdpa would run its fused
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
from .flex import _FLAGS
from .freeze import copy_module

perf_log = get_logger("perf")

#: the shape rule's limits (measured, module docstring)
MAX_HEAD_DIM = 64
MIN_QUERIES = 48
MAX_KEYS = 3072


def kernel_wins(lq: int, lk: int, d: int, dv: int) -> bool:
    """The rule: whether ember's kernel runs attention of these sizes faster than flash."""
    return d % 16 == 0 and dv % 16 == 0 and d <= MAX_HEAD_DIM and dv <= MAX_HEAD_DIM and \
        lq >= MIN_QUERIES and lk <= MAX_KEYS


def _spec(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float, causal: bool):
    B, H, LQ, D = q.shape
    m_strides = None
    if mask is not None:
        m4 = mask.reshape([1] * (4 - mask.dim()) + list(mask.shape))
        m_strides = tuple(m4.expand(B, H, LQ, k.shape[2]).stride())
    return sdpa_cpp.SdpaSpec(B, H, LQ, k.shape[2], D, v.shape[3], float(scale),
                             tuple(q.stride()[:3]), tuple(k.stride()[:3]), tuple(v.stride()[:3]),
                             m_strides, causal)


@functools.lru_cache(None)
def _kernel(spec: sdpa_cpp.SdpaSpec):
    lib = ctypes.CDLL(str(rt_build.build(sdpa_cpp.source(spec), flags=_FLAGS)))
    fn = lib.sdpa_fwd
    fn.argtypes = [ctypes.c_void_p] * 5
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
    fn, _ = _kernel(_spec(q, k, v, mask, scale, causal))
    out = _out(q, v.shape[3])
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), None if mask is None else mask.data_ptr(),
       out.data_ptr())
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
                isinstance(m, torch.Tensor) and m.dtype == torch.float32 and m.dim() <= 4 and
                not m.requires_grad and _static(m)):
        return None
    (B, H, LQ, D), (LK, DV) = q.shape, (k.shape[2], v.shape[3])
    if k.shape != (B, H, LK, D) or v.shape[:3] != (B, H, LK) or \
            not kernel_wins(LQ, LK, D, DV) or not isinstance(a.get("scale"), (float, int, type(None))):
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
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
        done += 1
    gm.recompile()
    perf_log.info("attention: %d sdpa call(s) on ember's fused inference kernel", done)
    return gm
