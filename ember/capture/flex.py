"""Capture: `flex_attention(q, k, v, score_mod=..., block_mask=...)` as one graph node.

Consumes the call's values; produces the node `torch.ops.ember.flex_attention(...)` (ember/backends/
flex.py runs it as a fused CPU kernel) and returns its output (and lse with return_lse=True).

Like Dynamo's flex_attention higher-order op, score_mod(score, b, h, q_idx, kv_idx) and the block
mask's mask_mod(b, h, q_idx, kv_idx) are traced as subgraphs on 0-dim stand-ins (the query dtype
for the score, int32 indices): the mod is traced inline by this interpreter, so globals, closure
cells and attributes it reads get their usual sources and guards, then its nodes are cut out of
the graph into a GraphModule whose extra placeholders are the tensors it read (a bias, sequence
lengths); those become the op's `score_bufs` / `mask_bufs` inputs, so their gradients flow. While
a mod is traced, `t[i]` with 0-dim integer tensor indices is `aten.index.Tensor` (eager evaluates
the mod under vmap, where such an index is a batched tensor, not a Python int).

The block mask's tensors (kv_num_blocks, kv_indices, full_*, q_*) are read from the BlockMask
object, so they are graph inputs with tensor guards; its block size and sequence lengths are
guarded constants. Anything the fused kernel does not cover is a graph break with the reason
(flex_attention then runs eagerly): a non-CPU device or a dtype other than float32/float64, a mod
with side effects or whose ops the kernel cannot translate, return_aux, a block mask whose
sequence lengths differ from the inputs'.
"""
from __future__ import annotations

import math
import sys

import torch

from .attrs import load_attr
from .builtins import real
from .subgraph import trace_subgraph
from .values import ListV, ObjV, TensorV, TupleV, peek

_NAMES = ("query", "key", "value", "score_mod", "block_mask", "scale", "enable_gqa",
          "return_lse", "kernel_options")
_BLOCK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                 "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def _module():
    return sys.modules.get("torch.nn.attention.flex_attention")


def is_flex_attention(f) -> bool:
    m = _module()
    return m is not None and f is getattr(m, "flex_attention", None)


def index_scalar(tr, c: TensorV, k):
    """`c[i]` / `c[i, 0, j]` with 0-dim integer tensors (and ints), inside a mod: the ints as
    selects (right to left, so the other positions hold), then aten.index.Tensor."""
    keys = list(k.items) if isinstance(k, TupleV) else [k]
    is_index = [isinstance(i, TensorV) and i.meta.dim() == 0 and not i.meta.is_floating_point()
                and i.meta.dtype != torch.bool for i in keys]
    is_int = [isinstance(i, ObjV) and type(peek(i)) is int for i in keys]
    if not any(is_index) or not all(a or b for a, b in zip(is_index, is_int)):
        return None
    for d in reversed(range(len(keys))):
        if is_int[d]:
            c = tr.call_graph(torch.select, [c, ObjV(d), keys[d]], {})
    tensors = [i for i, t in zip(keys, is_index) if t]
    return tr.call_graph(torch.ops.aten.index.Tensor, [c, ListV(tensors)], {})


