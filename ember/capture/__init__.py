"""Stage 1, capture: Python bytecode → torch.fx graphs + guards, run through a backend.

Consumes a user function or an nn.Module plus `CompileSettings`; produces a callable that, on
each call, checks guards and runs the compiled graph (compiling on a miss).

Entry points used by `ember.api`:
  compile_function(fn, settings) -> callable   (functools.wraps-compatible wrapper target)
  compile_module(module, settings) -> callable (installed as module._compiled_call_impl)
"""
from .entry import compile_function, compile_module, explain, reset

__all__ = ["compile_function", "compile_module", "explain", "reset"]
