"""Stage 6, codegen: kernels → one C++ translation unit (OpenMP + SIMD), no torch headers.

Each `Kernel` becomes `extern "C" void kernelN(T* buf, ...)` taking raw pointers. Bodies are
produced by running the loop IR under `CppHandler`, which emits one typed temporary per op
(CSE by expression text). The outer loop is `#pragma omp parallel for` when there is enough
work; contiguous inner loops get `#pragma omp simd` (with reduction clauses for accumulators);
a kernel that is one big reduction to a scalar uses per-thread partials. Statements that do not
change along the simd loop are hoisted before it, and masked loads are branch-free where they
can be (clamped indices, selects; see CppHandler.masked): g++ 12 does not vectorize an `if`
around a load, nor a plain select, when the condition is loop-invariant (channels-last pooling). fp16/bf16 are loaded
as float and accumulated in float. Math functions come from the prelude (ember::exp etc.),
written so GCC can vectorize them without -ffast-math.

Consumes: Kernel steps (schedule.fuse), buffers by name. Produces: C++ source + kernel argument
lists (buffer names, in order) for the wrapper.
"""
from __future__ import annotations

import math
import re

import sympy
import torch

from ..loopir.index import (SIZE_NAME, FloorDiv, ModularIndexing, hint, is_symbolic, numel,
                            simplify_index, sym)
from ..loopir.ops import BINARY, COMPARE, UNARY, OpsHandler, compute_dtype, set_handler
from .common import CTYPE, IndentedBuffer, index_printer
from .cpp_prelude import PRELUDE

PARALLEL_MIN_WORK = 32768
UNROLL = 2      # a pointwise kernel's innermost dim at most this long is unrolled (a pair)


# --- index printing ------------------------------------------------------------------------

def _int(v) -> str:
    if isinstance(v, sympy.Basic) and not v.is_Integer:
        return cexpr(v)          # a symbolic size: an expression over the size parameters
    v = int(v)
    return f"{v}LL" if abs(v) >= 2 ** 31 else str(v)


cexpr = index_printer("/", _int)


def _blocks(n, block: int) -> str:
    """C++ for ceil(n / block): n an int or a size expression."""
    return _int(FloorDiv(sympy.sympify(n) + block - 1, sympy.Integer(block)))



# --- the handler ---------------------------------------------------------------------------

LOOP_VAR = re.compile(r"v\d+")
TEMP = re.compile(r"\b(?:v|tmp|idx|acc|part)\d+\b")    # names the generated code declares
# integer ops that fault on a zero divisor (a masked-off lane may hold any value)
INT_TRAPS = {"floordiv", "truncdiv", "remainder", "fmod", "truediv"}

INT_DIV = re.compile(r"ember::i(truncdiv|mod|floordiv|remainder)\(")

CPP = {
    "neg": "(-{0})", "abs": "ember::abs_({0})", "exp": "ember::exp({0})", "exp2": "std::exp2({0})",
    "expm1": "ember::expm1({0})", "log": "ember::log({0})", "log2": "std::log2({0})",
    "log10": "std::log10({0})", "log1p": "ember::log1p({0})", "sqrt": "std::sqrt({0})",
    "rsqrt": "ember::rsqrt({0})", "sin": "std::sin({0})", "cos": "std::cos({0})",
    "tan": "std::tan({0})", "asin": "std::asin({0})", "acos": "std::acos({0})",
    "atan": "std::atan({0})", "sinh": "std::sinh({0})", "cosh": "std::cosh({0})",
    "tanh": "ember::tanh({0})", "asinh": "std::asinh({0})", "acosh": "std::acosh({0})",
    "atanh": "std::atanh({0})", "sigmoid": "ember::sigmoid({0})", "erf": "ember::erf({0})",
    "erfc": "std::erfc({0})", "reciprocal": "ember::reciprocal({0})", "relu": "ember::relu({0})",
    "floor": "std::floor({0})", "ceil": "std::ceil({0})", "round": "std::nearbyint({0})",
    "trunc": "std::trunc({0})", "sign": "ember::sign({0})", "signbit": "std::signbit({0})",
    "isnan": "ember::isnan_({0})", "isinf": "std::isinf({0})", "isfinite": "std::isfinite({0})",
    "logical_not": "(!{0})", "bitwise_not": "ember::bitwise_not({0})",
    "lgamma": "std::lgamma({0})", "square": "({0} * {0})",
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "floordiv": "ember::floordiv({0}, {1})", "truncdiv": "({0} / {1})",
    "remainder": "ember::remainder({0}, {1})", "fmod": "std::fmod({0}, {1})",
    "pow": "ember::pow_({0}, {1})", "maximum": "ember::maximum({0}, {1})",
    "minimum": "ember::minimum({0}, {1})", "atan2": "std::atan2({0}, {1})",
    "hypot": "std::hypot({0}, {1})", "copysign": "std::copysign({0}, {1})",
    "nextafter": "std::nextafter({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "({0} && {1})",
    "logical_or": "({0} || {1})", "logical_xor": "(static_cast<bool>({0}) != static_cast<bool>({1}))",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "lshift": "({0} << {1})", "rshift": "({0} >> {1})",
}
assert set(CPP) >= set(UNARY) | set(BINARY)
# Integer (not bool) operands: eager wraps around in the type, C++ signed overflow is UB and
# std::pow/std::fmod would compute in double. Integer-only, so float kernels are unchanged.
CPP_INT = {
    "add": "ember::wadd({0}, {1})", "sub": "ember::wsub({0}, {1})",
    "mul": "ember::wmul({0}, {1})", "square": "ember::wmul({0}, {0})",
    "neg": "ember::wneg({0})", "abs": "ember::wabs({0})", "pow": "ember::ipow({0}, {1})",
    "fmod": "ember::imod({0}, {1})", "truncdiv": "ember::itruncdiv({0}, {1})",
    "floordiv": "ember::ifloordiv({0}, {1})", "remainder": "ember::iremainder({0}, {1})",
    "lshift": "ember::ishl({0}, {1})", "rshift": "ember::ishr({0}, {1})",
}


