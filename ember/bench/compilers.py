"""How ember bench compiles a model, and how it tells whether anything was really compiled.

Consumes a fresh nn.Module and a compiler name ("eager", "ember", "torch"); produces the model
to run plus a `Path` record: which front end and backend produced the numbers, how many graphs
the backend saw, and which fallback warnings fired.

While the stages are being written, `ember.compile(model)` may still run eagerly (capture
placeholder) or a backend may fall back to eager with a warning. The "ember" compiler therefore
tries, in order, the most-ember path first and keeps the first one that compiles at least one
graph without a fallback warning:

    ember.compile(backend=B)  ->  torch.compile(backend=ember.get_backend(B))
    -> (B == "ember") ember.compile(backend="aot_eager") -> torch.compile(backend=aot_eager)

The reported path says which one won; nothing is silently eager. torch.compile is allowed here
(ember/bench measures against it); product code never imports Dynamo or Inductor.
"""
from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, Callable

import torch

_EAGER_WARNING = re.compile(r"eager", re.IGNORECASE)
_BREAK_WARNING = re.compile(r"graph.?break", re.IGNORECASE)


class CompileCounter:
    """A torch.compile-protocol backend that counts the graphs it is handed, then delegates."""

    def __init__(self, inner: Callable, name: str):
        self.inner = inner
        self.graphs = 0
        self.nodes = 0
        self.__name__ = name

    def __call__(self, gm, example_inputs, **kwargs):
        self.graphs += 1
        self.nodes += sum(1 for n in gm.graph.nodes if n.op == "call_function")
        return self.inner(gm, example_inputs, **kwargs)


@dataclasses.dataclass
class Path:
    """One way of compiling: `front` is "eager", "ember.compile" or "torch.compile"."""

    front: str
    backend: str
    counter: CompileCounter | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    rejected: list[str] = dataclasses.field(default_factory=list)   # earlier paths and why
    problem: str | None = None        # set when no path worked: why this one is not trusted
    stats: dict = dataclasses.field(default_factory=dict)        # ember.stats() after the call

    @property
    def label(self) -> str:
        if self.front == "eager":
            return "eager"
        if self.front == "torch.compile" and self.backend == "inductor":
            return "torch.compile(inductor)"
        return f"{self.front}(backend={self.backend!r})"

    @property
    def graphs(self) -> int:
        return self.counter.graphs if self.counter else 0

    @property
    def fallbacks(self) -> list[str]:
        return [w for w in self.warnings if is_fallback_warning(w)]

    @property
    def counted_fallbacks(self) -> int:
        """Fallbacks ember's own counters saw (only meaningful for ember's backends)."""
        if self.backend == "inductor" and self.front == "torch.compile":
            return 0
        return int(self.stats.get("counts", {}).get("fallbacks", 0) or 0)

    @property
    def compiled(self) -> bool:
        return self.front == "eager" or (self.graphs > 0 and not self.fallbacks
                                         and not self.counted_fallbacks)

    def refresh_stats(self) -> None:
        if self.front != "eager":
            import ember
            self.stats = ember.stats()

    def record(self) -> dict:
        return {"path": self.label, "front": self.front, "backend": self.backend,
                "graphs": self.graphs, "graph_breaks": max(self.graphs - 1, 0),
                "graph_nodes": self.counter.nodes if self.counter else 0,
                "compiled": self.compiled, "problem": self.problem,
                "counted_fallbacks": self.counted_fallbacks,
                "fallback_warnings": self.fallbacks[:5],
                "rejected_paths": self.rejected}


def is_fallback_warning(message: str) -> bool:
    """An ember warning saying some code ran eagerly instead of compiled (not a graph break)."""
    return (message.startswith("ember:") and bool(_EAGER_WARNING.search(message))
            and not _BREAK_WARNING.search(message))


def register_inductor() -> None:
    """Make `ember.compile(m, backend="inductor")` work in benchmarks: our capture, their backend."""
    import ember
    if "inductor" in ember.list_backends():
        return

    def inductor(gm, example_inputs, **_):
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs)

    ember.register_backend("inductor", inductor)


