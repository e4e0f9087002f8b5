"""Backend "ember" (the default): capture → aot → decomps → loop IR, fusion, generated kernels.

`ember_backend` runs aot with `compile_aten_graph` as its forward/backward compiler: the kernel
backend's pipeline, one function read top to bottom,

    lower (aten graph → loop IR) → dump → schedule (→ Plan) → dump → codegen (C++ TU or Triton
    kernels, and the Python wrapper, from the plan) → dump → runtime (build in a worker thread,
    disk cache, load at the first call)

Each dump goes to EMBER_DEBUG_DIR/graph_<n>/ (ember.debug), so LayerNorm can be followed from
the aten graph through `after lower:` and `after schedule:` to the C++ kernel
(docs/design/025-loop-ir.md). EMBER_LOGS=output_code prints the generated sources.

Consumes: aten graph (docs/design/001). Produces: callable(*inputs) -> tuple of tensors.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time

import torch

from .. import config, counters, debug, shapes
from ..errors import Unsupported
from ..aot import aot_compile, trace_aten
from ..codegen import triton_launch
from ..codegen.cpp import generate_tu
from ..codegen.wrapper import WrapperCodegen, grad_free, wrapper_globals
from ..fallback import fall_back, stage
from ..decomp import complex as real_pairs, get_decompositions
from ..logging import get_logger, warn_once
from ..loopir.index import size_hints
from ..loopir.printer import plan_summary, print_lowered, print_plan
from ..lower.lowering import GraphLowering
from ..runtime import graph_cache
from ..runtime.build import build_async, load
from ..runtime.cudagraphs import cudagraphify
from ..runtime.pycode import compile_cached
from ..schedule import ROW_LOCAL_MAX, ROW_LOCAL_MAX_TRITON, schedule
from . import backend_cache, freeze, gemmroute, layout, split
from .attention import fuse_attention, unfold_fast_paths
from .sdpa_kernel import use_kernel
from .freeze import copy_module, fold_batchnorm_per_call
from .speed import speed_checked    # never slower than eager

code_log = get_logger("output_code")
perf_log = get_logger("perf")
_ids = itertools.count()
#: counters of one aten graph's lowering, kept in its graph-cache entry's stats and bumped
#: again on a hit (which skips the lowering)
GRAPH_COUNTERS = ("onednn_gemms",)
_lock = threading.Lock()
#: one dict per compiled graph (kernels, externs, fallbacks); tests read and clear it
STATS: list = []


def ember_backend(gm, example_inputs, **kwargs):
    neg = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and x.is_neg()]
    if neg:     # the kernels read storage as it is: a negative view's values are its negation
        example_inputs = _resolve_views(example_inputs, neg)
        gm = copy_module(gm)
        phs = list(gm.graph.find_nodes(op="placeholder"))
        for i in neg:       # the traced strides: a resolved copy's (dense), not the view's
            phs[i].meta = {k: v.resolve_neg() if isinstance(v, torch.Tensor) else v
                           for k, v in phs[i].meta.items()}
        return _on_resolved_negs(_ember_backend(gm, example_inputs, **kwargs), neg)
    return _ember_backend(gm, example_inputs, **kwargs)


def _on_resolved_negs(fn, positions):
    """`fn` called with the negative views among its inputs (`torch._neg_view`, the imaginary
    part of a conjugate) resolved into plain tensors, which the graph's guards (Dynamo's
    dispatch keys, ember's TENSOR guard) hold to these positions; a resolved input the graph
    mutated is copied back through its view (which negates it again), as eager's write would."""
    def run(*args):
        resolved = _resolve_views(args, positions)
        versions = [resolved[i]._version for i in positions]
        out = fn(*resolved)
        for i, v in zip(positions, versions):
            if resolved[i]._version != v:
                args[i].copy_(resolved[i])
        return out
    return run


