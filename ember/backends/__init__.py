"""Backend registry: names → torch.compile-protocol callables `(gm, example_inputs) -> callable`."""
from .registry import get_backend, list_backends, lookup_backend, register_backend

__all__ = ["get_backend", "list_backends", "lookup_backend", "register_backend"]
