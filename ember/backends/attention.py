"""Backend "ember": attention written out as matmul → scale → mask → softmax → matmul runs as
one `F.scaled_dot_product_attention` call, so aot picks eager's fused CPU flash kernel for it.

Why (docs/design/030-attention-form.md, benchmarks/attention_form.py): on this CPU the flash
kernel beats two batched GEMMs around a fused scale+mask+softmax kernel at every measured shape
(batch 1-8, heads 2-12, sequence 50-1024, head dim 32-128, causal or not, masked or not,
inference and training), and never holds the B·H·Lq·Lk scores in memory. So the rule is: one
attention form, the fused one, wherever eager's own `_fused_sdp_choice` would run it.

The torch-level chain matched (each intermediate used once, an eval-mode dropout aside):

    s = q @ k.transpose(-2, -1)          # matmul / torch.matmul / Tensor.matmul, 4-D, same B, H
    s = s * c  |  s / c                  # optional, c a Python number
    s = s + mask                         # optional, a float mask of q's dtype, 2-4 dims
    p = softmax(s, dim=-1)               # F.softmax / torch.softmax / Tensor.softmax
    p = dropout(p, ..., training=False)  # optional, the identity
    o = p @ v

becomes `o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=c or 1/c or 1)`.
Not rewritten: other devices and dtypes, a softmax in another dtype, a mask that requires grad,
a dropout that draws numbers (ember's RNG stream stays as it is), shapes eager's fused choice
rejects. The values differ from the chain's only by rounding (flash sums in another order).

Off: options={"attention": "as_written"} (or False). Consumes a torch-level fx.GraphModule;
produces it, or a rewritten copy.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..logging import get_logger
from .freeze import copy_module

perf_log = get_logger("perf")

_MATMUL = (operator.matmul, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
_SOFTMAX = (F.softmax, torch.softmax, torch.Tensor.softmax)
_TRANSPOSE = (torch.transpose, torch.Tensor.transpose)
_MUL = (operator.mul, torch.mul, torch.Tensor.mul, torch.Tensor.__mul__)
_DIV = (operator.truediv, torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.__truediv__)
_ADD = (operator.add, torch.add, torch.Tensor.add, torch.Tensor.__add__)
_DROPOUT = (F.dropout, torch.dropout, torch.nn.functional.dropout)


def enabled(options: dict) -> bool:
    return options.get("attention", "auto") not in (False, "as_written")


def _val(n):
    return n.meta.get("example_value") if isinstance(n, fx.Node) else None


def _arg(n: fx.Node, i: int, name: str, default=None):
    return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)


def _calls(n, targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _identity_dropout(n: fx.Node) -> bool:
    """An eval-mode (or p=0) dropout: its output equals its input."""
    if not _calls(n, _DROPOUT) or n.kwargs.get("inplace") or (len(n.args) > 3 and n.args[3]):
        return False
    p, training = _arg(n, 1, "p", 0.5), _arg(n, 2, "training" if n.target is not torch.dropout
                                             else "train", True)
    return training is False or p == 0


def _only_user(n: fx.Node):
    """The one user that consumes n's value (eval dropouts nobody reads do not count), else None."""
    users = [u for u in n.users if not (_identity_dropout(u) and not u.users)]
    return users[0] if len(users) == 1 else None


def _last_two_transposed(kt: fx.Node):
    """k when kt is `k.transpose(-2, -1)` of a 4-D k (any spelling of the two dims), else None."""
    if not _calls(kt, _TRANSPOSE) or len(kt.users) != 1:
        return None
    k, d0, d1 = kt.args[0], _arg(kt, 1, "dim0"), _arg(kt, 2, "dim1")
    v = _val(k)
    if not (isinstance(v, torch.Tensor) and v.dim() == 4 and isinstance(d0, int)
            and isinstance(d1, int)):
        return None
    return k if sorted((d0 % 4, d1 % 4)) == [2, 3] else None


def _scalar_operand(n: fx.Node, ops):
    """(tensor operand, number) of a binary `ops` call with one Python-number operand."""
    if not _calls(n, ops) or len(n.args) != 2 or n.kwargs:
        return None
    a, b = n.args
    if _number(b) and isinstance(a, fx.Node):
        return a, float(b)
    if ops is _MUL and _number(a) and isinstance(b, fx.Node):
        return b, float(a)
    return None


