"""Backend "ember", warm start: the backend's product on disk, keyed on the captured graph.

A new process compiling the same captured graph for inputs with the same metadata skips
everything after capture: the layout and BatchNorm rewrites, aot (tracing, functionalization,
partition), decompositions, lower, schedule and codegen. What aot's runtime needs (the output
plan, input mutations, lifted constants, what the backward reads) is stored here; the compiled
forward and backward are runtime/graph_cache.py's entries, named by their keys and loaded (kernels
included) before the hit is used. Anything that fails to read, verify or load is a miss: the
graph compiles as usual, with one warning for a corrupt entry.

Key (`key_of`): the captured graph's code; every node's target (qualified name), its traced
shape/stride/dtype and the node meta that aot reads (checkpoint annotations); the graph's meta;
each input's type, shape, stride, storage offset, dtype, device and requires_grad (Python scalars
by value); grad mode, default dtype, autocast and the backend flags tracing reads; the options;
the GEMM library choice (gemmlib.choice: which GEMMs the lowering and freezing's packs move to
oneDNN; its probe runs once per machine, cached on disk); torch's and Python's versions and a
hash of every ember source file.

Never cached (`why_uncached`), because something that changes the product is not in the key:
  - the captured graph of a frozen inference call (freeze.py folds the weights' *values* into
    constants): its *main graph*, which takes the folded constants as inputs, is cached under
    its own key (`frozen=True`), and freezing's plan (freeze.FreezePlan: the constant graph's
    code and the main graph's key) under the captured graph's key with `frozen="plan"`, which
    holds no weight values: a warm start folds again, then loads the main graph;
  - graphs holding tensors (get_attr) and data-dependent graphs (split.py);
  - user code in the graph: custom ops (ember's own only where they run no user callable),
    user autograd.Functions, callables passed to ops
    (flex_attention's score_mod, checkpoint bodies, user Triton kernels): their Python may change
    while the graph's code does not;
  - random ops (the RNG tests compare a compile against eager's generator), symbolic sizes,
    tensor subclasses, non-CPU devices, options that are not plain values;
  - EMBER_DEBUG_DIR set (each stage's dump is the point) or the cache switched off:
    EMBER_BACKEND_CACHE=0 or options={"backend_cache": False}.
Training graphs are stored once their backward has been compiled (the first backward).

Entries are pickles (the cache dir is private to the user and already holds the kernels' .so,
which run as native code): written atomically with the sha256 of the payload, read back only
when it verifies, unpickled with an allow-list of modules (torch, ember, builtins).

Consumes: captured fx.GraphModule, example inputs, options. Produces: keys; entries (dicts).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import pickle
import sys
import tempfile
import types
from pathlib import Path

import torch
from torch.fx.node import _get_qualified_name

from .. import config, counters, debug, shapes
from ..logging import get_logger, warn_once
from ..runtime import graph_cache
from . import freeze, gemmlib, speed, split

perf_log = get_logger("perf")
_PLAIN = (int, float, bool, str, type(None))
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter) + (
    (torch.nn.parameter.Buffer,) if hasattr(torch.nn.parameter, "Buffer") else ())
_META_READ = ("recompute", "sac_save")      # torch-level node meta that aot's partition reads


# ---- the key ------------------------------------------------------------------------------------
@functools.lru_cache(None)
def sources_hash() -> str:
    """Every ember source file, by path and text: a product of other code is never reused."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def enabled(options: dict) -> bool:
    return config.backend_cache() and options.get("backend_cache", True) is not False \
        and not debug.active()


def _plain(v) -> bool:
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return isinstance(v, _PLAIN + (torch.dtype, torch.device, torch.memory_format))


_OWN_MODULES = speed._TORCH_MODULES + ("ember",)
# ember's custom ops whose product is ember's code alone (the hook, flex_attention and while_loop
# ops call the user's callables)
_PURE_EMBER_OPS = ("ember::conv2d_add", "ember::sdpa_infer")


