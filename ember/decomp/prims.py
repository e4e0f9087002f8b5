"""Stage 3, decomp: the primitive aten op set (PRIMS) that a kernel backend must lower.

Every decomposition in `ember.decomp` bottoms out in these ops. A kernel backend (ember.lower)
lowers exactly this set; an op outside it that has no decomposition is not an error — the backend
emits an extern call to the aten kernel ("fallback op", logged under EMBER_LOGS=perf).

Kinds (`PRIM_KINDS[op]`):

- ``pointwise``: elementwise with broadcasting and PyTorch type promotion; scalar operands arrive
  as Python numbers (``add.Tensor(x, 1.0)``). The output dtype is ``node.meta["val"].dtype``.
  ``_to_copy`` is the dtype/device cast (only ``dtype``/``device``/``memory_format`` kwargs are set
  by decompositions; layout stays strided); ``clone``/``copy`` are identity copies (``copy(dst, src)``
  = src broadcast to dst's shape, cast to dst's dtype); ``where.self`` is select.
- ``reduction``: over ``dim`` (None/[] = all dims) with ``keepdim``; ``sum``/``prod`` take an
  optional output ``dtype``; ``var_mean.correction`` returns (var, mean); ``argmax``/``argmin`` return
  int64 (first index of the extremum, NaN counts as the extremum like eager).
- ``creation``: ``full`` (value, shape, dtype), ``arange.start_step`` (iota: start + i*step),
  ``empty``/``empty_strided`` (uninitialised allocation, a value never read before written by a
  ``copy``/scatter), ``scalar_tensor``.
- ``random``: ``rand``/``randn`` (uniform [0,1) / normal) — eager's RNG stream is not reproduced
  bit-for-bit; dropout masks are decomposed to ``rand(...) < keep``.
- ``view``: no data movement, the output aliases the input with new sizes/strides (``view``
  requires a viewable input; decompositions call ``_unsafe_view``/``view`` only where eager's
  ``reshape`` would be a view; otherwise ``clone`` first).
- ``indexing``: data movement with computed indices: ``cat``, ``constant_pad_nd`` (negative pad =
  crop), ``gather``, ``index.Tensor`` (advanced indexing, None entries allowed; ``_unsafe_index``
  for indices a decomposition made in range: unchecked), ``index_put``
  (functional, ``accumulate`` flag), ``scatter.src``/``scatter.value``, ``scatter_add``.
- ``extern``: compute-bound or awkward ops the backend calls out to (aten kernel with ``out=`` or
  a library routine): matmuls, convolution and its backward, scaled-dot-product attention and its
  backward, max-pool with indices and its backward, sort/cumsum (scans).

This set is a contract with the kernel backend: it only grows (adding an op here means a backend
may lower it; until it does, the op is a fallback extern call — still correct).
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

POINTWISE = "pointwise"
REDUCTION = "reduction"
CREATION = "creation"
RANDOM = "random"
VIEW = "view"
INDEXING = "indexing"
EXTERN = "extern"

_POINTWISE_OPS = [
    # arithmetic (scalar `other` allowed as a Python number for add/sub/mul/div)
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.div.Tensor_mode,
    aten.neg.default, aten.abs.default, aten.reciprocal.default, aten.sign.default,
    aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar,
    aten.maximum.default, aten.minimum.default,
    aten.remainder.Tensor, aten.fmod.Tensor, aten.atan2.default,
    aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default,
    # transcendental
    aten.exp.default, aten.exp2.default, aten.expm1.default,
    aten.log.default, aten.log2.default, aten.log10.default, aten.log1p.default,
    aten.sqrt.default, aten.rsqrt.default,
    aten.sin.default, aten.cos.default, aten.tan.default,
    aten.asin.default, aten.acos.default, aten.atan.default,
    aten.sinh.default, aten.cosh.default, aten.tanh.default,
    aten.asinh.default, aten.acosh.default, aten.atanh.default,
    aten.sigmoid.default, aten.erf.default, aten.erfc.default, aten.erfinv.default,
    aten.lgamma.default, aten.digamma.default,
    # compare / select / logic
    aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor,
    aten.eq.Scalar, aten.ne.Scalar, aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar,
    aten.where.self,
    aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor,
    aten.bitwise_not.default,
    aten.isnan.default,
    # casts and copies
    aten._to_copy.default, aten.clone.default, aten.copy.default,
]

_REDUCTION_OPS = [
    aten.sum.dim_IntList, aten.prod.dim_int, aten.amax.default, aten.amin.default,
    aten.argmax.default, aten.argmin.default, aten.var_mean.correction,
]

_CREATION_OPS = [
    aten.full.default, aten.arange.start_step, aten.empty.memory_format, aten.empty_strided.default,
    aten.scalar_tensor.default,
]

_RANDOM_OPS = [aten.rand.default, aten.randn.default]

_VIEW_OPS = [
    aten.view.default, aten._unsafe_view.default, aten.expand.default, aten.permute.default,
    aten.squeeze.dims, aten.unsqueeze.default, aten.slice.Tensor, aten.select.int,
    aten.as_strided.default, aten.alias.default,
]

_INDEXING_OPS = [
    aten.cat.default, aten.constant_pad_nd.default, aten.gather.default, aten.index.Tensor,
    aten._unsafe_index.Tensor,
    aten.index_put.default, aten.scatter.src, aten.scatter.value, aten.scatter_add.default,
]

_EXTERN_OPS = [
    aten.mm.default, aten.bmm.default, aten.addmm.default,
    aten.convolution.default, aten.convolution_backward.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
    aten.max_pool2d_with_indices.default, aten.max_pool2d_with_indices_backward.default,
    aten.sort.default, aten.sort.stable, aten.cumsum.default,
]


def _kinds() -> dict:
    table = {}
    for kind, ops in ((POINTWISE, _POINTWISE_OPS), (REDUCTION, _REDUCTION_OPS),
                      (CREATION, _CREATION_OPS), (RANDOM, _RANDOM_OPS), (VIEW, _VIEW_OPS),
                      (INDEXING, _INDEXING_OPS), (EXTERN, _EXTERN_OPS)):
        for op in ops:
            assert op not in table, op
            table[op] = kind
    return table


PRIM_KINDS: dict = _kinds()
PRIMS: frozenset = frozenset(PRIM_KINDS)


def prim_kind(op) -> str | None:
    """The kind of a primitive op ("pointwise", "reduction", ...), or None if not a primitive."""
    return PRIM_KINDS.get(op)
