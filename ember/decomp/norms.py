"""Stage 3, decomp: normalization layers (layer/batch/group/rms norm) and their backwards.

Statistics are computed with the `var_mean` primitive in the opmath dtype (fp32 for fp16/bf16),
like ATen's CPU kernels; outputs are cast back to the input dtype. Batch norm's running-stat
update is written as `copy_` into the buffers (the aot functionalizer turns it into an input
mutation); `_native_batch_norm_legit_functional` returns the new stats instead.
"""
from __future__ import annotations

import torch

from ..shapes import is_symbolic
from ._util import numel, on_cpu, opmath_dtype, stats_dtype, to
from .registry import register

aten = torch.ops.aten


def _bcast(t, ndim, axis=1):
    """Reshape a per-channel vector [C] to broadcast against an ndim tensor along `axis`."""
    shape = [1] * ndim
    shape[axis] = -1
    return aten.view.default(t, shape)


# ---------------------------------------------------------------------------------- layer norm

def _contiguous_like_aten(t):
    """ATen's layer norm kernels return contiguous outputs whatever the input's layout (they
    run on `input.expect_contiguous()`); the decomposition's pointwise ops would follow the
    input's. Traced layouts must be eager's: after a conv1d front end (Whisper's encoder, a
    `[B, C, L]` output permuted to `[B, L, C]`) the normalized activations came out
    column-major, so each following `linear` traced as mm + a bias add instead of addmm, and its
    input gradient as `W^T @ grad^T` in the transposed orientation (mm_mat1_backward's
    column-major case: 1.3x slower at 1500 x 384 x 384)."""
    if is_symbolic(t) or t.is_contiguous():
        return t
    return aten.clone.default(t, memory_format=torch.contiguous_format)


@register(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    axis = input.dim() - len(normalized_shape)
    dims = list(range(axis, input.dim()))
    acc = opmath_dtype(input.dtype)
    x = to(input, acc)
    if numel(input.shape[axis:]) == 0 or input.numel() == 0:
        var = aten.full.default(list(input.shape[:axis]) + [1] * len(dims), float("nan"), dtype=acc,
                                device=input.device)
        mean = var
    else:
        var, mean = aten.var_mean.correction(x, dims, correction=0, keepdim=True)
    rstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    out = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, weight)
    if bias is not None:
        out = aten.add.Tensor(out, bias)
    return _contiguous_like_aten(to(out, input.dtype)), \
        to(mean, input.dtype if on_cpu(input) else acc), \
        to(rstd, input.dtype if on_cpu(input) else acc)


@register(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    acc = opmath_dtype(input.dtype)
    g, x, mean_, rstd_ = (to(t, acc) for t in (grad_out, input, mean, rstd))
    w = to(weight, acc) if weight is not None else None
    axis = input.dim() - len(normalized_shape)
    inner = list(range(axis, input.dim()))
    outer = list(range(axis))
    n = numel(input.shape[axis:])
    x_hat = aten.mul.Tensor(aten.sub.Tensor(x, mean_), rstd_)
    d_input = d_weight = d_bias = None
    if output_mask[0]:
        gx = aten.mul.Tensor(g, w) if w is not None else g
        if n == 0:
            d_input = aten.full.default(list(input.shape), 0, dtype=input.dtype, device=input.device)
        else:
            a = aten.mul.Tensor(gx, n)
            b = aten.sum.dim_IntList(gx, inner, True)
            c = aten.mul.Tensor(x_hat, aten.sum.dim_IntList(aten.mul.Tensor(x_hat, gx), inner, True))
            d = aten.sub.Tensor(aten.sub.Tensor(a, b), c)
            d_input = _contiguous_like_aten(
                to(aten.mul.Tensor(aten.div.Tensor(rstd_, n), d), input.dtype))
    if output_mask[1] and weight is not None:
        gw = aten.mul.Tensor(g, x_hat)
        d_weight = to(aten.sum.dim_IntList(gw, outer, False) if outer else gw, weight.dtype)
    if output_mask[2] and bias is not None:
        d_bias = to(aten.sum.dim_IntList(g, outer, False) if outer else aten.clone.default(g),
                    bias.dtype)
    return d_input, d_weight, d_bias


# ------------------------------------------------------------------------------------ rms norm

@register(aten._fused_rms_norm.default)
def fused_rms_norm(input, normalized_shape, weight, eps):
    axis = input.dim() - len(normalized_shape)
    dims = list(range(axis, input.dim()))
    acc = opmath_dtype(input.dtype)
    x = to(input, acc)
    if eps is None:
        eps = torch.finfo(acc).eps
    ms = aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(x, x), dims, True), numel(input.shape[axis:]))
    rstd = aten.rsqrt.default(aten.add.Tensor(ms, eps))
    out = aten.mul.Tensor(x, rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, weight)
    return to(out, input.dtype), rstd


