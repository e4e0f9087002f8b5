"""Stage 6, codegen: kernels → Triton source (GPU, or CPU under TRITON_INTERPRET=1).

The same loop IR the C++ backend prints is run under `TritonHandler`, which answers each `ops`
call with one Triton temporary (CSE by expression text) from the table `TRITON`. A pure
pointwise kernel is a 1-D block over the flattened outer loops (`xindex`, tail masked by
`xmask`); any other kernel is a 2-D block `[XBLOCK, RBLOCK]` whose rows are outer indices and whose
columns walk each stage's inner dims (reduced dims, or the rest of a fused pointwise node).
A stage is *persistent* (one block holds the whole row, no loop) when every row fits in
`max_persistent` (1024) columns, else it loops over the row in RBLOCK steps with per-lane
accumulators reduced after the loop. Loop variables `v0..` are decoded from xindex/rindex, so
index expressions print straight from the sympy indices (FloorDiv → `//`, ModularIndexing →
`//`+`%`; Triton's int division truncates, which is floor for the non-negative indices here).
Index math is int64 when any buffer or loop is ≥ 2**31 elements, else int32.

Beyond the plain scheme: a pointwise xindex is decoded in the first store's stride order
(coalesced transposed writes); persistent kernels keep one decoded row across stages of the
same shape, so later stages reuse earlier values (softmax loads x once) and stores nobody reads
afterwards are dropped; column reductions ("outer" hint) loop over narrow RBLOCKs; var_mean's
two sums become one Welford pass in looped kernels (triton_welford.py); buffers the C++ backend
keeps as per-thread row scratch ("row_local") get a scratch buffer from the launcher.

This file is the vocabulary: the handler, the prelude every module defines, the index printing
and the row-loop helpers; triton_kernel.py lays each kernel out as a block with them.

Consumes: loop-IR bodies (`ops` calls). Produces: Triton statements and `TVal` temporaries.
"""
from __future__ import annotations

import dataclasses
import math

import sympy
import torch

from ..loopir.index import is_symbolic, numel, sym
from ..loopir.ops import BINARY, COMPARE, UNARY, OpsHandler, compute_dtype, set_handler
from .common import IndentedBuffer, index_printer, py_repr

MAX_PERSISTENT = 1024      # rows up to this many elements are reduced in one block
LOOP_RBLOCK = 512          # column block of looped reductions
INT32_LIMIT = 2 ** 31
OUTER_PERSISTENT_MAX = 32  # column reductions with longer rows loop over small RBLOCKs

TL_DTYPE = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

#: Helpers every generated module defines (plain @triton.jit functions, interpreter-safe).
PRELUDE = '''\
import triton
import triton.language as tl

_NAN = tl.constexpr(float("nan"))
_INF = tl.constexpr(float("inf"))


@triton.jit
def _prod_combine(a, b):
    return a * b


@triton.jit
def _welford_combine(mean1, m2_1, n1, mean2, m2_2, n2):
    n = n1 + n2
    delta = mean2 - mean1
    w2 = tl.where(n == 0, 0.0, n2 / tl.where(n == 0, 1.0, n))
    return mean1 + delta * w2, m2_1 + m2_2 + delta * delta * n1 * w2, n


@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def _round_half_even(x):
    r = tl.floor(x + 0.5)
    return tl.where((r - x == 0.5) & (r - 2 * tl.floor(r * 0.5) != 0), r - 1, r)


@triton.jit
def _sign(x):
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


@triton.jit
def _floordiv_int(a, b):
    q = a // b
    return q - ((a % b != 0) & ((a < 0) != (b < 0))).to(q.dtype)


@triton.jit
def _remainder(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _pow(a, b):
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    # nested where, not &: b is often a 0-d constant, which `&` rejects in the interpreter
    odd = (b - 2 * tl.floor(b * 0.5)) != 0
    r = tl.where(a < 0, tl.where(tl.floor(b) == b, tl.where(odd, -r, r), _NAN), r)
    return tl.where(b == 0, 1.0, r)


@triton.jit
def _tanh(x):
    # 1 - 2/(exp(2x)+1): no cancellation for large |x|, exact limits at +-inf
    e = tl.exp(-2 * tl.abs(x))
    t = (1 - e) / (1 + e)
    return tl.where(x < 0, -t, t)
'''

