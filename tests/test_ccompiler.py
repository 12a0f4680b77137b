"""The C compiler's capabilities (runtime/ccompiler.py) and float16 stored as 16 bits (renderer/cstyle.py).

* The probe: what it finds agrees with an independent compile, it is cached in memory and on disk by the compiler's
  identity, a compiler without `_Float16` (a wrapper that rejects the type, as clang 14 does on x86-64) still runs
  float16 kernels, and a compiler that cannot build anything gets a clear error naming it and its version.
* The 16-bit storage of float16 converts exactly: every bit pattern round-trips, and float32, float64 and integer
  values round to the bits numpy gives (ties, subnormals, overflow, infinities, NaNs), with the same bits as the
  native `_Float16` path where the compiler has it.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from glassgrad import Device, Tensor, dtypes, kernels, nn
from glassgrad.engine import realize
from glassgrad.renderer.cstyle import SVML_WRAPPERS, ClangRenderer
from glassgrad.runtime import ccompiler
from glassgrad.runtime.ccompiler import CCompilerError, compiler_info, find_c_compiler

REPO = pathlib.Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def cpu_rendered_by(renderer: ClangRenderer) -> Iterator[None]:
    """Kernels for the CPU rendered by `renderer` (compiled by the CPU device's compiler) inside the block."""
    device = Device["CPU"]
    saved_renderer, saved_kernels = device.renderer, dict(realize._kernel_cache)
    device.renderer = renderer
    realize._kernel_cache.clear()
    try:
        yield
    finally:
        device.renderer = saved_renderer
        realize._kernel_cache.clear()
        realize._kernel_cache.update(saved_kernels)


def storage() -> ClangRenderer:
    return ClangRenderer(native_half=False, omp_simd=Device["CPU"].compiler.info.omp_simd)


def native() -> ClangRenderer:
    """The `_Float16` renderer; skips (with the reason) where this machine's compiler has no such type."""
    info = Device["CPU"].compiler.info
    if not info.native_half:
        pytest.skip(f"{info.describe()} has no _Float16: nothing to compare the 16-bit storage with")
    return ClangRenderer(native_half=True, omp_simd=info.omp_simd)


def convert(values: np.ndarray, to: str, renderer: ClangRenderer) -> np.ndarray:
    """`values` cast to the dtype `to` by a CPU kernel rendered by `renderer` (float16 results as their bits)."""
    with cpu_rendered_by(renderer):
        out = Tensor(values).cast(to)
        if to == "float16":
            out = out.bitcast(dtypes.uint16)
        return out.numpy()


def half_bits_from(bits: np.ndarray, to: str, renderer: ClangRenderer) -> np.ndarray:
    """float16 values given as their bits, cast to `to` by a kernel of `renderer`."""
    with cpu_rendered_by(renderer):
        return Tensor(bits).bitcast(dtypes.float16).cast(to).numpy()


def assert_half_bits_equal(got: np.ndarray, expected: np.ndarray) -> None:
    """float16 bits: equal, except that a NaN may be any NaN of the same sign (numpy keeps signalling NaNs as
    they are; the native conversions make them quiet)."""
    got_h, want_h = got.view(np.float16), expected.view(np.float16)
    nan = np.isnan(want_h)
    np.testing.assert_array_equal(np.isnan(got_h), nan)
    np.testing.assert_array_equal(np.signbit(got_h[nan]), np.signbit(want_h[nan]))
    mismatch = np.flatnonzero((got != expected) & ~nan)
    assert mismatch.size == 0, f"{mismatch.size} values differ; first: " + ", ".join(
        f"bits {expected[i]:#06x} expected, {got[i]:#06x} got" for i in mismatch[:5])


def float32_spread() -> np.ndarray:
    """float32 values that exercise every branch of a float -> half conversion: every half value, the midpoints
    between neighbours (ties) and the float32 values just beside them, half's subnormals and the values around
    2^-25 and 65520, infinities, NaNs, random bit patterns."""
    with np.errstate(invalid="ignore"):
        halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = np.unique(halves[np.isfinite(halves)].astype(np.float32))
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)  # exact in float32
    up, down = np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504.0, 65519.996, 65520.0, 65536.0, 1e30,
                        2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26, 1e-45, 2.0 ** -14, 2.0 ** -15],
                       dtype=np.float32)
    rng = np.random.default_rng(16)
    random_bits = rng.integers(0, 1 << 32, 50_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    signalling = np.array([0x7f800001, 0xff800123, 0x7fa00000], dtype=np.uint32).view(np.float32)
    return np.concatenate([finite, mids, up, down, -mids, special, random_bits, signalling])


def numpy_half_bits(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(np.float16).view(np.uint16)


# ---------------------------------------------------------------------------------------------- 16-bit storage

def test_every_float16_bit_pattern_round_trips() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    as_float = half_bits_from(bits, "float32", storage())
    with np.errstate(invalid="ignore"):
        expected = bits.view(np.float16).astype(np.float32)
    finite_or_inf = ~np.isnan(expected)
    np.testing.assert_array_equal(as_float.view(np.uint32)[finite_or_inf], expected.view(np.uint32)[finite_or_inf])
    np.testing.assert_array_equal(np.isnan(as_float), ~finite_or_inf)
    np.testing.assert_array_equal(np.signbit(as_float), np.signbit(expected))
    back = convert(as_float, "float16", storage())
    assert_half_bits_equal(back, bits)
    assert (back[finite_or_inf] == bits[finite_or_inf]).all()


def test_float32_to_float16_rounds_like_numpy() -> None:
    values = float32_spread()
    assert_half_bits_equal(convert(values, "float16", storage()), numpy_half_bits(values))


def test_float64_to_float16_rounds_once() -> None:
    """From float64 the value is rounded once: 1 + 2^-11 + 2^-40 is past the tie between 1 and 1 + 2^-10, so it
    rounds up (through float32 it would become the tie itself and round down to even)."""
    with np.errstate(invalid="ignore"):  # (signalling NaNs)
        base = float32_spread().astype(np.float64)
    base = base[np.isfinite(base)]
    nudged = np.concatenate([base * (1 + 2.0 ** -40), base * (1 - 2.0 ** -40)])
    values = np.concatenate([base, nudged, [1 + 2.0 ** -11 + 2.0 ** -40, 65519.99999999, 2.0 ** -25 * (1 + 2.0 ** -50),
                                            1e300, -1e-300, np.nan, -np.inf]])
    got = convert(values, "float16", storage())
    assert_half_bits_equal(got, numpy_half_bits(values))
    assert got[-7] == np.float16(1 + 2.0 ** -10).view(np.uint16)


@pytest.mark.parametrize("np_dtype", [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.bool_])
def test_integers_to_float16_round_like_numpy(np_dtype: type) -> None:
    info = np.iinfo(np_dtype) if np_dtype is not np.bool_ else None
    candidates = [0, 1, 2049, 2051, 4099, 65504, 65519, 65520, 70000, 2 ** 31 - 1, 2 ** 40, 2 ** 63 - 1,
                  -1, -2049, -65520, -(2 ** 31), -(2 ** 63)]
    if info is None:
        values = np.array([True, False])
    else:
        values = np.array([c for c in candidates if info.min <= c <= info.max], dtype=np_dtype)
    assert_half_bits_equal(convert(values, "float16", storage()), numpy_half_bits(values))


@pytest.mark.parametrize("to", ["float64", "int32", "int8", "bool", "bfloat16"])
def test_float16_to_other_types_matches_numpy(to: str) -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    with np.errstate(invalid="ignore"):
        halves = bits.view(np.float16)
    keep = np.isfinite(halves)
    if to in ("int32", "int8"):  # C leaves out-of-range conversions undefined: only values the type can hold
        limit = np.iinfo(to).max
        keep &= np.abs(halves.astype(np.float64)) < limit
    got = half_bits_from(bits[keep], to, storage())
    if to == "bfloat16":
        expected = Tensor(halves[keep].astype(np.float32)).cast("bfloat16").numpy()
    else:
        expected = halves[keep].astype(to)
    np.testing.assert_array_equal(got, expected)


def test_storage_gives_the_native_bits() -> None:
    """Where the compiler has `_Float16`, both paths give the same bits, NaNs included."""
    native_renderer = native()
    bits = np.arange(1 << 16, dtype=np.uint16)
    to_float = {r: half_bits_from(bits, "float32", r) for r in (storage(), native_renderer)}
    assert np.array_equal(*[v.view(np.uint32) for v in to_float.values()])
    with np.errstate(invalid="ignore"):  # (signalling NaNs)
        wide = float32_spread().astype(np.float64) * (1 + 2.0 ** -40)
    for values in (float32_spread(), wide,
                   np.array([3, -70000, 2 ** 40 + 1], dtype=np.int64)):
        got = [convert(values, "float16", r) for r in (storage(), native_renderer)]
        np.testing.assert_array_equal(got[0], got[1])


def test_float16_kernels_give_the_same_numbers_either_way() -> None:
    native_renderer = native()
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal((33, 40)).astype(np.float16) for _ in range(3))
    programs = {
        "a*b+c": lambda x, y, z: x * y + z,
        "exp": lambda x, y, z: (x * 2).exp(),
        "sum": lambda x, y, z: (x + y).sum(axis=1),
        "matmul": lambda x, y, z: x @ z.T,
        "max, where": lambda x, y, z: (x < y).where(x.maximum(z), -y),
        "to bfloat16": lambda x, y, z: (x + y).cast("bfloat16").cast("float32"),
    }
    for name, fn in programs.items():
        results = []
        for renderer in (storage(), native_renderer):
            with cpu_rendered_by(renderer):
                results.append(fn(Tensor(a), Tensor(b), Tensor(c)).numpy())
        np.testing.assert_array_equal(results[0].view(np.uint16 if results[0].dtype == np.float16 else np.uint32),
                                      results[1].view(np.uint16 if results[1].dtype == np.float16 else np.uint32),
                                      err_msg=name)


def test_the_renderer_writes_the_half_type_it_was_given() -> None:
    x = Tensor.ones(16, 16, dtype=dtypes.half) * 3.3
    with cpu_rendered_by(storage()):
        (spec,) = kernels(x)
    assert "_Float16" not in spec.source and "unsigned short* restrict data0" in spec.source
    assert f"0x{int(np.float16(3.3).view(np.uint16)):04x}" in spec.source  # 3.3 as float16 bits (3.30078125)
    with cpu_rendered_by(ClangRenderer(native_half=True)):
        (spec,) = kernels(x)
    assert "_Float16* restrict data0" in spec.source and "gg_f16" not in spec.source


def test_no_omp_simd_pragmas_for_a_compiler_without_them() -> None:
    x = Tensor.rand(64, 64)
    with cpu_rendered_by(ClangRenderer(omp_simd=False)):
        source = "\n".join(k.source for k in kernels(x.sum(axis=1), x * 2))
    assert "omp simd" not in source
    with cpu_rendered_by(ClangRenderer(omp_simd=True)):
        source = "\n".join(k.source for k in kernels(x.sum(axis=1), x * 2))
    assert "#pragma omp simd" in source


# ---------------------------------------------------------------------------------------------- the probe

def write_script(path: pathlib.Path, text: str) -> str:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def compiler_without_half(tmp_path: pathlib.Path) -> str:
    """A C compiler that rejects `_Float16`, as clang 14 does on x86-64: this machine's compiler behind a script."""
    real = Device["CPU"].compiler.info.path
    return write_script(tmp_path / "nohalf-cc", f"""
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "nohalf-cc 1.0 (wrapping {real})"; exit 0; fi
        src=$(cat)
        case "$src" in
          *_Float16*) echo "<stdin>:1:1: error: _Float16 is not supported on this target" >&2; exit 1;;
        esac
        printf '%s\\n' "$src" | exec {real} "$@"
        """)


def independently_has_float16(path: str) -> bool:
    proc = subprocess.run([path, "-x", "c", "-c", "-o", os.devnull, "-"], input=b"_Float16 h(float x) { return x; }",
                          capture_output=True)
    return proc.returncode == 0


@pytest.mark.parametrize("command", ["gcc", "clang"])
def test_the_probe_finds_what_the_compiler_has(command: str) -> None:
    if shutil.which(command) is None:
        pytest.skip(f"{command} is not installed here")
    info = compiler_info(command)
    assert info.problem == "" and info.version and command in (info.version + info.path)
    assert info.native_half == independently_has_float16(info.path)
    assert info.omp_simd == ("-fopenmp-simd" in info.flags)


def test_a_compiler_without_float16_stores_half_as_bits(tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEDIR", str(tmp_path / "cache"))
    info = compiler_info(compiler_without_half(tmp_path))
    assert info.problem == "" and not info.native_half and info.version.startswith("nohalf-cc 1.0")
    # the whole path, in a fresh process that picks that compiler with CC (no _Float16 anywhere in its kernels)
    code = textwrap.dedent("""
        import numpy as np
        from glassgrad import Device, Tensor, dtypes
        assert not Device["CPU"].compiler.info.native_half
        x = Tensor.ones(64, 64, dtype=dtypes.half)
        print(float(x.numpy().sum()), (x * 3.3).numpy()[0, 0] == np.float16(3.3), float(x.sum().numpy()))
    """)
    env = {**os.environ, "CC": info.path, "CACHEDIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["4096.0", "True", "4096.0"]


def test_a_compiler_that_builds_nothing_is_named_in_the_error(tmp_path: pathlib.Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    broken = write_script(tmp_path / "brokencc", """
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "brokencc 0.1"; exit 0; fi
        cat > /dev/null
        echo "fatal error: math.h: No such file or directory" >&2
        exit 1
        """)
    monkeypatch.setenv("CACHEDIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", broken)
    with pytest.raises(CCompilerError) as error:
        find_c_compiler()
    message = str(error.value)
    assert "brokencc 0.1" in message and broken in message and "math.h: No such file" in message
    assert "cannot build CPU kernels" in message
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(CCompilerError, match="no-such-cc.*not found"):
        find_c_compiler()


def test_without_cc_an_unusable_compiler_is_passed_over(tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """CC unset: the candidates are tried in order and the first that builds a kernel is used (here a broken
    'first choice', then this machine's compiler under another name); none usable: an error listing each."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_script(bin_dir / "gg-first-cc", """
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "first-cc 0.0 (broken)"; exit 0; fi
        cat > /dev/null
        exit 1
        """)
    (bin_dir / "gg-second-cc").symlink_to(Device["CPU"].compiler.info.path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CACHEDIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(ccompiler, "CANDIDATES", ("gg-first-cc", "gg-missing-cc", "gg-second-cc"))
    info = find_c_compiler()
    assert info.command == "gg-second-cc" and info.problem == ""
    (bin_dir / "gg-second-cc").unlink()
    with pytest.raises(CCompilerError, match=r"no usable C compiler(.|\n)*first-cc 0.0 \(broken\)"):
        find_c_compiler()
    monkeypatch.setattr(ccompiler, "CANDIDATES", ("gg-missing-cc",))
    with pytest.raises(CCompilerError, match="no C compiler found"):
        find_c_compiler()


def test_the_probe_is_cached_by_the_compiler_identity(tmp_path: pathlib.Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEDIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ccompiler, "_MEMORY", {})
    probes: list[str] = []
    real_probe = ccompiler.probe

    def counting_probe(command: str, path: str) -> ccompiler.CCompilerInfo:
        probes.append(command)
        return real_probe(command, path)
    monkeypatch.setattr(ccompiler, "probe", counting_probe)
    cc = compiler_without_half(tmp_path)
    first = compiler_info(cc)
    assert compiler_info(cc) is first and len(probes) == 1  # in memory
    assert len(list((tmp_path / "cache" / "ccompiler").glob("*.json"))) == 1
    monkeypatch.setattr(ccompiler, "_MEMORY", {})
    assert compiler_info(cc) == first and len(probes) == 1  # from disk: no compiler run
    stamp = os.stat(cc).st_mtime_ns
    os.utime(cc, ns=(stamp + 10**9, stamp + 10**9))  # "a new version of the compiler": probed again
    assert compiler_info(cc) == first and len(probes) == 2


# ---------------------------------------------------------------------------------------------- fused multiply-adds

def compiler_defines(macro: str) -> bool:
    """Whether the CPU device's compiler, with its kernel flags, predefines `macro` (what the kernels' #if sees)."""
    info = Device["CPU"].compiler.info
    flags = [f for f in info.flags if f != "-shared"]
    proc = subprocess.run([info.path, *flags, "-dM", "-E", "-x", "c", "-"], input=b"", capture_output=True)
    return f"#define {macro} " in proc.stdout.decode()


def test_sums_of_products_accumulate_with_one_rounding() -> None:
    """A matmul's `acc + a * b` is one fused multiply-add where the target has the instruction (BLAS's rounding),
    while elementwise `a * b + c` keeps its two roundings (numpy's, bit for bit). Each output here is
    -(1 + 2^-11) + (1 + 2^-12)^2: exactly 2^-24, which the unfused product (rounded to 1 + 2^-11 first) loses."""
    a = np.tile(np.array([[-(1 + 2**-11), 1 + 2**-12]], dtype=np.float32), (4, 1))
    b = np.tile(np.array([[1.0], [1 + 2**-12]], dtype=np.float32), (1, 16))
    product = Tensor(a) @ Tensor(b)
    assert "GG_FMAF(" in kernels(product)[-1].source
    fused = any(compiler_defines(m) for m in ("__FMA__", "__ARM_FEATURE_FMA", "__FP_FAST_FMAF"))
    np.testing.assert_array_equal(product.numpy(), np.full((4, 16), 2.0**-24 if fused else 0.0, np.float32))
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(4096, dtype=np.float32) for _ in range(3))
    elementwise = Tensor(x) * Tensor(y) + Tensor(z)
    assert "GG_FMA" not in kernels(elementwise)[-1].source
    np.testing.assert_array_equal(elementwise.numpy(), x * y + z)


def test_only_a_product_used_once_is_fused() -> None:
    """`acc + p` where the product `p` is also stored elsewhere stays unfused (it is computed once, as a variable);
    float64 sums use `fma`; integer sums of products never fuse."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 32)), rng.standard_normal((32, 16))
    assert "GG_FMA(" in kernels(Tensor(x) @ Tensor(w))[-1].source  # float64
    np.testing.assert_allclose((Tensor(x) @ Tensor(w)).numpy(), x @ w, rtol=1e-12)
    xi, wi = rng.integers(-5, 5, (8, 32)).astype(np.int32), rng.integers(-5, 5, (32, 16)).astype(np.int32)
    source = kernels(Tensor(xi) @ Tensor(wi))[-1].source
    assert "GG_FMA" not in source
    np.testing.assert_array_equal((Tensor(xi) @ Tensor(wi)).numpy(), xi @ wi)


# ---------------------------------------------------------------------------------------------- the SIMD width

@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"), reason="x86 -m flags")
@pytest.mark.parametrize("flag, width", [("-march=x86-64", 16), ("-mavx2", 32), ("-mavx512f", 64)])
def test_the_probe_reads_the_simd_width_from_the_flags(flag: str, width: int) -> None:
    info = Device["CPU"].compiler.info
    base = tuple(f for f in info.flags if f != "-march=native")
    assert ccompiler._vector_bytes(ccompiler._predefined_macros(info.path, (*base, flag))) == width


def test_the_renderer_gets_the_probed_width() -> None:
    info = Device["CPU"].compiler.info
    assert info.vector_bytes in (16, 32, 64)
    assert Device["CPU"].renderer.vector_bytes == info.vector_bytes
    expected = 64 if compiler_defines("__AVX512F__") else 32 if compiler_defines("__AVX__") else 16
    assert info.vector_bytes == expected


# ---------------------------------------------------------------------------------------------- abs and selects

def test_abs_renders_as_the_absolute_value_function() -> None:
    """`x.abs()` is `max(x, -x)` in the graph, written as fabs: NaN stays NaN and abs(+0.0) is +0.0 (the select
    gave -0.0 for it); CUDA and Metal render it the same way."""
    values = np.array([0.0, -0.0, np.nan, -3.5, 2.0, -np.inf, np.inf], np.float32)
    t = Tensor(values).abs()
    assert "fabsf(" in kernels(t)[-1].source
    out = t.numpy()
    np.testing.assert_array_equal(out, np.abs(values))
    assert not np.signbit(out[:2]).any()
    assert "fabsf(" in kernels(Tensor.empty(8).abs(), device="CUDA")[-1].source
    assert "fabs(" in kernels(Tensor.empty(8).abs(), device="METAL")[-1].source
    doubles = np.array([-0.0, 1e300, -1e-300], np.float64)
    np.testing.assert_array_equal(Tensor(doubles).abs().numpy(), np.abs(doubles))


def test_gelus_loop_is_vectorised_by_gcc(tmp_path: pathlib.Path) -> None:
    """GELU's tanh selects between a series (small |x|) and exp2: gcc keeps such a loop scalar when a select's arms
    hold arithmetic that might trap (-ftrapping-math) or when |x| is written as a select, which left GELU 3x slower
    than PyTorch's. With -fno-trapping-math and fabs, its loop calls glibc's SIMD exp2 (`_ZGV..._exp2f`)."""
    info = Device["CPU"].compiler.info
    if "gcc" not in (info.command + info.version).lower() or not info.vector_math:
        pytest.skip("the check reads gcc's assembly with glibc's libmvec")
    source = kernels(Tensor.empty(64, 1023).gelu())[-1].source
    asm = tmp_path / "gelu.s"
    flags = [f for f in info.flags if f != "-shared"]
    subprocess.run([info.path, *flags, "-S", "-x", "c", "-", "-o", str(asm)], input=source.encode(), check=True)
    assert "_ZGV" in asm.read_text() and "exp2f" in asm.read_text()
    x = np.linspace(-6, 6, 2048, dtype=np.float32).reshape(2, 1024)
    expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)))
    np.testing.assert_allclose(Tensor(x).gelu().numpy(), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- what the compiler makes

def assembly(source: str, tmp_path: pathlib.Path, extra: tuple[str, ...] = ()) -> str:
    """The CPU device's compiler's assembly for a kernel's source, with the kernels' own flags."""
    info = Device["CPU"].compiler.info
    asm = tmp_path / "kernel.s"
    flags = [f for f in info.flags if f != "-shared"]
    subprocess.run([info.path, *flags, *extra, "-S", "-x", "c", "-", "-o", str(asm)], input=source.encode(),
                   check=True, capture_output=True)
    return asm.read_text()


def test_optional_flags_are_taken_in_whole_groups() -> None:
    """`-mllvm` and its argument are one group: a compiler gets both (clang) or neither (gcc rejects `-mllvm`)."""
    info = Device["CPU"].compiler.info
    flags = list(info.flags)
    for group in ccompiler.OPTIONAL_FLAGS:
        whole = any(tuple(flags[i:i + len(group)]) == group for i in range(len(flags)))
        assert whole or not any(f in flags for f in group if f != "-mllvm"), (group, flags)
    accepts_mllvm = subprocess.run([info.path, "-mllvm", "-unroll-full-max-count=7", "-fsyntax-only", "-x", "c", "-"],
                                   input=b"int x;", capture_output=True).returncode == 0
    assert ("-mllvm" in flags) == accepts_mllvm


@pytest.mark.parametrize("channels", [32, 24], ids=["16 lanes", "8 lanes"])
def test_a_register_tiles_lanes_become_vector_fmas(channels: int, tmp_path: pathlib.Path) -> None:
    """A convolution's register tile (a `#pragma omp simd` loop of 16 lanes inside unrolled loops): clang 14 fully
    unrolled the lanes loop before its loop vectoriser ran and left 256 scalar FMAs (`vfmadd231ss`, the accumulators
    spilled: MNIST's convolutions 5-30x slower than gcc's); with LLVM's full unroll capped at 7 iterations
    (`-mllvm -unroll-full-max-count=7`) the lanes are vector FMAs, as gcc makes them. 24 output channels make a tile
    of 8 lanes (16 + 8), which a cap of 8 still unrolled (176 scalar FMAs)."""
    if not compiler_defines("__FMA__"):
        pytest.skip("reads x86 FMA instructions")
    out = Tensor.rand(2, 8, 10, 10).conv2d(Tensor.rand(channels, 8, 3, 3))
    source = kernels(out)[-1].source
    assert "#pragma omp simd" in source and "GG_FMAF(" in source
    asm = assembly(source, tmp_path)
    assert re.search(r"vfmadd\d+ps", asm) and not re.search(r"vfmadd\d+ss", asm)


def calls_vector_exp2f(asm: str) -> bool:
    """Whether compiled code calls a SIMD exp2f: glibc's (`_ZGV..._exp2f`, gcc) or SVML's name for it, which the
    kernel defines as glibc's (clang; the definitions themselves jump to glibc's, they do not call it)."""
    return re.search(r"call\w*\s+(_ZGV\w+_exp2f|__svml_exp2f\d+)", asm) is not None


def softmax_reference(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def gelu_reference(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("make, reference", [(lambda x: x.softmax(-1), softmax_reference),
                                             (lambda x: x.gelu(), gelu_reference)], ids=["softmax", "gelu"])
def test_exp2f_loops_call_vector_math(make: Callable[[Tensor], Tensor], reference: Callable[[np.ndarray], np.ndarray],
                                      tmp_path: pathlib.Path) -> None:
    """Softmax's and GELU's exp2f loops call glibc's SIMD exp2f with either compiler: gcc through the `simd`
    declarations, clang (whose vector library table of glibc has no exp2f) through -fveclib=SVML and the kernel's
    definitions of SVML's names as glibc's functions (clang 14 before: scalar calls, softmax 12x slower than gcc's)."""
    info = Device["CPU"].compiler.info
    if not info.vector_math:
        pytest.skip(f"{info.describe()} cannot link glibc's libmvec here")
    if "clang" in (info.command + info.version).lower() and not info.svml_libmvec:
        pytest.skip(f"{info.describe()} has no -fveclib=SVML")
    values = np.linspace(-30, 30, 64 * 1023, dtype=np.float32).reshape(64, 1023)
    out = make(Tensor(values))
    source = "\n".join(k.source for k in kernels(out) if "exp2f(" in k.source)
    assert source and calls_vector_exp2f(assembly(source, tmp_path))
    np.testing.assert_allclose(out.numpy(), reference(values.astype(np.float64)), rtol=2e-5, atol=1e-6)


SVML_CALLS = """
void gg_calls_float(float* out, const float* a, const float* b) {
  gg_float16 x, y; __builtin_memcpy(&x, a, 64); __builtin_memcpy(&y, b, 64);
  gg_float16 r[4] = {__svml_exp2f16(x), __svml_log2f16(y), __svml_sinf16(x), __svml_powf16(y, x)};
  __builtin_memcpy(out, r, sizeof r);
}
void gg_calls_double(double* out, const double* a, const double* b) {
  gg_double8 x, y; __builtin_memcpy(&x, a, 64); __builtin_memcpy(&y, b, 64);
  gg_double8 r[4] = {__svml_exp28(x), __svml_log28(y), __svml_sin8(x), __svml_pow8(y, x)};
  __builtin_memcpy(out, r, sizeof r);
}
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"), reason="glibc's x86-64 libmvec names")
@pytest.mark.parametrize("march", ["x86-64", "native"])
def test_svml_names_compute_glibcs_functions(march: str, tmp_path: pathlib.Path) -> None:
    """The kernels' definitions of SVML's names (`SVML_WRAPPERS`), at the widest width, give exp2, log2, sin and pow:
    with -march=x86-64 (SSE only) as two and four calls of the narrower ones, natively (AVX-512 or AVX2 here) as
    glibc's own function of that width. Built by either compiler (they are plain C with vector types)."""
    info = Device["CPU"].compiler.info
    if not info.vector_math:
        pytest.skip(f"{info.describe()} cannot link glibc's libmvec here")
    library = tmp_path / "svml.so"
    flags = [f for f in info.flags if not f.startswith("-march=")]
    subprocess.run([info.path, *flags, f"-march={march}", "-DGG_SVML_LIBMVEC", "-x", "c", "-", "-o", str(library),
                    *info.libs], input=f"#include <math.h>\n{SVML_WRAPPERS}\n{SVML_CALLS}".encode(), check=True,
                   capture_output=True)
    lib = ctypes.CDLL(str(library))
    for name, dtype, lanes in (("gg_calls_float", np.float32, 16), ("gg_calls_double", np.float64, 8)):
        a = np.linspace(-3.0, 3.0, lanes).astype(dtype)
        b = np.linspace(0.25, 9.0, lanes).astype(dtype)
        out = np.zeros(4 * lanes, dtype)
        getattr(lib, name)(ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(a.ctypes.data),
                           ctypes.c_void_p(b.ctypes.data))
        expected = np.concatenate([np.exp2(a), np.log2(b), np.sin(a), np.power(b, a)])
        np.testing.assert_allclose(out, expected, rtol=4 * np.finfo(dtype).eps, atol=np.finfo(dtype).eps)


@pytest.mark.parametrize("step", [2, 3, -2])
def test_a_strided_read_is_a_strided_vector_load(step: int, tmp_path: pathlib.Path) -> None:
    """`x[:, ::2] * 2 + 1`: the read's address is written `(data1 + base)[i * 2]`, which clang vectorises as
    strided (built with -fwrapv it could not tell that `base + i * 2` does not wrap, and gathered every lane with
    AVX-512: 4.5x gcc's time); the numbers are the same either way, backwards too (`(data1 + (base + 95))[i * -2]`)."""
    x = np.arange(64 * 96, dtype=np.float32).reshape(64, 96)
    out = Tensor(x)[:, ::step] * 2 + 1
    source = kernels(out)[-1].source
    assert re.search(rf"\(data1 \+ \([^()]*\)\)\[\(ridx\d+ \* {abs(step) if step > 0 else step}\)\]", source), source
    if step > 0:  # (backwards, clang 14 still gathers: left as it was)
        assert "gather" not in assembly(source, tmp_path)
    np.testing.assert_array_equal(out.numpy(), x[:, ::step] * 2 + 1)


def test_a_sum_of_products_reduction_is_vectorised(tmp_path: pathlib.Path) -> None:
    """A layernorm's sum of squares (`acc = GG_FMAF(v, v, acc)` under `omp simd reduction(+)`) is vector FMAs:
    clang's loop vectoriser does not take a chain of the fma builtin as a sum, so for clang the kernel fuses with
    `fp contract(on)` instead (which it takes); the loop stayed scalar before (rows of 1023: 5.6x gcc's time)."""
    if not compiler_defines("__FMA__"):
        pytest.skip("reads x86 FMA instructions")
    x = np.random.default_rng(2).standard_normal((256, 1023), dtype=np.float32)
    out = Tensor(x).layernorm(-1)
    source = kernels(out)[-1].source
    assert "GG_FMAF(" in source
    assert re.search(r"vfmadd\d+ps", assembly(source, tmp_path))  # (a scalar loop finishes the 1023)
    mean = x.astype(np.float64).mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_a_max_pool_gradients_window_is_not_gathered(tmp_path: pathlib.Path) -> None:
    """The gradient through batch norm and a 2x2 max-pool (MNIST's): each window's four values (two rows of two) were
    packed by LLVM 14's SLP vectoriser into an AVX-512 gather, and the window's compare into mask extractions (4.5-8
    ms against gcc's 1.0); with `-mllvm -slp-threshold=5` that marginal packing is left scalar (1.25 ms)."""
    with Tensor.train():
        x = Tensor.rand(4, 32, 20, 20, requires_grad=True)
        y = nn.BatchNorm(32)(x.relu()).max_pool2d(2)
        (y * Tensor.rand(*y.shape)).sum().backward()
        window = [k for k in kernels(x.grad) if k.name.startswith("E_") and k.name.endswith("_2_2")]
    assert window
    assert "gather" not in assembly(window[0].source, tmp_path)


def test_the_svml_probe_refuses_a_name_the_kernels_do_not_define(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SVML probe's library holds a vectorisable loop of every math function a kernel can call: a compiler that
    maps one of them to an SVML name the kernels do not define (here: the definitions of pow's names left out)
    cannot load it, and is not given -fveclib=SVML (its kernels would fail to load instead)."""
    info = Device["CPU"].compiler.info
    if not info.svml_libmvec:
        pytest.skip(f"{info.describe()} has no -fveclib=SVML")
    flags = tuple(f for f in info.flags if f not in ccompiler.SVML_FLAGS and f != "-DGG_VECTOR_MATH")
    assert ccompiler._has_svml_libmvec(info.path, flags)
    without_pow = "\n".join(line for line in ccompiler.SVML_PROBE.splitlines()
                            if "__svml_pow" not in line or "gg_probe" in line)
    monkeypatch.setattr(ccompiler, "SVML_PROBE", without_pow)
    assert not ccompiler._has_svml_libmvec(info.path, flags)
