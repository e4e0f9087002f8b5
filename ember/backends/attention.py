"""Backend "ember": attention written out as matmul → scale → mask → softmax → matmul runs as
one `F.scaled_dot_product_attention` call, so aot picks eager's fused CPU flash kernel for it.

Why (docs/design/031-attention-form.md, benchmarks/attention_form.py): at inference the flash
kernel beats two batched GEMMs around a fused scale+mask+softmax kernel at every measured shape
(0.5-0.9x for the chain; batch 1-8, heads 2-12, sequence 50-1024, head dim 32-128) and never
holds the B·H·Lq·Lk scores. In training, where autograd saves the chain's probabilities and the
fused backward recomputes the scores, the chain as written measured 1.0-1.3x of flash up to 197
keys with 8-12 heads and 0.7-1.0x at 512: `fused_wins` keeps it up to TRAIN_UNFUSED_MAX_KV keys.
Wherever the rule says fused, the rewrite needs eager's own `_fused_sdp_choice` to agree.

The torch-level chain matched (each intermediate used once, an eval-mode dropout aside):

    s = q @ kt                # matmul / torch.matmul / Tensor.matmul; 4-D, kt = k.transpose(-2,
                              # -1) or any [B, H, D, Lk] tensor (LeViT's permuted k)
    s = s * c  |  s / c       # optional, c a Python number
    s = s + mask              # optional (either order), a float mask of q's dtype, 2-4 dims
    p = softmax(s, dim=-1)    # F.softmax / torch.softmax / Tensor.softmax
    p = dropout(p, ...)       # optional, when it is the identity (eval mode or p=0)
    o = p @ v

becomes `o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=c or 1/c or 1)`.
Not rewritten: other devices and dtypes, a softmax in another dtype, a mask that requires grad,
a dropout that draws numbers (ember's RNG stream stays as it is), shapes eager's fused choice
rejects. The values differ from the chain's only by rounding (flash sums in another order); a query
row masked wholly with -inf, where flash gives 0, is set back to the chain's NaN.

At inference, sdpa calls of the shapes ember's own kernel wins go on to it (sdpa_kernel.py).
Off: options={"attention": "as_written"} (or False). Consumes a torch-level fx.GraphModule;
produces it, or a rewritten copy.
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..aot.attention import eager_fuses
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


#: a training graph keeps an explicit chain as written up to this many keys (module docstring)
TRAIN_UNFUSED_MAX_KV = 256
#: most B·H·Lq·Lk probabilities such a chain may save for its backward (64 MiB fp32)
MAX_SAVED_SCORES = 1 << 24


def fused_wins(query, key, training: bool) -> bool:
    """The rule: whether attention on these shapes should run fused. Shapes and mode only."""
    if not training:
        return True
    lk, scores = key.shape[-2], key.shape[-2] * query.shape[:-1].numel()
    return lk > TRAIN_UNFUSED_MAX_KV or scores > MAX_SAVED_SCORES


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


def _transposed_input(kt: fx.Node):
    """k when kt is `k.transpose(-2, -1)` (any spelling of the last two of 4 dims), else None."""
    if not _calls(kt, _TRANSPOSE) or len(kt.users) != 1 or not isinstance(kt.args[0], fx.Node):
        return None
    d0, d1 = _arg(kt, 1, "dim0"), _arg(kt, 2, "dim1")
    if not (isinstance(d0, int) and isinstance(d1, int)):
        return None
    return kt.args[0] if sorted((d0 % 4, d1 % 4)) == [2, 3] else None


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


@dataclasses.dataclass
class Chain:
    q: fx.Node
    kt: fx.Node                 # the right operand of q @ kt: [B, H, D, Lk]
    v: fx.Node
    mask: fx.Node | None
    scale: float | None
    out: fx.Node                # p @ v
    nodes: list                 # what the sdpa call replaces, last user first


def _match(sm: fx.Node) -> Chain | None:
    """The chain ending in softmax `sm` (module docstring), or None."""
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
            not all(isinstance(a, fx.Node) for a in x.args):
        return None
    scores = x
    chain.append(scores)
    if any(len(n.users) != 1 for n in chain[1:]) or mask in chain:
        return None                  # an intermediate someone else reads too
    source, pv = sm, _only_user(sm)
    if pv is not None and _identity_dropout(pv):        # a live eval-mode dropout between
        source, pv = pv, (next(iter(pv.users)) if len(pv.users) == 1 else None)
    if not _calls(pv, _MATMUL) or len(pv.args) != 2 or pv.kwargs or \
            pv.args[0] is not source or not isinstance(pv.args[1], fx.Node):
        return None
    found = Chain(scores.args[0], scores.args[1], pv.args[1], mask, scale, pv,
                  [pv, *([source] if source is not sm else []), *chain])
    return found if _fits(found, scores, sm) else None


def _fits(c: Chain, scores, sm) -> bool:
    """Shapes, dtypes and devices that the fused CPU kernel takes as eager would."""
    tq, tkt, tv, ts, tp = map(_val, (c.q, c.kt, c.v, scores, sm))
    if not all(isinstance(t, torch.Tensor) for t in (tq, tkt, tv, ts, tp)):
        return False
    if any(t.dim() != 4 or t.dtype not in (torch.float32, torch.float64) or t.dtype != tq.dtype
           or t.device.type not in ("cpu", "meta") for t in (tkt, tv, ts, tp)) or tq.dim() != 4 or tq.device.type not in ("cpu", "meta"):
        return False
    tk = tkt.transpose(-2, -1)
    if tp.shape != ts.shape or _val(c.out) is None or \
            tuple(_val(c.out).shape) != (*tq.shape[:3], tv.shape[3]):
        return False                # a mask that broadcasts the scores to a larger shape
    if tq.shape[:2] != tk.shape[:2] or tk.shape[:3] != tv.shape[:3] or tq.shape[3] != tk.shape[3]:
        return False
    if any(isinstance(s, torch.SymInt) for t in (tq, tk, tv) for s in t.shape):
        return False
    tm = _val(c.mask) if c.mask is not None else None
    if c.mask is not None:
        if not (isinstance(tm, torch.Tensor) and 2 <= tm.dim() <= 4 and tm.dtype == tq.dtype
                and not tm.requires_grad and not any(isinstance(s, torch.SymInt) for s in tm.shape)):
            return False
        tm = tm.reshape([1] * (4 - tm.dim()) + list(tm.shape))
    return fused_wins(tq, tk, training=ts.requires_grad) and eager_fuses(tq, tk, tv, tm)


def _node(g: fx.Graph, target, args, value):
    n = g.call_function(target, args)
    n.meta["example_value"] = value
    return n


def fuse_attention(gm: fx.GraphModule, example_inputs, options: dict) -> fx.GraphModule:
    """`gm`, or a copy of it with each matched chain rewritten into one sdpa call (CPU graphs:
    the rule was measured there, and example values are meta tensors without the device)."""
    if not enabled(options) or any(isinstance(x, torch.Tensor) and x.device.type != "cpu"
                                   for x in example_inputs) or \
            not any(_calls(n, _SOFTMAX) and _match(n) for n in gm.graph.nodes):
        return gm
    gm, done, g = copy_module(gm), 0, None
    g = gm.graph
    for sm in [n for n in g.nodes if _calls(n, _SOFTMAX)]:
        c = _match(sm)
        if c is None:
            continue
        with g.inserting_before(c.out):
            k = _transposed_input(c.kt)
            if k is None:           # q @ kt with kt made otherwise (a permute): its transpose
                k = _node(g, torch.transpose, (c.kt, -2, -1), _val(c.kt).transpose(-2, -1))
            else:
                c.nodes.append(c.kt)
            mask = c.mask
            if mask is not None and _val(mask).dim() < 4:   # [H, L, S] → [1, H, L, S]
                tm = _val(mask)
                shape = [1] * (4 - tm.dim()) + list(tm.shape)
                mask = _node(g, torch.reshape, (mask, shape), tm.reshape(shape))
            out = g.call_function(
                F.scaled_dot_product_attention, (c.q, k, c.v),
                {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False,
                 "scale": 1.0 if c.scale is None else c.scale})
        out.meta = dict(c.out.meta)
        result = out
        if mask is not None:        # a row masked wholly with -inf: NaN as the chain's softmax
            with g.inserting_before(c.out):     # (the fused kernel gives 0 there)
                tm = _val(mask)
                neg = _node(g, torch.isneginf, (mask,), torch.isneginf(tm))
                dead = _node(g, torch.Tensor.all, (neg, -1, True), torch.isneginf(tm).all(-1, True))
                result = _node(g, torch.where, (dead, float("nan"), out),
                               torch.where(dead.meta["example_value"], float("nan"),
                                           _val(c.out)))
        c.out.replace_all_uses_with(result)
        for n in c.nodes:           # last user first; dead eval dropouts go with their input
            for u in [u for u in n.users if _identity_dropout(u) and not u.users]:
                g.erase_node(u)
            g.erase_node(n)
        done += 1
    gm.recompile()
    perf_log.info("attention: %d matmul-softmax-matmul chain(s) run as one fused sdpa", done)
    return gm


# ---- nn.MultiheadAttention / nn.TransformerEncoderLayer inference fast paths -------------------
# In eval mode with grad off, both modules call one opaque aten op (torch's "fast path"):
# `_native_multi_head_attention` (in-projection, attention, out-projection) and
# `_transformer_encoder_layer_fwd` (a whole encoder layer). As graph nodes they ran as one
# fallback extern each: no weight packing for their linears, no fusion around them. Written out
# as their parts (the math of torch's own slow path, which the op implements), the linears are
# ordinary `F.linear` nodes that freezing packs, the attention one fused sdpa, and the norms,
# activations and residual adds ember kernels. Masks, attention weights (need_weights=True) and
# other devices keep the op.
_NATIVE_MHA = torch._native_multi_head_attention
_NATIVE_LAYER = torch._transformer_encoder_layer_fwd


class _Emit:
    """Adds call_function nodes before `at`, each with its example value computed from its
    arguments' example values (meta tensors)."""

    def __init__(self, g: fx.Graph, at: fx.Node):
        self.g, self.at = g, at

    def __call__(self, target, *args):
        with self.g.inserting_before(self.at):
            return _node(self.g, target, args, target(*fx.node.map_arg(args, _val)))


