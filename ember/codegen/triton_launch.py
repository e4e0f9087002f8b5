"""Stage 6/7, Triton: load generated kernels, choose launch configs, build the graph callable.

`compile_plan(plan, ...)` is the Triton twin of the C++ path of the kernel backend
(ember.backends.ember): same plan, the same wrapper generated from it (`WrapperCodegen` with
kernels called on tensors instead of `data_ptr()`s, allocations on the graph's device), Triton
kernels instead of a C++ TU. Launch configs come from heuristics (`heuristic_configs`) or, with
autotuning on (options mode="max-autotune" or "triton.autotune"), from timing 2–6 candidates once
per kernel source + argument shapes and caching the winner on disk
(`<cache>/triton/autotune/<key>.json`). The backend wraps CUDA graphs around the result in
mode="reduce-overhead" (runtime.cudagraphs).

Device selection (`selected`): CUDA graphs run here; CPU graphs only with
options["cpu_codegen"] == "triton", which needs TRITON_INTERPRET=1 (Triton's CPU interpreter).

Consumes: the schedule's Plan. Produces: callable(*inputs).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import itertools
import json
import os
import tempfile
import threading
import time

import torch

from .. import config, debug
from ..errors import EmberError, InternalError, Unsupported
from ..logging import get_logger
from ..loopir.index import SIZE_NAME, hint, is_symbolic
from .triton import LOOP_RBLOCK, MAX_PERSISTENT
from .triton_kernel import generate_kernels, module_source
from .wrapper import WrapperCodegen, grad_free

code_log = get_logger("output_code")
perf_log = get_logger("perf")
_ids = itertools.count()


# --- device selection ----------------------------------------------------------------------

class MixedDevices(EmberError):
    """Not `Unsupported` on purpose: the backend fallback policy runs such a graph eagerly
    (one warning; EMBER_STRICT=1 raises)."""


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def graph_devices(gm, example_inputs) -> set:
    devs = set()
    d = getattr(gm, "meta", {}).get("device")
    if d is not None:
        devs.add(torch.device(d).type)
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            devs.add(x.device.type)
    devs.discard("meta")
    return devs


def selected(gm, example_inputs, options) -> bool:
    """Should this graph take the Triton path? Raises on graphs no backend can run."""
    options = options or {}
    devs = graph_devices(gm, example_inputs)
    if len(devs) > 1:
        raise MixedDevices(f"graph mixes devices {sorted(devs)}; ember compiles one device per "
                           f"graph")
    want = options.get("cpu_codegen") == "triton"
    if "cuda" in devs:
        return True
    if want:
        if not interpreting():
            raise Unsupported("options={'cpu_codegen': 'triton'} runs Triton kernels on CPU "
                              "tensors, which needs Triton's interpreter: set TRITON_INTERPRET=1 "
                              "before importing triton")
        return True
    return False


# --- loading -------------------------------------------------------------------------------

def load_module(source: str):
    """Write `source` under the cache dir (Triton reads kernel source from files) and import it."""
    key = hashlib.sha256(source.encode()).hexdigest()[:24]
    d = config.cache_subdir("triton")
    path = d / f"k{key}.py"
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".py")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"ember_triton_{key}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- launch configs ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Config:
    XBLOCK: int
    RBLOCK: int = 0          # 0 for pointwise kernels
    num_warps: int = 4

    def kwargs(self) -> dict:
        kw = {"XBLOCK": self.XBLOCK, "num_warps": self.num_warps}
        if self.RBLOCK:
            kw["RBLOCK"] = self.RBLOCK
        return kw


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def heuristic_configs(ks, loop_rblock=LOOP_RBLOCK) -> list:
    """Candidate configs, best guess first (the heuristic choice is element 0). Symbolic sizes
    are judged at their trace-time hints."""
    xp = next_pow2(hint(ks.xnumel))
    if ks.kind == "pointwise":
        cands = [(min(xp, 1024), 4), (min(xp, 512), 4), (min(xp, 256), 4), (min(xp, 1024), 8),
                 (min(xp, 128), 2)]
        return list(dict.fromkeys(Config(x, 0, w) for x, w in cands))
    if ks.persistent:
        r = next_pow2(ks.rnumel)          # (persistent only when rnumel is static)
        cands = [(max(1, min(xp, 4096 // r)), 4 if r < 1024 else 8),
                 (max(1, min(xp, 1024 // r)), 4), (max(1, min(xp, 8192 // r)), 8), (1, 4)]
        return list(dict.fromkeys(Config(x, r, w) for x, w in cands))
    r = min(loop_rblock, next_pow2(hint(ks.rnumel)))
    if getattr(ks, "hint", "") == "outer":
        cands = [(min(xp, 64), min(r, 8), 4), (min(xp, 128), min(r, 4), 4),
                 (min(xp, 32), min(r, 16), 4), (min(xp, 8), min(r, 64), 4)]
        return list(dict.fromkeys(Config(max(1, x), max(1, rb), w) for x, rb, w in cands))
    cands = [(max(1, min(xp, 4096 // r)), r, 4), (1, r, 4), (max(1, min(xp, 8)), min(r, 256), 4),
             (max(1, min(xp, 2)), min(2 * r, 2048), 8)]
    return list(dict.fromkeys(Config(x, rb, w) for x, rb, w in cands))


def _autotune_path(key: str):
    return config.cache_subdir("triton", "autotune") / f"{key}.json"


class Launcher:
    """Calls one jit kernel on tensors: grid from xnumel and XBLOCK, config by heuristic or
    autotuning (timed once, cached on disk per kernel source + shapes)."""

    def __init__(self, fn, ks, configs, *, autotune=False, timer=None, writes=(), scratch=()):
        self.fn, self.ks, self.configs = fn, ks, configs
        self.writes = set(writes)
        self.scratch_specs = list(scratch)   # (name, size, stride, dtype, needed)
        self.scratch = None
        self.autotune = autotune and len(configs) > 1
        self.best = None if self.autotune else configs[0]
        self.timer = timer or _time_call
        self.lock = threading.Lock()
        self.tuned_from_cache = None

    def _sizes(self, x, args):
        """A size expression at this call's sizes (the size parameters among the args)."""
        if not is_symbolic(x):
            return x
        vals = {n: args[i] for i, n in enumerate(self.ks.args) if SIZE_NAME.fullmatch(n)}
        return int(x.xreplace({s: vals[s.name] for s in x.free_symbols}))

    def grid(self, cfg, args=()):
        return (max(1, -(-self._sizes(self.ks.xnumel, args) // cfg.XBLOCK)),)

    def launch(self, cfg, args):
        self.fn[self.grid(cfg, args)](*args, **cfg.kwargs())

    def __call__(self, *args):
        if self.scratch_specs:
            args = args + self._scratch(args)
        cfg = self.best
        if cfg is None:
            with self.lock:
                if self.best is None:
                    self.best = self._tune(args)
            cfg = self.best
        self.launch(cfg, args)

    def _scratch(self, args):
        dev = args[0].device if args else torch.device("cpu")
        if any(is_symbolic(x) for _, size, stride, _, _ in self.scratch_specs
               for x in (*size, *stride)):
            # dynamic shapes: this call's row scratch (sizes differ from call to call)
            return tuple(torch.empty_strided([self._sizes(x, args) for x in size],
                                             [self._sizes(x, args) for x in stride], dtype=dt,
                                             device=dev) if needed
                         else torch.empty(1, dtype=dt, device=dev)
                         for _, size, stride, dt, needed in self.scratch_specs)
        if self.scratch is None or self.scratch[0].device != dev:
            self.scratch = tuple(
                torch.empty_strided(size, stride, dtype=dt, device=dev) if needed
                else torch.empty(1, dtype=dt, device=dev)   # store elided: never touched
                for _, size, stride, dt, needed in self.scratch_specs)
        return self.scratch

    def key(self, args) -> str:
        h = hashlib.sha256(self.ks.source.encode())
        for a in args:
            if isinstance(a, torch.Tensor):
                h.update(f"{tuple(a.shape)}{tuple(a.stride())}{a.dtype}{a.device.type};".encode())
            else:                   # a size parameter (dynamic shapes): tuned per size
                h.update(f"{a!r};".encode())
        h.update(torch.cuda.get_device_name().encode() if args and args[0].is_cuda else b"cpu")
        return h.hexdigest()[:32]

    def _tune(self, args):
        path = _autotune_path(self.key(args))
        try:
            saved = json.loads(path.read_text())
            cfg = Config(**saved["config"])
            if cfg in self.configs:
                self.tuned_from_cache = True
                return cfg
        except (OSError, ValueError, KeyError, TypeError):
            pass
        writes = self.writes
        timings = []
        for cfg in self.configs:
            # outputs may alias inputs (in-place kernels): time on scratch copies of them
            names = list(self.ks.args) + list(self.ks.scratch)
            trial = [a.clone() if n in writes else a for n, a in zip(names, args)]
            timings.append((self.timer(lambda: self.launch(cfg, trial), args), cfg))
        best = min(timings, key=lambda t: t[0])[1]
        perf_log.info("autotune %s: %s", self.ks.name,
                      ", ".join(f"{c} {t * 1e6:.1f}us" for t, c in timings))
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump({"kernel": self.ks.name, "config": dataclasses.asdict(best),
                           "timings": [[t, dataclasses.asdict(c)] for t, c in timings]}, f)
            os.replace(tmp, path)
        except OSError:  # pragma: no cover - cache is an optimisation
            pass
        self.tuned_from_cache = False
        return best


def _time_call(fn, args) -> float:
    if args and args[0].is_cuda:  # pragma: no cover - GPU only
        import triton.testing
        return triton.testing.do_bench(fn, warmup=5, rep=20) * 1e-3
    fn()  # warm (first call builds/interprets)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- the graph callable --------------------------------------------------------------------

def options_autotune(options) -> bool:
    return bool(options.get("triton.autotune", options.get("mode") == "max-autotune"))


def compile_plan(plan, devices: set, options, stats: dict):
    """The Triton path of the kernel backend: kernels and the wrapper (kernels called on
    tensors) generated from the plan, loaded and made callable (same convention as C++)."""
    device = "cuda" if "cuda" in devices else "cpu"
    interpret = interpreting() or device == "cpu"
    outs = {o.buffer.name for o in plan.outputs if hasattr(o, "buffer")}
    kernels = plan.kernels
    dead = {s.name: {n for n in plan.writes[i] if plan.memory.last_use.get(n) == i
                     and n not in outs} for i, s in enumerate(plan.steps) if s in kernels}
    sources = generate_kernels(kernels, plan.deps, plan.buffers, dead=dead,
                               welford=bool(options.get("triton.welford", True)),
                               max_persistent=int(options.get("triton.max_persistent",
                                                              MAX_PERSISTENT)),
                               interpret=interpret)
    sigs = {s.name: s.args for s in sources}
    wrapper = WrapperCodegen(plan, sigs, pointers=False, profile=options.get("profile", False))
    wsrc = wrapper.generate()
    msrc = module_source(sources) if sources else ""
    gid = next(_ids)
    stats = dict(stats, backend="triton", device=device,
                 persistent=sum(s.persistent for s in sources),
                 looped=sum(s.kind == "reduction" and not s.persistent for s in sources),
                 elided_stores=sum(len(s.elided) for s in sources),
                 welford=sum(s.welford for s in sources))
    if code_log.isEnabledFor(20):
        code_log.info("graph %d Triton:\n%s\ngraph %d wrapper:\n%s", gid, msrc, gid, wsrc)
    if msrc:
        debug.dump("kernels", msrc, summary=f"{len(sources)} Triton kernels")
    debug.dump("wrapper", wsrc, summary=f"Triton wrapper, {len(plan.steps)} steps")
    globs = dict(wrapper.globals)
    if device == "cuda":
        globs["empty_strided"] = functools.partial(torch.empty_strided, device="cuda")
    launchers = {}
    if sources:
        mod = load_module(msrc)
        autotune = options_autotune(options)
        loop_rblock = int(options.get("triton.rblock", LOOP_RBLOCK))
        for s in sources:
            k = next(k for k in kernels if k.name == s.name)
            launchers[s.name] = Launcher(getattr(mod, s.name), s,
                                         heuristic_configs(s, loop_rblock), autotune=autotune,
                                         writes=[n.name for n in k.nodes if n.name not in k.local],
                                         scratch=[(n, plan.buffers[n].size, plan.buffers[n].stride,
                                                   plan.buffers[n].dtype, n not in s.elided)
                                                  for n in s.scratch])
    globs.update(launchers)
    exec(compile(wsrc, f"<ember triton wrapper {gid}>", "exec"), globs)
    run = grad_free(globs["call"])
    run.ember_stats = stats
    run.ember_wrapper = wsrc
    run.ember_triton_source = msrc
    run.ember_launchers = launchers
    return run


__all__ = ["selected", "compile_plan", "Launcher", "Config", "heuristic_configs",
           "interpreting", "InternalError"]
