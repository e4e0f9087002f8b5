"""Stage 3, decomp: helpers shared by the family modules (dtype rules, dims, in-place variants)."""
from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

LOW_PRECISION = (torch.float16, torch.bfloat16)


def opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype eager computes in: fp16/bf16 math runs in fp32 (like ATen's opmath_type)."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def stats_dtype(x) -> torch.dtype:
    """The dtype ATen's CPU batch norm accumulates its statistics in (acc_type<T, false>:
    double for float); on other devices the opmath dtype."""
    if x.dtype == torch.float32 and on_cpu(x):
        return torch.float64
    return opmath_dtype(x.dtype)


def to(x, dtype):
    """Cast through the `_to_copy` primitive, a no-op when the dtype already matches."""
    if not isinstance(x, torch.Tensor) or x.dtype == dtype:
        return x
    return aten._to_copy.default(x, dtype=dtype)


def upcast(x):
    return to(x, opmath_dtype(x.dtype)) if isinstance(x, torch.Tensor) else x


def opmath(fn):
    """Run fn with fp16/bf16 tensor arguments upcast to fp32 and cast tensor results back to the
    dtype of the first tensor argument (eager's pointwise kernels round once, at the end)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is None or first.dtype not in LOW_PRECISION:
            return fn(*args, **kwargs)
        out_dtype = first.dtype
        args = [upcast(a) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in args]
        out = fn(*args, **kwargs)
        if isinstance(out, (tuple, list)):
            return type(out)(to(o, out_dtype) if isinstance(o, torch.Tensor) and o.is_floating_point()
                             else o for o in out)
        return to(out, out_dtype)
    return wrapper


def canonical_dim(dim: int, ndim: int) -> int:
    nd = max(ndim, 1)
    if not -nd <= dim < nd:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], "
                         f"but got {dim})")
    return dim % nd


def canonical_dims(dims, ndim: int) -> list[int]:
    if dims is None:
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return list(range(ndim))
    return [canonical_dim(d, ndim) for d in dims]


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def full(shape, value, like: torch.Tensor, dtype=None):
    return aten.full.default(list(shape), value, dtype=dtype or like.dtype, device=like.device,
                             pin_memory=False)


def zeros_like(x, dtype=None):
    return full(x.shape, 0, x, dtype)


def scalar(value, like: torch.Tensor, dtype=None):
    return aten.full.default([], value, dtype=dtype or like.dtype, device=like.device)


def inplace_of(functional_op):
    """Decomposition of `op_(self, *args)`: compute `op(self, *args)` and copy it back into self
    (the aot functionalizer turns the copy_ into an input mutation)."""
    def fn(self, *args, **kwargs):
        return aten.copy_.default(self, functional_op(self, *args, **kwargs))
    fn.__name__ = f"inplace_{functional_op}"
    return fn


def where(cond, a, b):
    """where.self accepting Python scalars on either side (cast to the tensor side's dtype, the
    way eager's where(cond, tensor, scalar) keeps the tensor's dtype)."""
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        raise TypeError("where: at least one branch must be a tensor")
    if not isinstance(a, torch.Tensor):
        a = scalar(a, b)
    if not isinstance(b, torch.Tensor):
        b = scalar(b, a)
    return aten.where.self(cond, a, b)


INT = (int, torch.SymInt)      # a size may be symbolic (dynamic shapes)


def _category(dtype_or_value):
    if isinstance(dtype_or_value, torch.dtype):
        d = dtype_or_value
        return 0 if d == torch.bool else 3 if d.is_complex else 2 if d.is_floating_point else 1
    v = dtype_or_value
    return 0 if isinstance(v, (bool, torch.SymBool)) else 1 if isinstance(v, INT) else \
        3 if isinstance(v, complex) else 2


_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
           torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
           torch.complex128]
# computed at import, outside any dispatch mode: torch.promote_types is an aten op
_PROMOTE = {(a, b): torch.promote_types(a, b) for a in _DTYPES for b in _DTYPES}


def promote(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    return _PROMOTE[(a, b)]


def scalar_result_dtype(tensor_dtype, value):
    """Eager's result dtype of `tensor op python_scalar` (a scalar only wins across categories),
    computed here because torch.result_type would be dispatched as an op while tracing."""
    if isinstance(value, torch.Tensor):
        return promote(tensor_dtype, value.dtype) if value.dim() else tensor_dtype
    ct, cv = _category(tensor_dtype), _category(value)
    if cv <= ct:
        return tensor_dtype
    if cv == 1:
        return torch.int64
    if cv == 2:
        return torch.get_default_dtype()
    return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64


def channels_last(t) -> bool:
    """Whether `t` is a 4-D tensor laid out channels-last and not also NCHW (eager's
    `suggest_memory_format() == channels_last`)."""
    return isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_contiguous() and \
        t.is_contiguous(memory_format=torch.channels_last)


def in_format_of(out, ref):
    """`out` in `ref`'s layout where `ref` is channels-last: eager's CPU pooling and upsampling
    kernels (forward and backward) allocate their result in the input's suggested memory format.
    A decomposition that builds its result through a contiguous reshape would otherwise hand
    an NCHW gradient into a channels-last region: a transposing kernel plus oneDNN reorders."""
    if channels_last(ref) and out.dim() == 4 and not out.is_contiguous(memory_format=torch.channels_last):
        return aten.clone.default(out, memory_format=torch.channels_last)
    return out


def on_cpu(t) -> bool:
    """Whether t's real device is the CPU. Under the aot tracer tensors are `meta` and the real
    device is the graph's; we treat meta as CPU (the device whose eager output conventions we
    reproduce, e.g. batch norm's empty eval-mode save_mean)."""
    return t.device.type in ("cpu", "meta")
