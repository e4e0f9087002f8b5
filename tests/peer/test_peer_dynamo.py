"""PyTorch's own Dynamo tests under ember (tests/peer/dynamo_runner.py): no test that passes in
expected_dynamo.json may stop passing. The default run checks a fixed slice of them (every
SLICE-th passing test, about a minute); the `slow` run checks them all and the reference too."""
from __future__ import annotations

import pytest

from . import dynamo_runner as runner

SLICE = 10

pytestmark = pytest.mark.skipif(not runner.PEER_DIR.is_dir(),
                                reason=f"no peer tests at {runner.PEER_DIR}")


def _check(ids) -> None:
    expected = runner.load_expected()
    rows = runner.run(runner.FILES, ["ember"], ids=ids)
    reference = {t: {"outcome": "passed", "dynamo_graphs": 1} for t in ids}
    summary = runner.summarize(reference, rows["ember"])
    regressions, _ = runner.diff(summary, {t: expected[t] for t in ids})
    assert not regressions, "no longer passing under ember:\n" + runner.details(
        {t: summary[t] for t in regressions}, rows["ember"], runner.CLASSES[1:])


def _passing() -> list:
    return sorted(t for t, r in runner.load_expected().items() if r.get("class") == "pass")


def test_expected_file_is_consistent():
    expected = runner.load_expected()
    assert expected, "expected_dynamo.json is missing: python -m tests.peer.dynamo_runner --update"
    for tid, row in expected.items():
        assert tid.split("::")[0] in runner.FILES, tid
        assert ("class" in row) == (row["ref"] == "passed"), (tid, row)
        assert row.get("class", "pass") in runner.CLASSES, (tid, row)


def test_passing_slice_still_passes():
    _check(_passing()[::SLICE])


@pytest.mark.slow
def test_all_passing_still_pass():
    _check(_passing())