class CppVal:
    __slots__ = ("code", "dtype")

    def __init__(self, code: str, dtype: torch.dtype):
        self.code, self.dtype = code, dtype

    def __str__(self):
        return self.code


def _is_int(dtype) -> bool:
    return not dtype.is_floating_point and dtype != torch.bool


def ctype(dtype) -> str:
    return CTYPE[dtype]


def literal(value, dtype) -> str:
    dtype = compute_dtype(dtype) if dtype is not None else (
        torch.float32 if isinstance(value, float) else torch.int64)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        t = ctype(dtype)
        if math.isnan(v):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}std::numeric_limits<{t}>::infinity()"
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        return text + ("f" if dtype == torch.float32 else "")
    v = int(value)
    return f"static_cast<{ctype(dtype)}>({_int(v)})"


class CppHandler:
    """Emits C++ statements into `self.code`; returns CppVal temporaries."""

    def __init__(self, buffers: dict, local: set, row_local=None, outer_vars=()):
        self.buffers = buffers
        self.local = local
        self.row_local = row_local or {}
        self.row_subs = {v: sympy.Integer(0) for v in outer_vars}
        self.code = IndentedBuffer()
        self.cse: dict = {}
        self.stored: dict = {}
        self.n = 0
        self.subs: dict = {}      # merged loop dims: var -> 0 (see plan_loops)
        self.load_mask: str | None = None   # inside a branch-free masked body (see masked)
        self.ors: dict = {}       # logical_or result -> its operands (see where)
        self.need_if = False      # the masked body wants the `if` form (see masked)
        self.ranges: dict = {}    # loop var -> its size, for simplify_index
        self.simd = None          # (var, size) of the `omp simd` loop being emitted, if any
        self.hoisted = None       # IndentedBuffer: statements placed before that loop
        self.hoisted_cse: dict = {}   # their temporaries, valid in the whole loop body
        self.invariant: set = set()   # temporaries declared before that loop (or hoisted)
        self.writes: set = set()      # buffers the kernel stores (their loads are not hoisted)

    def simple(self, index):
        return simplify_index(sympy.expand(index), self.ranges)

    def idx(self, index) -> str:
        index = self.simple(index)
        if self.subs:
            index = index.xreplace(self.subs)
        return cexpr(index)

    def fresh(self, prefix="tmp") -> str:
        self.n += 1
        return f"{prefix}{self.n - 1}"

    def emit(self, expr: str, dtype, hoist: bool = True, load: bool = False) -> CppVal:
        """A temporary for `expr` (CSE by text). Inside a simd loop an expression that does not
        change along it is hoisted before the loop (also out of a masked `if` body: unless
        hoist=False it cannot fault, see _hoistable), so the vectorizer sees a uniform value.
        `load`: expr is one load whose index is checked like an expression (see load)."""
        key = (expr, dtype)
        hit = self.cse.get(key) or self.hoisted_cse.get(key)
        if hit is not None:
            return hit
        name = self.fresh()
        line = f"{ctype(dtype)} {name} = {expr};"
        if self.simd is None:
            self.invariant.add(name)
            self.code.writeline(line)
        elif hoist and self.is_invariant(expr, load) and self._hoistable(expr):
            self.invariant.add(name)
            self.hoisted.writeline(line)
            self.hoisted_cse[key] = CppVal(name, dtype)
        else:
            self.code.writeline(line)
        val = CppVal(name, dtype)
        self.cse[key] = val
        return val

    def is_invariant(self, expr: str, load: bool = False) -> bool:
        """Whether C++ `expr` has one value for all iterations of the simd loop: no load (but
        the one a `load` expr is), and every name in it an outer loop var or an invariant
        temporary. (Accumulators, `if`-form results and indirect indices are never invariant.)"""
        if self.simd is None:
            return True
        if "[" in expr and not load:
            return False
        simd = str(self.simd[0])
        return all(t != simd and (t[0] == "v" or t in self.invariant) for t in TEMP.findall(expr))

    @staticmethod
    def _hoistable(expr: str) -> bool:
        """No integer division by a value (ops with a zero check) and no index division by a
        size symbol (a size may be 0 where the loop would not run)."""
        return not INT_DIV.search(expr) and not (SIZE_NAME.search(expr)
                                                and ("/" in expr or "%" in expr))

    # scopes: temporaries declared inside a block are forgotten when it closes
    def push(self):
        return dict(self.cse), dict(self.stored)

    def pop(self, saved):
        self.cse, self.stored = saved

    # --- memory ---
    def load(self, name, index):
        idx = self.idx(index)
        hit = self.stored.get((name, idx))
        if hit is not None:
            return hit
        if name in self.row_local:
            if self.load_mask:          # row-local arrays are small: no clamped form for them
                self.need_if = True
            return self.emit(f"{name}_row[{self.idx(self.simple(index).xreplace(self.row_subs))}]",
                             compute_dtype(self.buffers[name].dtype))
        if self.load_mask:
            idx = self._clamped(name, self.simple(index).xreplace(self.subs), idx)
        if name in self.local:
            raise AssertionError(f"local buffer {name} read before it is written")
        dt = self.buffers[name].dtype
        # A load at an index the simd loop does not move (a per-row scale, a per-head bias) is
        # hoisted before the loop like any invariant expression, and what it feeds with it
        # (Swin v2's exp(min(logit_scale[h], log 100))): in the loop, g++ cannot prove that the
        # kernel's stores leave it unchanged, reloads it in the latch (PRE) and then gives up
        # if-converting the loop ("control flow in loop"), or keeps a select on a now
        # invariant compare that it cannot vectorize. Not under a mask (the index may be out of
        # bounds there), not a buffer this kernel writes, and only when the loop surely runs.
        hoist = (self.load_mask is None and name not in self.writes and self.simd is not None
                 and not is_symbolic(self.simd[1]) and int(self.simd[1]) > 0)
        if dt == torch.bfloat16:
            return self.emit(f"ember::bf16_to_float({name}[{idx}])", torch.float32, hoist, True)
        if dt == torch.float16:
            return self.emit(f"static_cast<float>({name}[{idx}])", torch.float32, hoist, True)
        return self.emit(f"{name}[{idx}]", dt, hoist, True)

    def store(self, name, index, value):
        idx = self.idx(index)
        dt = self.buffers[name].dtype
        value = self._as(value, compute_dtype(dt))
        self.stored[(name, idx)] = value
        if name in self.row_local:
            ridx = self.idx(self.simple(index).xreplace(self.row_subs))
            self.code.writeline(f"{name}_row[{ridx}] = {value};")
            return None
        if name in self.local:
            return None
        if dt == torch.bfloat16:
            self.code.writeline(f"{name}[{idx}] = ember::float_to_bf16({value});")
        elif dt == torch.float16:
            self.code.writeline(f"{name}[{idx}] = static_cast<_Float16>({value});")
        else:
            self.code.writeline(f"{name}[{idx}] = {value};")
        return None

    # --- values ---
    def constant(self, value, dtype):
        dtype = compute_dtype(dtype) if dtype is not None else (
            torch.float32 if isinstance(value, float) else torch.int64)
        if is_symbolic(value):          # a scalar computed from sizes (dynamic shapes)
            text = cexpr(value) if value.is_integer else sympy.ccode(sympy.N(value))
            return self.emit(f"static_cast<{ctype(dtype)}>({text})", dtype)
        return CppVal(literal(value, dtype), dtype)

    def index_expr(self, expr, dtype):
        dtype = compute_dtype(dtype)
        return self.emit(f"static_cast<{ctype(dtype)}>({self.idx(expr)})", dtype)

    def to_dtype(self, x, dtype):
        if dtype == torch.bfloat16:
            return self.emit(f"ember::round_bf16({self._as(x, torch.float32)})", torch.float32)
        if dtype == torch.float16:
            return self.emit(f"ember::round_half({self._as(x, torch.float32)})", torch.float32)
        return self._as(x, dtype)

    def _as(self, x, dtype):
        if not isinstance(x, CppVal):
            return self.constant(x, dtype)
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self.emit(f"({x} != 0)", torch.bool)
        return self.emit(f"static_cast<{ctype(dtype)}>({x})", dtype)

    def where(self, c, a, b):
        if str(c) in self.ors:
            # (x || y) ? a : b as y ? a : (x ? a : b): g++ 12 does not vectorize a select on
            # an or of two float compares (max pooling's `v > best || isnan(v)`)
            x, y = self.ors[str(c)]
            return self.where(y, a, self.where(x, a, b))
        dt = a.dtype if isinstance(a, CppVal) else b.dtype
        a, b, c = self._as(a, dt), self._as(b, dt), self._as(c, torch.bool)
        return self.emit(self._select(c, a, b), dt)

    def _select(self, c, a, b) -> str:
        if self.simd is not None and self.is_invariant(str(c)):
            return f"ember::pick({c}, {a}, {b})"
        return f"({c} ? {a} : {b})"

    def _clamped(self, name: str, index, idx: str) -> str:
        """A load's index inside a branch-free masked body, made safe for a masked-off lane (its
        value is then not selected):
        - contiguous in the simd loop var v (index = rest + c*v) under a mask that does not
          change along v (channels-last pooling windows, padding of outer dims): `rest` is
          clamped so all lanes stay in the buffer. For a lane that is on, the whole vector is
          (the mask holds for all v), so the clamp changes nothing; the clamp is invariant, so
          g++ hoists it and emits a plain vector load plus a select.
        - otherwise clamped as a whole into the buffer: a 32-bit clamp becomes a vector gather
          (strided NCHW pooling windows). Not `mask ? idx : 0`: g++ turns that back into a
          masked load, which it does not vectorize.
        A load contiguous in v under a mask that changes along v keeps the `if` form (padding or
        cat along the last dim): there g++'s masked vector load beats a gather."""
        buf = self.buffers[name]
        extent = 1 + sum((sz - 1) * st for sz, st in zip(buf.size, buf.stride))
        if is_symbolic(extent) or extent <= 0 or 0 in buf.size:
            # (a symbolic buffer may be empty at run time: nothing to clamp into)
            self.need_if = True
            return idx
        rebased = self._rebased(index, extent)
        if rebased is not None:
            return rebased
        contiguous = any(index.coeff(v) == 1 for v in index.free_symbols
                         if LOOP_VAR.fullmatch(str(v)))
        if contiguous:
            self.need_if = True
            return idx
        it = "int32_t" if extent < 2 ** 31 else "int64_t"
        return f"std::min<{it}>(std::max<{it}>(static_cast<{it}>({idx}), 0), {extent - 1})"

    def _rebased(self, index, extent) -> str | None:
        """`clamp(rest) + c*v` for a load rest + c*v contiguous-ish in the simd var v under an
        invariant mask (see _clamped), or None."""
        if self.simd is None or not self.is_invariant(self.load_mask):
            return None
        v, n = self.simd
        e = self.simple(index).xreplace(self.subs) if self.subs else self.simple(index)
        c = e.coeff(v)
        rest = sympy.expand(e - c * v)
        if not (c.is_Integer and 1 <= c <= 4) or rest.has(v) or is_symbolic(n):
            return None
        hi = extent - 1 - int(c) * (int(n) - 1)
        if hi < 0:
            return None
        base = self.emit(f"std::min<int64_t>(std::max<int64_t>({cexpr(rest)}, 0), {_int(hi)})",
                         torch.int64)
        return f"{base} + {cexpr(c * v)}"

    def masked(self, mask, body, other):
        """`mask ? body() : other`. Branch-free when the body cannot fault on a masked-off lane
        (its loads are clamped into their buffers, no integer division, no indirect index) and
        no load is contiguous (see _clamped): then strided windows (max pooling) vectorize.
        Otherwise an `if` around the body."""
        mask = self._as(mask, torch.bool)
        saved = self.push()
        outer_code, outer_mask, outer_trap = self.code, self.load_mask, self.need_if
        self.code = IndentedBuffer(outer_code.level + 1)
        self.load_mask = f"{outer_mask} && {mask}" if outer_mask else str(mask)
        self.need_if = False
        value = body()
        inner, trap = self.code, self.need_if
        self.code, self.load_mask, self.need_if = outer_code, outer_mask, outer_trap or trap
        self.pop(saved)
        dt = value.dtype
        if not trap and isinstance(value, CppVal):
            self.code.lines.extend(line[4:] for line in inner.lines)
            return self.emit(self._select(mask, value, literal(other, dt)), dt)
        name = self.fresh()
        self.code.writeline(f"{ctype(dt)} {name} = {literal(other, dt)};")
        self.code.writeline(f"if ({mask}) {{")
        self.code.lines.extend(inner.lines)
        self.code.writeline(f"    {name} = {value};")
        self.code.writeline("}")
        return CppVal(name, dt)

    def indirect_indexing(self, value, size, check=True):
        self.need_if = True
        v = self._as(value, torch.int64)
        name = self.fresh("idx")
        self.code.writeline(f"int64_t {name} = {v} < 0 ? {v} + {_int(size)} : {v};")
        return sym(name)

    def __getattr__(self, name):
        fmt = CPP.get(name)
        if fmt is None:
            raise AttributeError(name)

        def op(*args):
            dt = next((a.dtype for a in args if isinstance(a, CppVal)), torch.float32)
            trap = name in INT_TRAPS and not dt.is_floating_point
            if trap:
                self.need_if = True
            vals = [self._as(a, dt) for a in args]
            out = torch.bool if name in COMPARE else dt
            f = CPP_INT.get(name, fmt) if _is_int(dt) else fmt
            val = self.emit(f.format(*vals), out, hoist=not trap)
            if name == "logical_or":
                self.ors[str(val)] = tuple(vals)
            return val
        return op


