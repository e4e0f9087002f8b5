"""Integer arithmetic in generated C++ follows eager: wraparound in the type (C++ signed
overflow is UB; std::pow computes in double), eager's powi for negative exponents, eager's
shifts by the width or more, C semantics for fmod/trunc division, floor semantics for //."""
import pytest
import torch

from tests.unit.lower.helpers import check

INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _ints(dtype, n=64, seed=0, low=None, high=None):
    g = torch.Generator().manual_seed(seed)
    info = torch.iinfo(dtype)
    lo = info.min if low is None else low
    hi = info.max if high is None else high
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dtype", INTS)
def test_int_pow_wraps_like_eager(dtype):
    # Inductor's test_pow_int: x ** 0x57 overflowed to garbage for 8/16/32-bit types
    x, y = _ints(dtype, low=-20 if dtype.is_signed else 0, high=20), _ints(dtype, seed=1)
    check(lambda a, b: (torch.pow(a, 0x57), torch.pow(a, b)), x, y, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", (torch.int8, torch.int32, torch.int64))
def test_int_pow_negative_exponent(dtype):
    a = torch.tensor([1, -1, -1, 2, -3, 0, 5], dtype=dtype)
    b = torch.tensor([-3, -3, -4, -1, -2, 3, 0], dtype=dtype)
    check(torch.pow, a, b, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", INTS)
def test_int_add_mul_neg_abs_wrap(dtype):
    x, y = _ints(dtype), _ints(dtype, seed=1)
    check(lambda a, b: (a + b, a * b, a - b, -a, a.abs(), a * a, b * 3 + a), x, y,
          atol=0, rtol=0)


@pytest.mark.parametrize("dtype", INTS)
def test_int_shifts_past_width(dtype):
    x = _ints(dtype)
    bits = torch.iinfo(dtype).bits
    s = torch.arange(64, dtype=torch.int64).remainder(bits + 3).to(dtype)
    check(lambda a, b: (a << b, a >> b), x, s, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", (torch.int8, torch.int32, torch.int64))
def test_int_division_semantics(dtype):
    a = torch.tensor([7, -7, 7, -7, 0, 5, -128 if dtype == torch.int8 else -2 ** 30], dtype=dtype)
    b = torch.tensor([2, 2, -2, -2, 3, 7, 3], dtype=dtype)
    check(lambda a, b: (a // b, torch.div(a, b, rounding_mode="trunc"),
                        torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b),
                        torch.fmod(a, b), a % b), a, b, atol=0, rtol=0)


def test_int64_fmod_exact_for_large_values():
    # std::fmod would go through double and lose the low bits
    a = torch.tensor([2 ** 62 + 1, -(2 ** 62) - 3], dtype=torch.int64)
    b = torch.tensor([7, 7], dtype=torch.int64)
    check(torch.fmod, a, b, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", (torch.uint8, torch.int16, torch.int32, torch.int64))
def test_int_division_by_zero_raises_like_eager(dtype):
    # a zero divisor trapped (SIGFPE killed the process); eager raises "ZeroDivisionError"
    from tests.unit.lower.helpers import compile_fn
    a = torch.tensor([7, 6, 5, 4], dtype=dtype)
    b = torch.tensor([2, 0, 3, 1], dtype=dtype)
    ok = b.clamp(min=1)
    for fn in (lambda a, b: a // b, lambda a, b: torch.remainder(a, b),
               lambda a, b: torch.fmod(a, b), lambda a, b: torch.div(a, b, rounding_mode="trunc")):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(a, b)
        run, _ = compile_fn(fn, a, b)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            run(a, b)
        torch.testing.assert_close(run(a, ok)[0], fn(a, ok), atol=0, rtol=0)   # still usable
    run, _ = compile_fn(lambda a: a // 0, a)                              # a constant divisor
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run(a)


def test_int_min_by_minus_one_wraps():
    # x86 traps on MIN / -1 (eager's own kernel does too); the kernel wraps instead
    from tests.unit.lower.helpers import compile_fn
    a = torch.tensor([-2 ** 63, 9], dtype=torch.int64)
    b = torch.tensor([-1, -1], dtype=torch.int64)
    q, r = compile_fn(lambda a, b: (a // b, torch.fmod(a, b)), a, b)[0](a, b)
    assert q.tolist() == [-2 ** 63, -9] and r.tolist() == [0, 0]


INDEXING = {
    "index": (lambda x, i: x[i] * 2, (10,)),
    "embedding": (lambda w, i: torch.nn.functional.embedding(i, w) + 1, (10, 4)),
    "gather": (lambda x, i: torch.gather(x, 0, i.clamp(max=11)) - 1, (10,)),
    "index_put": (lambda x, i: torch.index_put(x, (i,), torch.ones(3)), (10,)),
    "scatter_add": (lambda x, i: x.scatter_add(0, i, torch.ones(3)), (10,)),
}


@pytest.mark.parametrize("name", INDEXING)
def test_index_out_of_bounds_raises_like_eager(name):
    # an index outside its dim read (or wrote) outside the buffer: garbage values, no error;
    # eager raises IndexError (index_put/scatter: RuntimeError). A kernel flags it and the call
    # raises IndexError; in-range and negative indices still work afterwards
    import ember
    fn, shape = INDEXING[name]
    x = torch.randn(shape)
    bad = torch.tensor([1, 12, 3])
    good = torch.tensor([1, -2, 3]) if name in ("index", "index_put") \
        else torch.tensor([1, 8, 3])
    with pytest.raises((IndexError, RuntimeError)):
        fn(x, bad)
    run = ember.compile(fn, fullgraph=True)
    torch.testing.assert_close(run(x, good), fn(x, good), atol=0, rtol=0)
    with pytest.raises((IndexError, RuntimeError), match="out of (bounds|range)"):
        run(x, bad)
    torch.testing.assert_close(run(x, good), fn(x, good), atol=0, rtol=0)
