"""Backend registry: names → backend callables `(gm, example_inputs) -> callable` (the protocol Dynamo backends use)."""
from .registry import get_backend, list_backends, lookup_backend, register_backend

__all__ = ["get_backend", "list_backends", "lookup_backend", "register_backend"]