@register(aten._fused_rms_norm_backward.default)
def fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    acc = opmath_dtype(input.dtype)
    g, x, r = to(grad_out, acc), to(input, acc), to(rstd, acc)
    axis = input.dim() - len(normalized_shape)
    inner = list(range(axis, input.dim()))
    outer = list(range(axis))
    n = numel(input.shape[axis:])
    d_input = d_weight = None
    if output_mask[0]:
        gx = aten.mul.Tensor(g, weight) if weight is not None else g
        dot = aten.sum.dim_IntList(aten.mul.Tensor(gx, x), inner, True)
        corr = aten.mul.Tensor(aten.mul.Tensor(x, aten.mul.Tensor(aten.mul.Tensor(r, r), r)),
                               aten.div.Tensor(dot, n))
        d_input = to(aten.sub.Tensor(aten.mul.Tensor(gx, r), corr), input.dtype)
    if output_mask[1] and weight is not None:
        gw = aten.mul.Tensor(g, aten.mul.Tensor(x, r))
        d_weight = to(aten.sum.dim_IntList(gw, outer, False) if outer else gw, weight.dtype)
    return d_input, d_weight


# ---------------------------------------------------------------------------------- group norm

def _per_group(t, N, group, cpg):
    """[N, C] channel sums -> [N, group] group sums."""
    return aten.sum.dim_IntList(aten.view.default(t, [N, group, cpg]), [2])


def _per_channel(t, N, group, cpg):
    """[N, group] -> [N, C], each group's value repeated over its channels: a computation
    (clone), not a view. A view would put a `c // (C/G)` index into the full-size loop that reads
    it, which then cannot vectorize along a channels-last C; lower stores this small gathering
    body once instead (IRREGULAR_AMPLIFY), and in NCHW keeps it inlined, hoisted out of H*W."""
    return aten.clone.default(aten.reshape.default(aten.expand.default(
        aten.unsqueeze.default(t, -1), [N, group, cpg]), [N, group * cpg]))