def _own_code(target) -> bool:
    """Whether `target` is torch's or ember's own code, which the key covers (torch's version,
    ember's sources), rather than user Python that may change between processes."""
    module = getattr(target, "__module__", None) or ""
    if module.startswith("torch._ops."):            # torch.ops.<namespace>.<op>
        ns = module.split(".")[2]
        return ns in ("aten", "prims", "mkldnn", "mkl") or \
            ns == "ember" and target._schema.name in _PURE_EMBER_OPS
    if isinstance(target, torch._ops.OperatorBase):  # higher-order ops (flex_attention, cond)
        return False
    if isinstance(target, speed._C_CALLABLES):     # C code, but whose? (a user autograd.Function's
        owner = getattr(target, "__self__", None) or getattr(target, "__objclass__", None)
        if isinstance(owner, types.ModuleType):                     # `apply` is C code too)
            module = owner.__name__
        elif owner is not None:
            module = (owner if isinstance(owner, type) else type(owner)).__module__ or ""
    return module.split(".")[0] in _OWN_MODULES


def _user_callable_arg(n) -> bool:
    from torch.utils._pytree import tree_leaves
    return any(callable(a) or isinstance(a, torch.nn.Module)
               for a in tree_leaves((n.args, n.kwargs)))


def why_uncached(gm, example_inputs, options: dict, frozen: bool = False) -> str | None:
    """None if this graph's product may be cached, else why not (for the perf log). `frozen`:
    the main graph of a frozen graph, whose folded constants are inputs like any other."""
    if not _plain(options):
        return "an option that is not a plain value"
    if split.data_dependent(gm):
        return "data-dependent graph"
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            if type(x) not in _TENSOR_TYPES:
                return f"an input of type {type(x).__name__}"
            if x.device.type != "cpu":
                return f"a {x.device.type} input"
            if shapes.is_symbolic(x) or x.is_complex():
                return "symbolic sizes or complex values"
        elif not isinstance(x, _PLAIN):
            return f"an input of type {type(x).__name__}"
    for n in gm.graph.nodes:
        if n.op in ("get_attr", "call_module"):
            return f"the graph holds {n.op} {n.target}"
        if n.op in ("call_function", "call_method"):
            if n.op == "call_function" and not _own_code(n.target):
                return f"user code in the graph ({n.target})"
            if _user_callable_arg(n):
                return f"a callable argument to {n.target}"
            if speed.is_random(n):
                return f"a random op ({getattr(n.target, '__name__', n.target)})"
    consts = freeze.module_state_inputs(gm, example_inputs)
    if not frozen and freeze.wants_freeze(gm, options, example_inputs, consts) is None:
        return "frozen inference graph (weight values are not in the key)"
    return None


def _spec(v):
    if isinstance(v, torch.Tensor) and v.layout != torch.strided:     # an MKL-packed weight
        return (type(v).__name__, tuple(v.shape), str(v.layout), str(v.dtype), str(v.device))
    if isinstance(v, torch.Tensor):
        return (type(v).__name__, tuple(v.shape), tuple(v.stride()), v.storage_offset(),
                str(v.dtype), str(v.device), bool(v.requires_grad))
    return (type(v).__name__, repr(v))


def _node_record(n):
    target = n.target if isinstance(n.target, str) else _get_qualified_name(n.target)
    val = n.meta.get("example_value", n.meta.get("val"))
    vals = val if isinstance(val, (list, tuple)) else (val,)
    for v in vals:
        if isinstance(v, torch.Tensor) and shapes.is_symbolic(v) or \
                isinstance(v, (torch.SymInt, torch.SymFloat)):
            raise _Uncached("symbolic sizes")
    return (n.op, n.name, target, [_spec(v) for v in vals if isinstance(v, torch.Tensor)],
            [(k, repr(n.meta[k])) for k in _META_READ if k in n.meta])


def _gemm_choice(options: dict) -> tuple:
    choice = gemmlib.choice(options)
    return choice.library, choice.plain


class _Uncached(Exception):
    pass


def _global_state() -> tuple:
    return (torch.is_grad_enabled(), str(torch.get_default_dtype()),
            torch.is_autocast_enabled("cpu"), str(torch.get_autocast_dtype("cpu")),
            torch.backends.mkldnn.enabled, torch.are_deterministic_algorithms_enabled(),
            torch.get_float32_matmul_precision())


