"""Stage 4 entry point: `compile_aten_graph(gm, example_inputs)` → callable (the kernel backend).

Pipeline: lower (GraphLowering) → dead-code elimination → schedule (deps, fuse, memory) →
codegen (C++ TU + Python wrapper) → runtime (g++ build in a worker thread, disk cache, ctypes).
The build is started here and awaited on the first call, so several graphs compile in parallel.
EMBER_LOGS=output_code prints the C++ and wrapper; EMBER_DEBUG_DIR writes them to files.

Consumes: aten graph (docs/design/001). Produces: callable(*inputs) -> tuple of tensors.
"""
from __future__ import annotations

import itertools
import threading
import time

import torch

from .. import config, shapes
from ..loopir.index import size_hints
from ..codegen.cpp import generate_tu
from ..codegen.wrapper import WrapperCodegen, grad_free
from ..fallback import fall_back, stage
from ..logging import get_logger
from ..runtime import graph_cache
from ..runtime.build import build_async, load
from ..schedule.deps import node_deps
from ..schedule.fuse import ExternStep, Kernel, fuse
from ..schedule.memory import (can_write_in_place, mark_locals, plan_memory, step_reads,
                               step_writes)
from ..loopir.nodes import TensorArg
from .lowering import GraphLowering

code_log = get_logger("output_code")
perf_log = get_logger("perf")
_ids = itertools.count()
_lock = threading.Lock()
#: one dict per compiled graph (kernels, externs, fallbacks); tests read and clear it
STATS: list = []


def _dce(nodes, deps, keep: set):
    needed = set(keep)
    out = []
    for n in reversed(nodes):
        names = {n.name} | {o.name for o in getattr(n, "outputs", [])}
        if names & needed:
            out.append(n)
            needed.update(deps[n.name].reads)
    return list(reversed(out))


def compile_aten_graph(gm, example_inputs, *, options=None):
    env = shapes.env_of(*[n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")])
    with size_hints(env.hints if env is not None else {}):
        return _compile_aten_graph(gm, example_inputs, options)


def _compile_aten_graph(gm, example_inputs, options):
    options = options or {}
    t0 = time.perf_counter()
    from ..codegen.triton_launch import compile_steps, selected  # Triton/GPU seam (issue 11)
    use_triton = selected(gm, example_inputs, options)   # never served from the C++ graph cache
    key = None if use_triton else graph_cache.graph_key(gm, options)
    entry = graph_cache.load(key) if key else None
    if entry is not None:
        stats = dict(entry["stats"], graph=next(_ids), cached=True)
        with _lock:
            STATS.append(stats)
        globs = {"torch": torch, "empty_strided": torch.empty_strided, "as_strided": torch.as_strided}
        globs.update({k: graph_cache.resolve_op(v) for k, v in entry["ops"].items()})
        future = build_async(entry["source"]) if entry["source"] else None
        perf_log.info("graph %d: graph cache hit (%d kernels), fallbacks %s", stats["graph"],
                      stats["kernels"], stats["fallbacks"])
        return _Compiled(entry["wrapper"], globs, future, entry["sigs"], stats, gm).entry()
    with stage("lower"):
        g = GraphLowering(gm, example_inputs).run()
    with stage("schedule"):
        deps = {n.name: node_deps(n) for n in g.nodes}
        out_names = {o.buffer.name for o in g.outputs if isinstance(o, TensorArg)}
        nodes = _dce(g.nodes, deps, out_names)
        buffers = {b.name: b for b in g.inputs if b.size is not None}
        for n in nodes:
            buffers[n.name] = n
            for o in getattr(n, "outputs", []):
                buffers[o.name] = o
        steps = fuse(nodes, deps, enable=options.get("fusion", True))
        mark_locals(steps, deps, keep=out_names)
        plan = plan_memory(steps, deps, out_names)
    kernels = [s for s in steps if isinstance(s, Kernel)]
    if use_triton:
        with stage("codegen"):
            run = compile_steps(g, steps, plan, deps, buffers, options, kernels=kernels,
                                step_reads=lambda s: step_reads(s, deps), step_writes=step_writes,
                                inplace_ok=lambda s, a, b: can_write_in_place(s, deps, a, b),
                                stats={"kernels": len(kernels), "nodes": len(nodes),
                                       "externs": sum(isinstance(s, ExternStep) for s in steps),
                                       "fallbacks": list(g.fallbacks)})
        with _lock:
            STATS.append(run.ember_stats)
        return run
    with stage("codegen"):
        source, sigs = generate_tu(kernels, deps, buffers)
        wrapper = WrapperCodegen(g.inputs, steps, plan, sigs, buffers, g.outputs,
                                 lambda s: step_reads(s, deps), step_writes,
                                 inplace_ok=lambda s, src, dst: can_write_in_place(s, deps, src, dst))
        wsrc = wrapper.generate()
    gid = next(_ids)
    stats = {"graph": gid, "kernels": len(kernels),
             "externs": sum(isinstance(s, ExternStep) for s in steps),
             "fallbacks": list(g.fallbacks), "nodes": len(nodes)}
    with _lock:
        STATS.append(stats)
    _report(gid, gm, source if kernels else "", wsrc)
    if key and not any(b.constant is not None for b in g.inputs):
        graph_cache.store(key, {"wrapper": wsrc, "source": source if kernels else "",
                                "sigs": sigs, "ops": wrapper.ops, "stats": stats})
    future = build_async(source) if kernels else None
    perf_log.info("graph %d: %d kernels, %d externs, fallbacks %s, lowered in %.3fs", gid,
                  stats["kernels"], stats["externs"], g.fallbacks, time.perf_counter() - t0)
    return _Compiled(wsrc, wrapper.globals, future, sigs, stats, gm).entry()


class _Compiled:
    """The wrapper, made callable at the first call: that waits for the kernels' build. A
    build that fails (g++ error, no compiler) makes this graph run its aten graph eagerly."""

    def __init__(self, wsrc, globs, future, sigs, stats, gm):
        self.wsrc, self.globs, self.future, self.sigs, self.stats = wsrc, globs, future, sigs, stats
        self.gm = gm
        self.call = self._first_call
        self.lock = threading.Lock()

    def _first_call(self, args):
        with self.lock:
            if self.call == self._first_call:
                try:
                    with stage("build"):
                        self.call = self._load()
                except Exception as exc:  # noqa: BLE001 - the fallback policy
                    fall_back("ember", exc)
                    self.call = self._eager
        return self.call(args)

    def _load(self):
        globs = dict(self.globs)
        if self.future is not None:
            globs.update(load(self.future.result(), self.sigs))
        exec(compile(self.wsrc, f"<ember wrapper {self.stats['graph']}>", "exec"), globs)
        return globs["call"]

    def _eager(self, args):
        out = self.gm(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    def entry(self):
        run = grad_free(lambda args: self.call(args))   # self.call changes after the first call
        run.ember_stats = self.stats
        run.ember_wrapper = self.wsrc
        return run


def _report(gid, gm, source, wsrc):
    if code_log.isEnabledFor(20):
        code_log.info("graph %d C++:\n%s\ngraph %d wrapper:\n%s", gid, source, gid, wsrc)
    d = config.debug_dir()
    if d is not None:
        d.mkdir(parents=True, exist_ok=True)
        (d / f"graph{gid}_aten.py").write_text(f"# aten graph given to ember.lower\n{gm.code}")
        if source:
            (d / f"graph{gid}_kernels.cpp").write_text(source)
        (d / f"graph{gid}_wrapper.py").write_text(f"# ember wrapper, graph {gid}\n{wsrc}")