# --- reductions ----------------------------------------------------------------------------

def _init(rtype, dt) -> str:
    t = ctype(dt)
    if rtype in ("sum", "any"):
        return literal(0, dt)
    if rtype == "prod":
        return literal(1, dt)
    if rtype in ("max", "argmax"):
        return (f"-std::numeric_limits<{t}>::infinity()" if dt.is_floating_point
                else f"std::numeric_limits<{t}>::lowest()")
    if rtype in ("min", "argmin"):
        return (f"std::numeric_limits<{t}>::infinity()" if dt.is_floating_point
                else f"std::numeric_limits<{t}>::max()")
    raise NotImplementedError(rtype)


#: float32 sums over at least this many elements accumulate in double, as ATen's CPU kernels do
#: for BatchNorm's statistics (acc_type<float, is_cuda=false> is double). A float accumulator
#: drifts by ~sqrt(n) ulps over n terms: over a BatchNorm's 8x112x112 = 100k elements per channel
#: that made ember's forward activations 20x less accurate than eager's (lraspp, mobilenet v3),
#: and ReLU masks flip at that level. Short rows (softmax, LayerNorm) keep float accumulators, and
#: so do bf16/fp16 results (float is already far finer than what they store).
LONG_SUM = 4096


def _acc_dtype(node, length) -> torch.dtype:
    body = node.body
    if (body.reduction_type == "sum" and body.src_dtype == torch.float32
            and body.dtype == torch.float32 and hint(length) >= LONG_SUM):
        return torch.float64
    return body.src_dtype


