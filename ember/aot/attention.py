"""Stage aot: CPU `F.scaled_dot_product_attention` traced as eager runs it.

Eager runs CPU attention as aten's fused flash kernel (and its fused backward) whenever its own
checks pass; on meta tensors sdpa would always decompose into its math form (bmm, softmax, bmm),
which measured 0.5-0.9x of the fused kernel at inference and 0.7-0.95x in training
(docs/design/031-attention-form.md). `eager_fuses` asks eager's question; the backend's rewrite
of explicit attention (backends/attention.py) asks it too.

Consumes: the traced sdpa call's arguments (meta tensors). Produces: the fused call's output, or
None (sdpa then decomposes under the tracer).
"""
from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import _disable_current_modes

from .. import shapes


def eager_fuses(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                scale=None, enable_gqa=False) -> bool:
    """Whether eager's sdpa would run these as its fused CPU flash kernel: eager's own question
    (`_fused_sdp_choice`) asked with empty CPU tensors of the same layouts."""
    def real(t):
        if not isinstance(t, torch.Tensor):
            return t
        # (at the traced sizes: the choice depends on dtypes and layouts, not on the lengths)
        r = torch.empty_strided([shapes.hint_int(n) for n in t.shape],
                                [shapes.hint_int(n) for n in t.stride()], dtype=t.dtype, device="cpu")
        return r.requires_grad_(t.requires_grad) if t.dtype.is_floating_point else r
    with _disable_current_modes():      # real CPU tensors, not traced ones
        choice = torch._fused_sdp_choice(real(query), real(key), real(value), real(attn_mask),
                                         dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    return choice == int(SDPBackend.FLASH_ATTENTION)


def cpu_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False, *, float_masks: dict | None = None):
    """On meta tensors sdpa always takes the math path (bmm, softmax, bmm: slower, other
    rounding); call the fused kernel where eager would (its backward is the fused backward, an
    extern too). None: let sdpa decompose.

    Grouped-query attention (`enable_gqa`, fewer key/value heads) goes to the fused kernel with
    key and value as given, as eager does: the kernel maps each query head to its key/value head,
    so nothing is repeated and the backward returns key/value gradients of their own shapes.
    `float_masks` (one per trace) holds the float form of each boolean mask already converted:
    a decoder passes one mask to every layer, and one conversion serves them all (converting per
    call stored one [B, 1, L, S] float mask per layer, forward and backward)."""
    if dropout_p != 0.0 or \
            not eager_fuses(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        return None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # as eager's sdpa does before the fused kernel: True keeps, False is -inf
        key_ = (id(attn_mask), attn_mask._version, query.dtype)
        hit = float_masks.get(key_) if float_masks is not None else None
        if hit is None or hit[0] is not attn_mask:
            hit = (attn_mask, torch.zeros(attn_mask.shape, dtype=query.dtype, device=attn_mask.device)
                   .masked_fill(attn_mask.logical_not(), float("-inf")))
            if float_masks is not None:
                float_masks[key_] = hit     # holds the mask: its id is not reused in the trace
        attn_mask = hit[1]
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    return out
