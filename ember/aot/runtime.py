"""Stage aot, runtime: the callables aot_compile returns.

Consumes: a `Traced` program (joint.py), its partition (partition.py) and the compiled forward
(and, lazily, backward) callables from the kernel compiler.
Produces: a callable with the captured graph's calling convention (positional tensors in, the
graph's outputs out) that
  - runs the compiled forward inside one torch.autograd.Function per graph when training;
    the backward graph is compiled on the first backward;
  - applies input mutations (BatchNorm running stats, user `x.add_`) once, after the graph;
  - rebuilds outputs that alias inputs or each other by replaying their views on the real
    tensors, so `out._base`, identity and version counters behave as in eager.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.fx as fx
from torch.utils._pytree import tree_structure, tree_unflatten

from .. import config, counters, debug, shapes
from ..errors import Unsupported
from ..logging import get_logger
from ..runtime.pycode import compile_cached
from .joint import Traced, trace_program
from .tracer import TensorSpec
from .partition import Partition


def _apply_views(t, views, sizes):
    for op, args, kwargs, index in views:
        if sizes is not None:
            args, kwargs = sizes(args), sizes(kwargs)
        t = op(t, *args, **kwargs)
        if index is not None:
            t = t[index]
    return t


def _symbol_values(traced: Traced, args) -> dict:
    """Dynamic shapes: each size symbol's value in this call, read from the input (dim) the
    trace took it from."""
    return {sym: args[i] if d is None else args[i].shape[d]
            for sym, (i, d) in traced.symbols.items()}


def _size_binder(traced: Traced, args):
    """A function replacing SymInts in view arguments by their values in this call. None
    when static."""
    if not traced.symbols:
        return None
    values = _symbol_values(traced, args)

    def concrete(x):
        if isinstance(x, (torch.SymInt, torch.SymFloat)):
            return type(x.node.hint())(shapes.expr_of(x).xreplace(values))
        if isinstance(x, (list, tuple)):
            return type(x)(concrete(v) for v in x)
        if isinstance(x, dict):
            return {k: concrete(v) for k, v in x.items()}
        return x
    return concrete


#: aten view ops and the Tensor methods doing the same with the same positional arguments:
#: a method's generated binding costs ~1.5-2 us less than the OpOverload's generic call
_VIEW_METHODS = {
    torch.ops.aten.view.default: torch.Tensor.view,
    torch.ops.aten.permute.default: torch.Tensor.permute,
    torch.ops.aten.transpose.int: torch.Tensor.transpose,
    torch.ops.aten.unsqueeze.default: torch.Tensor.unsqueeze,
    torch.ops.aten.squeeze.dim: torch.Tensor.squeeze,
    torch.ops.aten.squeeze.dims: torch.Tensor.squeeze,
    torch.ops.aten.select.int: torch.Tensor.select,
    torch.ops.aten.as_strided.default: torch.Tensor.as_strided,
    torch.ops.aten.t.default: torch.Tensor.t,
    torch.ops.aten.diagonal.default: torch.Tensor.diagonal,
    torch.ops.aten.unfold.default: torch.Tensor.unfold,
    torch.ops.aten.expand.default: torch.Tensor.expand,
}


def output_builder(traced: Traced, treespec) -> Callable:
    """`build(args, slots)`: the user outputs from a call's args and graph output slots.

    With static sizes it is generated straight-line code (one line per output, then the tuple,
    the tensor or the pytree): what does not change between calls is decided here, once. A view
    of a graph output is replayed with the Tensor method when there is one (graph outputs are
    plain tensors; a view of an input, which may be a subclass, keeps the aten op). A one-op
    graph's whole call is ~15 us; the per-call loop over the output kinds and one aten view
    call were ~5 of them (GroupNorm, whose output is a view of its [N, G, C/G * HW] result).
    With dynamic sizes, outputs that need this call's sizes take the loop below."""
    n = len(traced.outputs)
    if bool(traced.symbols) and any(
            s.kind == "view" or isinstance(s.value, (torch.SymInt, torch.SymFloat))
            for s in traced.outputs):
        return functools.partial(_build_sized, traced, treespec)
    ns: dict = {"unflatten": tree_unflatten, "spec": treespec}
    lines = ["def build(a, s):"]
    for i, spec in enumerate(traced.outputs):
        if spec.kind == "graph":
            expr = f"s[{spec.slot}]"
        elif spec.kind == "input":
            expr = f"a[{spec.index}]"
        elif spec.kind == "dup":
            expr = f"o{spec.index}"
        elif spec.kind == "view":
            expr = f"a[{spec.index}]" if spec.index is not None else f"s[{spec.slot}]"
            for j, (op, args, kwargs, index) in enumerate(spec.views):
                fn = _VIEW_METHODS.get(op) if spec.index is None and not kwargs else None
                ns[f"V{i}_{j}"], ns[f"A{i}_{j}"], ns[f"K{i}_{j}"], ns[f"I{i}_{j}"] = \
                    fn or op, tuple(args), kwargs, index
                expr = f"V{i}_{j}({expr}, *A{i}_{j}" + (f", **K{i}_{j})" if kwargs else ")") + \
                    (f"[I{i}_{j}]" if index is not None else "")
        else:           # a constant output (a size, static here)
            ns[f"C{i}"] = spec.value
            expr = f"C{i}"
        lines.append(f"    o{i} = {expr}")
    outs = "".join(f"o{i}, " for i in range(n))
    if treespec == tree_structure(tuple(range(n))):
        lines.append(f"    return ({outs})")
    elif n == 1 and treespec == tree_structure(0):
        lines.append("    return o0")
    else:
        lines.append(f"    return unflatten([{outs}], spec)")
    source = "\n".join(lines) + "\n"
    exec(compile_cached(source, "<ember outputs>"), ns)    # noqa: S102
    build = ns["build"]
    build.source = source
    return build


