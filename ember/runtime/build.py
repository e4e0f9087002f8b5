"""Stage 7, runtime: build a C++ translation unit with g++ (OpenMP) and load it with ctypes.

`build_async(source)` returns a Future of the .so path; builds run in a small thread pool (g++
is a subprocess, so several graphs compile in parallel) and hit the disk cache first.
`load(path, signatures)` returns ctypes functions whose arguments are raw pointers.

Consumes: C++ source. Produces: loaded kernels.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from ..errors import InternalError
from ..loopir.index import SIZE_NAME
from . import cache

CXX = os.environ.get("CXX", "g++")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
         "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-w"]
#: glibc's vector math library (x86-64): with it, `#pragma omp simd` loops call sin, pow, atan2
#: ... in vector form (cpp_prelude's EMBER_LIBMVEC block) instead of one scalar call a lane
_MVEC = ctypes.util.find_library("mvec") if platform.machine() == "x86_64" else None
LIBS = [f"-l:{_MVEC}"] if _MVEC else []
if _MVEC:
    FLAGS.append("-DEMBER_LIBMVEC")
#: hand-written kernels (flex and sdpa attention) that want fused multiply-adds: generated
#: kernels keep -ffp-contract=off so their rounding matches eager's
FMA_FLAGS = [f for f in FLAGS if f != "-ffp-contract=off"] + ["-ffp-contract=fast"]


def _has_avx512f() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(ln.startswith("flags") and " avx512f" in ln for ln in f)
    except OSError:
        return False


#: 512-bit vectors wherever the CPU has them, whatever tuning -march=native guesses: gcc 12
#: maps a CPU it does not know by its features and may tune for 256 bits (a Sapphire Rapids
#: Xeon reads as rocketlake, -mprefer-vector-width=256), which halves every simd loop's
#: width. The kernels are planned for 16 float lanes (cpp_reduce's 4-zmm accumulators,
#: simdlen(16)), as is eager's ATen on such a CPU. 1 thread, load 14, eager/ember, 256 -> 512
#: bits: softmax [8,12,128,128] 2.1-2.3 -> 2.4-2.7x, gelu [8,512,3072] 0.80-0.92 -> 0.96-1.04x,
#: silu*x 1.8-1.9 -> 2.2-2.3x, channels-last BN+relu 1.3-1.7 -> 2.0x.
if platform.machine() == "x86_64" and _has_avx512f():
    FLAGS.append("-mprefer-vector-width=512")
_pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                           thread_name_prefix="ember-build")


@functools.lru_cache(None)
def compiler_version(compiler: str | None = None) -> str:
    compiler = compiler or CXX          # read at call time: CXX may be changed after import
    try:
        return subprocess.run([compiler, "--version"], capture_output=True,
                              text=True).stdout.split("\n")[0]
    except OSError as exc:  # pragma: no cover
        raise InternalError(f"compiler {compiler!r} not found: {exc}") from exc


def cache_key(source: str, compiler: str | None = None, flags=None) -> str:
    return cache.key_of(source, " ".join(flags or FLAGS), compiler_version(compiler),
                        torch.__version__)


def build(source: str, compiler: str | None = None, flags=None, suffix: str = "cpp") -> Path:
    """The shared object built from `source` (kernels by default; capture's state checker is C
    built with the C compiler), from the disk cache when it holds it."""
    compiler, flags = compiler or CXX, flags or FLAGS
    key = cache_key(source, compiler, flags)
    hit = cache.lookup(key)
    if hit is not None:
        return hit
    d = cache.entry_dir(key)
    tmpdir = Path(tempfile.mkdtemp(dir=d, prefix="build-"))
    try:
        src = tmpdir / f"kernel.{suffix}"
        src.write_text(source)
        so = tmpdir / "kernel.so"
        libs = LIBS if flags is FLAGS else []      # after the source: linked only when used
        proc = subprocess.run([compiler, *flags, str(src), "-o", str(so), *libs],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise InternalError(f"{compiler} failed:\n{proc.stderr[-4000:]}")
        return cache.commit(key, so, source)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def build_async(source: str, flags=None) -> Future:
    return _pool.submit(build, source, flags=flags)


def load(path: Path, signatures: dict) -> dict:
    lib = ctypes.CDLL(str(path))
    fns = {}
    for name, args in signatures.items():
        fn = getattr(lib, name)
        # buffer pointers, then int64 sizes (dynamic shapes: names s0, s1, ...)
        fn.argtypes = [ctypes.c_int64 if SIZE_NAME.fullmatch(a) else ctypes.c_void_p for a in args]
        fn.restype = None
        if hasattr(lib, f"{name}_checked"):
            raise_kernel_errors(lib, fn, name)
        fns[name] = fn
    fns["__lib__"] = lib
    return fns


ZERO_DIV, INDEX_OOB = 1, 2      # the bits of cpp_prelude's kernel_error


def raise_kernel_errors(lib, fn, name: str):
    """A kernel with integer division or gathered indices flags what eager raises instead of
    trapping or reading outside a buffer (cpp_prelude's kernel_error): `fn` raises it."""
    take = lib.ember_take_error
    take.restype = ctypes.c_int

    def check(result, func, args):
        err = take()
        if err & ZERO_DIV:
            raise RuntimeError("ZeroDivisionError")
        if err & INDEX_OOB:
            raise IndexError(f"index out of bounds: an index read or written by kernel {name} "
                             "is outside its dimension")
        return result
    fn.errcheck = check
