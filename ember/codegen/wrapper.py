"""Stage 6, codegen: the Python wrapper that runs one compiled graph.

Generates straight-line `call(args)`: unpack and check inputs (size/stride), allocate with
`empty_strided`, call C++ kernels (ctypes functions bound as globals, tensor `data_ptr()`s as
arguments), call externs (aten `out=` variants where they exist), free each buffer after its
last use and hand freed buffers of the same size/stride/dtype to later allocations.

Consumes: the schedule's Plan (ember.loopir.plan), kernel signatures.
Produces: (python source, globals needed by it other than the kernels).
"""
from __future__ import annotations

import sympy
import torch

from ..errors import Unsupported
from ..loopir.index import SIZE_NAME, numel
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


class WrapperCodegen:
    def __init__(self, plan, signatures, *, pointers: bool = True):
        self.inputs, self.steps, self.plan = plan.inputs, plan.steps, plan
        self.signatures, self.buffers, self.outputs = signatures, plan.buffers, plan.outputs
        self.pointers = pointers    # C++ kernels take data_ptr()s; Triton kernels the tensors
        self.globals: dict = {"torch": torch, "empty_strided": torch.empty_strided,
                              "as_strided": torch.as_strided}
        self.owned: set = set()   # buffers we allocated (safe to reuse)
        self.donated: set = set()  # buffers whose memory an output took over (in place)
        self.code = IndentedBuffer()
        self.ops: dict = {}        # global name -> "namespace::op.overload" (for the graph cache)

    def tensor_arg(self, a) -> str:
        name = a.buffer.name
        if a.is_whole:
            return name
        off = str(a.offset)
        if a.buffer.name.startswith("arg"):
            off = f"{name}.storage_offset() + {a.offset}"
        return f"as_strided({name}, {py_repr(tuple(a.size))}, {py_repr(tuple(a.stride))}, {off})"

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
            pooled: dict = {}       # freed buffer -> where its `del` goes if nothing reuses it
            for i, step in enumerate(self.steps):
                self._step(i, step, pool)
                for name in self.plan.memory.frees.get(i, []):
                    buf = self.buffers.get(name)
                    if name in self.donated:
                        code.writeline(f"del {name}")
                    elif name in self.owned and buf is not None:
                        pool.setdefault(_sig(buf), []).append(name)
                        pooled[name] = (len(code.lines), code.level)
                    else:       # an input: drops this frame's reference (the last, if boxed)
                        code.writeline(f"del {name}")
            # a freed buffer no later allocation took is released when it dies, not at return
            unused = [pooled[n] + (n,) for names in pool.values() for n in names]
            for at, level, name in sorted(unused, reverse=True):
                code.lines.insert(at, "    " * level + f"del {name}")
            outs = ", ".join(self.value(o) for o in self.outputs)
            code.writeline(f"return ({outs}{',' if len(self.outputs) == 1 else ''})")
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
        for b in self.inputs:      # a dim `s1 - 1` only (a backward's tangent of a slice)
            for d, n in enumerate(b.size or () if b.position >= 0 else ()):
                if isinstance(n, sympy.Add) and len(n.free_symbols) == 1:
                    sym_ = next(iter(n.free_symbols))
                    if (n - sym_).is_Integer and sym_ not in bound:
                        bound[sym_] = f"{b.name}.size({d}) - ({int(n - sym_)})"
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

    def _alloc(self, buf, pool):
        code = self.code
        free = pool.get(_sig(buf))
        if free:
            old = free.pop()
            code.writeline(f"{buf.name} = {old}  # reuse")
        else:
            code.writeline(f"{buf.name} = empty_strided({py_repr(tuple(buf.size))}, "
                           f"{py_repr(tuple(buf.stride))}, dtype={py_repr(buf.dtype)})")
        self.owned.add(buf.name)

    def _step(self, i, step, pool):
        code = self.code
        node = getattr(step, "node", None)
        if node is None:  # a kernel
            dying = [b for b in self.plan.memory.frees.get(i, []) if b in self.owned
                     and b not in self.donated and b in self.plan.reads[i]]
            for name in self.plan.writes[i]:
                buf = self.buffers[name]
                src = next((d for d in dying if _sig(self.buffers[d]) == _sig(buf)
                            and (i, d, name) in self.plan.in_place), None)
                if src is not None:
                    dying.remove(src)
                    self.donated.add(src)
                    self.owned.add(name)
                    code.writeline(f"{name} = {src}  # in place")
                    continue
                self._alloc(buf, pool)
            if any(numel(self.buffers[n].size) == 0 for n in self.plan.writes[i]):
                return
            args = ", ".join(n if SIZE_NAME.fullmatch(n) or not self.pointers else f"{n}.data_ptr()"
                             for n in self.signatures[step.name])
            code.writeline(f"{step.name}({args})")
            return
        args = [self.value(a) for a in node.args]
        kwargs = [f"{k}={self.value(v)}" for k, v in node.kwargs.items()]
        if node.out_variant is not None:
            self._alloc(node, pool)
            fn = self.op_name(node.out_variant)
            code.writeline(f"{fn}({', '.join(args + kwargs + [f'out={node.name}'])})")
            return
        fn = self.op_name(node.op)
        code.writeline(f"{node.name} = {fn}({', '.join(args + kwargs)})")
        if node.outputs:
            for out in node.outputs:
                path = "".join(f"[{p}]" for p in out.path)
                code.writeline(f"{out.name} = {node.name}{path}")
                self._fix_layout(out)
            code.writeline(f"del {node.name}")
        else:
            self._fix_layout(node)

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