def _build_sized(traced: Traced, treespec, args, slots):
    """The user outputs when some need this call's sizes (dynamic shapes)."""
    sizes = _size_binder(traced, args)
    outs: list = []
    for spec in traced.outputs:
        kind = spec.kind
        if kind == "graph":
            outs.append(slots[spec.slot])
        elif kind == "input":
            outs.append(args[spec.index])
        elif kind == "view":
            src = args[spec.index] if spec.index is not None else slots[spec.slot]
            outs.append(_apply_views(src, spec.views, sizes))
        elif kind == "dup":
            outs.append(outs[spec.index])
        else:       # a size output (a SymInt) is this call's value of it, a Python number
            outs.append(sizes(spec.value))
    return tree_unflatten(outs, treespec)


def _apply_mutations(traced: Traced, args, new_values) -> None:
    if not traced.mutated:
        return
    with torch.no_grad():
        for index, value in zip(traced.mutated, new_values):
            args[index].copy_(value)


class InferenceRuntime:
    """Forward only: no input requires grad, or compiled under torch.no_grad()."""

    def __init__(self, traced: Traced, fw: Callable, treespec):
        self.traced, self.fw, self.treespec = traced, fw, treespec
        self.outputs = output_builder(traced, treespec)
        n = len(traced.outputs)
        # the common case needs no rebuilding: graph outputs in order, a flat tuple, no
        # mutations, no constants (saves the pytree round trip: microseconds per call)
        self.direct = (not traced.mutated and not traced.constants and traced.n_slots == n and
                       all(s.kind == "graph" and s.slot == i for i, s in enumerate(traced.outputs))
                       and treespec == tree_structure(tuple(range(n))))

    def __call__(self, *args):
        t = self.traced
        if self.direct:
            return tuple(self.fw(*args))
        outs = self.fw(*args, *t.constants)
        if t.mutated:
            _apply_mutations(t, args, outs[t.n_slots:t.n_fw_outputs])
        return self.outputs(args, outs)


def _coerce_tangent(g: torch.Tensor, spec, sizes: dict | None) -> torch.Tensor:
    if sizes is not None and any(isinstance(s, torch.SymInt) for s in (*spec.shape, *spec.stride)):
        # dynamic sizes: the traced strides at this call's sizes (saved by the forward)
        stride = tuple(int(shapes.expr_of(s).xreplace(sizes)) for s in spec.stride)
        if tuple(g.stride()) == stride or g.numel() <= 1:
            return g
        counters.bump("tangent_copies")
        return torch.empty_strided(g.shape, stride, dtype=g.dtype, device=g.device).copy_(g)
    if tuple(g.stride()) == spec.stride or g.numel() <= 1:
        return g
    counters.bump("tangent_copies")
    out = torch.empty_strided(spec.shape, spec.stride, dtype=g.dtype, device=g.device)
    out.copy_(g)
    return out


def _dense(t: torch.Tensor) -> bool:
    return shapes.dense_strides(t.shape, t.stride())


