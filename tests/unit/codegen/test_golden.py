"""Generated C++, Triton and wrapper sources are byte-identical to the recorded ones
(tests/unit/codegen/golden.py; regenerate with `python -m tests.unit.codegen.golden --regen`
when a change is meant to alter generated code)."""
import json
import os

import pytest

from . import golden

RECORD = json.loads(golden.GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(golden._cases()))
def test_generated_sources_unchanged(name):
    if name.startswith("triton") and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py without a GPU)")
    got = golden.digests(name)
    assert got == RECORD[name], (
        f"{name}: generated sources changed; diff `python -m tests.unit.codegen.golden --dump "
        f"DIR {name}` before and after, then --regen if the change is intended")


def test_every_case_is_recorded():
    assert set(RECORD) == set(golden._cases())
    assert all(RECORD[name] for name in RECORD)