def reset_all() -> None:
    import ember
    ember.reset()
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - reset is best effort between attempts
        pass


def make(front: str, backend: str, model: torch.nn.Module) -> tuple[Any, Path]:
    """Compile `model` (a fresh copy, compiled in place or wrapped) one way; nothing runs yet."""
    import ember
    path = Path(front, backend)
    if front == "eager":
        return model, path
    if backend == "inductor":
        register_inductor()
    if front == "torch.compile" and backend == "inductor":
        inner = _torch_inductor_backend()
    else:
        inner = ember.get_backend(backend)
    path.counter = CompileCounter(inner, backend)
    if front == "ember.compile":
        return ember.compile(model, backend=path.counter), path
    if front == "torch.compile":
        return torch.compile(model, backend=path.counter), path
    raise ValueError(f"unknown front end {front!r}")


def _torch_inductor_backend():
    from torch._inductor.compile_fx import compile_fx
    return compile_fx


def candidates(compiler: str, backend: str = "ember", front: str = "auto") -> list[tuple[str, str]]:
    """The (front, backend) paths to try, best first, for a --compilers entry."""
    if compiler == "eager":
        return [("eager", "eager")]
    if compiler == "torch":
        return [("torch.compile", "inductor")]
    if compiler != "ember":
        raise ValueError(f"unknown compiler {compiler!r}; valid: eager, ember, torch")
    backends = [backend] + (["aot_eager"] if backend == "ember" else [])
    fronts = {"auto": ["ember.compile", "torch.compile"], "ember": ["ember.compile"],
              "torch": ["torch.compile"]}[front]
    return [(f, b) for b in backends for f in fronts]


def call_recording(path: Path, fn: Callable, *args, **kwargs):
    """fn(*args) with every warning recorded onto `path` (and not printed)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(*args, **kwargs)
        finally:
            path.warnings.extend(str(w.message) for w in caught
                                 if str(w.message) not in path.warnings)


def describe_exception(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def first_working(compiler: str, build: Callable[[], torch.nn.Module],
                  first_call: Callable[[Any], Any], check: Callable[[Any], str | None] | None = None,
                  backend: str = "ember", front: str = "auto"):
    """Try each candidate path: build a fresh model, compile, run `first_call` on it.

    Returns (compiled, path, first_result, seconds) for the first path that compiled a graph
    without a fallback warning and whose result passes `check` (None = fine). When none does, the
    last attempt that ran at all is returned with `path.compiled` False, so callers can still
    report (honestly) what ran; when every attempt raised, the last exception is raised.
    """
    import time
    tried: list[str] = []
    ran = None
    last_exc: BaseException | None = None
    for f, b in candidates(compiler, backend, front):
        if tried:   # a failed attempt may leave caches and warn-once memory behind
            reset_all()
        model = build()
        try:
            compiled, path = make(f, b, model)
            t0 = time.perf_counter()
            out = call_recording(path, first_call, compiled)
            seconds = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - each failure is recorded and the next path tried
            tried.append(f"{Path(f, b).label}: {describe_exception(exc)}")
            last_exc = exc
            continue
        path.refresh_stats()
        problem = None
        if not path.compiled:
            problem = (f"fell back to eager ({path.fallbacks[0][:160]})" if path.fallbacks
                       else f"{path.counted_fallbacks} fallback(s) in ember.stats()"
                       if path.counted_fallbacks else "compiled no graph")
        elif check is not None:
            problem = check(out)
        path.rejected = list(tried)
        if problem is None:
            return compiled, path, out, seconds
        tried.append(f"{path.label}: {problem}")
        path.problem = problem
        if ran is None:
            ran = (compiled, path, out, seconds)
    if ran is not None:
        ran[1].rejected = tried
        return ran
    assert last_exc is not None
    last_exc.ember_bench_tried = tried
    raise last_exc
