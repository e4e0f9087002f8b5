"""Backends, flex_attention: the fused CPU attention as two torch.library ops every backend runs.

Capture (ember/capture/flex.py) turns `flex_attention(q, k, v, score_mod, block_mask, ...)` into
one graph node `torch.ops.ember.flex_attention(q, k, v, block_mask, score_bufs, mask_bufs, mods,
scale, gqa)`, where `mods` names the traced score_mod / mask_mod subgraphs in `MODS` and the bufs
are the tensors they read (a relative-position bias, sequence lengths), lifted to graph inputs.
aot traces the node through its fake kernel and, for training, its registered autograd formula
(`torch.ops.ember.flex_attention_backward`); the kernel backend calls both as externs.

At the first call per shape the ops trace each mod to an aten graph over 0-dim tensors (aot's
tracer), translate it to C++ (ember.codegen.flex_cpp), build the kernel (ember.runtime, disk
cache) and run it. `check_mods` does the same translation at capture time, so a mod the kernel
cannot fuse is a graph break there, never a failure at run time.

Consumes: the op's tensors. Produces: (out, lse) and the gradients.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
from typing import Optional

import torch
from torch import Tensor

from .. import shapes
from ..aot import trace_aten
from ..decomp import get_decompositions
from ..codegen import flex_cpp
from ..errors import Unsupported
from ..logging import get_logger
from ..runtime import build as rt_build

#: mods key -> (score_mod graph | None, mask_mod graph | None); torch-level graphs whose
#: placeholders are (score, b, h, q_idx, kv_idx, *bufs) and (b, h, q_idx, kv_idx, *bufs)
MODS: dict[str, tuple] = {}
DTYPES = (torch.float32, torch.float64)
# backward formulas (tanh_backward, ...) as pointwise math the translation table covers
perf_log = get_logger("perf")
_DENSE_LOGGED: set = set()
_DECOMPS = {op: fn for op, fn in get_decompositions().items()
            if "backward" in op.name() or op in (torch.ops.aten.zeros_like.default,)}


def register_mods(score_gm, mask_gm) -> str:
    text = "\n".join(g.code if g is not None else "None" for g in (score_gm, mask_gm))
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    MODS.setdefault(key, (score_gm, mask_gm))
    return key


def _standins(dtype):
    """0-dim example inputs of a mod: score (the query dtype) and four int32 indices."""
    return [torch.zeros((), dtype=dtype)] + [torch.zeros((), dtype=torch.int32)] * 4


def _mask_as_score(mask_gm):
    """mask_mod(b, h, q, kv, *bufs) as a function of (score, b, h, q, kv, *bufs)."""
    return lambda s, b, h, q, kv, *bufs: mask_gm(b, h, q, kv, *bufs)


def _grad_of(gm):
    """d gm(score, ...) / d score, as a function of the same inputs."""
    def grad(s, *rest):
        with torch.enable_grad():
            s = s.detach().requires_grad_()
            out = gm(s, *rest)
            if not out.requires_grad:
                return torch.zeros_like(s)
            return torch.autograd.grad(out, s, torch.ones_like(out))[0]
    return grad


@functools.lru_cache(None)
def _aten_mod(key: str, which: int, dtype, buf_specs: tuple):
    """The aten graph of score_mod (which=0), mask_mod (1) or d score_mod / d score (2) over
    0-dim stand-ins and buffers of `buf_specs`."""
    gm = MODS[key][1 if which == 1 else 0]
    if gm is None:
        return None
    bufs = [torch.empty_strided(s, st, dtype=dt, device="meta") for s, st, dt in buf_specs]
    fn = (gm, _mask_as_score(gm), _grad_of(gm))[which]
    # the kernel backend runs graphs under inference mode, where autograd records nothing
    with torch.inference_mode(False):
        return trace_aten(fn, _standins(dtype) + bufs, decompositions=_DECOMPS)


def _buf_spec(bufs) -> tuple:
    return tuple((tuple(b.shape), tuple(b.stride()), b.dtype) for b in bufs)


def check_mods(key: str, dtype, score_bufs, mask_bufs) -> None:
    """Raise Unsupported (with the reason) unless both mods translate to C++."""
    _translated(key, dtype, _buf_spec(score_bufs), _buf_spec(mask_bufs))


@functools.lru_cache(None)
def _translated(key, dtype, score_spec, mask_spec, grad=False):
    """[(translated, [(buf name, dtype)], lifted constants)] for score_mod, mask_mod and, with
    grad=True, d score_mod / d score."""
    out = []
    mods = ((0, score_spec, "sm"), (1, mask_spec, "mm")) + (((2, score_spec, "sg"),) if grad else ())
    for which, spec, prefix in mods:
        gm = _aten_mod(key, which, dtype, spec)
        if gm is None:
            out.append((None, [], []))
            continue
        consts = gm.meta.get("constants", [])
        names = [f"{prefix}_buf{i}" for i in range(len(spec) + len(consts))]
        out.append((flex_cpp.translate(gm, prefix, names),
                    list(zip(names, [s[2] for s in spec] + [c.dtype for c in consts])), consts))
    return out


def _spec(q, k, v, block_mask, scale, block_size) -> flex_cpp.FlexSpec:
    B, HQ, LQ, D = q.shape
    HKV, LKV, DV = k.shape[1], k.shape[2], v.shape[3]
    mask = None
    if block_mask:
        kv_num, kv_idx, full_num, _, q_num, q_idx = block_mask[:6]
        mask = (kv_num.shape[0], kv_num.shape[1], kv_num.shape[2], kv_idx.shape[3],
                full_num is not None, q_num.shape[2] if q_num is not None else 1,
                q_idx.shape[3] if q_idx is not None else 1)
    return flex_cpp.FlexSpec(q.dtype, B, HQ, HKV, LQ, LKV, D, DV, float(scale), block_size[0],
                             block_size[1], mask)


@functools.lru_cache(None)
def _kernel(key, spec: flex_cpp.FlexSpec, score_spec, mask_spec):
    (score, sbufs, _), (mask, mbufs, _) = _translated(key, spec.dtype, score_spec, mask_spec)
    src = flex_cpp.forward_source(spec, score, mask, sbufs + mbufs)
    lib = ctypes.CDLL(str(rt_build.build(src, flags=rt_build.FMA_FLAGS)))
    fn = lib.flex_fwd
    fn.argtypes = [ctypes.c_void_p] * 10
    fn.restype = None
    rt_build.raise_kernel_errors(lib, fn, "flex_fwd")   # a mod indexing a captured tensor
    return fn, lib


def _ptr(t):
    return t.data_ptr() if t is not None else None


def _block_args(block_mask, n=4):
    if not block_mask:
        return [None] * n
    return [t.contiguous() if t is not None else None for t in block_mask[:n]]


# --- the ops ------------------------------------------------------------------------------------

@functools.lru_cache(None)
def _bwd_kernel(key, spec: flex_cpp.FlexSpec, score_spec, mask_spec, need: tuple):
    """The backward kernel; `need[i]`: score buffer i needs a gradient (the joint path)."""
    mods = _translated(key, spec.dtype, score_spec, mask_spec, grad=True)
    (score, sbufs, _), (mask, mbufs, _), (grad, gbufs, _) = mods
    consts = [c for _, _, c in mods]
    bufs, joint, accs = sbufs + mbufs + gbufs, None, []
    if any(need):
        score, joint, jbufs, jconsts, accs = _joint_translation(key, spec.dtype, score_spec, need)
        bufs += jbufs
        consts.append(jconsts)
    src = flex_cpp.backward_source(spec, score, grad, mask, bufs, joint, accs)
    lib = ctypes.CDLL(str(rt_build.build(src, flags=rt_build.FMA_FLAGS)))
    fn = lib.flex_bwd
    fn.argtypes = [ctypes.c_void_p] * 19
    fn.restype = None
    rt_build.raise_kernel_errors(lib, fn, "flex_bwd")   # a mod indexing a captured tensor
    return fn, lib, consts


class _Substitute(torch.fx.Interpreter):
    """Run an aten graph with the values of some nodes given (by node name)."""

    def __init__(self, gm, given: dict):
        super().__init__(gm)
        self.given = given

    def run_node(self, n):
        return self.given[n.name] if n.name in self.given else super().run_node(n)


def _joint_translation(key, dtype, score_spec, need):
    """score_mod translated with its loads from the buffers that need gradients recorded, and
    its derivative with respect to (score, each such load) as a scalar graph of (score, b, h,
    q, kv, d_out, loaded values..., buffers...), translated."""
    aten_gm = _aten_mod(key, 0, dtype, score_spec)
    consts = aten_gm.meta.get("constants", [])
    names = [f"sm_buf{i}" for i in range(len(score_spec) + len(consts))]
    for i, (size, stride, _) in enumerate(score_spec):
        if need[i] and not shapes.dense_strides(size, stride):
            raise Unsupported("flex_attention backward: a captured tensor with overlapping "
                              "strides needs a gradient")
    score = flex_cpp.translate(aten_gm, "sm", names,
                               watch=[names[i] for i, n in enumerate(need) if n])
    loads = [n for *_, n in score.loads]
    by_name = {n.name: n for n in aten_gm.graph.nodes}
    xs = [torch.zeros((), dtype=by_name[n].meta["val"].dtype) for n in loads]
    bufs = [torch.empty_strided(sz, st, dtype=dt, device="meta") for sz, st, dt in score_spec]

    def joint(s, b, h, q, kv, gz, *rest):
        x, other = list(rest[:len(xs)]), rest[len(xs):]
        with torch.enable_grad():
            s = s.detach().requires_grad_()
            x = [t.detach().requires_grad_() for t in x]
            out = _Substitute(aten_gm, dict(zip(loads, x))).run(s, b, h, q, kv, *other)[0]
            grads = torch.autograd.grad(out, [s, *x], gz, allow_unused=True)
        return [torch.zeros_like(w) if g is None else g for g, w in zip(grads, [s, *x])]
    with torch.inference_mode(False):
        jgm = trace_aten(joint, _standins(dtype) + [torch.zeros((), dtype=dtype)] + xs + bufs +
                         list(consts), decompositions=_DECOMPS)
    jconsts = jgm.meta.get("constants", [])
    n_j = len(bufs) + len(consts) + len(jconsts)
    jnames = [f"sj_buf{i}" for i in range(n_j)]
    joint_t = flex_cpp.translate(jgm, "sj", jnames, n_scalars=6 + len(xs))
    dtypes = [d for *_, d in score_spec] + [c.dtype for c in consts] + [c.dtype for c in jconsts]
    accs = [(names[i], flex_cpp.ctype(dt), _extent(sz, st))
            for i, ((sz, st, dt), n) in enumerate(zip(score_spec, need)) if n]
    return score, joint_t, list(zip(jnames, dtypes)), list(consts) + list(jconsts), accs


def _extent(size, stride) -> int:
    return 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0


def _buf_array(bufs):
    arr = (ctypes.c_void_p * max(1, len(bufs)))(*[b.data_ptr() for b in bufs])
    return ctypes.cast(arr, ctypes.c_void_p), arr


@torch.library.custom_op("ember::flex_attention", mutates_args=())
def flex_attention(q: Tensor, k: Tensor, v: Tensor, block_mask: list[Optional[Tensor]],
                   score_bufs: list[Tensor], mask_bufs: list[Tensor], mods: str, scale: float,
                   block_size: list[int]) -> tuple[Tensor, Tensor]:
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    spec = _spec(q, k, v, block_mask, scale, block_size)
    fn, _ = _kernel(mods, spec, _buf_spec(score_bufs), _buf_spec(mask_bufs))
    (_, _, sconsts), (_, _, mconsts) = _translated(mods, spec.dtype, _buf_spec(score_bufs),
                                                   _buf_spec(mask_bufs))
    arr, _keep = _buf_array([*score_bufs, *sconsts, *mask_bufs, *mconsts])
    out = q.new_empty(q.shape[:3] + (v.shape[3],))
    lse = q.new_empty(q.shape[:3])
    kv = _block_args(block_mask)
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
       *[_ptr(t) for t in kv], arr)
    return out, lse


@flex_attention.register_fake
def _(q, k, v, block_mask, score_bufs, mask_bufs, mods, scale, block_size):
    return q.new_empty(q.shape[:3] + (v.shape[3],)), q.new_empty(q.shape[:3])


@torch.library.custom_op("ember::flex_attention_backward", mutates_args=())
def flex_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                            grad_out: Tensor, grad_lse: Optional[Tensor],
                            block_mask: list[Optional[Tensor]], score_bufs: list[Tensor],
                            mask_bufs: list[Tensor], mods: str, scale: float,
                            block_size: list[int], buf_grads: list[bool]) -> list[Tensor]:
    """[dq, dk, dv, *d score_bufs] (one flat list: aot registers each output). The fused kernel;
    where it cannot be made (a derivative it cannot translate), autograd through the dense
    computation, logged once under EMBER_LOGS=perf."""
    need = tuple(bool(n) for n in buf_grads)
    fused = None
    if not (block_mask and block_mask[4] is None):
        try:
            fused = _bwd_kernel(mods, _spec(q, k, v, block_mask, scale, block_size),
                                _buf_spec(score_bufs), _buf_spec(mask_bufs), need)
        except Unsupported as e:
            reason = str(e).splitlines()[0]
    else:
        reason = "the block mask has no q_num_blocks/q_indices"
    if fused is None:
        if mods not in _DENSE_LOGGED:
            _DENSE_LOGGED.add(mods)
            perf_log.info("flex_attention backward runs dense (materializes the scores): %s",
                          reason)
        return _math_backward(q, k, v, grad_out, grad_lse, block_mask, score_bufs, mask_bufs,
                              mods, scale, block_size, buf_grads)
    fn, _, consts = fused
    q, k, v, out, grad_out = (t.contiguous() for t in (q, k, v, out, grad_out))
    arr, _keep = _buf_array([*score_bufs, *consts[0], *mask_bufs, *consts[1], *score_bufs,
                             *consts[2], *[t for c in consts[3:] for t in (*score_bufs, *c)]])
    gbufs = [torch.zeros_like(b) for b in score_bufs]     # same strides: offsets agree
    garr, _gkeep = _buf_array([g for g, n in zip(gbufs, need) if n])
    delta = (grad_out * out).sum(-1)
    if grad_lse is not None:
        delta = delta - grad_lse
    lse = lse.contiguous()
    dq, dk, dv = torch.zeros_like(q), torch.empty_like(k), torch.empty_like(v)
    masks = _block_args(block_mask, 8)
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), grad_out.data_ptr(), lse.data_ptr(),
       delta.contiguous().data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
       *[_ptr(t) for t in masks], arr, garr)
    return [dq, dk, dv, *gbufs]


@flex_attention_backward.register_fake
def _(q, k, v, out, lse, grad_out, grad_lse, block_mask, score_bufs, mask_bufs, mods, scale,
      block_size, buf_grads):
    return [torch.empty_like(t) for t in [q, k, v, *score_bufs]]


def _math_backward(q, k, v, grad_out, grad_lse, block_mask, score_bufs, mask_bufs, mods, scale,
                   block_size, diff):
    """Autograd through the dense computation (`dense_attention`; materializes the scores)."""
    # the kernel backend runs backward graphs under inference mode: leave it (and copy its
    # inference tensors, which autograd may not save) to differentiate here
    with torch.inference_mode(False), torch.enable_grad():
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        sb = [b.detach().clone().requires_grad_(d) for b, d in zip(score_bufs, diff)]
        block_mask = [t if t is None else t.clone() for t in block_mask]
        mask_bufs = [t.clone() for t in mask_bufs]
        grad_out = grad_out.clone()
        grad_lse = grad_lse if grad_lse is None else grad_lse.clone()
        o, lse = dense_attention(q, k, v, block_mask, sb, mask_bufs, mods, scale, block_size)
        outs, grads = [o], [grad_out]
        if grad_lse is not None:
            outs.append(lse)
            grads.append(grad_lse)
        wrt = [q, k, v] + [b for b, d in zip(sb, diff) if d]
        got = list(torch.autograd.grad(outs, wrt, grads, allow_unused=True))
    got = [torch.zeros_like(w) if g is None else g for g, w in zip(got, wrt)]
    it = iter(got[3:])
    bufs = [next(it) if d else torch.zeros_like(b) for b, d in zip(score_bufs, diff)]
    return got[:3] + bufs


def dense_attention(q, k, v, block_mask, score_bufs, mask_bufs, mods, scale, block_size):
    """(out, lse) by dense torch ops with the kernel's semantics: blocks the block mask does not
    list are skipped, full blocks skip mask_mod, a row attending nothing gives 0 and -inf. The
    mods run on broadcast index tensors, which is what eager's vmap over them computes."""
    score_gm, mask_gm = MODS[mods]
    B, HQ, LQ, _ = q.shape
    G, LKV = HQ // k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    ar = [torch.arange(n, dtype=torch.int32) for n in (B, HQ, LQ, LKV)]
    b, h, qi, kj = (a.view([-1 if i == d else 1 for i in range(4)]) for d, a in enumerate(ar))
    s = (q @ k.transpose(-1, -2)) * scale
    if score_gm is not None:
        s = score_gm(s, b, h, qi, kj, *score_bufs)
    if block_mask:
        partial, full = (_dense_blocks(n, i, LQ, LKV, block_size) for n, i in
                         (block_mask[:2], block_mask[2:4]))
        keep = partial if mask_gm is None else partial & mask_gm(b, h, qi, kj, *mask_bufs)
        s = s.masked_fill(~(keep | full), float("-inf"))
    m = s.detach().amax(-1, keepdim=True)
    m = torch.where(m == float("-inf"), 0.0, m)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    ok = l > 0
    l1 = torch.where(ok, l, 1.0)
    lse = torch.where(ok, m + torch.log(l1), float("-inf")).squeeze(-1)
    return (e / l1) @ v, lse