def _acc_value(acc, adt, dt) -> str:
    return acc if adt == dt else f"static_cast<{ctype(dt)}>({acc})"


def _update(rtype, acc, v, dt) -> str:
    if rtype == "sum":
        return f"{acc} += {v};"
    if rtype == "prod":
        return f"{acc} *= {v};"
    if rtype == "any":
        return f"{acc} = {acc} || {v};"
    if rtype == "max":
        return f"{acc} = ember::max_nan({acc}, {v});"
    if rtype == "min":
        return f"{acc} = ember::min_nan({acc}, {v});"
    raise NotImplementedError(rtype)


def _combine(rtype, acc, part) -> str:
    return {"sum": f"{acc} += {part};", "prod": f"{acc} *= {part};",
            "any": f"{acc} = {acc} || {part};", "max": f"{acc} = ember::max_nan({acc}, {part});",
            "min": f"{acc} = ember::min_nan({acc}, {part});"}[rtype]


SIMD_RED = {"sum": "+", "prod": "*", "any": "||"}
UDR = {"max": "emax", "min": "emin"}


def _red_clause(rtypes_accs) -> str:
    parts = []
    for rtype, acc, dt in rtypes_accs:
        if rtype in SIMD_RED:
            parts.append(f"reduction({SIMD_RED[rtype]}:{acc})")
        elif rtype in UDR and dt in (torch.float32, torch.float64):
            parts.append(f"reduction({UDR[rtype]}:{acc})")
        elif rtype in UDR:
            parts.append(f"reduction({rtype}:{acc})")
        else:
            return None
    return " ".join(parts)


# --- loop planning: order and merge dims ---------------------------------------------------

