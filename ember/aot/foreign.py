"""Stage 2, aot: symbolic graphs from another capture (Dynamo's dynamic shapes).

Dynamo hands a backend a graph whose size placeholders are SymInts of its own shape env, and
whose tensor placeholders carry FakeTensors with symbolic sizes. ember traces, decomposes and
lowers on its own env (shapes.py), so `adopt` maps each of Dynamo's size symbols to a fresh
ember symbol with the same hint: a SymInt placeholder becomes that symbol, a tensor's sizes and
strides the same expressions over ember's symbols.

Dynamo's guards cover what Dynamo decided about the sizes, not what ember's stages decide
(a decomposition that branches on `size == 1`, a lowering that specializes): those land in
ember's env as guards. `ForeignShapes` checks them on every call, from the call's own ints and
tensor sizes, and compiles another variant when they fail, so a call never runs a graph built
for other sizes.

Consumes: fx.GraphModule + example inputs (a backend's). Produces: specs for `trace_program`,
and the dispatcher over compiled variants.
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten

from .. import shapes
from ..errors import Unsupported
from ..logging import warn_once


def _foreign(v) -> bool:
    if isinstance(v, torch.SymInt):
        return not isinstance(v.node, shapes.SymNode)
    return isinstance(v, torch.Tensor) and not shapes.is_ours(v)


def placeholder_values(gm, n: int) -> list:
    phs = [p for p in gm.graph.nodes if p.op == "placeholder"] if gm is not None else []
    if len(phs) != n:
        return [None] * n
    return [p.meta.get("example_value", p.meta.get("val")) for p in phs]


def is_foreign(gm, example_inputs) -> bool:
    return any(_foreign(v) for v in
               list(example_inputs) + placeholder_values(gm, len(example_inputs)))


def _hint(s) -> int:
    if not isinstance(s, torch.SymInt):
        return int(s)
    h = getattr(s.node, "hint", None)
    if h is None:
        raise Unsupported("ember.aot: an unbacked size symbol (a data-dependent size) in a graph "
                          "from another capture")
    return int(h)


def adopt(gm, example_inputs):
    """(env, specs, inputs, sources): ember's specs for `example_inputs`, the inputs with
    Dynamo's SymInts replaced by ember's, and [(ember symbol or pinned int, where it is read at
    run time: ("int", i) or ("dim", i, d))]."""
    from .tracer import TensorSpec
    env = shapes.ShapeEnv()
    mapping: dict = {}
    sources: list = []
    metas = placeholder_values(gm, len(example_inputs))

    def symbol_for(sym, hint, source):
        if sym not in mapping:
            if hint < shapes.LOWER_BOUND:      # 0 and 1 specialize (checked: == hint)
                mapping[sym] = sympy.Integer(hint)
            else:
                mapping[sym] = env.new_symbol(hint, source).node.expr
            sources.append((mapping[sym], source))
        return mapping[sym]

    # bare symbols first: a SymInt input, then a tensor dim that is one symbol
    for i, (x, m) in enumerate(zip(example_inputs, metas)):
        v = m if m is not None else x
        if isinstance(v, torch.SymInt) and _foreign(v) and isinstance(v.node.expr, sympy.Symbol):
            symbol_for(v.node.expr, _hint(x if not isinstance(x, torch.SymInt) else v),
                       ("int", i))
    for i, (x, m) in enumerate(zip(example_inputs, metas)):
        v = m if isinstance(m, torch.Tensor) else x
        if isinstance(v, torch.Tensor):
            for d, s in enumerate(v.shape):
                if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                    hint = x.shape[d] if isinstance(x, torch.Tensor) else _hint(s)
                    symbol_for(s.node.expr, int(hint), ("dim", i, d))

    def conv(s):
        if not isinstance(s, torch.SymInt):
            return s
        expr = s.node.expr
        missing = expr.free_symbols - set(mapping)
        if missing:
            raise Unsupported(f"ember.aot: size symbol(s) {sorted(map(str, missing))} of another "
                              "capture are no input's size, so they cannot be read at run time")
        return env.symint(expr.xreplace(mapping))

    specs, inputs = [], []
    for x, m in zip(example_inputs, metas):
        v = m if m is not None else x
        if isinstance(x, torch.Tensor):
            t = v if isinstance(v, torch.Tensor) else x
            specs.append(TensorSpec(tuple(conv(s) for s in t.shape),
                                    tuple(conv(s) for s in t.stride()), x.dtype, x.device,
                                    bool(x.requires_grad)))
            inputs.append(x)
        elif isinstance(v, torch.SymInt):
            specs.append(conv(v))
            inputs.append(specs[-1])
        else:
            specs.append(x)
            inputs.append(x)
    return env, specs, inputs, sources


def _read(source) -> str:
    return f"a[{source[1]}]" if source[0] == "int" else f"a[{source[1]}].shape[{source[2]}]"


def guard_check(env, sources):
    """A function of the call's arguments: True when ember's size guards hold for them."""
    where = {e: src for e, src in sources if isinstance(e, sympy.Symbol)}
    exprs = [shapes.pyexpr(g, lambda s: _read(where[s])) for g in env.guards]
    exprs += [f"{_read(src)} >= {shapes.LOWER_BOUND}" if isinstance(e, sympy.Symbol)
              else f"{_read(src)} == {int(e)}" for e, src in sources]
    return eval(f"lambda a: {' and '.join(exprs) or 'True'}")      # noqa: S307 - our own text


class ForeignShapes:
    """Runs the variant whose guards the call's sizes satisfy; compiles a new one otherwise."""

    def __init__(self, build):
        self.build = build           # build(example_inputs) -> (check, runtime)
        self.variants: list = []

    def add(self, check, runtime):
        self.variants.append((check, runtime))
        return self

    def __call__(self, *args):
        for check, runtime in self.variants:
            if check(args):
                return runtime(*args)
        check, runtime = self.build(list(args))
        self.variants.append((check, runtime))
        return runtime(*args)