def _ember_backend(gm, example_inputs, **kwargs):
    options = kwargs.get("options") or {}
    if "profile" not in options and config.profile_kernels():
        options = {**options, "profile": True}      # part of both cache keys, as an option
        kwargs = {**kwargs, "options": options}
    _refuse_implicit_autocast(gm)
    if split.data_dependent(gm):    # Dynamo's unbacked sizes: compiled around the data reads
        return split.split_at_data(gm, lambda g, ex: _ember_backend(g, ex, **kwargs)).forward
    key = backend_cache.key_of(gm, example_inputs, options)     # warm start: backend_cache.py
    warm = _from_backend_cache(key) if key else None
    if warm is not None:
        return speed_checked(gm, warm[0], example_inputs, warm[1])
    counts = counters.snapshot()["counts"]
    # the modules' fast-path ops as their parts (attention.py), before freezing packs linears;
    # the speed check times the captured graph as it is
    work = unfold_fast_paths(gm, example_inputs, options)
    # inference graphs: frozen weights (freeze.py) and channels-last convs (layout.py)
    frozen = _frozen(work, example_inputs, options)
    if frozen is not None:
        return speed_checked(gm, frozen, example_inputs, {**options, "plan": "frozen"})
    compiled, plan = _unfrozen(work, example_inputs, options, key, counts)
    return speed_checked(gm, compiled, example_inputs, plan)


def _unfrozen(gm, example_inputs, options, key, counts):
    """(compiled, plan): `gm` compiled with its weights as inputs (not frozen): an inference
    graph's BatchNorm folded on each call, convs channels-last where layout.py's rules say."""
    work = copy_module(gm)
    if not layout.training_graph(example_inputs) and \
            layout.why_not(work, example_inputs, options) is None:
        fold_batchnorm_per_call(work)
    if not layout.plan(work, example_inputs, options):
        work = gm
    plan = {**options, "plan": "channels_last"} if work is not gm else options
    return _compile_cached(key, work, example_inputs, options, plan, counts), plan


# ---- warm start (backend_cache.py) --------------------------------------------------------------
def _frozen(gm, example_inputs, options):
    """freeze.py's runtime for an inference graph whose weights are frozen, or None. Its plan
    (the rewritten graph's constant part, and the main graph's cache key) is cached: a warm
    start folds the weights and loads the main graph, without the rewrites."""
    why = freeze.why_not(gm, example_inputs, options)
    if why is not None:
        perf_log.info("not frozen: %s", why)
        return None
    pkey = backend_cache.key_of(gm, example_inputs, options, frozen="plan")
    entry = backend_cache.load(pkey) if pkey else None
    warm = _from_backend_cache(entry["plan"].main_key) if entry else None
    plan = entry["plan"] if warm else freeze.plan(gm, example_inputs, options)
    if isinstance(plan, str):
        perf_log.info("not frozen: %s", plan)
        return None

    def compile_main(p, main_args):
        key = backend_cache.key_of(p.main_gm, main_args, options, frozen=True)
        p.main_key = key
        return _compile_cached(key, p.main_gm, main_args, options, options,
                               counters.snapshot()["counts"])

    def replan(args):
        p = freeze.plan(gm, args, options)
        if isinstance(p, str):      # the same graph and input specs: the same decisions
            raise RuntimeError(f"frozen graph no longer freezes: {p}")
        return p

    rt = freeze.freeze(plan, example_inputs, options, compile_main, replan,
                       lambda ex: _unfrozen(gm, ex, options, None,
                                            counters.snapshot()["counts"])[0],
                       warm and warm[0])
    if rt is not None and pkey and plan.main_key and not warm:
        backend_cache.store(pkey, {"plan": dataclasses.replace(plan, main_gm=None)})
    return rt


def _compile_cached(key, gm, example_inputs, options, plan, counts_before):
    """`_compile`, its product stored under `key` (None: not cached) with the counts the
    compile bumped since `counts_before` (what a hit replays)."""
    if key is None:
        return _compile(gm, example_inputs, options)
    store = _backend_cache_store(key, plan, counts_before)
    compiled = _compile(gm, example_inputs, options, on_backward=store)
    store(None, compiled)
    return compiled


def _backend_cache_store(key, plan, counts_before):
    """A callback storing aot's runtime once it is complete: at once for inference, at the
    first backward for training (`store(backward, runtime)`)."""
    held = {}

    def store(backward, runtime=None):
        if "runtime" not in held:   # the compile's own counts (what a hit replays; the
            now = counters.snapshot()["counts"]     # graph entries it loads restore their own)
            held.update(runtime=runtime, counts={
                k: v - counts_before.get(k, 0) for k, v in now.items()
                if v != counts_before.get(k, 0) and "cache" not in k and k != "fallbacks"
                and k not in GRAPH_COUNTERS})
        entry = backend_cache.entry_of(held["runtime"], plan, held["counts"], backward)
        if entry is not None:
            backend_cache.store(key, entry)
    return store