def _order(t: torch.Tensor) -> tuple:
    """t's dims from the largest stride to the smallest, size-1 dims left out."""
    return tuple(sorted((d for d, n in enumerate(t.shape) if n != 1),
                        key=lambda d: -t.stride(d)))


def mixed_layouts(graph: fx.Graph) -> int:
    """How many ops in `graph` read a dense tensor of their output's shape in another dim order
    than the output's: each is a kernel converting between layouts (a transposing loop, or a
    strided read or write)."""
    count = 0
    for n in graph.nodes:
        out = n.meta.get("val")
        if n.op != "call_function" or not isinstance(out, torch.Tensor) or \
                isinstance(n.target, torch._ops.OpOverload) and n.target.is_view or \
                sum(s != 1 for s in out.shape) < 2 or not _dense(out):
            continue
        ins = [a.meta.get("val") for a in n.all_input_nodes]
        count += any(isinstance(v, torch.Tensor) and v.shape == out.shape and _dense(v) and
                     _order(v) != _order(out) for v in ins)
    return count


#: backward graphs compiled for tangent layouts other than the traced ones, per runtime; a
#: graph whose tangents keep changing layout pays the copies past this many
MAX_TANGENT_LAYOUTS = 4


class TrainingRuntime:
    """One autograd.Function per compiled graph; the backward is compiled on first use."""

    def __init__(self, traced: Traced, part: Partition, fw: Callable, bw_compiler: Callable,
                 bw_module: fx.GraphModule, treespec, backward: Callable | None = None):
        """`backward`: the compiled backward when it is known already (a warm disk cache)."""
        self.traced, self.part, self.fw, self.treespec = traced, part, fw, treespec
        self.outputs = output_builder(traced, treespec)
        self._bw_compiler, self._bw_module, self._bw = bw_compiler, bw_module, backward
        self._variants: dict = {}       # tangent strides -> backward for them (or None)
        self._debug_scope = debug.current_scope()    # the backward's dumps join the forward's
        self.function = self._make_function()

    @property
    def backward_ready(self) -> bool:
        return self._bw is not None

    def backward_fn(self) -> Callable:
        if self._bw is None:
            example = [n.meta["val"] for n in self._bw_module.graph.nodes if n.op == "placeholder"]
            with debug.resume(self._debug_scope, "backward_"):
                self._bw = self._bw_compiler(self._bw_module, example)
        return self._bw

    def backward_for(self, tangents: list, sizes: dict | None) -> tuple[Callable, list]:
        """(the backward, its tangents) for the tangents that arrived. A tangent in another
        dense layout than the traced one (the caller's NCHW gradient of an output ember stores
        NHWC, seen through the permute that makes it NCHW) is taken as it is by a backward
        compiled for that layout, once per layout (`_layout_variant`): its kernels read it in
        place instead of an ATen copy to the traced layout first. The compiled wrapper checks
        its inputs' strides on every call. Any other tangent is copied to the traced layout
        (`_coerce_tangent`): an expanded one, dynamic sizes, a warm-started runtime (no
        backward graph to retrace), a graph the retrace refuses."""
        specs = self.traced.tangent_specs
        if sizes is None and self._bw_module is not None:
            layout = tuple(tuple(g.stride()) if g.numel() > 1 and _dense(g) else s.stride
                           for g, s in zip(tangents, specs))
            if any(got != s.stride for got, s in zip(layout, specs)):
                bw = self._layout_variant(layout)
                if bw is not None:
                    return bw, [g if tuple(g.stride()) == want else _coerce_tangent(g, s, None)
                                for g, s, want in zip(tangents, specs, layout)]
        return self.backward_fn(), [_coerce_tangent(g, s, sizes) for g, s in zip(tangents, specs)]

    def _layout_variant(self, layout: tuple) -> Callable | None:
        """The backward compiled for tangents with strides `layout`, or None (refused)."""
        if layout in self._variants:
            return self._variants[layout]
        if len(self._variants) >= MAX_TANGENT_LAYOUTS:
            return None
        log = get_logger("perf")
        phs = [n for n in self._bw_module.graph.nodes if n.op == "placeholder"]
        vals = [n.meta.get("val") for n in phs]
        n_saved = len(phs) - len(layout)
        variant = None
        if all(isinstance(v, torch.Tensor) and not shapes.is_symbolic(v) for v in vals) and \
                not any(isinstance(n.target, torch._ops.OpOverload) and
                        torch.Tag.nondeterministic_seeded in n.target.tags
                        for n in self._bw_module.graph.nodes):   # a re-trace draws no numbers
            specs = [TensorSpec(tuple(v.shape), tuple(v.stride()) if i < n_saved else
                                layout[i - n_saved], v.dtype, self.traced.device, False)
                     for i, v in enumerate(vals)]
            try:
                # the backward graph re-traced on the new tangent layouts: every op's layout
                # follows from its inputs' again; a view the new strides cannot take raises
                traced = trace_program(self._bw_module, specs, decompositions=None,
                                       device=self.traced.device, joint=False, plan_aliases=False)
                if traced.mutated or traced.constants:
                    raise ValueError("the re-traced backward mutates or lifts constants")
                copies = sum(got != s.stride for got, s in zip(layout, self.traced.tangent_specs))
                mixed, before = mixed_layouts(traced.graph), mixed_layouts(self._bw_module.graph)
                if mixed >= before + copies:
                    # the arriving layout disagrees with the saved activations (a contiguous
                    # gradient of a channels-last BatchNorm): every kernel would convert;
                    # one copy first keeps them all in one layout
                    raise ValueError(f"{mixed} ops would mix layouts, against {before} and "
                                     f"{copies} tangent copies in the traced layout")
                gm = fx.GraphModule(torch.nn.Module(), traced.graph, class_name="EmberBackward")
                gm.meta["device"] = self.traced.device
                gm.meta["tangent_layouts"] = layout     # not the warm start's backward
                example = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
                with debug.resume(self._debug_scope, "backward_layout_"):
                    variant = self._bw_compiler(gm, example)
                counters.bump("tangent_layout_backwards")
                log.info("backward compiled for tangent strides %s (traced: %s)", layout,
                         tuple(s.stride for s in self.traced.tangent_specs))
            except Exception as exc:  # noqa: BLE001 - the copy to the traced layout is right too
                if config.strict() and not isinstance(exc, (RuntimeError, ValueError, Unsupported)):
                    raise               # not a view the new strides refuse: a bug, in tests
                log.info("backward for tangent strides %s refused (%s: %s): tangents copied to "
                         "the traced layout", layout, type(exc).__name__, exc)
        self._variants[layout] = variant
        return variant

    def _make_function(self):
        rt = self
        t, part = self.traced, self.part
        n_fw = t.n_fw_outputs
        tangent_set = set(t.tangent_outs)
        mutated = set(t.mutated)

        class EmberCompiledFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                full = list(args) + list(t.constants)
                outs = rt.fw(*full)
                fw_outs, acts = list(outs[:n_fw]), list(outs[n_fw:])
                saved_in = [full[i].clone() if i in mutated else full[i] for i in part.saved_inputs]
                saved = saved_in + acts
                # sizes (dynamic shapes) travel beside the tensors
                ctx.ember_ints = [(i, x) for i, x in enumerate(saved) if not isinstance(x, torch.Tensor)]
                ctx.save_for_backward(*[x for x in saved if isinstance(x, torch.Tensor)])
                ctx.ember_sizes = _symbol_values(t, args) if t.symbols else None
                ctx.mark_non_differentiable(*[o for j, o in enumerate(fw_outs)
                                              if j not in tangent_set and isinstance(o, torch.Tensor)])
                return tuple(fw_outs)

            @staticmethod
            def backward(ctx, *grad_outs):
                if torch.is_grad_enabled():
                    raise RuntimeError(
                        "ember: double backward (create_graph=True, or differentiating a gradient) "
                        "through an ember-compiled graph is not supported; run this part eagerly")
                saved = list(ctx.saved_tensors)
                # without retain_graph, autograd's references to the saved tensors go now, so a
                # boxed backward holds the last ones and frees each after its last use
                ctx.maybe_clear_saved_tensors()
                for i, x in ctx.ember_ints:
                    saved.insert(i, x)
                bw, tangents = rt.backward_for([grad_outs[j] for j in t.tangent_outs],
                                               ctx.ember_sizes)
                saved += tangents
                boxed = getattr(bw, "boxed", None)
                grads = boxed(saved) if boxed is not None else bw(*saved)
                result: list = [None] * t.n_inputs
                for k, g in zip(t.grad_inputs, grads):
                    result[k] = g
                return tuple(result)

        return EmberCompiledFunction

    def __call__(self, *args):
        t = self.traced
        outs = self.function.apply(*args)
        if t.mutated:
            _apply_mutations(t, args, outs[t.n_slots:t.n_fw_outputs])
        return self.outputs(args, outs)