def _match(sm: fx.Node):
    """(q, k, v, mask, scale, output node, chain nodes) for the chain ending in softmax `sm`,
    or None."""
    x = sm.args[0] if sm.args else None
    if _arg(sm, 1, "dim") not in (-1, 3) or sm.kwargs.get("dtype") is not None or \
            not isinstance(x, fx.Node):
        return None
    chain, mask, scale = [sm], None, None
    if _calls(x, _ADD) and len(x.args) == 2 and not x.kwargs:
        a, b = x.args
        s, mask = (a, b) if _calls(a, _MATMUL + _MUL + _DIV) else (b, a)
        if not isinstance(mask, fx.Node):
            return None
        chain.append(x)
        x = s
    for ops, invert in ((_MUL, False), (_DIV, True)):
        hit = _scalar_operand(x, ops) if isinstance(x, fx.Node) else None
        if hit is not None and hit[1] != 0:
            chain.append(x)
            x, scale = hit[0], (1.0 / hit[1] if invert else hit[1])
            break
    if not _calls(x, _MATMUL) or len(x.args) != 2 or x.kwargs or \
            not isinstance(x.args[0], fx.Node):
        return None
    scores = x
    chain.append(scores)
    if any(len(n.users) != 1 for n in chain[1:]):
        return None                  # an intermediate someone else reads too
    q, k = scores.args[0], _last_two_transposed(scores.args[1])
    source, pv = sm, _only_user(sm)
    if pv is not None and _identity_dropout(pv):        # a live eval-mode dropout between
        source, pv = pv, (next(iter(pv.users)) if len(pv.users) == 1 else None)
    if k is None or not _calls(pv, _MATMUL) or len(pv.args) != 2 or pv.kwargs or \
            pv.args[0] is not source or not isinstance(pv.args[1], fx.Node):
        return None
    v = pv.args[1]
    if not _fits(q, k, v, mask, scores, sm):
        return None
    return q, k, v, mask, scale, pv, [pv, *([source] if source is not sm else []), *chain,
                                      scores.args[1]]


def _fits(q, k, v, mask, scores, sm) -> bool:
    """Shapes, dtypes and devices that the fused CPU kernel takes as eager would."""
    tq, tk, tv, ts, tp = map(_val, (q, k, v, scores, sm))
    if not all(isinstance(t, torch.Tensor) for t in (tq, tk, tv, ts, tp)):
        return False
    if any(t.dim() != 4 or t.dtype not in (torch.float32, torch.float64) or t.dtype != tq.dtype
           or t.device.type not in ("cpu", "meta") for t in (tq, tk, tv, ts, tp)):
        return False
    if tq.shape[:2] != tk.shape[:2] or tk.shape[:3] != tv.shape[:3] or tq.shape[3] != tk.shape[3]:
        return False
    tm = _val(mask) if mask is not None else None
    if mask is not None and not (isinstance(tm, torch.Tensor) and 2 <= tm.dim() <= 4 and
                                 tm.dtype == tq.dtype and not tm.requires_grad):
        return False
    if any(isinstance(s, torch.SymInt) for t in (tq, tk, tv) for s in t.shape):
        return False
    return _eager_fuses(tq, tk, tv, tm)


def _eager_fuses(q, k, v, mask) -> bool:
    """Whether eager's sdpa would run these as its fused flash kernel (the question aot's tracer
    asks again when it traces the call), on empty CPU tensors of the same layouts."""
    from torch.nn.attention import SDPBackend

    def real(t):
        if t is None:
            return None
        r = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
        return r.requires_grad_(t.requires_grad)
    return torch._fused_sdp_choice(real(q), real(k), real(v), real(mask), 0.0, False) == \
        int(SDPBackend.FLASH_ATTENTION)


def fuse_attention(gm: fx.GraphModule, options: dict) -> fx.GraphModule:
    """`gm`, or a copy of it with each matched chain rewritten into one sdpa call."""
    if not enabled(options) or not any(_calls(n, _SOFTMAX) and _match(n) for n in gm.graph.nodes):
        return gm
    gm, done = copy_module(gm), 0
    for sm in [n for n in gm.graph.nodes if _calls(n, _SOFTMAX)]:
        m = _match(sm)
        if m is None:
            continue
        q, k, v, mask, scale, pv, replaced = m
        with gm.graph.inserting_before(pv):
            out = gm.graph.call_function(
                F.scaled_dot_product_attention, (q, k, v),
                {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False,
                 "scale": 1.0 if scale is None else scale})
        out.meta = dict(pv.meta)
        pv.replace_all_uses_with(out)
        for n in replaced:          # last user first; dead eval dropouts go with their input
            for u in [u for u in n.users if _identity_dropout(u) and not u.users]:
                gm.graph.erase_node(u)
            gm.graph.erase_node(n)
        done += 1
    gm.recompile()
    perf_log.info("attention: %d matmul-softmax-matmul chain(s) run as one fused sdpa", done)
    return gm