def _mha_parts(e: _Emit, q, k, v, embed, heads, w_in, b_in, w_out, b_out):
    """The output node of multi-head self/cross attention with packed in-projection `w_in`
    [3E, E] (as nn.MultiheadAttention's fast path computes it, without mask or weights)."""
    (b, lq, _), lk, d = _val(q).shape, _val(k).shape[1], embed // heads

    def split_heads(x, length):         # [B, L, E] -> [B, H, L, D]
        return e(torch.transpose, e(torch.reshape, x, (b, length, heads, d)), 1, 2)
    if q is k and k is v:
        qkv = e(F.linear, q, w_in, b_in)                        # [B, L, 3E]
        qkv = e(torch.permute, e(torch.reshape, qkv, (b, lq, 3, heads, d)), (2, 0, 3, 1, 4))
        qh, kh, vh = (e(operator.getitem, qkv, i) for i in range(3))
    else:
        ws = [e(operator.getitem, w_in, slice(i * embed, (i + 1) * embed)) for i in range(3)]
        bs = [e(operator.getitem, b_in, slice(i * embed, (i + 1) * embed)) for i in range(3)]
        qh, kh, vh = (split_heads(e(F.linear, x, w, bias), n) for x, w, bias, n in
                      zip((q, k, v), ws, bs, (lq, lk, lk)))
    o = e(F.scaled_dot_product_attention, qh, kh, vh)          # scale 1/sqrt(D), as the op's
    o = e(torch.reshape, e(torch.transpose, o, 1, 2), (b, lq, embed))
    return e(F.linear, o, w_out, b_out)


