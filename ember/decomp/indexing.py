"""Stage 3, decomp: embedding and index ops → index / index_put / gather / scatter prims."""
from __future__ import annotations

import torch

from ._util import canonical_dim, full, on_cpu, opmath_dtype, to, where
from .registry import register

aten = torch.ops.aten


@register(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if weight.dim() != 2:
        raise RuntimeError(f"'weight' must be 2-D, got {weight.dim()}-D")
    return aten.index.Tensor(weight, [indices])


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    acc = opmath_dtype(grad_output.dtype)
    g = to(grad_output, acc)
    indices = to(indices, torch.int64)
    if scale_grad_by_freq:
        counts = aten.full.default([num_weights], 0, dtype=torch.int64, device=indices.device)
        ones = aten.full.default(list(indices.shape), 1, dtype=torch.int64, device=indices.device)
        counts = aten.index_put.default(counts, [indices], ones, True)
        scale = aten.index.Tensor(counts, [indices])
        g = aten.div.Tensor(g, aten.unsqueeze.default(scale, -1))
    # rows at padding_idx go to an extra row past the end, sliced off: masking the gradient
    # instead copied all of it (12.5 MB for BERT's 8 x 512 tokens) for a per-token test.
    # Other negative indices wrap as index_put's do.
    n = num_weights
    wrapped = where(aten.lt.Scalar(indices, 0), aten.add.Scalar(indices, n), indices)
    target = where(aten.eq.Scalar(indices, padding_idx), n, wrapped)
    zeros = aten.full.default([n + 1] + list(g.shape[indices.dim():]), 0, dtype=acc,
                              device=g.device)
    rows = aten.index_put.default(zeros, [target], g, True)
    return to(aten.slice.Tensor(rows, 0, 0, n), grad_output.dtype)


def _index1d(index):
    return aten.view.default(index, [1]) if index.dim() == 0 else index


@register(aten.index_select.default)
def index_select(self, dim, index):
    if self.dim() == 0:
        picked = aten.index.Tensor(aten.view.default(self, [1]), [_index1d(index)])
        return aten.view.default(picked, []) if index.numel() == 1 else picked
    d = canonical_dim(dim, self.dim())
    return aten.index.Tensor(self, [None] * d + [_index1d(index)])


@register(aten.index_add.default)
def index_add(self, dim, index, source, *, alpha=1):
    d = canonical_dim(dim, max(self.dim(), 1))
    if self.dim() == 0:
        return aten.add.Tensor(self, aten.view.default(source, []), alpha=alpha)
    src = aten.mul.Tensor(source, alpha) if alpha != 1 else source
    if source.dim() == 0:
        src = aten.view.default(src, [1])
    src_moved = src
    return aten.index_put.default(self, [None] * d + [_index1d(index)], src_moved, True)


@register(aten.index_copy.default)
def index_copy(self, dim, index, source):
    if self.dim() == 0:
        return aten.clone.default(aten.view.default(source, []))
    d = canonical_dim(dim, self.dim())
    src = aten.view.default(source, [1]) if source.dim() == 0 else source
    return aten.index_put.default(self, [None] * d + [_index1d(index)], src)


@register(aten.index_fill.int_Scalar)
def index_fill_scalar(self, dim, index, value):
    return _index_fill(self, dim, index, aten.full.default([], value, dtype=self.dtype, device=self.device))


@register(aten.index_fill.int_Tensor)
def index_fill_tensor(self, dim, index, value):
    return _index_fill(self, dim, index, to(value, self.dtype))


def _index_fill(self, dim, index, value):
    if self.dim() == 0:
        return aten.clone.default(value) if index.numel() else aten.clone.default(self)
    d = canonical_dim(dim, self.dim())
    n = self.shape[d]
    hit = aten.full.default([n], False, dtype=torch.bool, device=self.device)
    idx = _index1d(index)
    idx = where(aten.lt.Scalar(idx, 0), aten.add.Tensor(idx, n), idx)
    hit = aten.index_put.default(hit, [idx], aten.full.default([], True, dtype=torch.bool, device=self.device))
    shape = [1] * self.dim()
    shape[d] = n
    return aten.where.self(aten.view.default(hit, shape), value, self)


@register(aten.take.default)
def take(self, index):
    return aten.index.Tensor(aten.reshape.default(self, [-1]), [index])


@register(aten._unsafe_index_put.default)
def unsafe_index_put(self, indices, values, accumulate=False):
    return aten.index_put.default(self, indices, values, accumulate)


@register(aten.index_put.hacked_twin)
def index_put_twin(self, indices, values, accumulate=False):
    return aten.index_put.default(self, indices, values, accumulate)


@register(aten.index.Tensor_hacked_twin)
def index_twin(self, indices):
    return aten.index.Tensor(self, indices)


def _needs_backward(*tensors) -> bool:
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


@register(aten._embedding_bag.default)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """The training form of embedding_bag: eager's bag kernel (`_embedding_bag_forward_only`, an
    extern) for the result, and the auxiliary outputs the backward reads computed here. Torch's
    meta kernel gives them other sizes than the CPU kernel (offset2bag is empty on CPU's sum fast
    path, bag_size has B+1 rows with include_last_offset, max_indices B rows for sum/mean), so a
    graph saving the extern's own would see sizes change at run time. These are what the CPU
    backward kernels accept: offset2bag (N,) = the bag of each index, bag_size (B,) = the non-
    padding indices of each bag, max_indices (B, D) from the kernel in max mode, else empty.
    Without a gradient to compute (no backward will read them) the op stays eager's own extern,
    whose auxiliary outputs a graph returning them must give as eager does."""
    if sparse or not on_cpu(weight) or indices.dim() != 1 or indices.dtype != offsets.dtype or \
            not _needs_backward(weight, per_sample_weights):
        return NotImplemented
    out = aten._embedding_bag_forward_only.default(
        weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
        include_last_offset, padding_idx)
    n, b = indices.shape[0], offsets.shape[0] - (1 if include_last_offset else 0)
    # bags start at offsets[:b]; with include_last_offset the last offset is the end, len(indices)
    starts = aten.slice.Tensor(offsets, 0, 0, b)
    counts = aten.index_put.default(full([n + 1], 0, indices), [starts], full([b], 1, indices),
                                    True)
    offset2bag = aten.sub.Tensor(aten.cumsum.default(aten.slice.Tensor(counts, 0, 0, n), 0,
                                                     dtype=indices.dtype), 1)
    counted = to(aten.ne.Scalar(indices, padding_idx), indices.dtype)
    bag_size = aten.index_put.default(full([b], 0, indices), [offset2bag], counted, True)
    max_indices = out[3] if mode == 2 else full([0], 0, indices)
    return out[0], offset2bag, bag_size, max_indices