# op → Triton expression; {0}, {1} are operand temporaries. Ops missing here that only
# libdevice has (asin, lgamma, ...) are in LIBDEVICE and work on a GPU only.
TRITON = {
    "neg": "(-{0})", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
    "expm1": "(tl.exp({0}) - 1)", "log": "tl.log({0})", "log2": "tl.log2({0})",
    "log10": "(tl.log({0}) * 0.4342944819032518)", "log1p": "tl.log(1 + {0})",
    "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})", "sin": "tl.sin({0})", "cos": "tl.cos({0})",
    "tan": "(tl.sin({0}) / tl.cos({0}))", "sinh": "((tl.exp({0}) - tl.exp(-{0})) * 0.5)",
    "cosh": "((tl.exp({0}) + tl.exp(-{0})) * 0.5)", "tanh": "_tanh({0})",
    "sigmoid": "tl.sigmoid({0})", "erf": "tl.erf({0})", "erfc": "(1 - tl.erf({0}))",
    "reciprocal": "(1 / {0})", "relu": "tl.where({0} < 0, 0, {0})", "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})", "round": "_round_half_even({0})", "trunc": "_trunc({0})",
    "sign": "_sign({0})", "signbit": "({0} < 0)", "isnan": "({0} != {0})",
    "isinf": "(tl.abs({0}) == _INF)", "isfinite": "(({0} == {0}) & (tl.abs({0}) != _INF))",
    "logical_not": "({0} == 0)", "bitwise_not": "(~{0})", "square": "({0} * {0})",
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "floordiv": "_floordiv_int({0}, {1})", "truncdiv": "({0} // {1})",
    "remainder": "_remainder({0}, {1})", "fmod": "({0} % {1})", "pow": "_pow({0}, {1})",
    "maximum": "tl.maximum({0}, {1}, tl.PropagateNan.ALL)",
    "minimum": "tl.minimum({0}, {1}, tl.PropagateNan.ALL)",
    "hypot": "tl.sqrt({0} * {0} + {1} * {1})",
    "copysign": "tl.where(({1} < 0) | ((1 / {1}) < 0), -tl.abs({0}), tl.abs({0}))",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "(({0} != 0) & ({1} != 0))",
    "logical_or": "(({0} != 0) | ({1} != 0))", "logical_xor": "(({0} != 0) != ({1} != 0))",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "lshift": "({0} << {1})", "rshift": "({0} >> {1})",
}
LIBDEVICE = {"asin": "libdevice.asin({0})", "acos": "libdevice.acos({0})",
             "atan": "libdevice.atan({0})", "asinh": "libdevice.asinh({0})",
             "acosh": "libdevice.acosh({0})", "atanh": "libdevice.atanh({0})",
             "lgamma": "libdevice.lgamma({0})", "atan2": "libdevice.atan2({0}, {1})",
             "nextafter": "libdevice.nextafter({0}, {1})"}
# More accurate GPU versions of ops the portable table approximates.
LIBDEVICE_BETTER = {"expm1": "libdevice.expm1({0})", "log1p": "libdevice.log1p({0})",
                    "tanh": "libdevice.tanh({0})", "pow": "libdevice.pow({0}, {1})",
                    "erfc": "libdevice.erfc({0})", "tan": "libdevice.tan({0})",
                    "sinh": "libdevice.sinh({0})", "cosh": "libdevice.cosh({0})"}
INT_IDENTITY = frozenset(("floor", "ceil", "round", "trunc"))
assert set(TRITON) | set(LIBDEVICE) >= set(UNARY) | set(BINARY)


class TritonUnsupported(NotImplementedError):
    """An op this Triton build (the CPU interpreter) cannot run."""


# --- index printing ------------------------------------------------------------------------

texpr = index_printer("//")


# --- the handler ---------------------------------------------------------------------------

@dataclasses.dataclass
class TVal:
    """A Triton temporary. `level`: 0 scalar, 1 varies along x, 2 along x and r."""
    code: str
    dtype: torch.dtype
    level: int = 0
    const: object = None

    def __str__(self):
        return self.code


def tl_dtype(dtype) -> str:
    return TL_DTYPE[dtype]


def _const_text(value, dtype) -> str:
    if dtype == torch.bool:
        return f"tl.full([], {int(bool(value))}, tl.int1)"
    if dtype.is_floating_point:
        v = float(value)
        text = "_NAN" if math.isnan(v) else ("_INF" if v == math.inf else (
            "-_INF" if v == -math.inf else repr(v)))
        return f"tl.full([], {text}, {tl_dtype(dtype)})"
    return f"tl.full([], {int(value)}, {tl_dtype(dtype)})"


