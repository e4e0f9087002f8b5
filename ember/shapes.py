"""Symbolic sizes: our shape environment, shared by capture, aot and lower (dynamic shapes).

A dynamic dimension is a sympy Symbol with a *hint* (the size seen when it was traced) and a
*source* (which input's which dim, set by capture). `torch.SymInt(SymNode(expr))` carries an
expression through PyTorch's own Python and C++ shape code: meta kernels compute with it, and
every time one needs a concrete answer (`guard_bool`, `guard_int`) the env answers from the hints
and records the relation as a guard (`s0 >= 2`, `Eq(s0, 7)` when a size is specialized). A guard
the bounds already decide (`Ne(s0, 1)`: every symbol is >= 2) is not recorded. Sizes 0 and 1 are
never symbolic: broadcasting and empty tensors specialize on them, as torch.compile does.

Consumers: capture makes symbols for dynamic input dims and turns the recorded guards into Python
checks (`pyexpr`); aot turns SymInt arguments of aten ops into graph nodes (`to_fx`); lower takes
sizes as sympy expressions and passes the symbols to kernels as arguments.
"""
from __future__ import annotations

import math
import operator

import sympy
import torch

LOWER_BOUND = 2      # a dynamic size is never 0 or 1 (those specialize)


class ShapeEnv:
    def __init__(self):
        self.hints: dict[sympy.Symbol, int] = {}
        self.sources: dict[sympy.Symbol, object] = {}
        self.guards: list = []               # sympy booleans, each true at the hints
        self._seen: set = set()
        self._shifted: dict = {}
        self.frozen = False      # set once the cache entry's guards are built

    def new_symbol(self, hint: int, source, guard_bound: bool = False) -> torch.SymInt:
        """A fresh size symbol (hint >= 2) for a dynamic input dim or int. `guard_bound`: add
        the guard `s >= 2` (a tensor dim's own guard checks it; an int's needs this one)."""
        if hint < LOWER_BOUND:
            raise ValueError(f"size {hint} cannot be dynamic (0 and 1 specialize)")
        s = sympy.Symbol(f"s{len(self.hints)}", integer=True, positive=True)
        self.hints[s] = int(hint)
        self.sources[s] = source
        self._shifted[s] = sympy.Symbol(f"_d{len(self.hints)}", integer=True, nonnegative=True) \
            + LOWER_BOUND
        install_meta_views()
        if guard_bound:
            self._record(sympy.Ge(s, LOWER_BOUND))
        return torch.SymInt(SymNode(s, self, int))

    def symint(self, expr, pytype=int):
        expr = sympy.sympify(expr)
        if not expr.free_symbols:
            return pytype(expr)
        cls = {int: torch.SymInt, float: torch.SymFloat, bool: torch.SymBool}[pytype]
        return cls(SymNode(expr, self, pytype))

    # ---- deciding -------------------------------------------------------------------
    def hint(self, expr):
        if not expr.free_symbols:
            return expr
        # doit: a constant subterm left unevaluated (Max(0, 2) from a decomposition's clamp)
        # would keep the substituted value undecided
        value = sympy.sympify(expr.xreplace(self.hints))
        return value if isinstance(value, (sympy.Number, sympy.logic.boolalg.BooleanAtom)) \
            else value.doit()

    def static(self, expr):
        """True/False when the bounds decide `expr` for every allowed size, else None."""
        if expr in (sympy.true, sympy.false):
            return bool(expr)
        if not expr.free_symbols:
            return bool(expr)
        e = expr.xreplace(self._shifted)
        if e in (sympy.true, sympy.false):
            return bool(e)
        if isinstance(e, sympy.core.relational.Relational):
            d = sympy.expand(e.lhs - e.rhs)
            sign = {"==": lambda: False if (d.is_positive or d.is_negative) else None,
                    "!=": lambda: True if (d.is_positive or d.is_negative) else None,
                    ">": lambda: True if d.is_positive else (False if d.is_nonpositive else None),
                    ">=": lambda: True if d.is_nonnegative else (False if d.is_negative else None),
                    "<": lambda: True if d.is_negative else (False if d.is_nonnegative else None),
                    "<=": lambda: True if d.is_nonpositive else (False if d.is_positive else None)}
            if d.is_zero:
                return e.rel_op in ("==", ">=", "<=")
            f = sign.get(e.rel_op)
            return f() if f else None
        return None

    def evaluate(self, expr):
        """The value of `expr` at the hints; records it as a guard unless the bounds decide it."""
        expr = sympy.sympify(expr)
        value = self.hint(expr)
        if expr.free_symbols and not isinstance(expr, sympy.Symbol):
            if expr.is_Boolean or isinstance(expr, sympy.core.relational.Relational):
                if self.static(expr) is None:
                    self._record(expr if value else sympy.Not(expr))
            else:
                self._record(sympy.Eq(expr, value))
        elif isinstance(expr, sympy.Symbol):
            self._record(sympy.Eq(expr, value))
        return value

    def _record(self, g) -> None:
        g = sympy.simplify_logic(g) if isinstance(g, (sympy.And, sympy.Or, sympy.Not)) else g
        if g in self._seen or g is sympy.true:
            return
        if self.frozen:
            # a graph compiled later (the lazily built backward) assumed something about the
            # sizes that no guard checks: refuse rather than run it at other sizes
            from .errors import Unsupported
            raise Unsupported(f"a size decision ({g}) was made after the guards of this graph "
                              "were fixed")
        self._seen.add(g)
        self.guards.append(g)
        from .logging import enabled, get_logger
        if enabled("dynamic"):
            import os
            import traceback
            where = "".join(traceback.format_stack(limit=int(os.environ.get("EMBER_DYNAMIC_STACK", "12")))[:-2])
            get_logger("dynamic").info("guard %s, from:\n%s", g, where)

    def specialized(self) -> set:
        """Symbols a guard pins to one value (Eq(s, n))."""
        return {g.lhs for g in self.guards
                if isinstance(g, sympy.Eq) and isinstance(g.lhs, sympy.Symbol) and g.rhs.is_Integer}