@register(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    """Statistics per channel first (sums over H*W), then per group (sums over the group's
    channels): both reductions read the input in its own layout, so a channels-last input is
    reduced along C-contiguous rows (vectorized along C) instead of being copied to NCHW first.
    The output is x * scale + shift with per-channel [N, C] scale = rstd * weight and
    shift = bias - mean * scale, as eager's CPU kernel computes it."""
    acc = opmath_dtype(input.dtype)
    cpg = C // group
    if not is_symbolic(input) and input.is_contiguous() and input.numel() > 0:
        return _group_norm_rows(input, weight, bias, N, C, HxW, group, eps, acc)
    x = to(aten.reshape.default(input, [N, C, HxW]), acc)   # a view in NCHW and channels-last
    if x.numel() == 0 or x.shape[-1] == 0:
        mean = rstd = aten.full.default([N, group], float("nan"), dtype=acc, device=input.device)
        mean_c = _per_channel(mean, N, group, cpg)
    else:
        n = cpg * HxW
        mean = aten.div.Tensor(_per_group(aten.sum.dim_IntList(x, [2]), N, group, cpg), n)
        mean_c = _per_channel(mean, N, group, cpg)
        dev = aten.sub.Tensor(x, aten.unsqueeze.default(mean_c, -1))
        var = aten.div.Tensor(_per_group(aten.sum.dim_IntList(aten.mul.Tensor(dev, dev), [2]),
                                         N, group, cpg), n)
        rstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    scale = _per_channel(rstd, N, group, cpg)
    if weight is not None:
        scale = aten.mul.Tensor(scale, to(weight, acc))
    shift = aten.mul.Tensor(mean_c, scale)
    shift = aten.sub.Tensor(to(bias, acc), shift) if bias is not None else aten.neg.default(shift)
    shape4 = [N, C] + [1] * (input.dim() - 2)
    out = aten.add.Tensor(aten.mul.Tensor(to(input, acc), aten.view.default(scale, shape4)),
                          aten.view.default(shift, shape4))
    return to(out, input.dtype), to(mean, input.dtype), to(rstd, input.dtype)


def _group_norm_rows(input, weight, bias, N, C, HxW, group, eps, acc):
    """A contiguous (NCHW) input: each group is one contiguous row of cpg*HxW elements, so the
    statistics are row reductions and the output is computed over [N, group, cpg, HxW], all in
    one kernel per row that reads the row from memory once (the per-channel form read the input
    three times: sums, centered sums, output; GroupNorm(32, 64) at 0.7x eager)."""
    cpg = C // group
    x = to(aten.view.default(input, [N, group, cpg * HxW]), acc)
    # var_mean: statistics as precise as eager's (double sums on CPU, lower/rules.py)
    var, mean = aten.var_mean.correction(x, [2], correction=0, keepdim=True)
    # rstd and the scale rstd * weight per group / channel in double on CPU, rounded once (as
    # batch norm's: a group's scale multiplies all its elements alike)
    sd = stats_dtype(input)
    rstd = aten.rsqrt.default(aten.add.Tensor(to(var, sd), eps))
    scale = aten.expand.default(aten.unsqueeze.default(rstd, -1), [N, group, cpg, 1])
    if weight is not None:
        scale = aten.mul.Tensor(scale, aten.view.default(to(weight, sd), [1, group, cpg, 1]))
    scale, rstd = to(scale, acc), to(rstd, acc)
    # (x - mean) * scale + bias, not eager's x * scale + (bias - mean * scale): that one cancels
    # when |mean| >> std (x + 1000: 1.5x eager's error in float sums, docs/design/061)
    x4 = aten.view.default(to(input, acc), [N, group, cpg, HxW])
    out = aten.mul.Tensor(aten.sub.Tensor(x4, aten.unsqueeze.default(mean, -1)), scale)
    if bias is not None:
        out = aten.add.Tensor(out, aten.view.default(to(bias, acc), [1, group, cpg, 1]))
    return (to(aten.view.default(out, list(input.shape)), input.dtype),
            to(aten.view.default(mean, [N, group]), input.dtype),
            to(aten.view.default(rstd, [N, group]), input.dtype))


@register(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_output, input, mean, rstd, gamma, N, C, HxW, group,
                               output_mask):
    """d_input = g * (rstd * gamma) + x * c2 + c3 with per-channel [N, C] coefficients (see
    _per_channel), reading grad and input in their own layout."""
    acc = opmath_dtype(input.dtype)
    if not is_symbolic(input) and input.is_contiguous() and grad_output.is_contiguous() \
            and input.numel() > 0:
        return _group_norm_backward_rows(grad_output, input, mean, rstd, gamma, N, C, HxW,
                                         group, output_mask, acc)
    g = to(aten.reshape.default(grad_output, [N, C, HxW]), acc)
    x = to(aten.reshape.default(input, [N, C, HxW]), acc)
    mean, rstd = to(mean, acc), to(rstd, acc)
    cpg = C // group
    gm = to(gamma, acc) if gamma is not None else None
    ds = aten.sum.dim_IntList(aten.mul.Tensor(g, x), [2])
    db = aten.sum.dim_IntList(g, [2])
    d_input = d_gamma = d_bias = None
    if output_mask[0]:
        s = 1.0 / (HxW * cpg)
        ds_val = _per_group(aten.mul.Tensor(ds, gm) if gm is not None else ds, N, group, cpg)
        db_val = _per_group(aten.mul.Tensor(db, gm) if gm is not None else db, N, group, cpg)
        r3 = aten.mul.Tensor(aten.mul.Tensor(rstd, rstd), rstd)
        c2 = aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(aten.mul.Tensor(db_val, mean), ds_val), r3), s)
        c3 = aten.sub.Tensor(aten.mul.Tensor(aten.neg.default(c2), mean),
                             aten.mul.Tensor(aten.mul.Tensor(db_val, rstd), s))
        c1 = _per_channel(rstd, N, group, cpg)
        if gm is not None:
            c1 = aten.mul.Tensor(c1, gm)

        def col(t):                         # [N, C] -> [N, C, 1]
            return aten.unsqueeze.default(t, -1)
        d = aten.add.Tensor(aten.add.Tensor(
            aten.mul.Tensor(g, col(c1)), aten.mul.Tensor(x, col(_per_channel(c2, N, group, cpg)))),
            col(_per_channel(c3, N, group, cpg)))
        d_input = to(aten.view.default(d, list(input.shape)), input.dtype)
    wdt = gamma.dtype if gamma is not None else input.dtype
    if output_mask[1]:
        t = aten.sub.Tensor(aten.view.default(ds, [N, group, cpg]),
                            aten.mul.Tensor(aten.view.default(db, [N, group, cpg]),
                                            aten.unsqueeze.default(mean, -1)))
        d_gamma = to(aten.view.default(aten.sum.dim_IntList(
            aten.mul.Tensor(t, aten.unsqueeze.default(rstd, -1)), [0]), [C]), wdt)
    if output_mask[2]:
        d_bias = to(aten.sum.dim_IntList(db, [0]), wdt)
    return d_input, d_gamma, d_bias