class TritonHandler:
    """Emits Triton statements into `self.code`; returns TVal temporaries."""

    def __init__(self, buffers: dict, local: set, *, interpret: bool = True):
        self.buffers, self.local, self.interpret = buffers, local, interpret
        self.code = IndentedBuffer(1)
        self.cse: dict = {}
        self.stored: dict = {}
        self.n = 0
        self.levels: dict = {}     # symbol name -> level
        self.loop_mask = TVal("xmask", torch.bool, 1)
        self.masks: list = []      # ops.masked conditions in force
        self.shapes = {1: "[XBLOCK]", 2: "[XBLOCK, RBLOCK]"}
        self.used_libdevice = False
        self.store_lines: dict = {}   # buffer name -> [(buffer, line index)] of its tl.store
        self.mem_loaded: set = set()  # buffers read back from memory in this kernel

    def fresh(self, prefix="tmp") -> str:
        self.n += 1
        return f"{prefix}{self.n - 1}"

    def emit(self, expr: str, dtype, level: int) -> TVal:
        key = (expr, dtype)
        hit = self.cse.get(key)
        if hit is not None:
            return hit
        name = self.fresh()
        self.code.writeline(f"{name} = {expr}")
        val = TVal(name, dtype, level)
        self.cse[key] = val
        return val

    def push(self):
        return dict(self.cse), dict(self.stored)

    def pop(self, saved):
        self.cse, self.stored = saved

    def index_level(self, index) -> int:
        return max((self.levels.get(s.name, 0) for s in index.free_symbols), default=0)

    # --- memory ---
    def _mask(self) -> TVal:
        m = self.loop_mask
        for extra in self.masks:
            m = self.emit(f"{m} & {extra}", torch.bool, max(m.level, extra.level))
        return m

    def _ptr(self, name, index, level):
        idx = texpr(index)
        ptr = f"{name} + {idx}" if idx != "0" else name
        ilevel = self.index_level(index)
        if ilevel < level:
            ptr = f"tl.broadcast_to({ptr}, {self.shapes[level]})"
        return ptr

    def load(self, name, index):
        index = sympy.expand(index)
        key = (name, texpr(index))
        hit = self.stored.get(key)
        if hit is not None:
            return hit
        if name in self.local:
            raise AssertionError(f"local buffer {name} read before it is written")
        self.mem_loaded.add(name)
        mask = self._mask()
        level = max(self.index_level(index), mask.level)
        dt = self.buffers[name].dtype
        v = self.emit(f"tl.load({self._ptr(name, index, level)}, {mask}, other=0)", dt, level)
        if dt in (torch.float16, torch.bfloat16):
            v = self.emit(f"{v}.to(tl.float32)", torch.float32, level)
        return v

    def store(self, name, index, value):
        index = sympy.expand(index)
        dt = self.buffers[name].dtype
        value = self._as(value, compute_dtype(dt))
        self.stored[(name, texpr(index))] = value
        if name in self.local:
            return None
        mask = self._mask()
        level = max(self.index_level(index), mask.level, value.level)
        out = value if dt == compute_dtype(dt) else f"{value}.to({tl_dtype(dt)})"
        self.store_lines.setdefault(name, []).append((self.code, len(self.code.lines)))
        self.code.writeline(f"tl.store({self._ptr(name, index, level)}, {out}, {mask})")
        return None

    # --- values ---
    def constant(self, value, dtype):
        dtype = compute_dtype(dtype) if dtype is not None else (
            torch.float32 if isinstance(value, float) else torch.int64)
        if is_symbolic(value):          # a scalar computed from sizes (dynamic shapes)
            text = texpr(value) if value.is_integer else py_repr(value)
            return self.emit(f"tl.full([], 0, {tl_dtype(dtype)}) + ({text})", dtype, 0)
        v = self.emit(_const_text(value, dtype), dtype, 0)
        return TVal(v.code, dtype, 0, const=value)

    def index_expr(self, expr, dtype):
        dtype = compute_dtype(dtype)
        expr = sympy.expand(expr)
        if not expr.free_symbols:
            return self.constant(int(expr), dtype)
        return self.emit(f"({texpr(expr)}).to({tl_dtype(dtype)})", dtype, self.index_level(expr))

    def to_dtype(self, x, dtype):
        if dtype in (torch.bfloat16, torch.float16):
            x = self._as(x, torch.float32)
            return self.emit(f"{x}.to({tl_dtype(dtype)}).to(tl.float32)", torch.float32, x.level)
        return self._as(x, dtype)

    def _as(self, x, dtype):
        if not isinstance(x, TVal):
            return self.constant(x, dtype)
        if x.dtype == dtype:
            return x
        if x.const is not None:
            return self.constant(x.const, dtype)
        if dtype == torch.bool:
            return self.emit(f"({x} != 0)", torch.bool, x.level)
        return self.emit(f"{x}.to({tl_dtype(dtype)})", dtype, x.level)

    def where(self, c, a, b):
        dt = a.dtype if isinstance(a, TVal) else b.dtype
        a, b, c = self._as(a, dt), self._as(b, dt), self._as(c, torch.bool)
        return self.emit(f"tl.where({c}, {a}, {b})", dt, max(a.level, b.level, c.level))

    def masked(self, mask, body, other):
        mask = self._as(mask, torch.bool)
        self.masks.append(mask)
        try:
            value = body()
        finally:
            self.masks.pop()
        value = self._as(value, value.dtype) if isinstance(value, TVal) else self.constant(
            value, torch.float32)
        o = self.constant(other, value.dtype)
        return self.emit(f"tl.where({mask}, {value}, {o})", value.dtype,
                         max(mask.level, value.level))

    def indirect_indexing(self, value, size, check=True):
        v = self._as(value, torch.int64)
        name = self.fresh("idx")
        self.code.writeline(f"{name} = tl.where({v} < 0, {v} + {texpr(sympy.sympify(size))}, {v})")
        self.levels[name] = v.level
        return sym(name)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        fmt = TRITON.get(name)
        if not self.interpret and name in LIBDEVICE_BETTER:
            fmt = LIBDEVICE_BETTER[name]
        if fmt is None and name in LIBDEVICE:
            if self.interpret:
                raise TritonUnsupported(f"ops.{name} needs libdevice (not in the Triton "
                                        f"interpreter)")
            fmt = LIBDEVICE[name]
        if fmt is None:
            raise AttributeError(name)
        if fmt.startswith("libdevice"):
            self.used_libdevice = True

        def op(*args):
            dt = next((a.dtype for a in args if isinstance(a, TVal)), torch.float32)
            if name in INT_IDENTITY and not dt.is_floating_point:
                return args[0]
            if dt == torch.bool and name in ("neg", "abs", "bitwise_not"):
                return args[0] if name == "abs" else self.emit(f"({args[0]} == 0)", dt,
                                                               args[0].level)
            vals = [self._as(a, dt) for a in args]
            out = torch.bool if name in COMPARE else dt
            return self.emit(fmt.format(*vals), out, max(v.level for v in vals))
        return op