class SymNode:
    """The object behind `torch.SymInt`/`SymBool`/`SymFloat`: PyTorch's C++ and Python shape code
    calls these methods (add, mul, eq, guard_bool, is_contiguous, ...)."""

    _hint = None        # torch's statically_known_true reads a cached hint: none, so it decides

    def __init__(self, expr, env: ShapeEnv, pytype):
        self.expr, self.env, self.pytype = expr, env, pytype

    # ---- kind ----
    def is_int(self): return self.pytype is int
    def is_float(self): return self.pytype is float
    def is_bool(self): return self.pytype is bool
    def is_nested_int(self): return False
    def is_symbolic(self): return True
    def is_constant(self): return False
    def has_hint(self): return True
    def nested_int(self): return None
    def constant_int(self): return None
    def maybe_as_int(self): return int(self.expr) if self.expr.is_Integer else None
    def maybe_as_bool(self): return None
    def maybe_as_float(self): return None
    def hint(self): return self.pytype(self.env.hint(self.expr))
    def clone(self): return self
    def with_shape_env(self, env): return self
    def str(self): return str(self.expr)
    def _graph_repr(self): return str(self.expr)
    __str__ = __repr__ = str

    def wrap_int(self, n): return SymNode(sympy.Integer(n), self.env, int)
    def wrap_bool(self, b): return SymNode(sympy.true if b else sympy.false, self.env, bool)
    def wrap_float(self, f): return SymNode(sympy.Float(f), self.env, float)

    def _new(self, expr, pytype):
        return SymNode(expr, self.env, pytype)

    # ---- concrete answers (each one a guard) ----
    def guard_int(self, file=None, line=None): return int(self.env.evaluate(self.expr))
    def guard_bool(self, file=None, line=None): return bool(self.env.evaluate(self.expr))

    def guard_float(self, file=None, line=None): return float(self.env.evaluate(self.expr))
    def bool_(self): return self.guard_bool()
    def int_(self): return self.guard_int()
    expect_true = guard_size_oblivious = guard_or_false = guard_or_true = guard_bool

    def statically_known_true(self, file=None, line=None):
        return self.env.static(self.expr) is True

    def expect_size(self, file=None, line=None):
        return self.guard_bool()

    # ---- integer arithmetic ----
    def add(self, o): return self._new(self.expr + o.expr, _num(self, o))
    def sub(self, o): return self._new(self.expr - o.expr, _num(self, o))
    def mul(self, o): return self._new(self.expr * o.expr, _num(self, o))
    def neg(self): return self._new(-self.expr, self.pytype)
    def pos(self): return self
    def abs(self): return self._new(sympy.Abs(self.expr), self.pytype)
    def floordiv(self, o): return self._new(sympy.floor(self.expr / o.expr), int)
    int_floordiv = floordiv
    def mod(self, o): return self._new(sympy.Mod(self.expr, o.expr), int)
    def sym_max(self, o): return self._new(sympy.Max(self.expr, o.expr), _num(self, o))
    def sym_min(self, o): return self._new(sympy.Min(self.expr, o.expr), _num(self, o))
    def sym_sum(self, args): return self._new(sympy.Add(*[a.expr for a in args]), int)

    def pow_by_natural(self, o): return self._new(self.expr ** o.expr, int)

    # floats: `x / s`, `float(s)`, `s ** 0.5` stay expressions (a tensor op's scalar argument)
    def truediv(self, o): return self._new(self.expr / o.expr, float)
    int_truediv = float_truediv = truediv
    def pow(self, o): return self._new(self.expr ** o.expr, _num(self, o))
    float_pow = pow
    def sym_float(self): return self._new(self.expr, float)
    def sym_sqrt(self): return self._new(sympy.sqrt(self.expr), float)
    def sym_int(self): return self.wrap_int(self.guard_int())
    def ceil(self): return self.wrap_int(math.ceil(self.guard_float()))
    def floor(self): return self.wrap_int(math.floor(self.guard_float()))
    def trunc(self): return self.wrap_int(math.trunc(self.guard_float()))
    def round(self, ndigits=None):       # round(x, n) stays a float (was an int: wrong value)
        v = self.guard_float()
        return self.wrap_int(round(v)) if ndigits is None else self.wrap_float(round(v, ndigits))

    # ---- comparisons and logic ----
    def eq(self, o): return self._new(sympy.Eq(self.expr, o.expr), bool)
    def ne(self, o): return self._new(sympy.Ne(self.expr, o.expr), bool)
    def lt(self, o): return self._new(sympy.Lt(self.expr, o.expr), bool)
    def le(self, o): return self._new(sympy.Le(self.expr, o.expr), bool)
    def gt(self, o): return self._new(sympy.Gt(self.expr, o.expr), bool)
    def ge(self, o): return self._new(sympy.Ge(self.expr, o.expr), bool)
    def sym_and(self, o): return self._new(sympy.And(self.expr, o.expr), bool)
    def sym_or(self, o): return self._new(sympy.Or(self.expr, o.expr), bool)
    and_, or_ = sym_and, sym_or
    def sym_not(self): return self._new(sympy.Not(self.expr), bool)

    def sym_ite(self, then, other):
        return then if self.guard_bool() else other

    # ---- layout questions from TensorImpl (answered symbolically, guarded when open) ----
    def is_contiguous(self, sizes, strides):
        return self.wrap_bool(_dense_in_order(self.env, sizes, strides, list(range(len(sizes)))))

    def is_channels_last_contiguous_2d(self, sizes, strides):
        return self.wrap_bool(len(sizes) == 4 and
                              _dense_in_order(self.env, sizes, strides, [0, 2, 3, 1]))

    def is_channels_last_contiguous_3d(self, sizes, strides):
        return self.wrap_bool(len(sizes) == 5 and
                              _dense_in_order(self.env, sizes, strides, [0, 2, 3, 4, 1]))

    is_channels_last_strides_2d = is_channels_last_contiguous_2d
    is_channels_last_strides_3d = is_channels_last_contiguous_3d

    def is_non_overlapping_and_dense(self, sizes, strides):
        return self.wrap_bool(is_dense(self.env, sizes, strides))

    def is_non_overlapping_and_dense_indicator(self, sizes, strides):
        return self.wrap_int(int(self.is_non_overlapping_and_dense(sizes, strides).expr == sympy.true))