def _dense_blocks(num, idx, LQ, LKV, block_size):
    """[B, H, LQ, LKV] bool: the elements of the blocks the (num, idx) lists name."""
    if num is None:
        return torch.zeros(1, 1, LQ, LKV, dtype=torch.bool)
    nkb = -(-LKV // block_size[1])
    listed = torch.arange(idx.shape[-1]) < num.unsqueeze(-1)
    blocks = torch.zeros(idx.shape[:3] + (nkb + 1,), dtype=torch.bool)
    blocks.scatter_(-1, torch.where(listed, idx.long(), nkb), True)
    dense = blocks[..., :nkb].repeat_interleave(block_size[0], 2).repeat_interleave(
        block_size[1], 3)
    return dense[:, :, :LQ, :LKV]


def _setup(ctx, inputs, output):
    q, k, v, block_mask, score_bufs, mask_bufs, mods, scale, block_size = inputs
    ctx.save_for_backward(q, k, v, *output, *[t for t in block_mask if t is not None],
                          *score_bufs, *mask_bufs)
    ctx.layout = ([t is not None for t in block_mask], len(score_bufs), len(mask_bufs))
    ctx.mods, ctx.scale, ctx.block_size = mods, scale, block_size
    ctx.buf_grads = [b.requires_grad and b.is_floating_point() for b in score_bufs]


def _backward(ctx, grad_out, grad_lse):
    present, n_s, n_m = ctx.layout
    saved = list(ctx.saved_tensors)
    q, k, v, out, lse = saved[:5]
    it = iter(saved[5:])
    block_mask = [next(it) if p else None for p in present]
    score_bufs = [next(it) for _ in range(n_s)]
    mask_bufs = [next(it) for _ in range(n_m)]
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, *dbufs = flex_attention_backward(q, k, v, out, lse, grad_out, grad_lse, block_mask,
                                                score_bufs, mask_bufs, ctx.mods, ctx.scale,
                                                ctx.block_size, ctx.buf_grads)
    dbufs = [g if need else None for g, need in zip(dbufs, ctx.buf_grads)]
    return dq, dk, dv, [None] * len(present), dbufs, [None] * n_m, None, None, None


flex_attention.register_autograd(_backward, setup_context=_setup)