class IndexCollector(OpsHandler):
    """Records every index expression a body uses (loads, stores, index_expr)."""

    def __init__(self, ranges: dict):
        self.exprs: list = []
        self.stores: list = []
        self.n = 0
        self.ranges = ranges

    def load(self, name, index):
        self.exprs.append(simplify_index(sympy.expand(index), self.ranges))

    def store(self, name, index, value):
        index = simplify_index(sympy.expand(index), self.ranges)
        self.exprs.append(index)
        self.stores.append(index)

    def index_expr(self, expr, dtype):
        self.exprs.append(simplify_index(sympy.expand(expr), self.ranges))

    def masked(self, mask, body, other):
        return body()

    def indirect_indexing(self, value, size, check=True):
        self.n += 1
        return sym(f"indirect{self.n}")

    def default(self, name, *args, **kwargs):
        return None


def collect(fn, ranges: dict) -> IndexCollector:
    """The index expressions `fn`'s body uses, simplified for loop vars in `ranges`."""
    c = IndexCollector(ranges)
    with set_handler(c):
        fn()
    return c


def _coeff(e, v):
    return e.coeff(v) if e.has(v) else 0


def plan_loops(ranges, vars_, exprs, order=None):
    """Loop nest (sizes, vars) after reordering dims by `order` and merging adjacent dims
    that every index treats as one (coef[outer] == coef[inner] * size[inner], no div/mod).
    Returns (sizes, vars, subs) where subs maps merged-away vars to 0 and the surviving var
    of a group ranges over the product."""
    dims = list(order if order is not None else range(len(ranges)))
    opaque = set()
    for e in exprs:
        for f in e.atoms(FloorDiv, ModularIndexing):
            opaque |= f.free_symbols
    groups = []
    for d in dims:
        v = vars_[d]
        if groups and v not in opaque and vars_[groups[-1][-1]] not in opaque:
            last = vars_[groups[-1][-1]]
            if all(_coeff(e, last) == _coeff(e, v) * ranges[d] for e in exprs):
                groups[-1].append(d)
                continue
        groups.append([d])
    sizes, out_vars, subs = [], [], {}
    for g in groups:
        sizes.append(numel([ranges[d] for d in g]))
        out_vars.append(vars_[g[-1]])
        for d in g[:-1]:
            subs[vars_[d]] = sympy.Integer(0)
    return sizes, out_vars, subs


def _drop_simd_over_masked_ifs(lines, start):
    """g++ 12 miscompiles `#pragma omp simd` over a loop whose body loads the two halves of a
    stride-2 group under `if (mask)` (constant_pad_nd of pairs: valid elements came out 0):
    an unrolled pair loop with an `if`-form masked load loses its simd pragma (the branch-free
    clamped form, which the unrolled loads normally take, is vectorized correctly)."""
    body = lines[start:]
    if not any(line.lstrip().startswith("if (") for line in body):
        return
    for i, line in enumerate(body, start):
        if line.lstrip().startswith("#pragma omp") and "simd" in line:
            kept = line.replace(" simd", "")
            lines[i] = kept if kept.strip() != "#pragma omp" else ""