def _unfold_mha(g: fx.Graph, n: fx.Node) -> bool:
    """`(out, None) = _native_multi_head_attention(...)` as its parts, when the op's mask is
    None, its weights are not asked for and nothing reads them."""
    names = ("query", "key", "value", "embed_dim", "num_head", "qkv_weight", "qkv_bias",
             "proj_weight", "proj_bias", "mask", "need_weights", "average_attn_weights",
             "mask_type")
    a = dict(zip(names, n.args)) | n.kwargs
    users = list(n.users)
    if a.get("mask") is not None or a.get("need_weights", True) or \
            not all(_calls(u, (operator.getitem,)) and u.args[1] in (0, 1) for u in users) or \
            any(u.args[1] == 1 and u.users for u in users) or \
            not _float_cpu_3d(a["query"], a["key"], a["value"]) or \
            any(not isinstance(a[k], fx.Node) for k in names[5:9]):
        return False
    out = _mha_parts(_Emit(g, n), a["query"], a["key"], a["value"], a["embed_dim"],
                     a["num_head"], a["qkv_weight"], a["qkv_bias"], a["proj_weight"],
                     a["proj_bias"])
    for u in users:
        if u.args[1] == 0:
            u.replace_all_uses_with(out)
        g.erase_node(u)
    g.erase_node(n)
    return True


