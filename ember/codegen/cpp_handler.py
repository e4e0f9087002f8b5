"""Stage 6, codegen: the C++ expression handler of the CPU kernels.

`CppHandler` is the loop IR's `ops` handler that emits C++: one typed temporary per op (CSE by
expression text), loads and stores with printed indices, masked bodies made branch-free where
they can be (clamped indices, selects; see CppHandler.masked), and statements that do not
change along the `omp simd` loop hoisted before it (g++ 12 does not vectorize an `if` around a
load, nor a plain select, when the condition is loop-invariant: channels-last pooling).
fp16/bf16 are loaded as float. Math comes from the prelude (ember::exp etc.) through the `CPP`
table (op -> C++ format), `CPP_INT` for integer operands (wrap-around like eager).

Consumes: loop IR bodies run under the handler by cpp.py's loop nests. Produces: C++ statements
(`handler.code`) and CppVal temporaries.
"""
from __future__ import annotations

import math
import re

import sympy
import torch

from ..loopir.index import SIZE_NAME, FloorDiv, is_symbolic, simplify_index, surely_positive, sym
from ..loopir.ops import BINARY, COMPARE, UNARY, compute_dtype
from .common import CTYPE, IndentedBuffer, index_printer
from .cpp_ranges import CMP, SWAP, bounds, decide, is_size


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

#: low-precision buffer dtypes a staged simd loop converts a chunk at a time (cpp_prelude.STAGED)
LOWP = {torch.float16: "half", torch.bfloat16: "bf16"}
#: a staged store's function by its buffer's dtype (ember::store_<name>): a float store is staged
#: only for a streamed output (CppHandler.streamed)
STAGED_STORE = {**LOWP, torch.float32: "stream"}


class Staging:
    """The fp16/bf16 loads and stores (and the float stores of streamed outputs) of one simd
    loop over `var` that are contiguous in it: each is a float array of a chunk of the loop,
    converted (or streamed) before the chunk's loop (loads) or after it (stores) by
    cpp_loops.stage_chunks. `code`: the loop body's buffer (a store in a
    nested block is not staged); `loaded` / `stored`: buffer names the loop reads / stores staged
    (a store to a buffer the loop also reads converts in the loop, and a load after a staged
    store of its buffer is an error: it would read the chunk before the store)."""

    def __init__(self, var, code, fresh):
        self.var, self.code, self.fresh = var, code, fresh
        self.lo = f"{var}_c"
        self.offset = f"{var} - {self.lo}"
        self.loads: dict = {}       # (buffer, rest) -> (array, dtype)
        self.stores: dict = {}
        self.loaded: set = set()
        self.stored: set = set()

    def array(self, table, name, rest, dtype) -> str:
        key = (name, rest)
        if key not in table:
            table[key] = (self.fresh("stg"), dtype)
        return table[key][0]


LOOP_VAR = re.compile(r"v\d+")
TEMP = re.compile(r"\b(?:v|tmp|idx|acc|part)\d+\b")    # names the generated code declares
# integer ops that fault on a zero divisor (a masked-off lane may hold any value)
INT_TRAPS = {"floordiv", "truncdiv", "remainder", "fmod", "truediv"}

INT_DIV = re.compile(r"ember::i(truncdiv|mod|floordiv|remainder)\(")
#: calls that set the kernel error flag (cpp_prelude: zero divisor, index out of bounds)
CHECKED = re.compile(r"ember::(i(truncdiv|mod|floordiv|remainder)|bound|flag_index_oob)\(")