# --- kernels -------------------------------------------------------------------------------

@dataclasses.dataclass
class TritonKernelSource:
    name: str
    source: str            # the @triton.jit function
    args: list             # buffer names in argument order
    kind: str              # "pointwise" | "reduction"
    xnumel: int
    rnumel: int            # max row length (1 for pointwise)
    persistent: bool
    index_dtype: str       # "tl.int32" | "tl.int64"
    libdevice: bool = False
    elided: list = dataclasses.field(default_factory=list)   # stores dropped as dead
    welford: int = 0       # sum / sum-of-squared-deviation pairs fused into one welford loop
    scratch: list = dataclasses.field(default_factory=list)  # extra params the launcher allocates
    hint: str = ""         # "outer": rows are strided, columns contiguous (column reductions)


def _loop_var(i):
    return sym(f"v{i}")


def _open_rloop(code, h, stage, rn, rv) -> None:
    """Open a looped reduction's `for roffset` block: rindex/rmask, the decoded reduction vars and
    the loop mask. The caller closes it (code.level -= 1)."""
    code.writeline(f"for roffset in range(0, {_size(rn)}, RBLOCK):")
    code.level += 1
    code.writeline("rindex = roffset + rbase")
    code.writeline(f"rmask = rindex < {_size(rn)}")
    h.levels["rindex"] = 2
    _decode(code, "rindex", list(stage.inner), rv, h, 2)
    h.loop_mask = h.emit("xmask & rmask", torch.bool, 2)


def _decode(code, flat: str, sizes, vars_, handler, level):
    """vars_[i] = digit i of `flat` in the mixed radix `sizes` (outermost first)."""
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= s
    strides.reverse()
    for i, (v, s, st) in enumerate(zip(vars_, sizes, strides)):
        e = flat if st == 1 else f"({flat} // {_size(st)})"
        if i > 0:
            e = f"{e} % {_size(s)}"
        code.writeline(f"{v.name} = {e}")
        handler.levels[v.name] = level


def _size(x) -> str:
    """A size in kernel source: an int, or a parenthesized expression of the size parameters."""
    return texpr(sympy.sympify(x))


def _row_rnumel(stage):
    return numel(stage.inner) if stage.inner else 1


def _full2(value, dt) -> str:
    inner = _const_text(value, dt).replace("tl.full([], ", "tl.full([XBLOCK, RBLOCK], ")
    return inner


class _ReadCollector(OpsHandler):
    def __init__(self):
        self.names = set()

    def load(self, name, index):
        self.names.add(name)

    def masked(self, mask, body, other):
        return body()

    def indirect_indexing(self, value, size, check=True):
        return sym("ind")

    def default(self, name, *args, **kwargs):
        return None


def _reads(node, xv, rv, stage) -> set:
    c = _ReadCollector()
    with set_handler(c):
        if stage.kind == "pointwise":
            node.store_pointwise(xv + rv)
        else:
            node.reduction_value(xv, rv)
    return c.names