def _num(a, b):
    return float if float in (a.pytype, b.pytype) else int


def expr_of(x):
    """sympy expression of an int / SymInt (or of a SymNode)."""
    if isinstance(x, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        x = x.node
    if isinstance(x, SymNode):
        return x.expr
    return sympy.Integer(int(x)) if not isinstance(x, sympy.Basic) else x


def hint_int(x) -> int:
    """A size's value at the hints (an int passes through)."""
    if isinstance(x, torch.SymInt):
        return int(x.node.hint())
    return int(x)


def _hint(env, x):
    e = expr_of(x)
    return int(env.hint(e) if e.free_symbols else e)


def _decide(env, cond) -> bool:
    cond = sympy.sympify(cond)
    if not cond.free_symbols:
        return bool(cond)
    s = env.static(cond)
    return s if s is not None else bool(env.evaluate(cond))


def _dense_in_order(env, sizes, strides, order) -> bool:
    """Strides are the row-major strides of `sizes` laid out outermost-first in `order`."""
    expected = sympy.Integer(1)
    for d in reversed(order):
        size, stride = expr_of(sizes[d]), expr_of(strides[d])
        if _decide(env, sympy.Eq(size, 1)):
            continue
        if not _decide(env, sympy.Eq(stride, expected)):
            return False
        expected = expected * size
    return True


def dense_strides(sizes, strides) -> bool:
    """Concrete sizes and strides: every element at its own offset, no gaps (a permuted
    contiguous tensor). Plain int arithmetic, for per-call paths; `is_dense` decides symbolic ones."""
    expect = 1
    for st, n in sorted((st, n) for n, st in zip(sizes, strides) if n != 1):
        if st != expect:
            return False
        expect *= n
    return True


def is_dense(env, sizes, strides) -> bool:
    """Non-overlapping and dense: some permutation of the dims is row-major contiguous."""
    order = sorted(range(len(sizes)), key=lambda d: (_hint(env, strides[d]), _hint(env, sizes[d])),
                   reverse=True)
    return _dense_in_order(env, sizes, strides, order)


def env_of(*values) -> ShapeEnv | None:
    """The shape env behind any of ember's SymInts among `values` (tensors' sizes included).
    Another tracer's symbols (Dynamo's, in eager torch.cond's own compile) are not ours: None,
    so the Meta view kernels installed below hand those calls to the original kernels."""
    for v in values:
        if isinstance(v, torch.Tensor):
            for s in tuple(v.shape) + tuple(v.stride()):
                if isinstance(s, torch.SymInt) and isinstance(s.node, SymNode):
                    return s.node.env
        elif isinstance(v, (torch.SymInt, torch.SymBool, torch.SymFloat)) and \
                isinstance(v.node, SymNode):
            return v.node.env
        elif isinstance(v, (list, tuple)):
            e = env_of(*v)
            if e is not None:
                return e
    return None


def is_ours(t: torch.Tensor) -> bool:
    """No size or stride of `t` is a SymInt of another shape env (Dynamo's)."""
    return all(not isinstance(s, torch.SymInt) or isinstance(s.node, SymNode)
               for s in tuple(t.shape) + tuple(t.stride()))


def is_symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in tuple(t.shape) + tuple(t.stride()))


