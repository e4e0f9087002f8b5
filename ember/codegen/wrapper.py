"""Stage 6, codegen: the Python wrapper that runs one compiled graph.

Generates straight-line `call(args)`: unpack and check inputs (size/stride), allocate with
`empty_strided`, call C++ kernels (ctypes functions bound as globals, tensor `data_ptr()`s as
arguments), call externs (aten `out=` variants where they exist), free each buffer after its
last use and hand freed buffers of the same size/stride/dtype to later allocations.

Per-call overhead matters where the kernels are short (LLM decode: ~45 GEMVs and ~60 small
kernels a token), so the wrapper also
  - calls mm/addmm/bmm through torch's own bindings (`torch.mm(..., out=)`), not the OpOverload
    (a Python frame and slower argument parsing: ~2 us a call);
  - keeps the strided views of nn.Parameter inputs that externs take (a transposed weight)
    from one call to the next, keyed by the parameter's identity and data pointer (`_view`);
  - writes into the caller's mutated inputs (`mutations`: a static KV cache, a counter) instead
    of computing a copy that aot's runtime then copies back: the kernel computing the new value
    stores it into the input when nothing reads the old value later, and a functional
    `index_put` whose destination dies there runs in place (`index_put_`).

Consumes: the schedule's Plan (ember.loopir.plan), kernel signatures.
Produces: (python source, globals needed by it other than the kernels).
"""
from __future__ import annotations

import sympy
import torch

from ..errors import Unsupported
from ..loopir.index import SIZE_NAME, contiguous_strides, numel
from ..loopir.nodes import InputBuffer, Pointwise, Scan
from ..loopir.ops import count_body
from .common import IndentedBuffer, py_repr


def grad_free(call):
    """`run(*args)` = `call(args)` with grad mode off: autograd is aot's job, and externs'
    out= variants refuse grad inputs. (Not the no_grad() context manager: that costs a
    microsecond per call on small graphs.)"""
    grad_enabled, set_grad = torch.is_grad_enabled, torch._C._set_grad_enabled

    def run(*args):
        return boxed(args)

    def boxed(args):
        """Called with a list the callee may empty: it then holds the only references to the
        inputs and frees each after its last use (the backward's saved activations)."""
        if not grad_enabled():
            return call(args)
        set_grad(False)
        try:
            return call(args)
        finally:
            set_grad(True)
    run.boxed = boxed
    return run


def _strides(buf) -> tuple[str, str]:
    """(expression, expected) comparing a buffer's strides, except of size-1 dims: their
    stride says nothing about where elements are (a 1x1 conv's weight gradient comes back as
    (320, 1, 320, 320) for (320, 1, 1, 1))."""
    n = buf.name
    dims = [d for d, sz in enumerate(buf.size) if not (isinstance(sz, int) and sz == 1)]
    if len(dims) == len(buf.size):
        return f"{n}.stride()", py_repr(tuple(buf.stride))
    if not dims:
        return "()", "()"
    first, *rest = dims             # one stride() call, bound by the first item
    picked = [f"(_st := {n}.stride())[{first}]"] + [f"_st[{d}]" for d in rest]
    return f"({', '.join(picked)},)", py_repr(tuple(buf.stride[d] for d in dims))


def _sig(buf):
    return (tuple(buf.size), tuple(buf.stride), buf.dtype)


#: out= variants called through torch's Python bindings (same aten kernel, cheaper call)
TORCH_OUT = {torch.ops.aten.mm.out: "torch.mm", torch.ops.aten.addmm.out: "torch.addmm",
             torch.ops.aten.bmm.out: "torch.bmm"}
_Parameter = torch.nn.Parameter
_aten = torch.ops.aten
#: functional externs that clone their first argument, and the in-place variant a dying
#: destination runs instead (Wrapper._extern_in_place)
IN_PLACE = {_aten.index_put.default: _aten.index_put_.default,
            _aten.scatter_add.default: _aten.scatter_add_.default,
            _aten.scatter.src: _aten.scatter_.src, _aten.scatter.value: _aten.scatter_.value,
            _aten.scatter_reduce.two: _aten.scatter_reduce_.two,
            _aten.index_add.default: _aten.index_add_.default}


def memo_view(views, slot, base, size, stride, offset):
    """`as_strided(base, size, stride, base's offset + offset)`, kept in `views[slot]` across
    calls when `base` is an nn.Parameter: a later call with the same parameter object at the
    same data pointer reuses it (the view holds the old storage alive, so an equal pointer is
    the same memory; the wrapper's input checks cover a size/stride change)."""
    hit = views[slot]
    if hit is not None and hit[0] is base and hit[1] == base.data_ptr():
        return hit[2]
    view = torch.as_strided(base, size, stride, base.storage_offset() + offset)
    if type(base) is _Parameter:
        views[slot] = (base, base.data_ptr(), view)
    return view


