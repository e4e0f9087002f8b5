"""Stage 1, capture: Python bytecode → torch.fx graphs + guards, run through a backend.

Consumes a user function or an nn.Module plus `CompileSettings`; produces a callable that, on
each call, checks guards and runs the compiled graph (compiling on a miss).

Entry points used by `ember.api`:
  compile_function(fn, settings) -> callable   (functools.wraps-compatible wrapper target)
  compile_module(module, settings) -> callable (installed as module._compiled_call_impl)
  explain(fn, *args, **kwargs) -> Explanation; stats() -> counters; reset()
  set_stance(name) -> previous; ERROR_ON_BREAK (ContextVar: scoped fullgraph)
Layout: bytecode.py (decode/assemble) → interpreter.py (+ handlers/, calls.py, attrs.py,
inputs.py, builtins.py, aggregates.py, iters.py, stdlib.py, dictkeys.py,
values.py, sources.py; controls.py below them) → guards.py, effects.py →
breaks.py (graph breaks, residual code) → entry.py (cache, guards, dispatch of residual calls).
"""
from .controls import ERROR_ON_BREAK
from .entry import STANCES, compile_function, compile_module, reset, set_stance, stats
from .explain import explain

__all__ = ["compile_function", "compile_module", "explain", "reset", "stats", "set_stance",
           "STANCES", "ERROR_ON_BREAK"]