CPP = {
    "neg": "(-{0})", "abs": "ember::abs_({0})", "exp": "ember::exp({0})", "exp2": "std::exp2({0})",
    "expm1": "ember::expm1({0})", "log": "ember::log({0})", "log2": "std::log2({0})",
    "log10": "std::log10({0})", "log1p": "ember::log1p({0})", "sqrt": "std::sqrt({0})",
    "rsqrt": "ember::rsqrt({0})", "sin": "ember::sin_({0})", "cos": "ember::cos_({0})",
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


#: a temporary's declaration, `[const] T tmpN = expr;` (the handler's one-line form)
DECL = re.compile(r"^\s*(?:const\s+)?[\w:<>]+\s+((?:tmp|idx)\d+)\s*=\s*(.*);$")


def prune_dead(lines: list[str]) -> list[str]:
    """A kernel's lines without the temporaries nothing reads (to a fixpoint: what only they
    read goes too). An unswitched nest (cpp_ranges.unswitch) emits each copy with the clamps,
    compares and index math of every branch, also those decided false in that copy (HF Mamba's
    scan kernels: ~20% of the C++). Declarations with a checked call (an error flag) stay, and so
    does a name used in any other line (the `if` form assigns it again)."""
    uses: dict = {}
    for line in lines:
        for t in TEMP.findall(line):
            uses[t] = uses.get(t, 0) + 1
    decl = {}
    for i, line in enumerate(lines):
        m = DECL.match(line)
        if m and not CHECKED.search(m.group(2)):
            decl[m.group(1)] = (i, m.group(2))
    dead, todo = set(), [t for t in decl if uses[t] == 1]
    while todo:
        i, expr = decl[todo.pop()]
        dead.add(i)
        for t in TEMP.findall(expr):
            uses[t] -= 1
            if uses[t] == 1 and t in decl:
                todo.append(t)
    return [line for i, line in enumerate(lines) if i not in dead]


class CppVal:
    __slots__ = ("code", "dtype")

    def __init__(self, code: str, dtype: torch.dtype):
        self.code, self.dtype = code, dtype

    def __str__(self):
        return self.code


def index_type(buffers: dict) -> str:
    """C++ type of a gather's index: int32_t when every buffer spans under 2^31 elements (then
    every partial sum of an in-bounds index does too), else int64_t. g++ 12 vectorizes a load
    through a 32-bit index (vgatherdps) but not one through a 64-bit index ("no vectype": a
    bilinear upsampling or gather_last loop ran scalar)."""
    for b in buffers.values():
        size, stride = getattr(b, "size", None), getattr(b, "stride", None)
        if size is None:
            continue
        if stride is None or any(map(is_symbolic, tuple(size) + tuple(stride))):
            return "int64_t"
        if 1 + sum((int(n) - 1) * abs(int(st)) for n, st in zip(size, stride) if int(n) > 0) >= 2 ** 31:
            return "int64_t"
    return "int32_t"


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
        self.simd_oob = None      # [flag name, used] of that loop, if it has an omp simd pragma
        self.hoisted_cse: dict = {}   # their temporaries, valid in the whole loop body
        self.invariant: set = set()   # temporaries declared before that loop (or hoisted)
        self.writes: set = set()      # buffers the kernel stores (their loads are not hoisted)
        self.spans: dict = {}         # loop var -> (lo, hi): the segment of a split loop
        self.known: dict = {}         # temporary or literal -> its index expr or constant
        self.index_t = index_type(buffers)   # a gather's index (indirect_indexing)
        self.rounded: dict = {}       # a to_dtype(fp16/bf16) temporary -> (its input, dtype)
        self.bits: dict = {}          # an fp16/bf16 load's float temporary -> (its C++ load, dtype)
        self.staging = None           # Staging of the simd loop being emitted (cpp_loops.py)
        self.streamed: set = set()    # float outputs stored non-temporally (cpp.streamed_outputs)
        self.tiles: dict = {}         # (buffer, index) -> its element of a staged row tile

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
        tile = self.tiles.get((name, self.simple(index))) if self.tiles else None
        if tile is not None:        # a column reduction's staged row load (cpp_column_reduction.py _row_tiles)
            dt = self.buffers[name].dtype
            if dt in LOWP:          # a tile of bf16 / fp16 bits (cpp_row_staging)
                return self._lowp(tile, dt, False)
            return self.emit(tile, dt, False)
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
                 and surely_positive(self.simd[1]))
        st = self.staging
        if st is not None:
            if name in st.stored:
                raise AssertionError(f"{name} loaded after its staged store in one simd loop")
            st.loaded.add(name)
            base = self._stageable(index) if dt in LOWP and name not in self.writes else None
            if base is not None:
                return self.emit(f"{st.array(st.loads, name, base, dt)}[{st.offset}]",
                                 torch.float32, False)
        if dt in LOWP:
            return self._lowp(f"{name}[{idx}]", dt, hoist)
        if dt == torch.bool:
            # read as bytes: g++ 12 does not vectorize a loop that loads through a bool* and
            # also works on float lanes ("no vectype": a masked_fill(mask, -inf) before exp
            # ran scalar, softmax with an attention mask at 0.5x eager)
            return self.emit(f"(reinterpret_cast<const uint8_t*>({name})[{idx}] != 0)", dt,
                             hoist, True)
        return self.emit(f"{name}[{idx}]", dt, hoist, True)

    def _lowp(self, load: str, dt, hoist: bool):
        """An fp16/bf16 element read by C++ `load`, as float; remembered so that a store of it
        unchanged into the same type copies its bits (bits)."""
        val = self.emit(f"ember::{LOWP[dt]}_to_float({load})", torch.float32, hoist, True)
        self.bits[str(val)] = (load, dt)
        return val

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
        if self.rounded.get(str(value), (None, None))[1] == dt:
            value = self.rounded[str(value)][0]   # stored rounded anyway: one conversion
        if self.bits.get(str(value), (None, None))[1] == dt:
            # an fp16/bf16 value stored unchanged (a layout conversion, a cat, a gather): its
            # bits move, as eager's copy moves them (no float round trip, which also quiets a
            # signaling NaN); not staged, so the loop is a plain 16-bit copy
            self.code.writeline(f"{name}[{idx}] = {self.bits[str(value)][0]};")
            return None
        st = self.staging
        staged = dt in LOWP or name in self.streamed
        base = self._stageable(index) if (staged and st is not None and name not in st.loaded
                                          and self.code is st.code) else None
        if base is not None:
            st.stored.add(name)
            self.code.writeline(f"{st.array(st.stores, name, base, dt)}[{st.offset}] = {value};")
        elif dt == torch.bfloat16:
            self.code.writeline(f"{name}[{idx}] = ember::float_to_bf16({value});")
        elif dt == torch.float16:
            self.code.writeline(f"{name}[{idx}] = ember::float_to_half({value});")
        else:
            self.code.writeline(f"{name}[{idx}] = {value};")
        return None

    def _stageable(self, index) -> str | None:
        """The C++ of `rest` for an index `rest + v` contiguous in the staged simd loop's var v,
        with `rest` the same in every iteration; else None (the load or store converts in the
        loop). Not under a mask: the chunk is converted whole, masked-off lanes included."""
        if self.load_mask is not None:
            return None
        v = self.simd[0]
        e = self.simple(index).xreplace(self.subs) if self.subs else self.simple(index)
        rest = sympy.expand(e - v)
        if rest.has(v):
            return None
        text = cexpr(rest)
        return text if self.is_invariant(text) else None

    # --- values ---
    def constant(self, value, dtype):
        dtype = compute_dtype(dtype) if dtype is not None else (
            torch.float32 if isinstance(value, float) else torch.int64)
        if is_symbolic(value):          # a scalar computed from sizes (dynamic shapes)
            text = cexpr(value) if value.is_integer else sympy.ccode(sympy.N(value))
            val = self.emit(f"static_cast<{ctype(dtype)}>({text})", dtype)
            if value.is_integer and not dtype.is_floating_point and dtype != torch.bool:
                self.known[val.code] = value    # a cat's boundary `s0`: compares decide on it
            return val
        val = CppVal(literal(value, dtype), dtype)
        if not dtype.is_floating_point and dtype != torch.bool:
            self.known[val.code] = int(value)
        return val

    def index_expr(self, expr, dtype):
        dtype = compute_dtype(dtype)
        val = self.emit(f"static_cast<{ctype(dtype)}>({self.idx(expr)})", dtype)
        if not dtype.is_floating_point and dtype != torch.bool:
            self.known[val.code] = self.simple(expr)
        return val

    def _decided(self, name, args) -> CppVal | None:
        """A compare of an index with an integer constant that holds (or fails) over the whole
        loop ranges, narrowed to the segment in `spans` (cpp_ranges): `true` / `false`."""
        if len(args) != 2:
            return None
        a, b = (self.known.get(x.code) if isinstance(x, CppVal) else x for x in args)
        if isinstance(b, sympy.Basic) and not is_size(b):
            a, b, name = b, a, SWAP[name]
        if not isinstance(a, sympy.Basic) or b is None or isinstance(a, sympy.Integer):
            return None
        b = int(b) if isinstance(b, sympy.Integer) else b
        if isinstance(b, bool) or not isinstance(b, (int, sympy.Basic)):
            return None             # (a float operand is cast to the index type in C++)
        # a loop var fixed in a one-value segment (`v1 = s0`) prints as its size expression
        lohi = (a, a) if is_size(a) else bounds(a, self.ranges, self.spans)
        got = None if lohi is None else decide(name, *lohi, b)
        return None if got is None else CppVal("true" if got else "false", torch.bool)

    def to_dtype(self, x, dtype):
        if dtype in (torch.bfloat16, torch.float16):
            x = self._as(x, torch.float32)
            fn = "round_bf16" if dtype == torch.bfloat16 else "round_half"
            val = self.emit(f"ember::{fn}({x})", torch.float32)
            self.rounded[str(val)] = (x, dtype)
            return val
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
        if str(c) in ("true", "false"):
            dt = a.dtype if isinstance(a, CppVal) else b.dtype
            return self._as(a if str(c) == "true" else b, dt)
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
        # v runs over [first, last]: the segment of a split loop (cpp_ranges), else [0, n)
        first, last = (self.spans[v][0], self.spans[v][1] - 1) if v in self.spans else (0, int(n) - 1)
        lo, hi = -int(c) * first, extent - 1 - int(c) * last
        if hi < lo:
            return None
        base = self.emit(f"std::min<int64_t>(std::max<int64_t>({cexpr(rest)}, {_int(lo)}), "
                         f"{_int(hi)})", torch.int64)
        return f"{base} + {cexpr(c * v)}"

    def masked(self, mask, body, other):
        """`mask ? body() : other`. Branch-free when the body cannot fault on a masked-off lane
        (its loads are clamped into their buffers, no integer division, no indirect index) and
        no load is contiguous (see _clamped): then strided windows (max pooling) vectorize.
        Otherwise an `if` around the body."""
        mask = self._as(mask, torch.bool)
        if mask.code == "true":         # decided over the loop's segment (cpp_ranges)
            return body()
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
        if mask.code == "false":
            return CppVal(literal(other, dt), dt)
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
        n = _int(size)
        key = ("indirect", str(v), n, check)    # one wrap/check per index (bilinear: 4 loads, 2 indices)
        if key in self.cse:
            return sym(self.cse[key])
        name = self.fresh("idx")
        self.cse[key] = name
        idx = f"{v} < 0 ? {v} + {n} : {v}"
        it = self.index_t       # (wrapped and checked as int64, then narrowed: in [0, n) now)
        if not check and self.simd is not None and self.is_invariant(str(v)):
            self.hoisted.writeline(f"const {it} {name} = {idx};")   # (a wrap cannot fault)
            self.invariant.add(name)
        elif not check:
            self.code.writeline(f"{it} {name} = {idx};")
        elif self.simd is not None and self.load_mask is None and self.is_invariant(str(v)):
            # the same index along the simd loop (an embedding row): checked once before it
            self.hoisted.writeline(f"const {it} {name} = ember::bound({idx}, {n});")
            self.invariant.add(name)
        elif self.simd_oob is None:
            # eager raises IndexError: outside the dim, the kernel flags it and reads index 0
            self.code.writeline(f"{it} {name} = ember::bound({idx}, {n});")
        else:
            # the same, branch-free in an omp simd loop: the lanes OR `v outside [-n, n)` (one
            # unsigned compare) into the loop's flag, checked after it (KernelCodegen._loops),
            # and the index is wrapped and clamped in the narrow type. (Selecting the int64
            # index on the check, `out ? 0 : w`, kept g++ 12 from vectorizing the loop:
            # gather_last ran scalar with a branch per element, 0.8x eager.)
            flag = self.simd_oob[0]
            self.simd_oob[1] = True
            u = f"static_cast<uint64_t>({n})"
            self.code.writeline(f"{flag} |= static_cast<int>(static_cast<uint64_t>({v}) + {u} "
                                f">= 2 * {u});")
            self.code.writeline(f"{it} {name}_t = static_cast<{it}>({v});")
            self.code.writeline(f"{it} {name} = std::max<{it}>(std::min<{it}>({name}_t < 0 ? "
                                f"{name}_t + {n} : {name}_t, {n} - 1), 0);")
        return sym(name)

    def __getattr__(self, name):
        fmt = CPP.get(name)
        if fmt is None:
            raise AttributeError(name)

        def op(*args):
            if name in CMP:
                decided = self._decided(name, args)
                if decided is not None:
                    return decided
            elif name == "logical_not" and getattr(args[0], "code", None) in ("true", "false"):
                return CppVal("false" if args[0].code == "true" else "true", torch.bool)
            elif name in ("logical_and", "logical_or"):
                codes = [a.code if isinstance(a, CppVal) else None for a in args]
                short = "false" if name == "logical_and" else "true"
                if short in codes:
                    return CppVal(short, torch.bool)
                if codes[0] in ("true", "false"):
                    return self._as(args[1], torch.bool)
                if codes[1] in ("true", "false"):
                    return self._as(args[0], torch.bool)
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