# --- scalars read from inputs (`y.item()`, `sz.tolist()`): one variant per value ---------------
# Dynamo (capture_scalar_outputs, or a float argument under dynamic=True) passes a scalar as a
# tensor input and reads it in the graph: an unbacked symbol ember's tracer cannot size by. When
# every such read is of an input (or an element of one), the graph is compiled per value: the
# read becomes that constant, the size checks Dynamo emitted about it (`_assert_scalar(u0 >=
# 0)`, `sym_sum`) are evaluated at compile time (a failing one raises as eager would), and each
# call reads the values first and runs the variant built for them. Past VALUE_VARIANTS distinct
# values the graph runs eagerly (one warning): a value that changes every call would otherwise
# compile every call.
VALUE_VARIANTS = 8

_READS = {"item", "tolist"}
_FOLD = {torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range_for_size.default,
         torch.ops.aten.sym_constrain_range.default, torch._check, torch._check_is_size,
         torch.sym_sum, torch.sym_max, torch.sym_min, torch.sym_not, torch.sym_float, torch.sym_int}


def _is_read(n: fx.Node) -> bool:
    return n.op == "call_method" and n.target in _READS or \
        n.op == "call_function" and n.target in (torch.Tensor.item, torch.Tensor.tolist,
                                                 torch.ops.aten._local_scalar_dense.default)


def _foldable(n: fx.Node) -> bool:
    return n.op == "call_function" and (n.target in _FOLD or getattr(
        n.target, "__module__", None) in ("_operator", "math", "builtins"))


def scalar_reads(gm: fx.GraphModule) -> list[fx.Node]:
    """The graph's reads of tensor values into Python scalars, if each reads an input (through
    integer indexing only); [] if there is none or one reads a computed tensor."""
    reads = [n for n in gm.graph.nodes if _is_read(n)]
    for n in reads:
        src = n.args[0]
        while src.op == "call_function" and src.target is operator.getitem and \
                isinstance(src.args[1], int):
            src = src.args[0]
        if src.op != "placeholder":
            return []
    return reads


def _read_values(gm, reads, args) -> tuple:
    env = dict(zip(gm.graph.find_nodes(op="placeholder"), args))

    def ev(n):
        if n not in env:
            x = ev(n.args[0])
            env[n] = x[n.args[1]] if n.target is operator.getitem else \
                x.tolist() if "tolist" in str(n.target) else x.item()
        return env[n]
    return tuple(tuple(v) if isinstance(v, list) else v for v in map(ev, reads))


def specialize(gm: fx.GraphModule, reads, values) -> fx.GraphModule:
    """`gm` with each read replaced by its value and the scalar code on it folded."""
    g = fx.Graph()
    val_map: dict = {}
    g.output(g.graph_copy(gm.graph, val_map))
    const = {val_map[r]: list(v) if isinstance(v, tuple) else v for r, v in zip(reads, values)}
    for n in list(g.nodes):
        if n not in const and _foldable(n):
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda x: const.get(x, x))
            if not any(isinstance(a, fx.Node) for a in tree_flatten((args, kwargs))[0]):
                const[n] = n.target(*args, **kwargs)     # raises where eager would
        if n in const:
            for u in list(n.users):
                u.args, u.kwargs = fx.node.map_arg((u.args, u.kwargs),
                                                   lambda x: const.get(x, x))
    for n in reversed(list(g.nodes)):
        if n in const and not n.users:
            g.erase_node(n)
    g.eliminate_dead_code()
    return fx.GraphModule(gm, g)


class ValueSpecialized:
    """Runs the variant compiled for the values the call's scalar reads give."""

    def __init__(self, gm, reads, build):
        self.gm, self.reads, self.build = gm, reads, build   # build(gm, inputs) -> runtime
        self.variants: dict = {}

    def __call__(self, *args):
        key = _read_values(self.gm, self.reads, args)
        runtime = self.variants.get(key)
        if runtime is None and len(self.variants) >= VALUE_VARIANTS:
            warn_once(f"value-variants:{id(self)}", f"ember: a graph reading input values "
                      f"(.item()) saw over {VALUE_VARIANTS} distinct ones; it runs eagerly now")
            return self.gm.forward(*args)
        if runtime is None:
            runtime = self.build(specialize(self.gm, self.reads, key), list(args))
            self.variants[key] = runtime
        return runtime(*args)