def key_of(gm, example_inputs, options: dict, frozen: bool = False) -> str | None:
    """The cache key of this backend call, or None when it is not cached (logged once)."""
    if not enabled(options):
        return None
    try:
        why = why_uncached(gm, example_inputs, options, frozen)
        if why is None:
            parts = [f"frozen={frozen}", gm.code, repr([_node_record(n) for n in gm.graph.nodes]),
                     repr(sorted((k, repr(v)) for k, v in gm.meta.items())),
                     repr([_spec(x) for x in example_inputs]), repr(sorted(options.items())),
                     repr(_global_state()), repr(_gemm_choice(options)), torch.__version__,
                     sys.version, sources_hash()]
            return hashlib.sha256("\0".join(parts).encode()).hexdigest()
    except _Uncached as exc:
        why = str(exc)
    perf_log.info("backend cache: not used: %s", why)
    counters.bump("backend_cache_bypassed")
    return None


# ---- entries ------------------------------------------------------------------------------------
def _path(key: str) -> Path:
    return config.cache_subdir("backend", key[:2]) / f"{key}.pkl"


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, torch._ops.OpOverload):       # not picklable: stored by name
            return graph_cache.resolve_op, (f"{obj.name()}.{obj._overloadname}",)
        return NotImplemented


_ALLOWED = ("torch", "ember", "builtins", "collections", "_operator", "operator", "math")


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.split(".")[0] not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a cache entry")
        return super().find_class(module, name)


def store(key: str, entry: dict) -> None:
    """Write `entry` (atomically); one that would not load back (an output value of a type
    the unpickler refuses, say) is not written."""
    buf = io.BytesIO()
    try:
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(entry)
        _Unpickler(io.BytesIO(buf.getvalue())).load()
    except Exception as exc:  # noqa: BLE001 - an entry that cannot be stored is not cached
        perf_log.info("backend cache: not stored: %s", exc)
        return
    payload = buf.getvalue()
    try:
        path = _path(key)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
        os.replace(tmp, path)
    except OSError as exc:      # a read-only or full disk: the next process compiles again
        warn_once("backend-cache-store", f"backend cache not written ({exc})")
        return
    counters.bump("backend_cache_stores")


def load(key: str) -> dict | None:
    path = _path(key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, _, payload = data.partition(b"\n")
    try:
        if digest.decode() != hashlib.sha256(payload).hexdigest():
            raise ValueError("sha256 mismatch")
        entry = _Unpickler(io.BytesIO(payload)).load()
        if not isinstance(entry, dict):
            raise ValueError("not an entry")
        return entry
    except Exception as exc:  # noqa: BLE001 - a corrupt entry is a miss, never a crash
        warn_once(f"backend-cache:{key}", f"backend cache entry {path} is unreadable ({exc}); "
                  f"recompiling")
        return None


# ---- what aot's runtime needs, without its graphs ---------------------------------------------
def entry_of(runtime, plan: dict, counts: dict, backward=None) -> dict | None:
    """The entry for aot's runtime `runtime` (whose forward, and `backward` when training, are
    graph-cache entries), or None when it cannot be stored."""
    from ..aot.runtime import InferenceRuntime, TrainingRuntime
    fw_key = getattr(getattr(runtime, "fw", None), "ember_cache_key", None)
    if fw_key is None or type(runtime) not in (InferenceRuntime, TrainingRuntime):
        return None
    entry = {"plan": plan, "counts": counts, "fw": fw_key, "treespec": runtime.treespec,
             "traced": dataclasses.replace(runtime.traced, graph=None)}
    if type(runtime) is TrainingRuntime:
        bw_key = getattr(backward, "ember_cache_key", None)
        if bw_key is None:
            return None
        entry.update(bw=bw_key, saved_inputs=list(runtime.part.saved_inputs))
    return entry


def runtime_of(entry: dict, load_graph):
    """aot's runtime rebuilt from `entry`; `load_graph(key)` gives a compiled graph (or None)."""
    from ..aot.partition import Partition
    from ..aot.runtime import InferenceRuntime, TrainingRuntime
    fw = load_graph(entry["fw"])
    if fw is None:
        return None
    if "bw" not in entry:
        return InferenceRuntime(entry["traced"], fw, entry["treespec"])
    bw = load_graph(entry["bw"])
    if bw is None:
        return None
    part = Partition(fw=None, bw=None, saved_inputs=entry["saved_inputs"], saved_values=[],
                     saved_nodes=[])
    return TrainingRuntime(entry["traced"], part, fw, None, None, entry["treespec"], backward=bw)
