"""Stage 1, capture: Python bytecode → torch.fx graphs + guards, run through a backend.

Consumes a user function or an nn.Module plus `CompileSettings`; produces a callable that, on
each call, checks guards and runs the compiled graph (compiling on a miss).

Entry points used by `ember.api`:
  compile_function(fn, settings) -> callable   (functools.wraps-compatible wrapper target)
  compile_module(module, settings) -> callable (installed as module._compiled_call_impl)
  explain(fn, *args, **kwargs) -> Explanation; stats() -> counters; reset()
  set_stance(name) -> previous; ERROR_ON_BREAK (ContextVar: scoped fullgraph)
Layout: bytecode.py (decode/assemble) → interpreter.py (+ handlers/, calls.py, attrs.py,
builtins.py, values.py, sources.py) → guards.py, effects.py → entry.py.
"""
from .entry import (ERROR_ON_BREAK, STANCES, compile_function, compile_module, reset, set_stance,
                    stats)
from .explain import explain

__all__ = ["compile_function", "compile_module", "explain", "reset", "stats", "set_stance",
           "STANCES", "ERROR_ON_BREAK"]