def split_pair(outer, xv, exprs_of):
    """A loop dim whose indices read it only as v // 2 and v % 2 (a pointwise op on the
    flattened view of (..., n, 2) pairs: LLaMA's `view_as_real(x).flatten(3).type_as(q)`) is
    split into v = 2*a + b, so the kernel loops over a and the pair b (unrolled, see generate)
    with affine indices instead of dividing per element in a loop g++ does not vectorize.
    `exprs_of(point, ranges)` collects the body's index expressions at loop point `point`.
    Returns (ranges, loop vars, point) or None."""
    c = exprs_of(xv, dict(zip(xv, outer)))
    opaque = set()
    for e in c.exprs:
        for f in e.atoms(FloorDiv, ModularIndexing):
            opaque |= f.free_symbols
    for d, (v, n) in enumerate(zip(xv, outer)):
        if v not in opaque or is_symbolic(n) or int(n) % 2 or int(n) < 4:
            continue
        a, b = loop_var(len(xv)), loop_var(len(xv) + 1)
        ranges = list(outer[:d]) + [sympy.Integer(int(n) // 2), sympy.Integer(2)] + \
            list(outer[d + 1:])
        lv = list(xv[:d]) + [a, b] + list(xv[d + 1:])
        point = list(xv[:d]) + [2 * a + b] + list(xv[d + 1:])
        split = exprs_of(point, dict(zip(lv, ranges)))
        if not any(f.has(a) or f.has(b) for e in split.exprs
                   for f in e.atoms(FloorDiv, ModularIndexing)):
            return ranges, lv, point
    return None


# --- kernels -------------------------------------------------------------------------------

def loop_var(i):
    return sym(f"v{i}")


class KernelCodegen:
    def __init__(self, kernel, buffers: dict):
        self.kernel = kernel
        self.par_if = ""            # an OpenMP if() clause when the work is symbolic
        self.buffers = buffers
        self.h = CppHandler(buffers, kernel.local, kernel.row_local,
                            [loop_var(i) for i in range(len(kernel.outer))])
        self.h.writes = {n.name for n in kernel.nodes}
        self.outer_ranges = {loop_var(i): n for i, n in enumerate(kernel.outer)}
        self.h.ranges = self.outer_ranges

    def ranges_with(self, rv, inner) -> dict:
        """Loop var sizes for a stage: the outer vars and this stage's inner vars (stages reuse
        the inner var names with their own sizes)."""
        return {**self.outer_ranges, **dict(zip(rv, inner))}

    def work(self):
        """Elements computed: an int, or a sympy expression of the size parameters."""
        k = self.kernel
        inner = sum(numel(s.inner) * len(s.nodes) for s in k.stages)
        return numel(k.outer) * (inner if inner != 0 else 1)

    def generate(self, args: list) -> str:
        k, h = self.kernel, self.h
        outer = list(k.outer)
        m = len(outer)
        xv = [loop_var(i) for i in range(m)]
        code = h.code
        params = []
        writes = {n.name for n in k.nodes}
        for name in args:
            const = "" if name in writes else "const "
            params.append(f"{const}{ctype(self.buffers[name].dtype)}* {name}")
        code.writeline(f'extern "C" void {k.name}({", ".join(params)}/*SIZES*/)')
        code.writeline("{")
        code.level += 1
        work = self.work()
        parallel = hint(work) >= PARALLEL_MIN_WORK
        scalar_reduce = (m == 0 or hint(numel(outer)) == 1) and parallel and self._partials_ok()
        self.par_if = ""
        if is_symbolic(work):
            # sizes known at run time only: the outer loop is parallel when the call is big
            parallel = True
            self.par_if = f" if({cexpr(sympy.expand(work))} >= {PARALLEL_MIN_WORK})"
        if k.pure_pointwise and m > 0:
            nodes = k.stages[0].nodes

            def exprs_of(point, ranges):
                return collect(lambda: [n.store_pointwise(point) for n in nodes], ranges)
            ranges, lv, point = split_pair(outer, xv, exprs_of) or (outer, xv, xv)
            h.ranges = dict(zip(lv, ranges))
            c = exprs_of(point, h.ranges)
            first = c.stores[0] if c.stores else sympy.Integer(0)
            order = sorted(range(len(lv)), key=lambda d: -hint(_coeff(first, lv[d])))
            sizes, lvars, subs = plan_loops(ranges, lv, c.exprs, order)
            h.subs = subs
            if len(sizes) > 1 and not is_symbolic(sizes[-1]) and 1 < int(sizes[-1]) <= UNROLL:
                # an innermost dim of 2 (the (re, im) pair of a complex value, decomp/complex.py)
                # is unrolled, so the simd loop runs over the dim above it: g++ vectorizes the
                # stride-2 loads and stores as interleaved groups, not a 2-lane loop (RoPE's
                # complex multiply ran 3x slower than eager's)
                def body():
                    for k in range(int(sizes[-1])):
                        h.subs = {**subs, lvars[-1]: sympy.Integer(k)}
                        for n in nodes:
                            n.store_pointwise(point)
                    h.subs = subs
                start = len(code.lines)
                self._loops(sizes[:-1], lvars[:-1], parallel, simd_last=True, body=body)
                _drop_simd_over_masked_ifs(code.lines, start)
            else:
                self._loops(sizes, lvars, parallel, simd_last=True,
                            body=lambda: [n.store_pointwise(point) for n in nodes])
            h.subs = {}
            h.ranges = self.outer_ranges
        elif self._column_reduction_ok(xv):
            self._column_reduction(xv, parallel)
        elif scalar_reduce:
            xv0 = [sympy.Integer(0)] * m
            for stage in k.stages:
                self._stage(stage, xv0, m, parallel_inner=True)
        else:
            def body():
                for name, size in k.row_local.items():
                    dt = compute_dtype(self.buffers[name].dtype)
                    code.writeline(f"alignas(64) {ctype(dt)} {name}_row[{size}];")
                for stage in k.stages:
                    self._stage(stage, xv, m, parallel_inner=False)
            if m:
                self._loops(outer, xv, parallel, simd_last=False, body=body)
            else:
                body()
        code.level -= 1
        code.writeline("}")
        text = code.getvalue()
        # dynamic shapes: the size symbols the body uses are int64 parameters after the buffers
        self.size_params = sorted(set(SIZE_NAME.findall(text)), key=lambda n: int(n[1:]))
        sizes = "".join(f", int64_t {n}" for n in self.size_params)
        return text.replace("/*SIZES*/", sizes, 1)

    COLUMN_BLOCK = 64

    def _column_reduction_ok(self, xv) -> bool:
        """Reduction stages (and pointwise stages after them) whose loads run contiguously along
        the last *outer* dim and not along the reduced dims (but for loads the outer dim does not
        move): sum over the batch of [B, F], BatchNorm's statistics (sum, then centered sum of
        squares), softmax over dim 0 or over C of NCHW (max, sum of exp, output). Vectorize across
        the outer dim with a block of accumulators per stage instead of striding down each
        column once per stage."""
        k = self.kernel
        if not k.outer or k.row_local or not any(st.kind == "reduction" for st in k.stages):
            return False
        if any(n.name in k.local for st in k.stages if st.kind == "pointwise" for n in st.nodes):
            return False    # a pointwise value kept in registers for a later stage: not per lane
        if hint(k.outer[-1]) < 16:
            return False
        exprs = []
        for st in k.stages:
            rv = [loop_var(len(xv) + i) for i in range(len(st.inner))]
            if st.kind == "reduction":
                if any(n.body.reduction_type not in ("sum", "prod", "max", "min") for n in st.nodes):
                    return False
                if not rv:
                    return False
                c = collect(lambda: [n.reduction_value(xv, rv) for n in st.nodes],
                            self.ranges_with(rv, st.inner))
            elif rv:
                c = collect(lambda: [n.store_pointwise(xv + rv) for n in st.nodes],
                            self.ranges_with(rv, st.inner))
            else:
                continue
            if not c.exprs:
                return False
            exprs += [(e, rv[-1]) for e in c.exprs]
        last = xv[-1]
        # a load that does not move with the outer dim (a per-row mean in LayerNorm's weight
        # gradient) is one value for the whole block: contiguous along the reduced dim is fine
        return (all(_coeff(e, rlast) != 1 or _coeff(e, last) == 0 for e, rlast in exprs)
                and any(_coeff(e, last) == 1 for e, _ in exprs))

    def _column_reduction(self, xv, parallel):
        k, h = self.kernel, self.h
        code = h.code
        m = len(xv)
        B = self.COLUMN_BLOCK
        L = k.outer[-1]
        nblk = _blocks(L, B)
        saved = h.push()
        for i, (size, v) in enumerate(zip(k.outer[:-1], xv[:-1])):
            if i == 0 and parallel:
                code.writeline("#pragma omp parallel for" + self.par_if)
            code.writeline(f"for (int64_t {v} = 0; {v} < {_int(size)}; ++{v})")
            code.writeline("{")
            code.level += 1
        if m == 1 and parallel:
            code.writeline("#pragma omp parallel for" + self.par_if)
        code.writeline(f"for (int64_t blk = 0; blk < {nblk}; ++blk)")
        code.writeline("{")
        code.level += 1
        code.writeline(f"int64_t lo = blk * {B}, n = std::min<int64_t>({B}, {_int(L)} - lo);")

        def lanes(body, simd=True, keep_stored=False):
            """for j in the block (xv[-1] = lo + j): body(). Its temporaries end with the loop;
            with keep_stored, what it stores (a stage's `acc[j]`) stays visible to later stages."""
            if simd:
                code.writeline("#pragma omp simd")
            code.writeline("for (int64_t j = 0; j < n; ++j)")
            code.writeline("{")
            code.level += 1
            code.writeline(f"int64_t {xv[-1]} = lo + j;")
            cse, stored = dict(h.cse), dict(h.stored)
            body()
            h.cse = cse
            if not keep_stored:
                h.stored = stored
            code.level -= 1
            code.writeline("}")

        for st in k.stages:
            rv = [loop_var(m + i) for i in range(len(st.inner))]
            h.ranges = self.ranges_with(rv, st.inner)
            if st.kind == "pointwise":
                if not rv:
                    lanes(lambda: [n.store_pointwise(xv) for n in st.nodes], simd=False)
                    continue
                for size, v in zip(st.inner, rv):
                    code.writeline(f"for (int64_t {v} = 0; {v} < {_int(size)}; ++{v})")
                    code.writeline("{")
                    code.level += 1
                lanes(lambda: [n.store_pointwise(xv + rv) for n in st.nodes])
                for _ in rv:
                    code.level -= 1
                    code.writeline("}")
                continue
            accs, widened = [], {}
            for n in st.nodes:
                dt, rt = n.body.src_dtype, n.body.reduction_type
                adt = _acc_dtype(n, numel(st.inner))
                acc = h.fresh("acc")
                code.writeline(f"{ctype(adt)} {acc}[{B}];")
                code.writeline(f"for (int64_t j = 0; j < {B}; ++j) {acc}[j] = {_init(rt, adt)};")
                accs.append((n, acc, rt, dt))
                widened[acc] = adt
            for size, v in zip(st.inner, rv):
                code.writeline(f"for (int64_t {v} = 0; {v} < {_int(size)}; ++{v})")
                code.writeline("{")
                code.level += 1

            def update(accs=accs, rv=rv):
                for n, acc, rt, dt in accs:
                    v = h._as(n.reduction_value(xv, rv), dt)
                    code.writeline(_update(rt, f"{acc}[j]", v, dt))
            lanes(update)
            for _ in rv:
                code.level -= 1
                code.writeline("}")
            lanes(lambda accs=accs, widened=widened: [
                h.store(n.name, n.store_index(xv),
                        CppVal(_acc_value(f"{acc}[j]", widened[acc], dt), dt))
                for n, acc, rt, dt in accs], simd=False, keep_stored=True)
        code.level -= 1
        code.writeline("}")
        for _ in xv[:-1]:
            code.level -= 1
            code.writeline("}")
        h.pop(saved)

    def _partials_ok(self) -> bool:
        for s in self.kernel.stages:
            if s.kind == "reduction":
                if any(n.body.reduction_type not in SIMD_RED and n.body.reduction_type not in UDR
                       for n in s.nodes):
                    return False
        return True

    def _loops(self, ranges, vars_, parallel, simd_last, body, reduction=None, partial=False):
        """Emit a loop nest over `ranges`; body() emits the innermost statements."""
        code, h = self.h.code, self.h
        n = len(ranges)
        saved = h.push()
        for i, (size, v) in enumerate(zip(ranges, vars_)):
            last = i == n - 1
            pragma = None
            if i == 0 and parallel:
                if partial:
                    pragma = "#pragma omp for"
                else:
                    collapse = 1
                    limit = n - 1 if simd_last else n
                    prod = hint(size)
                    while prod < 64 and collapse < limit:
                        prod *= hint(ranges[collapse])
                        collapse += 1
                    pragma = "#pragma omp parallel for" + (
                        f" collapse({collapse})" if collapse > 1 else "")
                    if last and simd_last:
                        pragma += " simd"
                        if reduction:
                            pragma += " " + reduction
                    pragma += self.par_if
            elif last and simd_last:
                pragma = "#pragma omp simd" + (f" {reduction}" if reduction else "")
            if last and simd_last:
                hoist_at = len(code.lines)
                hoisted = IndentedBuffer(code.level)
            if pragma:
                code.writeline(pragma)
            code.writeline(f"for (int64_t {v} = 0; {v} < {_int(size)}; ++{v})")
            code.writeline("{")
            code.level += 1
        outer = h.simd, h.hoisted, h.hoisted_cse
        if n and simd_last:
            h.simd, h.hoisted, h.hoisted_cse = (vars_[-1], ranges[-1]), hoisted, {}
        body()
        if n and simd_last:
            code.lines[hoist_at:hoist_at] = hoisted.lines
        h.simd, h.hoisted, h.hoisted_cse = outer
        for _ in range(n):
            code.level -= 1
            code.writeline("}")
        h.pop(saved)

    def _stage(self, stage, xv, m, parallel_inner):
        h = self.h
        code = h.code
        rv = [loop_var(m + i) for i in range(len(stage.inner))]
        h.ranges = ranges = self.ranges_with(rv, stage.inner)
        if stage.kind == "pointwise":
            if not stage.inner:
                for n in stage.nodes:
                    n.store_pointwise(xv)
                return
            par = parallel_inner and hint(numel(stage.inner)) >= PARALLEL_MIN_WORK
            c = collect(lambda: [n.store_pointwise(xv + rv) for n in stage.nodes], ranges)
            sizes, lvars, subs = plan_loops(stage.inner, rv, c.exprs)
            h.subs = {**h.subs, **subs}
            self._loops(sizes, lvars, par, simd_last=True,
                        body=lambda: [n.store_pointwise(xv + rv) for n in stage.nodes])
            for v in subs:
                h.subs.pop(v, None)
            return
        accs, widened = [], {}
        for n in stage.nodes:
            dt = n.body.src_dtype
            rt = n.body.reduction_type
            acc = h.fresh("acc")
            widened[acc] = adt = _acc_dtype(n, numel(stage.inner))
            code.writeline(f"{ctype(adt)} {acc} = {_init(rt, adt)};")
            if rt in ("argmax", "argmin"):
                code.writeline(f"int64_t {acc}_i = 0;")
            accs.append((n, acc, rt, dt))
        clause = _red_clause([(rt, acc, dt) for _, acc, rt, dt in accs])
        strides = []
        acc_st = 1
        for s in reversed(stage.inner):
            strides.append(acc_st)
            acc_st *= s
        strides = list(reversed(strides))

        def body(targets):
            for (n, acc, rt, dt), tgt in zip(accs, targets):
                v = h._as(n.reduction_value(xv, rv), dt)
                if rt in ("argmax", "argmin"):
                    cmp = ">" if rt == "argmax" else "<"
                    flat = cexpr(sum((r * s for r, s in zip(rv, strides)), sympy.Integer(0)))
                    nan = f" || ({v} != {v} && {acc} == {acc})" if dt.is_floating_point else ""
                    code.writeline(f"if ({v} {cmp} {acc}{nan}) {{ {acc} = {v}; {acc}_i = {flat}; }}")
                else:
                    code.writeline(_update(rt, tgt, v, dt))

        par = parallel_inner and clause is not None
        if par:
            parts = [(n, h.fresh("part"), rt, widened[acc]) for n, acc, rt, _ in accs]
            code.writeline("#pragma omp parallel")
            code.writeline("{")
            code.level += 1
            for n, p, rt, adt in parts:
                code.writeline(f"{ctype(adt)} {p} = {_init(rt, adt)};")
            pclause = _red_clause([(rt, p, dt) for _, p, rt, dt in parts])
            inner = list(stage.inner)
            if len(inner) == 1:   # split one long dim into blocks: omp for outside, simd inside
                blk = 4096
                nb = _blocks(inner[0], blk)
                code.writeline("#pragma omp for")
                code.writeline(f"for (int64_t blk = 0; blk < {nb}; ++blk)")
                code.writeline("{")
                code.level += 1
                code.writeline(f"int64_t lo = blk * {blk}, hi = std::min<int64_t>(lo + {blk}, {_int(inner[0])});")
                code.writeline(f"#pragma omp simd {pclause}")
                code.writeline(f"for (int64_t {rv[0]} = lo; {rv[0]} < hi; ++{rv[0]})")
                code.writeline("{")
                code.level += 1
                saved = h.push()
                body([p for _, p, _, _ in parts])
                h.pop(saved)
                code.level -= 2
                code.writeline("}")
                code.writeline("}")
            else:
                self._loops(inner, rv, True, simd_last=True, reduction=pclause, partial=True,
                            body=lambda: body([p for _, p, _, _ in parts]))
            code.writeline("#pragma omp critical")
            code.writeline("{")
            for (n, acc, rt, dt), (_, p, _, _) in zip(accs, parts):
                code.writeline("    " + _combine(rt, acc, p))
            code.writeline("}")
            code.level -= 1
            code.writeline("}")
        else:
            simd = clause is not None
            sizes, lvars, subs = list(stage.inner), rv, {}
            if simd:
                c = collect(lambda: [n.reduction_value(xv, rv) for n in stage.nodes], ranges)
                sizes, lvars, subs = plan_loops(stage.inner, rv, c.exprs)
            h.subs = {**h.subs, **subs}
            self._loops(sizes, lvars, False, simd_last=simd, reduction=clause,
                        body=lambda: body([acc for _, acc, _, _ in accs]))
            for v in subs:
                h.subs.pop(v, None)
        for n, acc, rt, dt in accs:
            result = CppVal(f"{acc}_i" if rt in ("argmax", "argmin")
                            else _acc_value(acc, widened[acc], dt),
                            torch.int64 if rt in ("argmax", "argmin") else dt)
            h.store(n.name, n.store_index(xv), result)


def kernel_args(kernel, deps) -> list:
    names = []
    for n in kernel.nodes:
        for b in deps[n.name].reads:
            if b not in kernel.local and b not in names:
                names.append(b)
    for n in kernel.nodes:
        if n.name not in kernel.local and n.name not in names:
            names.append(n.name)
    return names


def generate_tu(kernels, deps, buffers: dict) -> tuple[str, dict]:
    """(C++ source, {kernel name: [buffer names, then size symbols, in argument order]})."""
    out = [PRELUDE]
    signatures = {}
    for k in kernels:
        args = kernel_args(k, deps)
        signatures[k.name] = args
        cg = KernelCodegen(k, buffers)
        with set_handler(cg.h):
            out.append(cg.generate(args))
        if INT_DIV.search(out[-1]):     # load() checks ember_take_zero_div after its calls
            out.append(f'extern "C" const int {k.name}_zero_div = 1;')
        signatures[k.name] = args + cg.size_params
    return "\n".join(out), signatures
