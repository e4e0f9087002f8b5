"""lower: aten.cat of only legacy empty 1-D parts (their result is empty too)."""
import pytest
import torch

import ember


@pytest.mark.parametrize("dynamic", [False, True])
def test_cat_of_only_empty_parts(dynamic):
    """cat drops empty 1-D parts; with every part empty nothing was left to read (IndexError in
    lower, found by OpInfo's cat samples under dynamic=True; static too)."""
    ember.reset()

    def f(a, b, c):
        return torch.cat([a, b]) * 2, torch.cat([a, c]) + 1
    cf = ember.compile(f, dynamic=dynamic)
    a, b, c = torch.randn(0), torch.randn(0), torch.randn(5)
    got, want = cf(a, b, c), f(a, b, c)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)
    assert ember.stats()["counts"].get("fallbacks", 0) == 0
