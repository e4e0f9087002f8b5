"""A fast subset of PyTorch's Inductor tests through ember (issue #27), in default CI.

The whole run (three configurations, ~500 tests, the Inductor reference slow on 2 cores) is
`python -m tests.peer.inductor_runner --config dynamo|ember|inductor`; see tests/peer/README.md.
Here a few dozen programs that once gave wrong values or crashed run through both captures,
and each must land in the class the expected file records for it (a pass that turns into
anything else, or a loud refusal that turns into a crash, fails this test)."""
import pytest

from tests.peer.inductor_runner import PEER_FILE, load_expected, run_config

SUBSET = [
    "CpuTests::test_pow_int_cpu",                       # integer wraparound (was wrong values)
    "CpuTests::test_as_strided_cpu",                    # as_strided of a channels-last value
    "CpuTests::test_builtins_round_float_ndigits_pos_cpu",   # round(symfloat, n)
    "CpuTests::test_add_complex5_cpu",                  # complex buffers as externs
    "CpuTests::test_fft_real_input_real_output_cpu",
    "CpuTests::test_scalar_output_cpu",                 # Dynamo's symbolic graph, a size output
    "CpuTests::test_convolution5_cpu",
    "CpuTests::test_gather3_cpu",                       # sparse gradient: Unsupported, not a crash
    "CpuTests::test_div_by_zero_cpu",
    "CpuTests::test_add_const_float_cpu",
    "CpuTests::test_views1_cpu",
    "CpuTests::test_sum_int_cpu",
    "CpuTests::test_conv_with_as_strided_cpu",          # aten.as_strided after a channels-last conv
    "CpuTests::test_mutable_custom_op_fixed_layout_cpu",     # a custom op writing its argument
    "CpuTests::test_div_softmax_symfloat_cpu",          # a SymFloat argument (was a NameError)
    "CpuTests::test_dtype_sympy_expr_cpu",              # a backward size seen only as s1 - 1
    "CpuTests::test_input_mutation3_cpu",               # torch.ops.aten.sigmoid_ on an input
    "CpuTests::test_cat_unbacked_2d_cpu",               # y.item() of an input: a variant per value
    "CpuTests::test_embedding_bag_cpu",                 # auxiliary outputs (was a wrong value)
    "CpuTests::test_nonzero_unbacked_refinement_cpu",   # split at a data-dependent size
]


@pytest.mark.skipif(not PEER_FILE.exists(), reason="needs ../shared/peer-tests")
@pytest.mark.parametrize("config", ["dynamo", "ember"])
def test_fast_subset_matches_expected(config, tmp_path):
    expected = load_expected()
    ids = [t for t in SUBSET if t in expected and config in expected[t]]
    assert len(ids) >= len(SUBSET) - 2, "the expected file lacks most of the subset"
    got = run_config(config, ids, tmp_path / "out.jsonl")
    diff = {t: (expected[t][config], got[t]["class"], got[t].get("why", ""))
            for t in ids if got[t]["class"] != expected[t][config]}
    assert not diff, diff
    assert not [t for t in ids if got[t]["class"] in ("wrong", "crash")]
