"""Stage aot, tracer: run a callable on meta tensors under a TorchDispatchMode and record every aten
op into a functional FX graph.

Consumes: a callable (a torch-level fx.GraphModule from capture/Dynamo, or any function) and input
specs (shape/stride/dtype/requires_grad; FakeTensors are only read for those).
Produces: `Tracer` state — an fx.Graph whose call_function nodes are aten OpOverloads with
node.meta["val"] (a fresh meta tensor per node), which inputs were mutated, and how each output
aliases inputs or other outputs (`OutputSpec`).

Functionalization happens while tracing. Every user-visible meta tensor maps to the graph node that
holds its current value. A view remembers (parent, view op, args); an in-place op records its
functional form (functionalize.py), then the new value is scattered up the view chain into the base
and the storage's generation is bumped, so every other alias regenerates its node (view replay from
the new base) the next time it is read. Decompositions (ember.decomp) apply at dispatch, recursively:
a decomposition runs under this mode, so its body is traced like user code.
"""
from __future__ import annotations

import contextlib
import dataclasses
import operator
from types import FunctionType
from typing import Any, Callable

import sympy
import torch
import torch.fx as fx
from torch.overrides import TorchFunctionMode, redispatch_function
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_flatten, tree_map

from .. import regions, shapes
from ..errors import InternalError, Unsupported
from ..fallback import stage
from .attention import cpu_sdpa
from .functionalize import IDENTITY_VIEWS, SCATTER, SCATTER_MULTI, functional_variant, mutated_args

aten = torch.ops.aten
META = torch.device("meta")
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
# the functionalizer's own primitive: how decompositions write, never decomposed itself
NEVER_DECOMPOSE = frozenset({aten.copy_.default})


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool

    @staticmethod
    def of(t: torch.Tensor) -> "TensorSpec":
        return TensorSpec(tuple(t.shape), tuple(t.stride()), t.dtype, t.device, bool(t.requires_grad))


@dataclasses.dataclass
class OutputSpec:
    """How the runtime produces one user output.

    kind: "graph"  — graph output `slot`;
          "input"  — the runtime input `index` itself (after its mutation is applied);
          "view"   — replay `views` on the input `index` (after mutation) or on graph output `slot`;
          "dup"    — the same object as user output `index`;
          "const"  — the Python value `value`.
    """

    kind: str
    slot: int | None = None
    index: int | None = None
    views: tuple = ()
    value: Any = None
    requires_grad: bool = False


def _is_factory(func) -> bool:
    """`func` takes a `device` keyword and no tensor argument (a factory)."""
    sch = func._schema
    return any(a.name == "device" and a.kwarg_only for a in sch.arguments) and not any(
        isinstance(a.type, torch.TensorType) for a in sch.arguments)


