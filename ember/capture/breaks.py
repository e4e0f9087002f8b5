"""Capture, graph breaks: compile the prefix, run the unsupported instruction, resume.

Consumes a Runner, the call's locals and the `Unsupported` a full trace raised at instruction
`break_at` of the root frame; produces a cache entry (entry.build_entry) whose run function
calls the prefix graph, replays side effects, rebuilds the frame's stack and locals as real
values and then, by the kind of instruction:
  call  - calls the function eagerly (user functions and modules through `dispatch`, which
          compiles them as their own roots) and continues in a compiled resume function;
  jump  - evaluates the tensor condition and continues in one of two compiled resume functions;
  eager - anything else, and any break inside a loop, a try block or an unknown `with`: the
          rest of the frame runs eagerly from the unsupported instruction on, its calls
          routed through `dispatch` too (resume.route_calls).
Context managers open at the break (no_grad & co.) are closed at the end of the prefix graph,
the residual call runs inside real ones, and resume functions re-enter them (resume.py).
Breaks are recorded for explain() and logged once each under EMBER_LOGS=graph_breaks.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import linecache
import types

import torch

from ..errors import Unsupported
from ..logging import enabled, get_logger, warn_once
from .bytecode import decode
from .effects import Plan, Rebuild, effect_lines, graph_module, mutates_first_arg
from .handlers.contexts import context_method
from .interpreter import CO_VARARGS, CO_VARKEYWORDS, StopTrace, Tracer
from .resume import (NULL as NULL_SLOT, UNBOUND, VALUE, call_trampoline, instruction_starts,
                     resume_function, with_closure)
from .values import NULL, BuiltinMethodV, ContextV, GenV, IterV, MethodV, ObjV, TensorV

_JUMPS = {"POP_JUMP_IF_TRUE": True, "POP_JUMP_IF_FALSE": False}
GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200     # generator, coroutine, async generator
_LOGGED: set = set()
RECORD: list = []          # BreakInfo of every break compiled (explain() reads a slice)
EAGER: list = []           # "file:line runs eagerly: reason" per eager (part of a) frame, ditto


def runs_eagerly(key: str, code, lineno: int, reason: str) -> None:
    """A frame (or its rest after a graph break) was set to run eagerly: say so once per
    `key`, as `ember: <file:line> runs eagerly: <reason>`, and record it for explain()."""
    msg = f"{code.co_filename}:{lineno} runs eagerly: {code.co_qualname}: {reason}"
    EAGER.append(msg)
    warn_once(key, msg)


@dataclasses.dataclass
class BreakInfo:
    reason: str
    filename: str
    lineno: int
    source_line: str | None
    kind: str               # call / jump / eager

    def __str__(self) -> str:
        line = f"    {self.source_line.strip()}" if self.source_line else ""
        return f"{self.filename}:{self.lineno}: {self.reason} [{self.kind}]" + \
            (f"\n{line}" if line else "")


class ResumeTarget:
    """Calls the rest of a frame: compiled through capture, or eagerly."""

    def __init__(self, fn, offset, layout, unbound, host, compiled: bool):
        # host: the entry.Runner whose frame broke; the rest runs through a Runner like it
        self.settings, self.compiled, self.make_runner = host.settings, compiled, type(host)
        self.closure = bool(fn.__code__.co_freevars)
        # a frame with cells passes them first; its resume function is made per call
        self.n_cells = len(fn.__code__.co_cellvars)
        # the eager rest still sends the calls it makes through the dispatcher
        route = None if compiled else host.route
        self.fn = resume_function(fn, offset, layout, unbound, route,
                                  tuple(types.CellType() for _ in range(self.n_cells)))
        self.runner = self._runner(self.fn)

    def _runner(self, fn):
        if not self.compiled:
            return fn
        return self.make_runner(fn, self.settings)

    def __call__(self, fn, *args):
        if self.n_cells:
            return self._runner(with_closure(self.fn.__code__, fn, args[0]))(*args[1:])
        if self.closure and fn.__closure__ is not self.fn.__closure__:
            # same code, another closure: build the resume function over this one's cells
            self.fn = types.FunctionType(self.fn.__code__, fn.__globals__, self.fn.__name__,
                                         None, fn.__closure__)
            self.runner = self._runner(self.fn)
        return self.runner(*args)


def compile_break(runner, locals_, err: Unsupported):
    """An Entry for a frame whose full trace raised `err`, or None (run the frame eagerly).

    `runner` (an entry.Runner) is all this layer sees of the cache layer above it: it retraces
    (`trace`), makes the entry (`make_entry`), routes residual calls (`route`) and is the model
    for the resume functions' runners."""
    if not err.break_at:        # None, or () where no break is correct (hooks.py)
        return None
    idx, visit = err.break_at
    code = runner.code
    instrs, table = decode(code)
    ins = instrs[idx]
    tr = Tracer(runner.settings)
    tr.stop_at = err.break_at
    try:
        try:
            runner.trace(tr, locals_)
        except StopTrace as s:
            frame = s.frame
        else:
            return None            # the retrace took another path: do not guess
        kind, why = _kind(instrs, table, idx, ins, frame)
        if kind == "eager" and idx == 0:
            return None
        plan = _plan(tr, runner, frame, idx, ins, kind)
    except Unsupported as e:       # the stack cannot be rebuilt: the frame runs eagerly
        err.no_break = e.reason
        if enabled("graph_breaks"):
            get_logger("graph_breaks").info("no resumable break at %s: %s", err.location, e)
        return None
    finally:
        torch._C._set_grad_enabled(tr.state0[0])
        for c in reversed(tr.real_contexts):
            c.__exit__(None, None, None)
    info = _record(err, code, ins, kind)
    if kind == "eager":
        runs_eagerly(f"eager-rest:{id(code)}:{idx}", code, info.lineno,
                     f"from this line on ({why}), after a graph break: {err.reason}")
    elif kind == "call" and err.location != f"{code.co_filename}:{info.lineno}" and \
            (callee := _eager_callee(runner, frame, ins)) is not None:
        runs_eagerly(f"eager-call:{id(code)}:{idx}", code, info.lineno,
                     f"the call to {callee.__qualname__} here (torch code, not compiled on "
                     f"its own), after a graph break in it: {info.reason}")
    entry = runner.make_entry(tr, plan)
    entry.breaks = [info]
    return entry