def _group_norm_backward_rows(grad_output, input, mean, rstd, gamma, N, C, HxW, group,
                              output_mask, acc):
    """Contiguous grad and input: everything over [N, group, cpg, HxW], so each group's block
    is one row of the schedule: the per-channel sums (over HxW), the group sums of them (over
    cpg) and d_input run in one kernel per (n, group) that reads grad and input from memory
    once (schedule/segments.py); the [N, C] form read both twice, as eager does."""
    cpg = C // group
    shape4 = [N, group, cpg, HxW]
    g = to(aten.view.default(grad_output, shape4), acc)
    x = to(aten.view.default(input, shape4), acc)
    mean, rstd = to(mean, acc), to(rstd, acc)
    gm = to(aten.view.default(gamma, [group, cpg]), acc) if gamma is not None else None
    ds = aten.sum.dim_IntList(aten.mul.Tensor(g, x), [3])          # [N, group, cpg]
    db = aten.sum.dim_IntList(g, [3])
    d_input = d_gamma = d_bias = None
    if output_mask[0]:
        s = 1.0 / (HxW * cpg)
        ds_val = aten.sum.dim_IntList(aten.mul.Tensor(ds, gm) if gm is not None else ds, [2])
        db_val = aten.sum.dim_IntList(aten.mul.Tensor(db, gm) if gm is not None else db, [2])
        r3 = aten.mul.Tensor(aten.mul.Tensor(rstd, rstd), rstd)
        c2 = aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(aten.mul.Tensor(db_val, mean), ds_val), r3), s)
        c3 = aten.sub.Tensor(aten.mul.Tensor(aten.neg.default(c2), mean),
                             aten.mul.Tensor(aten.mul.Tensor(db_val, rstd), s))

        def col(t):                         # [N, group] -> [N, group, 1, 1]
            return aten.view.default(t, [N, group, 1, 1])
        c1 = col(rstd)
        if gm is not None:
            c1 = aten.mul.Tensor(c1, aten.view.default(gm, [1, group, cpg, 1]))
        d = aten.add.Tensor(aten.add.Tensor(aten.mul.Tensor(g, c1), aten.mul.Tensor(x, col(c2))),
                            col(c3))
        d_input = to(aten.view.default(d, list(input.shape)), input.dtype)
    wdt = gamma.dtype if gamma is not None else input.dtype
    if output_mask[1]:
        t = aten.sub.Tensor(ds, aten.mul.Tensor(db, aten.unsqueeze.default(mean, -1)))
        d_gamma = to(aten.view.default(aten.sum.dim_IntList(
            aten.mul.Tensor(t, aten.unsqueeze.default(rstd, -1)), [0]), [C]), wdt)
    if output_mask[2]:
        d_bias = to(aten.view.default(aten.sum.dim_IntList(db, [0]), [C]), wdt)
    return d_input, d_gamma, d_bias