# ---- printing -----------------------------------------------------------------------------
_REL = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def pyexpr(expr, name) -> str:
    """Python source for a sympy size/guard expression; `name(symbol) -> str`."""
    e = expr
    if isinstance(e, sympy.Symbol):
        return name(e)
    if e is sympy.true or e is sympy.false:
        return str(bool(e))
    if e.is_Integer:
        return str(int(e))
    if isinstance(e, sympy.core.relational.Relational):
        return f"({pyexpr(e.lhs, name)} {_REL[e.rel_op]} {pyexpr(e.rhs, name)})"
    if isinstance(e, sympy.And):
        return "(" + " and ".join(pyexpr(a, name) for a in e.args) + ")"
    if isinstance(e, sympy.Or):
        return "(" + " or ".join(pyexpr(a, name) for a in e.args) + ")"
    if isinstance(e, sympy.Not):
        return f"(not {pyexpr(e.args[0], name)})"
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(pyexpr(a, name) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        num, den = sympy.fraction(e)
        if den != 1:     # a true division: floor division is always wrapped in floor()
            return f"({pyexpr(num, name)} / {pyexpr(den, name)})"
        return "(" + " * ".join(pyexpr(a, name) for a in e.args) + ")"
    if e.is_Number:
        return repr(float(e))
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
        return "(" + " * ".join([pyexpr(e.base, name)] * int(e.exp)) + ")"
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return f"({pyexpr(num, name)} // {pyexpr(den, name)})"
    if isinstance(e, sympy.Mod):
        return f"({pyexpr(e.args[0], name)} % {pyexpr(e.args[1], name)})"
    if isinstance(e, sympy.Max):
        return "max(" + ", ".join(pyexpr(a, name) for a in e.args) + ")"
    if isinstance(e, sympy.Min):
        return "min(" + ", ".join(pyexpr(a, name) for a in e.args) + ")"
    raise NotImplementedError(f"cannot print size expression {e}")


def _with_val(node, expr, env: ShapeEnv | None):
    """`node` with meta["val"], its SymInt/SymFloat, when there is an env: every size node has
    one, the partial products and sums of a chain too (the partitioner may save one for the
    backward, and the tracer places new size nodes after all nodes that have one)."""
    if env is not None and "val" not in node.meta:
        node.meta["val"] = env.symint(expr, int if expr.is_integer else float)
    return node


def to_fx(graph, expr, symbol_node, cache: dict, env: ShapeEnv | None = None):
    """FX nodes (operator.* on int nodes) computing a size expression; `symbol_node(s)`.
    With `env`, each new node's meta["val"] is its SymInt/SymFloat."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Number:
        return float(expr)
    hit = cache.get(expr)
    if hit is not None:
        return hit
    if isinstance(expr, sympy.Symbol):
        out = symbol_node(expr)
    elif isinstance(expr, (sympy.Add, sympy.Mul)):
        num, den = sympy.fraction(expr) if isinstance(expr, sympy.Mul) else (expr, 1)
        if den != 1:
            out = graph.call_function(operator.truediv, (to_fx(graph, num, symbol_node, cache, env),
                                                         to_fx(graph, den, symbol_node, cache, env)))
        else:
            op = operator.add if isinstance(expr, sympy.Add) else operator.mul
            args = [to_fx(graph, a, symbol_node, cache, env) for a in expr.args]
            out, part = args[0], expr.args[0]
            for a, e in zip(args[1:], expr.args[1:]):
                part = op(part, e)
                out = _with_val(graph.call_function(op, (out, a)), part, env)
    elif isinstance(expr, sympy.floor):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        out = graph.call_function(operator.floordiv, (to_fx(graph, num, symbol_node, cache, env),
                                                      to_fx(graph, den, symbol_node, cache, env)))
    elif isinstance(expr, sympy.Mod):
        out = graph.call_function(operator.mod, tuple(to_fx(graph, a, symbol_node, cache, env)
                                                      for a in expr.args))
    elif isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        b = to_fx(graph, expr.base, symbol_node, cache, env)
        out = b
        for k in range(2, int(expr.exp) + 1):
            out = _with_val(graph.call_function(operator.mul, (out, b)), expr.base ** k, env)
    elif isinstance(expr, sympy.Pow):
        out = graph.call_function(operator.pow, (to_fx(graph, expr.base, symbol_node, cache, env),
                                                 float(expr.exp)))
    elif isinstance(expr, (sympy.Max, sympy.Min)):
        f = max if isinstance(expr, sympy.Max) else min
        out = graph.call_function(f, tuple(to_fx(graph, a, symbol_node, cache, env) for a in expr.args))
    else:
        raise NotImplementedError(f"cannot build size expression {expr} in a graph")
    if hasattr(out, "meta"):
        _with_val(out, expr, env)
    cache[expr] = out
    return out


# ---- meta kernels for symbolic meta tensors -------------------------------------------------
# These aten ops have only a CompositeExplicitAutograd kernel that takes concrete sizes: on a
# meta tensor with symbolic sizes they raise or specialize the size (permute, constant_pad_nd,
# _to_copy). Registered for the Meta key once a symbol exists; a view computes sizes/strides/
# offset itself and returns `as_strided` of its input (a view of the same storage, as the
# original kernel gives); the others return a fresh meta tensor of the right geometry.
_installed = False


def _wrap_dim(d, n):
    return d + n if d < 0 else d


def _geom(t):
    return list(t.shape), list(t.stride()), t.storage_offset()


def _view(t, sizes, strides, offset):
    return torch.ops.aten.as_strided.default(t, sizes, strides, offset)


def _expand(t, size, implicit=False):
    sizes, strides, off = _geom(t)
    n = len(size)
    pad = n - len(sizes)
    out_s, out_st = [], []
    for i, want in enumerate(size):
        j = i - pad
        have = sizes[j] if j >= 0 else 1
        st = strides[j] if j >= 0 else 0
        if isinstance(want, int) and want == -1:
            want = have
        if _same(have, want):
            out_s.append(have)
            out_st.append(st)
        elif not isinstance(have, torch.SymInt) and have == 1:
            out_s.append(want)
            out_st.append(0)
        else:
            raise RuntimeError(f"expand: size {have} cannot expand to {want}")
    return _view(t, out_s, out_st, off)


def _same(a, b) -> bool:
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        env = env_of(a, b)
        return _decide(env, sympy.Eq(expr_of(a), expr_of(b)))
    return a == b


def _permute(t, dims):
    sizes, strides, off = _geom(t)
    dims = [_wrap_dim(d, len(sizes)) for d in dims]
    return _view(t, [sizes[d] for d in dims], [strides[d] for d in dims], off)


def _transpose(t, a, b):
    n = t.dim()
    dims = list(range(n))
    if n:
        a, b = _wrap_dim(a, n), _wrap_dim(b, n)
        dims[a], dims[b] = dims[b], dims[a]
    return _permute(t, dims)


def _t(t):
    return _transpose(t, 0, 1) if t.dim() == 2 else _permute(t, list(range(t.dim())))


def _clamp(v, lo, hi):
    return torch.sym_min(torch.sym_max(v, lo), hi)


def _slice(t, dim=0, start=None, end=None, step=1):
    sizes, strides, off = _geom(t)
    dim = _wrap_dim(dim, len(sizes))
    n = sizes[dim]
    start = 0 if start is None else start
    end = n if end is None else end
    if not isinstance(start, torch.SymInt) and start < 0:
        start = start + n
    if not isinstance(end, torch.SymInt) and end < 0:
        end = end + n
    if not isinstance(end, torch.SymInt) and end >= 2 ** 62:
        end = n
    start, end = _clamp(start, 0, n), _clamp(end, 0, n)
    end = torch.sym_max(end, start)
    length = (end - start + step - 1) // step
    sizes[dim] = length
    off = off + start * strides[dim]
    strides[dim] = strides[dim] * step
    return _view(t, sizes, strides, off)


def _select(t, dim, index):
    sizes, strides, off = _geom(t)
    dim = _wrap_dim(dim, len(sizes))
    if not isinstance(index, torch.SymInt) and index < 0:
        index = index + sizes[dim]
    off = off + index * strides[dim]
    del sizes[dim], strides[dim]
    return _view(t, sizes, strides, off)


def _unsqueeze(t, dim):
    sizes, strides, off = _geom(t)
    dim = _wrap_dim(dim, len(sizes) + 1)
    st = sizes[dim] * strides[dim] if dim < len(sizes) else 1
    sizes.insert(dim, 1)
    strides.insert(dim, st)
    return _view(t, sizes, strides, off)


def _squeeze(t, dims=None):
    sizes, strides, off = _geom(t)
    n = len(sizes)
    if dims is None:
        dims = range(n)
    elif isinstance(dims, int):
        dims = [dims]
    drop = {_wrap_dim(d, n) for d in dims if n and not isinstance(sizes[_wrap_dim(d, n)], torch.SymInt)
            and sizes[_wrap_dim(d, n)] == 1}
    return _view(t, [s for i, s in enumerate(sizes) if i not in drop],
                 [s for i, s in enumerate(strides) if i not in drop], off)


def _alias(t):
    return _view(t, *_geom(t))


def _split_with_sizes(t, split_sizes, dim=0):
    out, start = [], 0
    for s in split_sizes:
        out.append(_slice(t, dim, start, start + s))
        start = start + s
    return out


def _split(t, split_size, dim=0):
    n = t.shape[_wrap_dim(dim, t.dim())]
    hn = hint_int(n)
    hs = hint_int(split_size)
    count = max((hn + hs - 1) // hs, 1)
    if isinstance(n, torch.SymInt) or isinstance(split_size, torch.SymInt):
        # the number of pieces is a Python value: specialize it
        count = int((n + split_size - 1) // split_size) if hn else 1
    sizes = [split_size] * (count - 1) + [n - split_size * (count - 1)]
    return _split_with_sizes(t, sizes, dim)


def _unbind(t, dim=0):
    n = int(t.shape[_wrap_dim(dim, t.dim())])
    return [_select(t, dim, i) for i in range(n)]


_LAST_ORDER = {torch.channels_last: (0, 2, 3, 1), torch.channels_last_3d: (0, 2, 3, 4, 1)}


def _to_copy(t, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if memory_format in (None, torch.preserve_format) and \
            is_dense(env_of(t), list(t.shape), list(t.stride())):
        strides = list(t.stride())
    elif memory_format in _LAST_ORDER and t.dim() == len(_LAST_ORDER[memory_format]):
        # `.to(memory_format=channels_last)`: the meta kernel of oneDNN's conv returns its
        # output this way (a dynamic channels-last graph, docs/design/058)
        strides = row_major_strides(list(t.shape), _LAST_ORDER[memory_format])
    else:
        strides = row_major_strides(list(t.shape))
    return torch.empty_strided(list(t.shape), strides, dtype=dtype or t.dtype, device="meta")


def _constant_pad_nd(t, pad, value=0):
    sizes = list(t.shape)
    for i in range(len(pad) // 2):
        d = len(sizes) - 1 - i
        sizes[d] = sizes[d] + pad[2 * i] + pad[2 * i + 1]
    return torch.empty_strided(sizes, row_major_strides(sizes), dtype=t.dtype, device="meta")


def row_major_strides(sizes, order=None) -> list:
    """Strides of `sizes` laid out densely with dims in `order` (outermost first; default:
    contiguous). Sizes may be ints or SymInts."""
    order = range(len(sizes)) if order is None else order
    strides = [0] * len(sizes)
    acc = 1
    for d in reversed(list(order)):
        strides[d] = acc
        acc = acc * sizes[d]
    return strides


_VIEWS = {
    "expand": _expand, "permute": _permute, "transpose.int": _transpose, "t": _t,
    "slice.Tensor": _slice, "select.int": _select, "unsqueeze": _unsqueeze,
    "squeeze": _squeeze, "squeeze.dim": _squeeze, "squeeze.dims": _squeeze,
    "alias": _alias, "split_with_sizes": _split_with_sizes, "split.Tensor": _split,
    "unbind.int": _unbind, "_to_copy": _to_copy, "constant_pad_nd": _constant_pad_nd,
}
_LIB = None


def _symbolic_or_original(op, fn):
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)

    def kernel(*args, **kwargs):
        if env_of(*args, *kwargs.values()) is None:
            return op.redispatch(keys, *args, **kwargs)
        return fn(*args, **kwargs)
    return kernel


def install_meta_views() -> None:
    """Register the kernels above for the Meta key (once); concrete calls take the original."""
    global _installed, _LIB
    if _installed:
        return
    _installed = True
    _LIB = torch.library.Library("aten", "IMPL")
    for name, fn in _VIEWS.items():
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        _LIB.impl(name, _symbolic_or_original(op, fn), "Meta")
