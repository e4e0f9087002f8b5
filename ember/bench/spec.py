"""What a benchmark model is: `ModelSpec`, and the registry every suite module adds to.

suites.py (the small suites, selection, model preparation) and broad.py (the broad suite) both
register here; suites imports broad, so this module keeps that one-way.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from torch import nn


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    suite: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple]      # positional args; call under a fixed seed
    kwargs: Callable[[], dict] = dict
    quick: bool = False
    note: str = ""
    family: str = ""                 # a sub-group of the suite, for --family and geomeans


REGISTRY: dict[str, ModelSpec] = {}