def _skey(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def fresh_val(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with t's geometry and its own storage (node.meta["val"])."""
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=META)


def _val_of(x):
    if isinstance(x, torch.Tensor):
        return fresh_val(x)
    if isinstance(x, (tuple, list)):
        return tuple(_val_of(y) for y in x)
    return x


@dataclasses.dataclass
class _Storage:
    base: torch.Tensor
    gen: int = 0
    input_index: int | None = None


class Tracer(TorchDispatchMode):
    """Records aten ops on meta tensors into `self.graph`, functionalizing as it goes."""

    def __init__(self, decompositions: dict | None, device: torch.device):
        super().__init__()
        self.graph = fx.Graph()
        self.decomps = dict(decompositions or {})
        self.device = torch.device(device)
        self._node: dict[int, tuple[torch.Tensor, fx.Node, int]] = {}   # id(t) → (t, node, gen)
        self._view: dict[int, tuple] = {}        # id(t) → (parent, op, args, kwargs, index)
        self._storage: dict[int, _Storage] = {}
        self._val_tensor: dict[fx.Node, torch.Tensor] = {}
        self.inputs: list[torch.Tensor] = []
        self.placeholders: list[fx.Node] = []
        self.constants: list[tuple[fx.Node, torch.Tensor]] = []
        self._const_ids: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._decomposing: set = set()
        self._selective = False         # inside an op a selective-checkpoint policy was asked
        self._rng0 = torch.default_generator.get_state()
        # dynamic shapes: where each size symbol's value comes from (an int input, or a dim of
        # a tensor input), and the nodes computing size expressions
        self._symbols: dict = {}
        self._symbol_dims: dict = {}
        self._size_nodes: dict = {}

    # ---- inputs -------------------------------------------------------------------------
    def add_input(self, name: str, spec: TensorSpec | Any) -> Any:
        node = self.graph.placeholder(name)
        self.placeholders.append(node)
        if not isinstance(spec, TensorSpec):
            node.meta["val"] = spec
            self.inputs.append(spec)
            if isinstance(spec, torch.SymInt) and isinstance(shapes.expr_of(spec), sympy.Symbol):
                self._symbols[shapes.expr_of(spec)] = node
            return spec
        for d, n in enumerate(spec.shape):
            if isinstance(n, torch.SymInt) and isinstance(shapes.expr_of(n), sympy.Symbol):
                self._symbol_dims.setdefault(shapes.expr_of(n), (node, d))
        t = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=META)
        if spec.requires_grad:
            t.requires_grad_(True)
        node.meta["val"] = fresh_val(t)
        self._register(t, node)
        self._storage[_skey(t)].input_index = len(self.inputs)
        self.inputs.append(t)
        return t

    def _lift_constant(self, real: torch.Tensor) -> torch.Tensor:
        ent = self._const_ids.get(id(real))
        if ent is not None and ent[0] is real:
            return ent[1]
        node = self.graph.placeholder(f"_const{len(self.constants)}")
        t = torch.empty_strided(tuple(real.shape), tuple(real.stride()), dtype=real.dtype, device=META)
        node.meta["val"] = fresh_val(t)
        self._register(t, node)
        self.constants.append((node, real.detach()))
        self._const_ids[id(real)] = (real, t)   # holding `real` keeps its id from being reused
        return t

    # ---- tensor ↔ node ----------------------------------------------------------------
    def _register(self, t: torch.Tensor, node: fx.Node, view: tuple | None = None) -> None:
        key = _skey(t)
        st = self._storage.get(key)
        if st is None:
            st = self._storage[key] = _Storage(base=t)
        elif view is None and t is not st.base and id(t) not in self._view:
            # an op that aliases without being a view op (e.g. _unsafe_view): track as identity view
            view = (st.base, None, (), {}, None)
        self._node[id(t)] = (t, node, st.gen)
        if view is not None:
            self._view[id(t)] = view

    def node_of(self, t: torch.Tensor) -> fx.Node:
        ent = self._node.get(id(t))
        if ent is None or ent[0] is not t:
            if t.device.type != "meta":
                return self.node_of(self._lift_constant(t))
            raise InternalError(f"ember.aot tracer: unknown meta tensor {tuple(t.shape)} {t.dtype}")
        _, node, gen = ent
        st = self._storage[_skey(t)]
        if gen == st.gen:
            return node
        parent, op, args, kwargs, index = self._view[id(t)]
        pnode = self.node_of(parent)
        node = self._replay_view(op, pnode, args, kwargs, index, t)
        self._node[id(t)] = (t, node, st.gen)
        return node

    def tensor_of(self, node: fx.Node) -> torch.Tensor:
        """A traced meta tensor whose value is `node` (never mutated: it has its own storage)."""
        t = self._val_tensor.get(node)
        if t is None:
            t = fresh_val(node.meta["val"])
            self._register(t, node)
            self._val_tensor[node] = t
        return t

    def _meta_arg(self, x):
        if isinstance(x, torch.Tensor):
            if x.device.type != "meta":
                return self._lift_constant(x)
            return x
        if isinstance(x, torch.device):
            return META
        return x

    def _node_arg(self, x):
        if isinstance(x, torch.Tensor):
            return self.node_of(x)
        if isinstance(x, (torch.SymInt, torch.SymFloat)):
            return self.size_node(x)
        if isinstance(x, torch.device):
            return self.device if x.type == "meta" else x
        return x

    def size_node(self, x) -> fx.Node | int | float:
        """A node computing SymInt/SymFloat `x` from the inputs (aten.sym_size of an input dim)."""
        env = x.node.env
        first = _first_op(self.graph)       # sizes first: ops later in the graph may use them
        with self.graph.inserting_before(first) if first is not None else contextlib.nullcontext():
            return shapes.to_fx(self.graph, shapes.expr_of(x), self._symbol_node,
                                self._size_nodes, env)

    def _symbol_node(self, sym) -> fx.Node:
        node = self._symbols.get(sym)
        if node is None:
            src = self._symbol_dims.get(sym)
            if src is None:
                raise InternalError(f"ember.aot tracer: size symbol {sym} is no input's size")
            node = self.graph.call_function(aten.sym_size.int, src)
            self._symbols[sym] = node
        return node

    # ---- emitting ----------------------------------------------------------------------
    def emit(self, op, args, kwargs, out) -> fx.Node | list:
        """Append `op(*args, **kwargs)` (args already nodes) with the meta result `out`."""
        node = self.graph.call_function(op, tuple(args), dict(kwargs))
        node.meta["val"] = _val_of(out)
        recompute = regions.current()
        if recompute is not None:
            node.meta["recompute"] = recompute
        if isinstance(out, (tuple, list)):
            items = []
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    g = self.graph.call_function(operator.getitem, (node, i))
                    g.meta["val"] = fresh_val(o)
                    if recompute is not None:
                        g.meta["recompute"] = recompute
                    items.append(g)
                else:
                    items.append(None)
            return items
        return node

    def call(self, op, *args, **kwargs):
        """Run aten `op` on traced tensors through this mode (decompositions apply)."""
        if _get_current_dispatch_mode() is self:
            return op(*args, **kwargs)
        with self:
            return op(*args, **kwargs)

    def _replay_view(self, op, pnode, args, kwargs, index, t) -> fx.Node:
        if op is None:                                   # identity alias
            return pnode
        base = self.tensor_of(pnode)
        out = self.call(op, base, *args, **kwargs)
        if index is not None:
            out = out[index]
        return self.node_of(out)

    # ---- dispatch ----------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t not in _PLAIN_TYPES for t in types):
            # a tensor subclass (aot/subclass.py): its __torch_dispatch__ runs next and calls
            # aten on its inner tensors, which come back here
            return NotImplemented
        if regions.has_policy() and not self._selective:
            return self._dispatch_selective(func, types, args, kwargs)
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            self._check_rng_untouched(func)
        decomp = self.decomps.get(func)
        if decomp is not None and func not in self._decomposing and func not in NEVER_DECOMPOSE:
            # a decomposition that calls its own op (a fallback case) records that op as is
            self._decomposing.add(func)
            try:
                with self, stage("decomp"):
                    out = decomp(*args, **kwargs)
            finally:
                self._decomposing.discard(func)
            if out is not NotImplemented:
                return out
        rule = SPECIAL.get(func)
        if rule is not None:
            out = rule(self, func, args, kwargs)
            if out is not NotImplemented:
                return out
        if torch.Tag.data_dependent_output in func.tags or func is aten._local_scalar_dense.default:
            raise Unsupported(f"ember.aot: data-dependent op {func} (a value read back to Python)")
        if torch.Tag.inplace_view in func.tags:
            return self._inplace_view_op(func, args, kwargs)
        if func.is_view:
            return self._view_op(func, args, kwargs)
        if func._schema.is_mutable:
            return self._mutating_op(func, args, kwargs)
        return self._functional_op(func, args, kwargs)

    def _dispatch_selective(self, func, types, args, kwargs):
        """An op in a selective-checkpoint region: recorded as usual (the ops of its
        decomposition are not asked), then its outputs are tagged when the policy saves it."""
        self._selective = True
        try:
            out = self.__torch_dispatch__(func, types, args, kwargs)
        finally:
            self._selective = False
        if regions.must_save(func, args, kwargs or {}):
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor):
                    self.node_of(o).meta["sac_save"] = True
        return out

    def _check_rng_untouched(self, func) -> None:
        """A random op after the traced code reseeded the global RNG (torch.manual_seed inside
        the graph, as under `freeze_rng_state`) would draw from the caller's state at run time,
        not from the seed: a silently different result. Restore the state and refuse."""
        if not torch.equal(torch.default_generator.get_state(), self._rng0):
            torch.default_generator.set_state(self._rng0)
            raise Unsupported(f"ember.aot: {func} draws random numbers after the traced code "
                              f"changed the global RNG state (torch.manual_seed inside the graph)",
                              hint="seed outside the compiled region")

    def _run_meta(self, func, args, kwargs):
        margs = tree_map(self._meta_arg, args)
        mkwargs = tree_map(self._meta_arg, kwargs)
        if mkwargs.get("device") is None and _is_factory(func):
            # a factory without a device (aten.full(size, v) in a graph) would run its CPU
            # kernel, which refuses symbolic sizes: make it on meta (recorded as self.device)
            mkwargs["device"] = META
        try:
            out = func(*margs, **mkwargs)
            if func in _CPU_FOLLOWS_INPUT and self.device.type == "cpu":
                out = _cpu_conv_layout(margs[0], out)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.layout != torch.strided:
                    # a sparse gradient (gather/embedding sparse_grad=True), to_sparse, ...
                    raise Unsupported(f"ember.aot: {func} makes a {t.layout} tensor (only "
                                      "strided tensors are compiled)")
            return out, margs, mkwargs
        except NotImplementedError as e:
            # no meta kernel: the output's shape cannot be known without running the op
            if torch.Tag.dynamic_output_shape in func.tags:
                raise Unsupported(f"ember.aot: data-dependent output shape of {func} "
                                  f"(a boolean mask index, nonzero, unique, ...)") from e
            raise Unsupported(f"ember.aot: {func} has no meta kernel, so it cannot be traced") from e

    def _functional_op(self, func, args, kwargs):
        out, margs, mkwargs = self._run_meta(func, args, kwargs)
        nodes = self.emit(func, tree_map(self._node_arg, margs), tree_map(self._node_arg, mkwargs), out)
        view = None
        if (isinstance(out, torch.Tensor) and margs and isinstance(margs[0], torch.Tensor)
                and out is not margs[0] and _skey(out) == _skey(margs[0])):
            # aliases its input without being a view op (_unsafe_view): replay it like a view,
            # so regenerating this alias keeps the op's shape instead of the base's
            view = (margs[0], func, tuple(margs[1:]), dict(mkwargs), None)
        self._register_out(out, nodes, view)
        return out

    def _register_out(self, out, nodes, view=None):
        if isinstance(out, torch.Tensor):
            self._register(out, nodes, view)
        elif isinstance(out, (tuple, list)):
            for i, (o, n) in enumerate(zip(out, nodes)):
                if isinstance(o, torch.Tensor):
                    self._register(o, n, None if view is None else view[:4] + (i,))

    def _view_op(self, func, args, kwargs):
        out, margs, mkwargs = self._run_meta(func, args, kwargs)
        if margs and out is margs[0]:
            # the op returns its argument itself (lift_fresh of a `torch.tensor([])` made in the
            # graph, as HF's DynamicCache starts its layers): nothing to record, and a view of
            # itself would be a cycle in the alias chain
            return out
        nodes = self.emit(func, tree_map(self._node_arg, margs), tree_map(self._node_arg, mkwargs), out)
        self._register_out(out, nodes, view=(margs[0], func, tuple(margs[1:]), dict(mkwargs), None))
        return out

    def _inplace_view_op(self, func, args, kwargs):
        """`t.squeeze_(d)` on an intermediate (matmul of a 1-D operand emits it): record the
        out-of-place view and rebind `t` to it. `t` stays the autograd-visible tensor, so it is
        registered as a value of its own (not a view of a hidden pre-squeeze alias, which would
        carry no autograd history and make the output non-differentiable); when `t` is itself
        a view of an intermediate, its view record composes both ops (`_then`)."""
        t = args[0]
        rest = tuple(tree_map(self._meta_arg, tuple(args[1:])))
        kwargs = tree_map(self._meta_arg, kwargs)
        st = self._storage[_skey(t)]
        if st.input_index is not None:
            raise Unsupported(f"ember.aot: in-place metadata change {func} of a graph input is "
                              "not supported")
        view_func = _out_of_place_view(func)
        old_node = self.node_of(t)
        prev = self._view.get(id(t))
        func(t, *rest, **kwargs)  # meta: changes t's sizes/strides in place
        node = self.emit(view_func, (old_node,) + tree_map(self._node_arg, rest),
                         tree_map(self._node_arg, kwargs), t)
        self._node[id(t)] = (t, node, st.gen)
        if prev is not None:
            # a view of an intermediate (vmap's matmul batching rule squeezes one): it is
            # regenerated from its parent by both view ops; a write through it has no scatter
            # rule for the pair, so it is refused there
            parent, op, args, kw, index = prev
            self._view[id(t)] = (parent, _then(op, args, kw, index, view_func, rest, kwargs),
                                 (), {}, None)
        return t

    def _mutating_op(self, func, args, kwargs):
        form = functional_variant(func)
        if form.op.namespace == "ember_functional" and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in tree_flatten((args, kwargs))[0]):
            # a custom op has no derivative here: its gradient would be silently missing
            raise Unsupported(f"ember.aot: the mutating custom op {func} on tensors that require "
                              "grad (it has no autograd formula ember can trace)")
        bound = bind_args(func, args, kwargs)
        fargs = [bound[a.name] for a in form.op._schema.arguments if not a.kwarg_only and a.name in bound]
        fkwargs = {a.name: bound[a.name] for a in form.op._schema.arguments if a.kwarg_only and a.name in bound}
        fout, margs, mkwargs = self._run_meta(form.op, fargs, fkwargs)
        fnodes = self.emit(form.op, tree_map(self._node_arg, margs), tree_map(self._node_arg, mkwargs), fout)
        if not isinstance(fnodes, list):
            fnodes = [fnodes]
        # the original op on meta gives the user-visible results (mutated args returned as is)
        out, _, _ = self._run_meta(func, args, kwargs)
        new_values = fnodes[form.n_orig:]
        for name, new in zip(form.mutated, new_values):
            target = bound[name]
            if isinstance(target, (list, tuple)):
                raise Unsupported(f"ember.aot: {func} mutates a list of tensors")
            self.mutate(target, new)
        if form.n_orig:
            origs = fnodes[:form.n_orig]
            self._register_out(out if isinstance(out, (tuple, list)) else out,
                               origs if isinstance(out, (tuple, list)) else origs[0])
        return out

    def mutate(self, t: torch.Tensor, new: fx.Node) -> None:
        """`t` now holds `new` (a node with t's shape): scatter it into t's base, bump the storage."""
        val = new.meta["val"]
        if val.dtype != t.dtype:
            new = self.node_of(self.call(aten._to_copy.default, self.tensor_of(new), dtype=t.dtype))
        if tuple(val.shape) != tuple(t.shape):
            new = self.node_of(self.call(aten.expand.default, self.tensor_of(new), list(t.shape)))
        st = self._storage[_skey(t)]
        cur_t, cur = t, new
        chain = []
        while id(cur_t) in self._view:
            parent, op, args, kwargs, index = self._view[id(cur_t)]
            pnode = self.node_of(parent)
            if op is None:
                nb = cur
            else:
                nb = self._scatter(op, pnode, cur, args, kwargs, index)
            chain.append((parent, nb))
            cur_t, cur = parent, nb
        st.gen += 1
        self._node[id(t)] = (t, new, st.gen)
        for parent, nb in chain:
            self._node[id(parent)] = (parent, nb, st.gen)

    def _scatter(self, op, pnode, src, args, kwargs, index) -> fx.Node:
        base_t, src_t = self.tensor_of(pnode), self.tensor_of(src)
        if index is not None:
            rule = SCATTER_MULTI.get(op)
            if rule is None:
                raise Unsupported(f"ember.aot: mutation through the view op {op} is not supported")
            out = rule(self.call, base_t, src_t, *args, index=index, **kwargs)
        else:
            rule = SCATTER.get(op)
            if rule is None:
                raise Unsupported(f"ember.aot: mutation through the view op {op} is not supported")
            out = rule(self.call, base_t, src_t, *args, **kwargs)
        return self.node_of(out)

    # ---- results -----------------------------------------------------------------------
    def mutated_inputs(self) -> list[int]:
        return [st.input_index for st in self._storage.values()
                if st.input_index is not None and st.gen > 0]

    def input_new_value(self, index: int) -> fx.Node:
        return self.node_of(self.inputs[index])

    def view_chain(self, t: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """(root tensor, ((op, args, kwargs, index), ...)) replaying t from its storage's base."""
        chain, seen = [], set()
        while id(t) in self._view:
            if id(t) in seen:  # never loop: an aliasing pattern we cannot replay
                raise Unsupported("ember.aot: cyclic alias chain between tensors (unsupported "
                                  "aliasing pattern); this graph runs eagerly")
            seen.add(id(t))
            parent, op, args, kwargs, index = self._view[id(t)]
            if op is not None:
                chain.append((op, args, kwargs, index))
            t = parent
        return t, tuple(reversed(chain))

    def is_alias(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return _skey(a) == _skey(b)

    def storage_root(self, t: torch.Tensor) -> torch.Tensor:
        return self.view_chain(t)[0]

    def input_index_of(self, t: torch.Tensor) -> int | None:
        st = self._storage.get(_skey(t))
        return None if st is None else st.input_index


#: ops whose CPU kernel returns channels-last for a channels-last input where the meta kernel
#: says contiguous (the others ember decomposes follow their input by construction)
_CPU_FOLLOWS_INPUT = frozenset((torch.ops.aten.convolution.default,
                                torch.ops.aten.reflection_pad2d.default,
                                torch.ops.aten.replication_pad2d.default))


def _cpu_conv_layout(x, out):
    """The CPU convolution (and _CPU_FOLLOWS_INPUT's ops) returns channels-last for a
    channels-last input, where the meta kernel says contiguous; what follows (a cat, an add)
    takes its layout from it, so the traced layouts would differ from eager's (Inductor's
    test_cat_of_loops_and_extern_kernel)."""
    if not (isinstance(out, torch.Tensor) and out.dim() == 4 and x.dim() == 4) or any(
            isinstance(v, torch.SymInt) for v in (*x.shape, *x.stride(), *out.shape)):
        return out
    n, c, h, w = x.shape
    if c == 1 or h * w == 1 or tuple(x.stride()) != (h * w * c, 1, w * c, c):
        return out
    n, c, h, w = out.shape
    if c == 1 or h * w == 1:
        return out
    return torch.empty_strided(out.shape, (h * w * c, 1, w * c, c), dtype=out.dtype, device="meta")


def _then(op, args, kwargs, index, view_func, rest, rest_kwargs):
    """One view op replaying `op` (None: an identity alias), then `view_func`."""
    def replay(base):
        x = base if op is None else op(base, *args, **kwargs)
        return view_func(x if index is None else x[index], *rest, **rest_kwargs)
    replay.__name__ = f"{getattr(op, '__name__', 'alias')}_then_{view_func.__name__}"
    return replay


def _out_of_place_view(func):
    """aten.squeeze_.dim → aten.squeeze.dim; overload names can differ (transpose_.default →
    transpose.int), so match on the argument names when the same name is missing."""
    packet = getattr(aten, func._schema.name.split("::")[1].rstrip("_"))
    same = getattr(packet, func._overloadname, None)
    if same is not None:
        return same
    names = [a.name for a in func._schema.arguments]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        if [a.name for a in cand._schema.arguments] == names:
            return cand
    raise Unsupported(f"ember.aot: no out-of-place form of {func}")


def bind_args(func, args, kwargs) -> dict:
    """Argument name → value for a call of `func`, schema defaults filled in."""
    bound = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def _native_batch_norm(tracer: Tracer, func, args, kwargs):
    # native_batch_norm updates running_mean/var in training mode without saying so in its schema
    bound = bind_args(func, args, kwargs)
    if not bound["training"] or bound["running_mean"] is None:
        return NotImplemented
    fop = aten._native_batch_norm_legit_functional.default
    fargs = [bound[n] for n in ("input", "weight", "bias", "running_mean", "running_var",
                                "training", "momentum", "eps")]
    fout, margs, _ = tracer._run_meta(fop, fargs, {})
    nodes = tracer.emit(fop, tree_map(tracer._node_arg, margs), {}, fout)
    out, _, _ = tracer._run_meta(func, args, kwargs)
    tracer._register_out(out, nodes[:3])
    tracer.mutate(bound["running_mean"], nodes[3])
    tracer.mutate(bound["running_var"], nodes[4])
    return out


def _bernoulli_mask(tracer: Tracer, func, args, kwargs):
    # bernoulli draws 0/1: keep the draw (same RNG stream as eager) but route its value through a
    # bool mask, so the partitioner can save 1 byte per element and recompute the float in backward
    form = functional_variant(func)
    bound = bind_args(func, args, kwargs)
    fargs = [bound[a.name] for a in form.op._schema.arguments if not a.kwarg_only]
    fkwargs = {a.name: bound[a.name] for a in form.op._schema.arguments if a.kwarg_only and a.name in bound}
    fout, margs, mkwargs = tracer._run_meta(form.op, fargs, fkwargs)
    if not fout.dtype.is_floating_point:
        return NotImplemented
    drawn = tracer.emit(form.op, tree_map(tracer._node_arg, margs), tree_map(tracer._node_arg, mkwargs), fout)
    mask = tracer.call(aten.ne.Scalar, tracer.tensor_of(drawn), 0)
    value = tracer.node_of(tracer.call(aten._to_copy.default, mask, dtype=fout.dtype))
    self_t = bound["self"]
    out, _, _ = tracer._run_meta(func, args, kwargs)
    tracer.mutate(self_t, value)
    return out


def _data_dependent(tracer, func, args, kwargs):
    raise Unsupported(f"ember.aot: data-dependent op {func} (a tensor value read back to Python)")


SPECIAL: dict[Any, Callable] = {
    aten.native_batch_norm.default: _native_batch_norm,
    aten.bernoulli_.float: _bernoulli_mask,
    aten._local_scalar_dense.default: _data_dependent,
    aten.nonzero.default: _data_dependent,
    aten.equal.default: _data_dependent,
}


def remove_identity_views(graph: fx.Graph) -> None:
    """A functional graph needs no alias/detach nodes: forward their input."""
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in IDENTITY_VIEWS:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def specs_of(example_inputs, gm: fx.GraphModule | None = None) -> list:
    """Input specs; a placeholder traced with symbolic sizes (capture's dynamic shapes: its
    example_value has SymInt sizes, or is a SymInt) gives the symbolic spec."""
    symbolic = [None] * len(example_inputs)
    if gm is not None:
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(phs) == len(example_inputs):
            for i, n in enumerate(phs):
                v = n.meta.get("example_value", n.meta.get("val"))
                if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and
                                                   shapes.is_symbolic(v)):
                    symbolic[i] = v
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and not shapes.is_ours(x) or \
                isinstance(x, torch.SymInt) and not isinstance(x.node, shapes.SymNode):
            raise Unsupported("ember.aot: symbolic sizes from another capture (Dynamo's dynamic "
                              "shapes); ember's own capture supports dynamic shapes",
                              hint="use ember.compile, or turn that capture's dynamic shapes off")
    out = []
    for x, sym in zip(example_inputs, symbolic):
        if isinstance(sym, torch.SymInt):
            out.append(sym)
        elif sym is not None:
            out.append(TensorSpec(tuple(sym.shape), tuple(sym.stride()), x.dtype, x.device,
                                  bool(x.requires_grad)))
        elif isinstance(x, torch.Tensor):
            out.append(TensorSpec.of(x))
        elif isinstance(x, (int, float, bool)) or x is None:
            out.append(x)
        else:
            raise Unsupported(f"ember.aot: graph input of type {type(x).__name__} (symbolic sizes are "
                              "not supported; compile with dynamic=False)")
    return out


def _first_op(graph: fx.Graph):
    """The first node that is neither an input nor size arithmetic (where new sizes go)."""
    return next((n for n in graph.nodes if n.op != "placeholder" and not isinstance(
        n.meta.get("val"), (torch.SymInt, torch.SymFloat))), None)


def graph_device(example_inputs) -> torch.device:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return x.device
    return torch.device("cpu")


def order_placeholders(graph: fx.Graph, order: list[fx.Node]) -> None:
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if first is None:
        return
    for p in order:
        first.prepend(p)


_TENSOR_LITERALS = (torch.tensor, torch.as_tensor, torch.scalar_tensor)


class LiftTensorLiterals(TorchFunctionMode):
    """`torch.tensor(v, device=x.device)` inside traced code: the constructor runs with Python
    dispatch excluded, so on meta inputs it would make a meta tensor whose value the tracer never
    sees. Build the literal on the graph's real device instead; ops lift it as a constant.
    Also chooses the form of CPU sdpa (attention.py, `cpu_sdpa`): composite ops decompose above
    the dispatch mode, so this torch-function level is where to choose.
    A graph call of a function written in Python (`F.multi_head_attention_forward`, the form
    nn.MultiheadAttention takes in training) runs its body with this mode on, so the torch calls
    inside it (its sdpa, its literals) are seen too: the mode is popped while it handles a call."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer
        self.float_masks: dict = {}     # cpu_sdpa: boolean masks converted in this trace
        self.bodies: list = []          # Python functions whose bodies run under this mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func in _TENSOR_LITERALS and device is not None and torch.device(device).type == "meta" \
                and not any(isinstance(a, torch.Tensor) for a in tree_flatten(args)[0]):
            # the real tensor itself: every op that uses it lifts it as a graph constant
            return func(*args, **{**kwargs, "device": self.tracer.device})
        if func is torch._C._nn.scaled_dot_product_attention and self.tracer.device.type == "cpu":
            out = cpu_sdpa(*args, **kwargs, float_masks=self.float_masks)
            if out is not None:
                return out
        if func is torch.Tensor.__getitem__ or func is torch.Tensor.__setitem__:
            # `x[[1, 2]]`: indexing turns the list into an index tensor on x's device the same
            # way; make it a real tensor first
            args = (args[0], _index_literals(args[1])) + tuple(args[2:])
        try:
            if isinstance(func, FunctionType) and func not in self.bodies:
                # (a Tensor method in Python reaches here again from its C part: called as is)
                self.bodies.append(func)
                try:
                    with self:
                        return redispatch_function(func, types, args, kwargs)
                finally:
                    self.bodies.pop()
            return func(*args, **kwargs)
        except RuntimeError as e:
            # a composite that reads tensor values ("cannot repeat_interleave a meta tensor
            # without output_size"): a data-dependent size, refused like .item()
            if "meta tensor" in str(e):
                raise Unsupported(f"ember.aot: {getattr(func, '__name__', func)} needs tensor "
                                  f"values to know its output size ({e})") from e
            raise


def _int_list(v) -> bool:
    return isinstance(v, list) and all(
        (isinstance(e, (int, bool)) and not isinstance(e, torch.Tensor)) or _int_list(e) for e in v)


def _index_literals(index):
    if _int_list(index) and index:
        return torch.tensor(index)
    if isinstance(index, tuple):
        return tuple(torch.tensor(i) if _int_list(i) and i else i for i in index)
    return index