def _from_backend_cache(key):
    """(aot's runtime, its plan) loaded from the backend cache, or None (a miss)."""
    entry = backend_cache.load(key)
    runtime = None
    if entry is not None:
        try:
            runtime = backend_cache.runtime_of(entry, _load_graph_now)
        except Exception as exc:  # noqa: BLE001 - an entry that does not load is a miss
            if config.strict():
                raise
            warn_once(f"backend-cache-load:{key}", f"backend cache entry {key[:12]} did not "
                      f"load ({type(exc).__name__}: {exc}); recompiling")
    if runtime is None:
        counters.bump("backend_cache_misses")
        return None
    counters.bump("backend_cache_hits")
    for name, n in entry["counts"].items():
        counters.bump(name, n)
    perf_log.info("backend cache hit %s: capture -> kernels skipped", key[:12])
    return runtime, entry["plan"]


def _load_graph_now(key):
    """A graph-cache entry as a callable, its kernels loaded now (or None: not cached)."""
    entry = graph_cache.load(key)
    return None if entry is None else _from_graph_cache(entry, None, key, now=True)


def _compile(gm, example_inputs, options, on_backward=None):
    """aot → decompositions → kernels for the torch-level graph `gm`."""

    def compiler(g, ex):            # forward now, backward lazily at the first backward
        with counters.timed("codegen"):
            return compile_aten_graph(g, ex, options=options)

    def bw_compiler(g, ex):
        # runs inside the first backward, past the backend's own fallback: a failure here makes
        # the backward graph run eagerly (its aten ops), the forward stays compiled
        try:
            compiled = compiler(g, ex)
        except Exception as exc:  # noqa: BLE001 - the fallback policy
            fall_back("ember", exc, "this graph's backward")
            return g
        if on_backward is not None and "tangent_layouts" not in g.meta:
            on_backward(compiled)       # the warm start's backward takes the traced layouts
        return compiled
    gm = fuse_attention(gm, example_inputs, options)     # explicit attention → the fused kernel (attention.py)
    gm = use_kernel(gm, example_inputs, options)         # inference sdpa → ember's kernel (sdpa_kernel.py)
    with counters.timed("aot"), stage("aot"):
        compiled = aot_compile(gm, example_inputs, fw_compiler=compiler, bw_compiler=bw_compiler,
                               decompositions=get_decompositions())
    return compiled


def _refuse_implicit_autocast(gm) -> None:
    """aot traces on meta tensors, which have no autocast dispatch key: an autocast region is
    compiled right only when its casts are explicit in the graph (ember's capture writes them,
    marking the graph with meta["ember_device"]). Another capture's graph (Dynamo's) relies on
    the dispatcher: refuse it loudly rather than compute the region in the wrong dtype."""
    if "ember_device" in gm.meta:
        return
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.amp.autocast_mode._enter_autocast \
                and (len(n.args) < 3 or n.args[2] is not False):
            raise Unsupported("an autocast region in a graph from another capture (its casts "
                              "are implicit; ember traces on meta tensors, which autocast "
                              "does not see)", hint="use ember.compile, or autocast outside")