def _kind(instrs, table, idx, ins, frame) -> str:
    in_loop = any(j.target is not None and j.target <= idx <= k and j.target <= k
                  for k, j in enumerate(instrs))      # inside some backward jump's range
    covering = [e for e in table if e.start <= idx <= e.end]
    with_only = all(_is_with_cleanup(instrs, e) for e in covering)
    contexts = [v.recv for v in frame.stack
                if isinstance(v, BuiltinMethodV) and isinstance(v.recv, ContextV)]
    python_ctx = any(isinstance(v, MethodV) and isinstance(v.func, ObjV) and
                     getattr(v.func.value, "__name__", "") == "__exit__" for v in frame.stack)
    simple_ctx = all(c.ctx_kind in ("grad", "grad_set", "null", "autocast") for c in contexts) and \
        not python_ctx
    if in_loop or not with_only or not simple_ctx:
        return "eager", ("inside a loop" if in_loop else "inside a try block" if not with_only
                         else "inside a with-block of an unknown context manager")
    if ins.opname in ("CALL", "CALL_FUNCTION_EX"):
        return "call", None
    if ins.opname in _STATEMENTS:
        return "statement", None
    if ins.opname in _JUMPS and frame.stack and isinstance(frame.stack[-1], TensorV):
        return "jump", None
    return "eager", f"{ins.opname} cannot resume"


# instructions that only consume stack slots (how many): run eagerly on their own, then resume
_STATEMENTS = {"STORE_SUBSCR": 3, "STORE_ATTR": 2, "DELETE_SUBSCR": 2, "DELETE_ATTR": 1}


def _is_with_cleanup(instrs, e) -> bool:
    h = instrs[e.target:e.target + 2]
    return len(h) == 2 and h[0].opname == "PUSH_EXC_INFO" and h[1].opname == "WITH_EXCEPT_START"


_FACTORIES: dict = {}