def wrapper_globals() -> dict:
    """What every generated wrapper reads besides its kernels and aten ops."""
    return {"torch": torch, "empty_strided": torch.empty_strided,
            "as_strided": torch.as_strided, "_view": memo_view,
            "_rf": torch.profiler.record_function}


def profile_label(kernel) -> str:
    """A kernel's name in torch.profiler tables (options={"profile": True}): the kernel and the
    graph nodes its buffers were realized at (EMBER_DEBUG_DIR has its source by that name)."""
    origins = list(dict.fromkeys(n.origin for n in kernel.nodes if n.origin))
    shown = ", ".join(origins[:4]) + (f" +{len(origins) - 4}" if len(origins) > 4 else "")
    return f"ember {kernel.name}: {shown}" if shown else f"ember {kernel.name}"


class WrapperCodegen:
    """`mutations`: {output position: input position} for outputs the caller copies into an
    input after the call (aot's input mutations); the wrapper may then compute such an output
    in the input's own memory."""

    def __init__(self, plan, signatures, *, pointers: bool = True, mutations=None,
                 profile: bool = False):
        self.inputs, self.steps, self.plan = plan.inputs, plan.steps, plan
        self.profile = profile      # each kernel call inside a torch.profiler.record_function
        self.signatures, self.buffers, self.outputs = signatures, plan.buffers, plan.outputs
        self.pointers = pointers    # C++ kernels take data_ptr()s; Triton kernels the tensors
        self.globals: dict = wrapper_globals()
        self.owned: set = set()   # buffers we allocated (safe to reuse)
        self.donated: set = set()  # buffers whose memory an output took over (in place)
        self.code = IndentedBuffer()
        self.ops: dict = {}        # global name -> "namespace::op.overload" (for the graph cache)
        self.n_views = 0           # memo_view slots
        self.memory_of: dict = {}  # buffer -> the mutated input whose memory it is
        # kernel-written buffers allocated in the shape an extern reads them as (kernels only
        # take their data pointer): buffer -> (size, stride) of the tensor object
        self.shape_of: dict = {}
        self.output_names = {o.buffer.name for o in self.outputs if hasattr(o, "buffer")}
        self.extern_shape = self._extern_shapes() if pointers else {}
        mutations = mutations or {}
        self.mutated = {b.name for b in self.inputs if b.position in mutations.values()}
        self.write_into = self._write_through(mutations)

    def tensor_arg(self, a) -> str:
        name = a.buffer.name
        shape = self.shape_of.get(name)
        if shape is not None and a.offset == 0 and shape == (tuple(a.size), tuple(a.stride)):
            return name
        if a.is_whole and shape is None:
            return name
        size, stride = py_repr(tuple(a.size)), py_repr(tuple(a.stride))
        if isinstance(a.buffer, InputBuffer) and a.buffer.position >= 0 and \
                not _symbolic(a.size, a.stride, a.offset):
            self.n_views += 1
            return f"_view(_views, {self.n_views - 1}, {name}, {size}, {stride}, {a.offset})"
        off = str(a.offset)
        if a.buffer.name.startswith("arg"):
            off = f"{name}.storage_offset() + {a.offset}"
        return f"as_strided({name}, {size}, {stride}, {off})"

    def value(self, v) -> str:
        if hasattr(v, "buffer") and hasattr(v, "stride"):
            return self.tensor_arg(v)
        if isinstance(v, (list, tuple)):
            inner = ", ".join(self.value(x) for x in v)
            if isinstance(v, tuple):
                return f"({inner},)" if len(v) == 1 else f"({inner})"
            return f"[{inner}]"
        return py_repr(v)

    def op_name(self, op) -> str:
        name = str(op).replace(".", "_").replace("::", "_")
        self.globals[name] = op
        self.ops[name] = f"{op._schema.name}.{op._overloadname}" 
        return name

    def _extern_shapes(self) -> dict:
        """{buffer: (size, stride)} for kernel-written buffers that an extern reads as a dense
        reshape of the whole buffer (the (1, 1, 512) hidden state an mm reads as (1, 512)):
        allocated in that shape, the extern takes the tensor itself instead of a view made on
        every call (~2 us each, ~45 a decode step)."""
        kernel_written = {n for step, w in zip(self.steps, self.plan.writes)
                          if getattr(step, "node", None) is None for n in w}
        outputs = self.output_names
        shapes: dict = {}
        for step in self.steps:
            node = getattr(step, "node", None)
            if node is None:
                continue
            for a in _tensor_args(node.args) + _tensor_args(node.kwargs):
                b = a.buffer
                if b.name in shapes or b.name not in kernel_written or b.name in outputs or \
                        a.offset != 0 or a.is_whole or \
                        _symbolic(a.size, a.stride, b.size, b.stride):
                    continue
                if numel(a.size) == numel(b.size) and \
                        tuple(a.stride) == contiguous_strides(a.size) and \
                        tuple(b.stride) == contiguous_strides(b.size):
                    shapes[b.name] = (tuple(a.size), tuple(a.stride))
        return shapes

    def _pool_key(self, name):
        buf = self.buffers[name]
        shape = self.shape_of.get(name) or (tuple(buf.size), tuple(buf.stride))
        return (*shape, buf.dtype)

    def _write_through(self, mutations) -> dict:
        """{output buffer: input name} for mutated inputs a kernel may store the new value in:
        the kernel writing it reads the input (or a buffer in its memory) only at the index it
        writes, no later step reads the input, and no other output is that input."""
        by_pos = {b.position: b for b in self.inputs if b.position >= 0}
        out_names = [o.buffer.name if hasattr(o, "buffer") else None for o in self.outputs]
        chosen = {}
        for k, pos in mutations.items():
            inp = by_pos.get(pos)
            o = self.outputs[k] if k < len(self.outputs) else None
            if inp is None or inp.size is None or o is None or not hasattr(o, "buffer") or \
                    not o.is_whole or inp.name in out_names or out_names.count(o.buffer.name) != 1:
                continue
            buf = o.buffer
            if _sig(buf) != _sig(inp) or _symbolic(buf.size, buf.stride, 0):
                continue
            step = next((i for i, w in enumerate(self.plan.writes) if buf.name in w), None)
            if step is None or getattr(self.steps[step], "node", None) is not None:
                continue
            chosen[buf.name] = (inp.name, step)
        return chosen

    def _input_free_after(self, name, step, writer=None) -> bool:
        """Does nothing read input `name` (or a buffer living in its memory) after `step`, nor
        at `step` except a pointwise kernel reading it where it writes `writer`?"""
        mem = {name} | {b for b, m in self.memory_of.items() if m == name}
        for i in range(step, len(self.steps)):
            for r in mem & set(self.plan.reads[i]):
                if i > step or writer is None or (i, r, writer) not in self.plan.in_place:
                    return False
        return True

    def generate(self) -> str:
        code = self.code
        code.writeline("def call(args):")
        with code.indent():
            names = [b.name for b in self.inputs if b.position >= 0]
            for b in self.inputs:
                if b.position < 0 and b.constant is not None:
                    self.globals[b.name] = b.constant
            if names:
                code.writeline(f"{', '.join(names)}, = args")
                code.writeline("if args.__class__ is list: args.clear()  # boxed: inputs die here")
            self._bind_sizes()
            for b in self.inputs:
                if b.size is not None and b.position >= 0:
                    got, want = _strides(b)
                    code.writeline(f"assert {b.name}.size() == {py_repr(tuple(b.size))} and "
                                   f"{got} == {want}, "
                                   f"'ember: input {b.position} changed size/stride'")
            pool: dict = {}
            targets = {into for into, _ in self.write_into.values()}  # kept to be written
            pooled: dict = {}       # freed buffer -> where its `del` goes if nothing reuses it
            for i, step in enumerate(self.steps):
                self._step(i, step, pool)
                for name in self.plan.memory.frees.get(i, []):
                    buf = self.buffers.get(name)
                    if name in self.donated:
                        code.writeline(f"del {name}")
                    elif name in self.owned and buf is not None:
                        pool.setdefault(self._pool_key(name), []).append(name)
                        pooled[name] = (len(code.lines), code.level)
                    elif name not in targets:   # an input: drops this frame's reference
                        code.writeline(f"del {name}")     # (the last, if boxed)
            # a freed buffer no later allocation took is released when it dies, not at return
            unused = [pooled[n] + (n,) for names in pool.values() for n in names]
            for at, level, name in sorted(unused, reverse=True):
                code.lines.insert(at, "    " * level + f"del {name}")
            outs = ", ".join(self.value(o) for o in self.outputs)
            code.writeline(f"return ({outs}{',' if len(self.outputs) == 1 else ''})")
        if self.n_views:
            code.lines.insert(0, f"_views = [None] * {self.n_views}  # memo_view slots")
        return code.getvalue()

    def _bind_sizes(self):
        """Dynamic shapes: each size symbol from the first input that has it as a bare dim (or
        is it: a size placeholder). A symbol no input carries cannot be bound: refuse."""
        bound = {}
        for b in self.inputs:
            if b.position < 0:
                continue
            if b.symbol is not None:
                bound.setdefault(b.symbol, b.name)
            for d, n in enumerate(b.size or ()):
                if isinstance(n, sympy.Symbol):
                    bound.setdefault(n, f"{b.name}.size({d})")
        for b in self.inputs:      # a dim linear in one symbol: `s1 - 1` (a backward's tangent
            # of a slice), `3*s1 - 3` (that tangent flattened: a language model's loss)
            for d, n in enumerate(b.size or () if b.position >= 0 else ()):
                if isinstance(n, sympy.Expr) and len(n.free_symbols) == 1:
                    sym_ = next(iter(n.free_symbols))
                    a = n.coeff(sym_)
                    c = sympy.expand(n - a * sym_)
                    if sym_ not in bound and a.is_Integer and a > 0 and c.is_Integer:
                        src = f"{b.name}.size({d}) - ({int(c)})"
                        bound[sym_] = src if a == 1 else f"({src}) // {int(a)}"
        for sym_, src in sorted(bound.items(), key=lambda kv: kv[0].name):
            if src != sym_.name:
                self.code.writeline(f"{sym_.name} = {src}")
        used = set()
        for b in list(self.buffers.values()) + list(self.inputs):
            for x in (*(b.size or ()), *(b.stride or ())):
                if isinstance(x, sympy.Basic):
                    used |= x.free_symbols
        for sig in self.signatures.values():
            used |= {sympy.Symbol(n) for n in sig if SIZE_NAME.fullmatch(n)}
        missing = sorted(s.name for s in used if s.name not in {k.name for k in bound})
        if missing:
            raise Unsupported(f"ember codegen: size symbol(s) {', '.join(missing)} are no input's "
                              "dimension, so the wrapper cannot bind them")

    def _write_into_input(self, step, name) -> bool:
        """Kernel output `name` is a mutated input's new value: stored in that input's memory?"""
        into = self.write_into.get(name)
        if into is None or into[1] != step or not self._input_free_after(into[0], step, name):
            return False
        self.code.writeline(f"{name} = {into[0]}  # the caller's mutated input, written in place")
        self.memory_of[name] = into[0]
        return True

    def _copy_source(self, kernel) -> str | None:
        """The buffer a kernel only copies (same layout and dtype, no math), or None."""
        nodes = kernel.nodes
        body = getattr(nodes[0], "body", None) if len(nodes) == 1 else None
        if not isinstance(body, Pointwise) or isinstance(body, Scan) or not kernel.pure_pointwise:
            return None     # (a scan of a plain load is no copy: cumsum_ of an input)
        deps = self.plan.deps[nodes[0].name]
        if len(deps.reads) != 1 or deps.indirect:
            return None
        (src, index), = deps.reads.items()
        if index != {deps.write_index} or _sig(self.buffers[src]) != _sig(nodes[0]):
            return None
        counts = count_body(body.inner_fn, [sympy.Symbol(f"i{d}") for d in range(len(body.size))])
        return src if counts.loads == 1 and counts.ops == 0 else None

    def _alloc(self, buf, pool, shape=None):
        code = self.code
        size, stride = shape or (tuple(buf.size), tuple(buf.stride))
        free = pool.get((size, stride, buf.dtype))
        if free:
            old = free.pop()
            code.writeline(f"{buf.name} = {old}  # reuse")
        else:
            code.writeline(f"{buf.name} = empty_strided({py_repr(size)}, {py_repr(stride)}, "
                           f"dtype={py_repr(buf.dtype)})")
        if shape is not None:
            self.shape_of[buf.name] = shape
        self.owned.add(buf.name)

    def _step(self, i, step, pool):
        code = self.code
        node = getattr(step, "node", None)
        if node is None:  # a kernel
            dying = [b for b in self.plan.memory.frees.get(i, []) if b in self.owned
                     and b not in self.donated and b in self.plan.reads[i]]
            for name in self.plan.writes[i]:
                buf = self.buffers[name]
                if self._write_into_input(i, name):
                    continue
                src = next((d for d in dying if _sig(self.buffers[d]) == _sig(buf)
                            and (i, d, name) in self.plan.in_place
                            and not (d in self.shape_of and name in self.output_names)), None)
                if src is not None:
                    dying.remove(src)
                    self.donated.add(src)
                    self.owned.add(name)
                    if src in self.shape_of:
                        self.shape_of[name] = self.shape_of[src]
                    code.writeline(f"{name} = {src}  # in place")
                    continue
                self._alloc(buf, pool, self.extern_shape.get(name))
            if any(numel(self.buffers[n].size) == 0 for n in self.plan.writes[i]):
                return
            out = self.plan.writes[i][0] if len(self.plan.writes[i]) == 1 else None
            src = self._copy_source(step) if out in self.memory_of else None
            if src is not None and self.memory_of.get(src, src) == self.memory_of[out]:
                code.writeline(f"# {step.name} skipped: it copies {src} onto itself")
                return
            args = ", ".join(n if SIZE_NAME.fullmatch(n) or not self.pointers else f"{n}.data_ptr()"
                             for n in self.signatures[step.name])
            if self.profile:
                code.writeline(f"with _rf({profile_label(step)!r}):")
                code.writeline(f"    {step.name}({args})")
            else:
                code.writeline(f"{step.name}({args})")
            return
        args = [self.value(a) for a in node.args]
        kwargs = [f"{k}={self.value(v)}" for k, v in node.kwargs.items()]
        if node.out_variant is not None:
            self._alloc(node, pool)
            fn = TORCH_OUT.get(node.out_variant) or self.op_name(node.out_variant)
            code.writeline(f"{fn}({', '.join(args + kwargs + [f'out={node.name}'])})")
            return
        if self._extern_in_place(i, node, args, kwargs):
            return
        fn = self.op_name(node.op)
        code.writeline(f"{node.name} = {fn}({', '.join(args + kwargs)})")
        if node.outputs:
            read = set(self.output_names).union(*self.plan.reads[i + 1:])
            for out in node.outputs:
                path = "".join(f"[{p}]" for p in out.path)
                code.writeline(f"{out.name} = {node.name}{path}")
                if out.name in read:    # (embedding_bag's unused offset2bag: no check per call)
                    self._fix_layout(out)
            code.writeline(f"del {node.name}")
        else:
            self._fix_layout(node)

    def _extern_in_place(self, i, node, args, kwargs) -> bool:
        """A functional index_put / scatter / index_add whose destination dies at this step (a
        buffer of ours, or a mutated input whose old value nothing reads later) runs as its
        in-place variant on it (IN_PLACE): the functional op clones the destination first (a
        gather's backward scatter_add into a zero fill copied the whole zero buffer)."""
        inplace = IN_PLACE.get(node.op)
        if inplace is None or node.outputs or node.size is None:
            return False
        dst = node.args[0]
        if not hasattr(dst, "buffer") or not dst.is_whole or _sig(dst.buffer) != _sig(node):
            return False
        name = dst.buffer.name
        if name in self.shape_of and node.name in self.output_names:
            return False            # an output is its own tensor, never a view of ours
        others = [a.buffer.name for a in _tensor_args(node.args[1:]) + _tensor_args(node.kwargs)]
        if name not in self.plan.memory.frees.get(i, []) or name in others:
            return False
        freed = any(node.name in names for names in self.plan.memory.frees.values())
        if name not in self.owned and not freed:   # an output (or viewed by one): not the input's
            return False
        if name in self.owned and name not in self.donated:
            self.donated.add(name)
            self.owned.add(node.name)
        elif name in self.memory_of and self._input_free_after(self.memory_of[name], i + 1):
            self.memory_of[node.name] = self.memory_of[name]    # the caller's input: no pool
        elif name in self.mutated and self._input_free_after(name, i + 1):
            self.memory_of[node.name] = name
        else:
            return False
        fn = self.op_name(inplace)
        self.code.writeline(f"{node.name} = {fn}({', '.join(args + kwargs)})  # in place")
        return True

    def _fix_layout(self, buf):
        """Externs return whatever layout aten picks; kernels index by the meta layout. (An
        output the meta kernel gives as a tensor may be None at run time: the attention weights
        of _native_multi_head_attention with need_weights=False.)"""
        if buf.size is None:
            return
        n = buf.name
        got, want = _strides(buf)
        self.code.writeline(
            f"if {n} is not None and {got} != {want}: {n} = empty_strided("
            f"{py_repr(tuple(buf.size))}, {py_repr(tuple(buf.stride))}, dtype={n}.dtype).copy_({n})")


def _symbolic(*values) -> bool:
    return any(isinstance(x, sympy.Basic) and not x.is_Integer
               for v in values for x in (v if isinstance(v, (tuple, list)) else (v,)))


def _tensor_args(value) -> list:
    if hasattr(value, "buffer") and hasattr(value, "stride"):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _tensor_args(v)]
    return []