# ---------------------------------------------------------------------------------- batch norm

def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var) without mutation."""
    nd = input.dim()
    dims = [0] + list(range(2, nd))
    acc = opmath_dtype(input.dtype)
    x = to(input, acc)
    new_rm, new_rv = running_mean, running_var
    w = aten.reshape.default(weight, [-1]) if weight is not None else None
    if training:
        # var_mean's kernels accumulate float statistics in double (lower/rules.py), as ATen's
        # CPU batch norm does (acc_type<float, false>): a standardized conv filter's mean
        # (|mean| ~ 1e-3 under std ~ 0.1) must be exact for its normalized row to sum to 0
        # (docs/design/060, 061)
        var, mean = aten.var_mean.correction(x, dims, correction=0, keepdim=True)
        save_mean = aten.view.default(mean, [-1])
        # per channel in double on CPU (free), each rounded once: rstd, the output's scale
        # rstd * weight (a channel's scale multiplies all its elements alike: its rounding is
        # a correlated error), the running statistics
        sd = stats_dtype(input)
        rstd = aten.rsqrt.default(aten.add.Tensor(to(aten.view.default(var, [-1]), sd), eps))
        save_rstd = to(rstd, acc)
        scale = to(aten.mul.Tensor(rstd, to(w, sd)) if w is not None else rstd, acc)
        # (x - mean) * scale: not eager's x * scale + (bias - mean * scale), which cancels when
        # |mean| >> std (x + 1000), and one rounding fewer than scaling by rstd, then weight
        out = aten.mul.Tensor(aten.sub.Tensor(x, mean), _bcast(scale, nd))
        w = None
        if running_mean is not None:
            new_rm = to(aten.add.Tensor(aten.mul.Tensor(to(save_mean, sd), momentum),
                                        aten.mul.Tensor(to(running_mean, sd), 1 - momentum)),
                        running_mean.dtype)
        if running_var is not None:
            n = input.numel() / input.shape[1]
            unbiased = aten.mul.Tensor(to(aten.view.default(var, [-1]), sd),
                                       n / max(n - 1, 1e-300) if n > 1 else float("inf"))
            new_rv = to(aten.add.Tensor(aten.mul.Tensor(unbiased, momentum),
                                        aten.mul.Tensor(to(running_var, sd), 1 - momentum)),
                        running_var.dtype)
    else:
        rm, rv = to(running_mean, acc), to(running_var, acc)
        invstd = aten.rsqrt.default(aten.add.Tensor(rv, eps))
        out = aten.mul.Tensor(aten.sub.Tensor(x, _bcast(rm, nd)), _bcast(invstd, nd))
        if on_cpu(input):
            save_mean = aten.full.default([0], 0, dtype=acc, device=input.device)
            save_rstd = save_mean
        else:
            save_mean, save_rstd = rm, invstd
    if w is not None:
        out = aten.mul.Tensor(out, _bcast(w, nd))
    if bias is not None:
        out = aten.add.Tensor(out, _bcast(aten.reshape.default(bias, [-1]), nd))
    if on_cpu(input):
        save_mean, save_rstd = to(save_mean, input.dtype), to(save_rstd, input.dtype)
    return to(out, input.dtype), save_mean, save_rstd, new_rm, new_rv


def _update_stats(running_mean, running_var, new_rm, new_rv, training):
    if training and running_mean is not None:
        aten.copy_.default(running_mean, new_rm)
    if training and running_var is not None:
        aten.copy_.default(running_var, new_rv)


@register(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, sm, sr, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
    _update_stats(running_mean, running_var, rm, rv, training)
    return out, sm, sr


@register(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, True, momentum, eps)[:3]


@register(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_functional(input, weight, bias, running_mean, running_var, training,
                                 momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@register(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


def _reserve(input):
    return aten.full.default([0], 0, dtype=torch.uint8, device=input.device)


@register(aten._batch_norm_with_update.default)
def batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, sm, sr, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var, True,
                                      momentum, eps)
    _update_stats(running_mean, running_var, rm, rv, True)
    return out, sm, sr, _reserve(input)


@register(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update_functional(input, weight, bias, running_mean, running_var, momentum,
                                      eps):
    out, sm, sr, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var, True,
                                      momentum, eps)
    return out, sm, sr, _reserve(input), rm, rv


@register(aten._batch_norm_no_update.default)
def batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, sm, sr, _, _ = _batch_norm(input, weight, bias, running_mean, running_var, False,
                                    momentum, eps)
    return out, sm, sr, _reserve(input)


@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    acc = opmath_dtype(input.dtype)
    wdt = weight.dtype if weight is not None else input.dtype
    g, x = to(grad_out, acc), to(input, acc)
    nd = input.dim()
    dims = [d for d in range(nd) if d != 1]
    n = input.numel() / input.shape[1]
    if train:
        mean, invstd = to(save_mean, acc), to(save_invstd, acc)
    else:
        mean = to(running_mean, acc)
        invstd = aten.rsqrt.default(aten.add.Tensor(to(running_var, acc), eps))
    xc = aten.sub.Tensor(x, _bcast(mean, nd))
    g_sum = aten.sum.dim_IntList(g, dims)
    dot_p = aten.sum.dim_IntList(aten.mul.Tensor(g, xc), dims)
    scale = invstd if weight is None else aten.mul.Tensor(invstd, to(weight, acc))
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if train:
            proj_scale = aten.mul.Tensor(aten.div.Tensor(dot_p, n), aten.mul.Tensor(invstd, invstd))
            proj = aten.mul.Tensor(xc, _bcast(proj_scale, nd))
            grad_mean = _bcast(aten.div.Tensor(g_sum, n), nd)
            gi = aten.mul.Tensor(aten.sub.Tensor(aten.sub.Tensor(g, proj), grad_mean), _bcast(scale, nd))
        else:
            gi = aten.mul.Tensor(g, _bcast(scale, nd))
        grad_input = to(gi, input.dtype)
    if output_mask[1]:
        grad_weight = to(aten.mul.Tensor(dot_p, invstd), wdt)
    if output_mask[2]:
        grad_bias = to(g_sum, wdt)
    return grad_input, grad_weight, grad_bias


@register(aten.batch_norm_backward.default)
def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                        update, eps, output_mask, reserve):
    return native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
                                      save_mean, save_var, update, eps, output_mask)


@register(aten.cudnn_batch_norm.default)
def cudnn_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, sm, sr, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
    _update_stats(running_mean, running_var, rm, rv, training)
    if not training:
        sm = aten.full.default([0], 0, dtype=input.dtype, device=input.device)
        sr = sm
    return out, sm, sr, _reserve(input)


@register(aten.cudnn_batch_norm_backward.default)
def cudnn_batch_norm_backward(input, grad_output, weight, running_mean, running_var, save_mean,
                              save_var, epsilon, reserve):
    return native_batch_norm_backward(grad_output, input, weight, running_mean, running_var,
                                      save_mean, save_var, True, epsilon, [True, True, True])