def context_factory(ctx: ContextV):
    """A zero-argument callable that makes a context manager equal to `ctx` (one per kind)."""
    k = ctx.ctx_kind
    if k in ("grad", "grad_set"):
        return torch.enable_grad if ctx.args[0] else torch.no_grad
    if k == "null":
        return contextlib.nullcontext
    if k == "autocast":
        dev, dtype, on, cache = ctx.args
        key = (k, dev, dtype, on, cache)
        make = functools.partial(torch.autocast, dev, dtype=dtype, enabled=on, cache_enabled=cache)
    elif k == "inference":
        key, make = (k, ctx.args[0]), functools.partial(torch.inference_mode, ctx.args[0])
    else:
        raise Unsupported(f"graph break inside a {k} context")
    return _FACTORIES.setdefault(key, make)


class _BreakRebuild(Rebuild):
    """Rebuilds stack values too: iterators, bound methods, methods of values."""

    def expr(self, v):
        if isinstance(v, _Res):
            return "__res"
        if isinstance(v, IterV):
            return f"iter([{', '.join(self.expr(i) for i in v.items[v.pos:])}])"
        if isinstance(v, GenV):
            if id(v) in self.memo:
                return self.memo[id(v)]
            if v.frame is not None and not v.started and v.frame.fn_v is not None:
                # not started: the same generator, made again by calling its function
                return self._temp(v, f"{self.expr(v.frame.fn_v)}({', '.join(self._args(v.frame))})")
            items = _finish(self.tr, v)
            return self._temp(v, f"iter([{', '.join(self.expr(i) for i in items)}])")
        if isinstance(v, MethodV):
            return f"{self.bind(types.MethodType, 'c')}({self.expr(v.func)}, {self.expr(v.self_v)})"
        if isinstance(v, BuiltinMethodV):
            if isinstance(v.recv, ContextV):
                raise self.tr.unsupported(f"graph break with {v.name} of a context on the stack")
            return f"{self.expr(v.recv)}.{v.name}"
        return super().expr(v)

    def _args(self, frame) -> list[str]:
        """Arguments that bind a function's parameters to an unstarted frame's locals."""
        co, loc = frame.code, frame.locals
        names = co.co_varnames
        n, nk = co.co_argcount, co.co_kwonlyargcount
        out = [self.expr(loc[x]) for x in names[:n]]
        i = n + nk
        if co.co_flags & CO_VARARGS:
            out.append("*" + self.expr(loc[names[i]]))
            i += 1
        out += [f"{x}={self.expr(loc[x])}" for x in names[n:n + nk]]
        if co.co_flags & CO_VARKEYWORDS:
            out.append("**" + self.expr(loc[names[i]]))
        return out


def _finish(tr, g) -> list:
    """The values a generator suspended at the break has left. Eager code would run it one
    step at a time, between its own statements; running it to the end here, in the prefix,
    is the same only when that writes nothing (no container, attribute, cell, global or
    in-place tensor write): else the frame is not resumable here."""
    writes, nodes = tr.writes, set(tr.graph.nodes)
    items = tr.iterate(g)
    if tr.writes != writes or any(mutates_first_arg(n) for n in tr.graph.nodes if n not in nodes):
        raise tr.unsupported("graph break while a generator with side effects is suspended")
    return items


def _slots(stack, ins, kind):
    """The stack slots the breaking instruction consumes, and the callee's position in them."""
    n_slots = _STATEMENTS[ins.opname] if kind == "statement" else \
        ins.arg + 2 if ins.opname == "CALL" else 3 + (ins.arg & 1)
    slots = stack[len(stack) - n_slots:]
    return slots, 1 if slots[0] is NULL else 0          # [NULL, fn, args] or [fn, self, args]


def _eager_callee(runner, frame, ins):
    """The torch function a call break runs as it is (the residual call's dispatcher,
    `runner.route`, does not compile it as its own root), or None: its whole body then runs
    eagerly. torch's own Python (an optimizer step, a functional) computes on tensors; the
    standard library's (logging, copy) does not: saying that a log call ran eagerly is noise."""
    slots, fi = _slots(frame.stack, ins, "call")
    v = slots[fi]
    fn = v.func.value if isinstance(v, MethodV) and isinstance(v.func, ObjV) else \
        getattr(v, "value", None)
    func = getattr(fn, "__func__", fn)
    if not isinstance(func, types.FunctionType) or func.__code__.co_flags & GENERATOR_FLAGS or \
            (func.__module__ or "").split(".")[0] != "torch":
        return None
    return fn if runner.route(fn) is fn else None


def _is_exit(v) -> bool:
    return isinstance(v, BuiltinMethodV) and isinstance(v.recv, ContextV) and v.name == "__exit__"


