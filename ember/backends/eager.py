"""Backend "eager": run the captured FX graph as it is (measures capture alone)."""
from __future__ import annotations


def eager(gm, example_inputs):
    return gm.forward