def compile_aten_graph(gm, example_inputs, *, options=None):
    """The kernel backend: aten graph → callable running generated kernels."""
    options = options or {}
    env = shapes.env_of(*[n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")])
    with size_hints(env.hints if env is not None else {}), debug.graph_scope():
        t0 = time.perf_counter()
        use_triton = triton_launch.selected(gm, example_inputs, options)  # raises on mixed devices
        with stage("decomp"):
            work = _complex_as_real_pairs(gm, example_inputs)
        mutations = _mutation_outputs(work)
        gemm_rule = None if use_triton else gemmroute.onednn_gemm_rule(options)
        key = None if use_triton else graph_cache.graph_key(work, _key_options(
            options, mutations, gemmroute.decisions(work, gemm_rule)))
        entry = graph_cache.load(key) if key else None
        if entry is not None:
            return _from_graph_cache(entry, gm, key)
        debug.dump("aot", gm.code, summary=f"the aten graph given to the kernel backend, "
                                          f"{len(gm.graph.nodes)} nodes", of=gm)
        if work is not gm:
            debug.dump("real_pairs", work.code, summary=f"complex values as real pairs "
                       f"(decomp/complex.py), {len(work.graph.nodes)} nodes", of=work)
        with stage("lower"):
            g = GraphLowering(work, example_inputs, cpp=not use_triton,
                              onednn_gemm=gemm_rule).run()
        _report_gemms(g)
        if debug.active():
            debug.dump("lower", print_lowered(g.inputs, g.nodes, g.outputs), summary=None)
        with stage("schedule"):
            plan = schedule(g, fusion=options.get("fusion", True),
                            row_local_max=ROW_LOCAL_MAX_TRITON if use_triton else ROW_LOCAL_MAX,
                            row_gather=not use_triton, columns=not use_triton)
        if debug.active():
            debug.dump("schedule", print_plan(plan), summary=None)
        stats = {"kernels": len(plan.kernels), "externs": len(plan.externs),
                 "fallbacks": list(plan.fallbacks), "nodes": len(plan.nodes),
                 "counters": {GRAPH_COUNTERS[0]: len(g.onednn_gemms)} if g.onednn_gemms else {}}
        if use_triton:
            with stage("codegen"):
                run = triton_launch.compile_plan(
                    plan, triton_launch.graph_devices(gm, example_inputs), options, stats)
            if run.ember_stats["device"] == "cuda" and options.get("mode") == "reduce-overhead":
                run = cudagraphify(run, list(example_inputs))
            with _lock:
                STATS.append(run.ember_stats)
            return run
        with stage("codegen"):
            source, sigs = generate_tu(plan.kernels, plan.deps, plan.buffers)
            wrapper = WrapperCodegen(plan, sigs, mutations=mutations,
                                     profile=options.get("profile", False))
            wsrc = wrapper.generate()
        stats = {"graph": next(_ids), **stats}
        with _lock:
            STATS.append(stats)
        _report(stats["graph"], plan, source if plan.kernels else "", wsrc)
        if key and not any(b.constant is not None for b in plan.inputs):
            graph_cache.store(key, {"wrapper": wsrc, "source": source if plan.kernels else "",
                                    "sigs": sigs, "ops": wrapper.ops, "stats": stats})
        else:
            key = None
        future = build_async(source) if plan.kernels else None
        perf_log.info("graph %d: %s, fallbacks %s, lowered in %.3fs", stats["graph"],
                      plan_summary(plan), list(plan.fallbacks), time.perf_counter() - t0)
        return _Compiled(wsrc, wrapper.globals, future, sigs, stats, gm, key).entry()


def _key_options(options: dict, mutations: dict, gemms: tuple) -> dict:
    """The options as the graph cache's key holds them, with the decisions outside `options`
    that change the compiled code: which outputs are copied back into inputs, and which GEMMs
    run on oneDNN (gemmroute.decisions: the probe's verdict, the mkldnn switch)."""
    extra = {"mutations": sorted(mutations.items())} if mutations else {}
    if gemms:
        extra["onednn_gemms"] = gemms
    return {**options, **extra} if extra else options


def _report_gemms(g) -> None:
    """Count and log the GEMMs the lowering moved to oneDNN (gemmroute.py)."""
    if not g.onednn_gemms:
        return
    counters.bump(GRAPH_COUNTERS[0], len(g.onednn_gemms))
    total = sum(n.target in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
                for n in g.gm.graph.nodes)
    shapes_ = collections.Counter("x".join(map(str, mkn)) for mkn in g.onednn_gemms)
    perf_log.info("gemm: %d of %d mm/addmm on oneDNN (MxKxN: %s); the others on aten (under the "
                  "size rule, a transposed first operand, or not float32)", len(g.onednn_gemms),
                  total, ", ".join(f"{k} x{v}" for k, v in shapes_.most_common()))


def _mutation_outputs(gm) -> dict:
    """{output position: input position} for outputs the caller copies into an input after the
    call (aot's inference runtime lists those inputs in gm.meta["copied_back"]; their new
    values are the graph's last outputs)."""
    mutated = gm.meta.get("copied_back") or ()
    outs = list(gm.graph.find_nodes(op="output"))[0].args[0]
    n = len(outs) if isinstance(outs, (list, tuple)) else 1
    return {n - len(mutated) + j: pos for j, pos in enumerate(mutated)}


def _complex_as_real_pairs(gm, example_inputs):
    """A graph holding complex values, re-traced with decomp/complex.py's rules: complex math
    on real (..., 2) pairs, so it becomes kernels. Outputs keep their layouts."""
    phs = list(gm.graph.find_nodes(op="placeholder"))
    outs = list(gm.graph.find_nodes(op="output"))[0].args[0]
    metas = [o.meta.get("val") if isinstance(o, torch.fx.Node) else None for o in outs]
    if not real_pairs.has_complex(gm) or len(phs) != len(example_inputs) or \
            not all(isinstance(v, torch.Tensor) for v in list(example_inputs) + metas):
        return gm
    vals = [n.meta.get("val") for n in phs] + metas + list(example_inputs)
    if any(isinstance(v, torch.Tensor) and shapes.is_symbolic(v) for v in vals):
        return gm       # dynamic shapes: re-traced on example sizes it would specialize them

    def program(*args):
        return tuple(real_pairs.keep_layout(o, m) for o, m in zip(gm.forward(*args), metas))
    try:
        with torch.no_grad():
            work = trace_aten(program, list(example_inputs), decompositions=real_pairs.table(),
                              device=gm.meta.get("device"))
    except Exception as exc:  # noqa: BLE001 - the fallback policy
        # loud (raises under EMBER_STRICT=1); the graph keeps its complex ops as aten externs
        fall_back("ember", exc, "its complex ops as aten externs (not kernels)")
        return gm
    if work.meta["constants"] or work.meta["mutated_inputs"]:
        return gm
    return real_pairs.fold_pairs(work)


def _from_graph_cache(entry, gm, key, now=False):
    """`now`: load the kernels at once (a warm start's graph, which has no aten graph `gm` to
    fall back to); else at the first call."""
    stats = dict(entry["stats"], graph=next(_ids), cached=True)
    with _lock:
        STATS.append(stats)
    for name, n in stats.get("counters", {}).items():  # what the skipped lowering counted
        counters.bump(name, n)
    globs = wrapper_globals()
    globs.update({k: graph_cache.resolve_op(v) for k, v in entry["ops"].items()})
    future = build_async(entry["source"]) if entry["source"] else None
    perf_log.info("graph %d: graph cache hit (%d kernels), fallbacks %s", stats["graph"],
                  stats["kernels"], stats["fallbacks"])
    compiled = _Compiled(entry["wrapper"], globs, future, entry["sigs"], stats, gm, key)
    if now:
        compiled.call = compiled._load()
    return compiled.entry()


class _Compiled:
    """The wrapper, made callable at the first call: that waits for the kernels' build. A
    build that fails (g++ error, no compiler) makes this graph run its aten graph eagerly."""

    def __init__(self, wsrc, globs, future, sigs, stats, gm, key=None):
        self.wsrc, self.globs, self.future, self.sigs, self.stats = wsrc, globs, future, sigs, stats
        self.gm, self.key = gm, key       # key: its graph-cache entry, if it has one
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
        exec(compile_cached(self.wsrc, f"<ember wrapper {self.stats['graph']}>"), globs)
        return globs["call"]

    def _eager(self, args):
        out = self.gm.forward(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    def entry(self):
        cplx = [] if self.gm is None else [      # (warm starts have no complex graph)
            i for i, n in enumerate(self.gm.graph.find_nodes(op="placeholder"))
            if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_complex()]
        if cplx:
            # the kernels read complex inputs as real pairs (view_as_real), which a conjugate
            # or negative view (z.conj() passed in) does not have: such an input is resolved
            run = grad_free(lambda args: self.call(_resolve_views(args, cplx)))
        else:
            run = grad_free(lambda args: self.call(args))   # self.call changes after the first
        run.ember_stats = self.stats
        run.ember_wrapper = self.wsrc
        run.ember_cache_key = self.key
        return run


def _resolve_views(args, positions):
    """`args` with the conjugate and negative views at `positions` resolved into plain tensors
    (a list), or `args` itself when there is none."""
    if not any(args[i].is_conj() or args[i].is_neg() for i in positions):
        return args
    args = list(args)
    for i in positions:
        args[i] = args[i].resolve_conj().resolve_neg()
    return args


def _report(gid, plan, source, wsrc):
    if code_log.isEnabledFor(20):
        code_log.info("graph %d C++:\n%s\ngraph %d wrapper:\n%s", gid, source, gid, wsrc)
    if source:
        debug.dump("kernels", source, summary=f"{len(plan.kernels)} C++ kernels, graph {gid}",
                   ext="cpp")
    debug.dump("wrapper", wsrc, summary=f"Python wrapper, {len(plan.steps)} steps, graph {gid}")