def call_flex(tr, args: list, kwargs: dict):
    from ..backends import flex as kernel
    bound = dict(zip(_NAMES, args))
    bound.update(kwargs)
    if len(args) > len(_NAMES) or set(bound) - set(_NAMES) - {"return_aux"}:
        raise tr.unsupported("flex_attention with unexpected arguments")
    if not (isinstance(bound.get("return_aux"), ObjV) and bound["return_aux"].value is None) \
            and "return_aux" in bound:
        raise tr.unsupported("flex_attention with return_aux", hint="use return_lse=True")
    q, k, v = (bound.get(n) for n in _NAMES[:3])
    if not all(isinstance(t, TensorV) for t in (q, k, v)):
        raise tr.unsupported("flex_attention on non-tensor query/key/value")
    metas = [t.meta for t in (q, k, v)]
    if any(m.dim() != 4 for m in metas) or len({m.dtype for m in metas}) != 1 or \
            metas[0].dtype not in kernel.DTYPES or any(t.device.type != "cpu" for t in (q, k, v)):
        raise tr.unsupported("flex_attention fused only for 4-d float32/float64 CPU tensors",
                             hint="other dtypes and devices run eagerly")
    if any(not isinstance(s, int) for m in metas for s in m.shape):
        raise tr.unsupported("flex_attention with dynamic shapes")
    (B, HQ, LQ, D), (Bk, HKV, LKV, Dk), (Bv, Hv, Lv, DV) = (tuple(m.shape) for m in metas)
    scale = real(tr, bound.get("scale", ObjV(None)))
    gqa = bool(real(tr, bound.get("enable_gqa", ObjV(False))))
    return_lse = bool(real(tr, bound.get("return_lse", ObjV(False))))
    if not (B == Bk == Bv and D == Dk and (HKV, LKV) == (Hv, Lv)) or \
            (HQ != HKV and not (gqa and HQ % HKV == 0)):
        raise tr.unsupported("flex_attention with mismatched query/key/value shapes",
                             hint="the same call fails eagerly")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)

    block_mask, block_size, mask_v = _block_mask(tr, bound.get("block_mask", ObjV(None)), LQ, LKV)
    dtype = metas[0].dtype
    score_gm, score_bufs = _trace_mod(tr, bound.get("score_mod", ObjV(None)), [dtype], dtype)
    mask_gm, mask_bufs = _trace_mod(tr, mask_v, [], torch.bool)
    key = kernel.register_mods(score_gm, mask_gm)
    try:
        kernel.check_mods(key, dtype, [b.meta for b in score_bufs], [b.meta for b in mask_bufs])
    except Exception as e:  # noqa: BLE001 - Unsupported, or a mod aot cannot trace
        raise tr.unsupported(f"flex_attention: {str(e).splitlines()[0]}") from None
    out = tr.call_graph(torch.ops.ember.flex_attention.default,
                        [q, k, v, ListV(block_mask), ListV(score_bufs), ListV(mask_bufs),
                         ObjV(key), ObjV(scale), ObjV(list(block_size))], {})
    return out if return_lse else out.items[0]


def _block_mask(tr, bm_v, LQ, LKV):
    """([8 tensors or None] or [], (q block, kv block), mask_mod value or None)."""
    m = _module()
    if isinstance(bm_v, ObjV) and bm_v.value is None:
        return [], (128, 128), ObjV(None)
    if not (isinstance(bm_v, ObjV) and isinstance(bm_v.value, m.BlockMask)):
        raise tr.unsupported("flex_attention with a block mask made inside the compiled code",
                             hint="create the BlockMask outside and pass it in")
    seq = tuple(real(tr, load_attr(tr, bm_v, "seq_lengths")))
    if seq != (LQ, LKV):
        raise tr.unsupported(f"flex_attention with a block mask for sequence lengths {seq} on "
                             f"inputs of lengths {(LQ, LKV)}")
    size = tuple(real(tr, load_attr(tr, bm_v, "BLOCK_SIZE")))
    if size[0] % 4:        # the kernel's register tile is 4 query rows
        raise tr.unsupported(f"flex_attention with a block mask of query block size {size[0]}",
                             hint="the fused kernel needs a multiple of 4")
    fields = [load_attr(tr, bm_v, n) for n in _BLOCK_FIELDS]
    if not all(isinstance(f, TensorV) or isinstance(f, ObjV) and f.value is None for f in fields) \
            or not isinstance(fields[0], TensorV) or not isinstance(fields[1], TensorV):
        raise tr.unsupported("flex_attention with a malformed block mask")
    mask_v = load_attr(tr, bm_v, "mask_mod")
    if isinstance(mask_v, ObjV) and peek(mask_v) is m.noop_mask:   # peek: no ID guard
        mask_v = ObjV(None)
    return fields, size, mask_v


def _trace_mod(tr, fn_v, lead_dtypes: list, out_dtype):
    """(GraphModule of the mod, [TensorV of each tensor it reads]) or (None, [])."""
    if isinstance(fn_v, ObjV) and peek(fn_v) is None:
        return None, []
    standins = [tr.call_graph(torch.zeros, [ObjV(())], {"dtype": ObjV(dt)})
                for dt in lead_dtypes + [torch.int32] * 4]
    what = "flex_attention's " + ("score_mod" if lead_dtypes else "mask_mod")

    def check_out(out):
        if not isinstance(out, TensorV) or out.meta.dim() != 0 or out.meta.dtype != out_dtype:
            raise tr.unsupported(f"{what} does not return a 0-dim {out_dtype} tensor per "
                                 "element")
        return [out]
    tr.flex_mods = getattr(tr, "flex_mods", 0) + 1
    try:
        return trace_subgraph(tr, fn_v, standins, what, check_out)
    finally:
        tr.flex_mods -= 1