def _unfold_layer(g: fx.Graph, n: fx.Node) -> bool:
    """`_transformer_encoder_layer_fwd(...)` (nn.TransformerEncoderLayer's fast path) as its
    parts, when it has no mask."""
    names = ("src", "embed_dim", "num_heads", "qkv_weight", "qkv_bias", "proj_weight",
             "proj_bias", "use_gelu", "norm_first", "eps", "norm_weight_1", "norm_bias_1",
             "norm_weight_2", "norm_bias_2", "ffn_weight_1", "ffn_bias_1", "ffn_weight_2",
             "ffn_bias_2", "mask", "mask_type")
    a = dict(zip(names, n.args)) | n.kwargs
    if a.get("mask") is not None or not _float_cpu_3d(a["src"]) or \
            any(not isinstance(a[k], fx.Node) for k in names[3:7] + names[10:18]):
        return False
    e, x, embed = _Emit(g, n), a["src"], a["embed_dim"]

    def norm(h, i):
        return e(F.layer_norm, h, (embed,), a[f"norm_weight_{i}"], a[f"norm_bias_{i}"], a["eps"])

    def attn(h):
        return _mha_parts(e, h, h, h, embed, a["num_heads"], a["qkv_weight"], a["qkv_bias"],
                          a["proj_weight"], a["proj_bias"])

    def ffn(h):
        h = e(F.gelu if a["use_gelu"] else F.relu, e(F.linear, h, a["ffn_weight_1"],
                                                      a["ffn_bias_1"]))
        return e(F.linear, h, a["ffn_weight_2"], a["ffn_bias_2"])
    if a["norm_first"]:
        x = e(operator.add, x, attn(norm(x, 1)))
        out = e(operator.add, x, ffn(norm(x, 2)))
    else:
        x = norm(e(operator.add, x, attn(x)), 1)
        out = norm(e(operator.add, x, ffn(x)), 2)
    n.replace_all_uses_with(out)
    g.erase_node(n)
    return True


def _float_cpu_3d(*nodes) -> bool:
    """Batched [B, L, E] float tensors of static sizes (nested tensors and others keep the op)."""
    vals = [_val(x) for x in nodes]
    return all(isinstance(t, torch.Tensor) and t.dim() == 3 and not t.is_nested and
               t.dtype in (torch.float32, torch.float64) and
               all(isinstance(s, int) for s in t.shape) for t in vals)


_UNFOLD = {_NATIVE_MHA: _unfold_mha, _NATIVE_LAYER: _unfold_layer}


def unfold_fast_paths(gm: fx.GraphModule, example_inputs, options: dict) -> fx.GraphModule:
    """`gm`, or a copy of it with the fast-path ops of nn.MultiheadAttention and
    nn.TransformerEncoderLayer written out as their parts (CPU graphs; see above)."""
    if not enabled(options) or any(isinstance(x, torch.Tensor) and x.device.type != "cpu"
                                   for x in example_inputs) or \
            not any(_calls(n, tuple(_UNFOLD)) for n in gm.graph.nodes):
        return gm
    gm = copy_module(gm)
    g = gm.graph
    done = sum(_UNFOLD[n.target](g, n) for n in list(g.nodes) if _calls(n, tuple(_UNFOLD)))
    g.lint()
    gm.recompile()
    perf_log.info("attention: %d fast-path op(s) of nn.MultiheadAttention / "
                  "nn.TransformerEncoderLayer written out as their parts", done)
    return gm