def _plan(tr, runner, frame, idx, ins, kind) -> Plan:
    code = runner.code
    stack = list(frame.stack)
    # close, innermost first, the contexts still open on the stack: the graph ends balanced
    for v in reversed(stack):
        if isinstance(v, BuiltinMethodV) and isinstance(v.recv, ContextV) and v.name == "__exit__":
            context_method(tr, v.recv, "__exit__", [])
    rb = _BreakRebuild(tr)
    contexts = [context_factory(v.recv) for v in stack if _is_exit(v)]
    local_exprs, unbound = [], []
    for name in code.co_varnames:
        v = frame.locals.get(name)
        if v is None:
            unbound.append(name)
            local_exprs.append(rb.bind(UNBOUND, "u"))
        else:
            local_exprs.append(rb.expr(v))
    starts = instruction_starts(code)
    fn_b = runner.fn
    tail: list[str] = []

    cells = [f"({''.join(rb.cell(frame.cells[n]) + ', ' for n in code.co_cellvars)})"] \
        if code.co_cellvars else []

    def resume(offset, slots, compiled):
        layout = tuple(NULL_SLOT if s is NULL else context_factory(s.recv) if _is_exit(s)
                       else VALUE for s in slots)
        target = ResumeTarget(fn_b, offset, layout, tuple(unbound), runner, compiled)
        args = cells + local_exprs + [rb.expr(s) for s, k in zip(slots, layout) if k is VALUE]
        return f"{rb.bind(target, 'resume')}(__fn, {', '.join(args)})"

    if kind in ("call", "statement"):
        slots, fi = _slots(stack, ins, kind)
        n_slots = len(slots)
        args = [f"{rb.bind(runner.route, 'f')}({rb.expr(s)})" if i == fi and kind == "call"
                else rb.expr(s) for i, s in enumerate(slots) if s is not NULL]
        tramp = call_trampoline(code, starts[idx], starts[idx + 1],
                                tuple(s is NULL for s in slots), ins.lineno or code.co_firstlineno,
                                statement=kind == "statement")
        call = f"{rb.bind(tramp, 'f')}({', '.join(args)})"
        # the call runs inside the contexts open at the break (outermost first)
        for i, make in enumerate(contexts):
            tail.append("    " * i + f"with {rb.bind(make, 'c')}():")
        tail.append("    " * len(contexts) + f"__res = {call}")
        rest = stack[:len(stack) - n_slots] + ([_Res()] if kind == "call" else [])
        tail.append(f"return {resume(starts[idx + 1], rest, True)}")
    elif kind == "jump":
        cond = rb.expr(stack[-1])
        rest = stack[:-1]
        taken = resume(starts[ins.target], rest, True)
        fallthrough = resume(starts[idx + 1], rest, True)
        neg = "" if _JUMPS[ins.opname] else "not "
        tail += [f"if {neg}{cond}:", f"    return {taken}", f"return {fallthrough}"]
    else:
        tail.append(f"return {resume(starts[idx], stack, False)}")
    tr.check_abandoned_generators()      # after the live ones were finished or made again
    effects = effect_lines(tr, rb)
    body = rb.pre + effects + tail
    gm, structural, dynamic, examples = graph_module(tr, rb.outputs)
    n_ops = sum(1 for n in tr.graph.nodes if n.op == "call_function")
    return Plan(gm, structural, dynamic, examples, body, n_ops)


class _Res(ObjV):
    """The residual call's result on the resumed stack."""

    def __init__(self):
        super().__init__(None)


def _record(err: Unsupported, code, ins, kind) -> BreakInfo:
    lineno = ins.lineno or code.co_firstlineno
    src = linecache.getline(code.co_filename, lineno) or None
    reason = err.reason
    if err.location and err.location != f"{code.co_filename}:{lineno}":
        reason = f"{reason} (at {err.location})"
    info = BreakInfo(reason, code.co_filename, lineno, src, kind)
    RECORD.append(info)
    key = (code.co_filename, lineno, err.reason)
    if enabled("graph_breaks") and key not in _LOGGED:
        _LOGGED.add(key)
        get_logger("graph_breaks").info("graph break at %s:%d (%s): %s", code.co_filename,
                                        lineno, code.co_qualname, err.reason)
    return info
