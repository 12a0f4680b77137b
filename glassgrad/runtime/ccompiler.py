"""The CPU backend's C compiler: which one, and what it can do, probed rather than assumed.

In: `CC` (a command), else the first of gcc, clang and cc that builds a kernel. Out: a `CCompilerInfo`: the
compiler's identity (resolved path, first line of `--version`), the flags and libraries kernels are built with, and
its capabilities, each found by building (and, where numbers matter, running) a small program:

* `native_half`: `_Float16` compiles, links and converts float32/float64 to half with round-to-nearest-even.
  gcc 12 has it; clang before 15 rejects it on x86-64 ("_Float16 is not supported on this target"). Without it the
  renderer stores float16 as its 16 bits and converts with exact helpers (`renderer/cstyle.py`, `_F16_HELPERS`).
* `native_bfloat16`: `__bf16` converts to and from float (gcc 13+, clang 17+ on x86-64). Recorded, not used:
  bfloat16 is stored as its 16 bits on every compiler (its helpers are exact and its math is float32 anyway).
* `omp_simd`: `-fopenmp-simd` is accepted, so the renderer's `#pragma omp simd` hints mean something.
* `march_native`: `-march=native` is accepted (code for this machine's vector units).
* `vector_math`: glibc's SIMD `exp2f`/`log2f`/`sinf` (libmvec) link and load (`-DGG_VECTOR_MATH`).
* `vector_bytes`, `family`: the widest SIMD registers the flags allow, and whether it is gcc or clang, from the
  macros it predefines (the heuristic sizes register tiles by the first and picks optimisation levels by the second).
* `svml_libmvec`: the compiler takes `-fveclib=SVML` and then vectorises a loop of `exp2f` into calls of SVML's
  names, which the renderer's definitions (`renderer/cstyle.py`, `SVML_WRAPPERS`) forward to glibc's libmvec: the
  library builds, loads and computes exp2f (`-fveclib=SVML -DGG_SVML_LIBMVEC`). clang 14: its libmvec table has no
  exp2f or log2f, so without this its softmax and GELU loops call the scalar functions (gcc's `simd` declarations
  of them are ignored).

A compiler that cannot build and run a plain kernel raises `CCompilerError`, naming the compiler, its version and
the step that failed, with the compiler's own messages. Probing costs a few compiler runs the first time a compiler
is seen; the answer is kept in memory and on disk (`<cache dir>/ccompiler/`, not with CACHELEVEL=0), keyed by the
compiler's resolved path, size and modification time, the machine, and the text of the probes, so a different or
upgraded compiler (or a new probe) is probed again while a warm start runs no compiler at all.
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from glassgrad.helpers import CACHELEVEL, atomic_write, cache_dir
from glassgrad.renderer.cstyle import SVML_WRAPPERS, ClangRenderer

# flags every kernel is built with: -fwrapv (integer overflow wraps, like numpy), -ffp-contract=off (no FMA, so a*b+c
# rounds like numpy), -fno-math-errno (math functions may vectorise; NaN and inf handling is unchanged),
# -fno-trapping-math (no program here reads the floating-point exception flags, so both arms of a select may be
# computed: gcc then vectorises a loop whose selects hold arithmetic, GELU's tanh among them; values are unchanged)
# -O2 unless a kernel asks for another level (an OPTLEVEL opt: `ClangCompiler.flags_for`, docs/OPTIMIZER.md)
OPT_FLAG = "-O2"
BASE_FLAGS = (OPT_FLAG, "-fPIC", "-shared", "-fwrapv", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math")
# tried as groups (a group is taken whole or not at all), each where the compiler accepts it:
# * -fno-ivopts: gcc 12.2's induction-variable pass rewrote a read of a local array (a register tile's accumulators,
#   in a loop of masked stores: a column max or sum over a padded row of 257 or 1021) as an address based on the
#   output pointer, and RTL dead-store elimination then dropped the accumulation as never read: max(0) of a
#   (2, 3, 257) tensor gave -inf everywhere. clang ignores it (with a warning)
# * -mllvm -unroll-full-max-count=7 (LLVM only): LLVM's cost model fully unrolls loops of up to 7 iterations, not
#   more; loops with an unroll pragma are unrolled as the pragma says. LLVM fully unrolls small loops before its loop
#   vectoriser runs, so a register tile's 8 or 16 SIMD lanes (`#pragma omp simd`, a loop of 8 or 16) became scalar
#   copies that its SLP vectoriser did not put back together: scalar FMAs with the accumulators spilled (clang 14,
#   AVX-512: a 3x3 convolution 97 ms against gcc's 4.5, a 5x5 weight gradient with 8 lanes 3.6 ms against 0.43).
#   Capped, the lanes loop is vectorised first, and the single vector iteration left is unrolled after (the
#   accumulators then live in registers): 4.0 and 0.47 ms. (Loops of 4 lanes or fewer are left to SLP.)
# * -mllvm -slp-threshold=5 (LLVM only): LLVM's SLP vectoriser packs straight-line code only where its cost model
#   sees a gain of 5 or more, not any gain. With AVX-512, where LLVM 14 takes gathers as cheap, it packed a 2x2
#   max-pool window's four loads (two rows) into a gather and the window's compare into mask-register extractions:
#   MNIST's max-pool gradient 4.5-8 ms against gcc's 1.0, 1.25 ms with the threshold; clear wins (small reductions'
#   partial sums) stay packed
OPTIONAL_FLAGS: tuple[tuple[str, ...], ...] = (("-march=native",), ("-fopenmp-simd",), ("-fno-ivopts",),
                                               ("-mllvm", "-unroll-full-max-count=7"), ("-mllvm", "-slp-threshold=5"))
# tried in this order when CC is not set. gcc first: the kernels' loop shapes and pragmas were tuned with gcc 12.
# clang 14 ran them 3-14x slower (MNIST's TinyJit training step on 2 loaded cores: batch 512 1.39 s with gcc, 11.5 s
# with clang; batch 128 0.22 s, 2.4 s); with the LLVM flags above, its vector math (`svml_libmvec`) and the
# renderer's strided addresses and fmuladd sums it is within about 1.2x of gcc (batch 512 2.05 s against 1.74 s,
# batch 128 0.220 s against 0.222 s; per kernel of the step, 0.9-1.1x): docs/OPTIMIZER.md, "clang 14"
CANDIDATES = ("gcc", "clang", "cc")


class CCompilerError(RuntimeError):
    """No usable C compiler: none found, or the one found (or named by CC) cannot build a kernel."""


@dataclass(frozen=True)
class CCompilerInfo:
    """A C compiler and what it can do (see the module docstring). `problem` is empty when it can build kernels."""
    command: str
    path: str
    version: str
    flags: tuple[str, ...]
    libs: tuple[str, ...]
    native_half: bool = False
    native_bfloat16: bool = False
    omp_simd: bool = False
    march_native: bool = False
    vector_math: bool = False
    svml_libmvec: bool = False
    vector_bytes: int = 16
    family: str = ""  # 'gcc' or 'clang' (from its predefined macros), '' for another compiler
    problem: str = ""

    def describe(self) -> str:
        """'clang (/usr/lib/llvm-14/bin/clang, Debian clang version 14.0.6)'."""
        return f"{self.command} ({self.path}, {self.version or 'version unknown'})"

    def check_usable(self) -> CCompilerInfo:
        if self.problem:
            raise CCompilerError(f"the C compiler {self.describe()} cannot build CPU kernels: {self.problem}")
        return self


# ---------- the probes: small programs, each built with the flags found so far ----------

KERNEL_PROBE = """#include <math.h>
#include <stdbool.h>
void gg_probe(float* restrict out, const float* restrict in, long long n) {
  float acc = 0.0f;
  for (long long i = 0; i < n; i++) { bool big = in[i] > 2.0f; acc = acc + (big ? sqrtf(in[i]) : in[i]); }
  out[0] = acc;
}
"""

SIMD_PROBE = """void gg_probe(float* restrict out, const float* restrict in) {
  float acc = 0.0f;
  #pragma omp simd reduction(+:acc)
  for (long long i = 0; i < 64; i++) acc = acc + in[i];
  out[0] = acc;
}
"""

HALF_PROBE = """void gg_probe_f32(const float* in, unsigned short* out, int n) {
  for (int i = 0; i < n; i++) { union { _Float16 h; unsigned short b; } u = { (_Float16)in[i] }; out[i] = u.b; }
}
void gg_probe_f64(const double* in, unsigned short* out, int n) {
  for (int i = 0; i < n; i++) { union { _Float16 h; unsigned short b; } u = { (_Float16)in[i] }; out[i] = u.b; }
}
float gg_probe_back(unsigned short b) { union { unsigned short b; _Float16 h; } u = { b }; return (float)u.h; }
"""

BFLOAT16_PROBE = """__bf16 gg_probe_to(float x) { return (__bf16)x; }
float gg_probe_from(__bf16 x) { return (float)x; }
"""

VECTOR_MATH_PROBE = """#include <math.h>
float exp2f(float) __attribute__((simd("notinbranch")));
void gg_probe(float* restrict out, const float* restrict in) { for (int i = 0; i < 64; i++) out[i] = exp2f(in[i]); }
"""

# every math function a CPU kernel can call, in a vectorisable loop of each type: should the compiler map any of them
# to an SVML name that the kernel does not define, the library would not load (ctypes binds every symbol at load)
_TWO_ARGUMENTS = ("pow", "fmod")
_KERNEL_MATH = (*ClangRenderer.float_functions.values(), "fabs")
SVML_PROBE = f"""#include <math.h>
{SVML_WRAPPERS}
void gg_probe(float* restrict out, const float* restrict in) {{ for (int i = 0; i < 64; i++) out[i] = exp2f(in[i]); }}
""" + "\n".join(
    f"void gg_probe_{fn}{suffix}({ctype}* restrict out, const {ctype}* restrict a, const {ctype}* restrict b) {{ "
    f"for (int i = 0; i < 64; i++) out[i] = {fn}{suffix}(a[i]{', b[i]' if fn in _TWO_ARGUMENTS else ''}); }}"
    for fn in _KERNEL_MATH for ctype, suffix in (("float", "f"), ("double", ""))) + "\n"
SVML_FLAGS = ("-fveclib=SVML", "-DGG_SVML_LIBMVEC")

# float32 values whose float16 conversion tells round-to-nearest-even from other roundings: ties to even (down and
# up), just past a tie, a subnormal tie, overflow past 65504, an infinity
HALF_CHECKS = np.array([1.0, 2049.0, 2051.0, np.nextafter(np.float32(2049), np.float32(4096)), 2.0 ** -25 * 3,
                        65519.0, 65520.0, -np.inf, 1e-8], dtype=np.float32)


@dataclass
class _Build:
    """The result of building one probe: the shared library (None if the build failed) and the messages."""
    library: bytes | None
    messages: str


def _build(path: str, source: str, flags: tuple[str, ...], libs: tuple[str, ...] = ()) -> _Build:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "probe.so")
        try:
            proc = subprocess.run([path, *flags, "-x", "c", "-", "-o", out, *libs], input=source.encode(),
                                  capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            return _Build(None, str(e))
        if proc.returncode != 0 or not os.path.exists(out):
            return _Build(None, proc.stderr.decode(errors="replace"))
        with open(out, "rb") as f:
            return _Build(f.read(), proc.stderr.decode(errors="replace"))


def _load(library: bytes) -> ctypes.CDLL:
    """A probe's shared library, loaded (the mapping outlives the temporary file)."""
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(library)
        f.flush()
        return ctypes.CDLL(f.name)


def _first_lines(text: str, count: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[:count]) or "(no messages)"


def _kernel_problem(path: str, flags: tuple[str, ...], libs: tuple[str, ...]) -> str:
    """'' if a plain kernel builds, loads and computes the right sum; else what went wrong."""
    build = _build(path, KERNEL_PROBE, flags, libs)
    if build.library is None:
        return (f"building a plain C kernel (`{' '.join(flags)} -x c - {' '.join(libs)}`) failed; a C compiler with "
                f"the C library's headers (math.h, stdbool.h) and a linker is needed:\n{_first_lines(build.messages)}")
    try:
        fn = _load(build.library).gg_probe
    except OSError as e:
        return f"the shared library it built does not load: {e}"
    values = (ctypes.c_float * 4)(1.0, 4.0, 9.0, -1.0)
    out = (ctypes.c_float * 1)()
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
    fn(out, values, 4)
    return "" if out[0] == 1.0 + 2.0 + 3.0 - 1.0 else f"a probe kernel computed {out[0]}, not 5.0"


def _accepts(path: str, flags: tuple[str, ...], extra: tuple[str, ...], libs: tuple[str, ...]) -> bool:
    return _build(path, SIMD_PROBE, (*flags, *extra), libs).library is not None


def _has_native_half(path: str, flags: tuple[str, ...], libs: tuple[str, ...]) -> bool:
    """`_Float16` builds, loads, and converts float32 and float64 to the bits numpy gives (round to nearest even)."""
    build = _build(path, HALF_PROBE, flags, libs)
    if build.library is None:
        return False
    try:
        lib = _load(build.library)
    except OSError:
        return False
    n = len(HALF_CHECKS)
    with np.errstate(over="ignore"):  # (65520 overflows to infinity, as it should)
        expected = HALF_CHECKS.astype(np.float16).view(np.uint16)
    for name, values in (("gg_probe_f32", HALF_CHECKS), ("gg_probe_f64", HALF_CHECKS.astype(np.float64))):
        got = np.zeros(n, dtype=np.uint16)
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        fn(values.ctypes.data, got.ctypes.data, n)
        if not np.array_equal(got, expected):
            return False
    back = lib.gg_probe_back
    back.argtypes, back.restype = [ctypes.c_ushort], ctypes.c_float
    return all(back(int(b)) == float(v) for b, v in zip(expected, expected.view(np.float16)))


def _has_bfloat16(path: str, flags: tuple[str, ...]) -> bool:
    proc = subprocess.run([path, *[f for f in flags if f != "-shared"], "-fsyntax-only", "-x", "c", "-"],
                          input=BFLOAT16_PROBE.encode(), capture_output=True, timeout=120)
    return proc.returncode == 0


def _has_vector_math(path: str, flags: tuple[str, ...]) -> bool:
    build = _build(path, VECTOR_MATH_PROBE, (*flags, "-DGG_VECTOR_MATH"), ("-lmvec", "-lm"))
    if build.library is None:
        return False
    try:
        _load(build.library)
    except OSError:
        return False
    return True


def _has_svml_libmvec(path: str, flags: tuple[str, ...]) -> bool:
    """See the module docstring: the vectorised loop calls an SVML name, the library (with loops of every math
    function a kernel can call, each type) loads, and its exp2f gives glibc's results."""
    flags = (*flags, *SVML_FLAGS)
    try:
        proc = subprocess.run([path, *[f for f in flags if f != "-shared"], "-S", "-o", "-", "-x", "c", "-"],
                              input=SVML_PROBE.encode(), capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if proc.returncode != 0 or b"__svml_exp2f" not in proc.stdout:
        return False
    build = _build(path, SVML_PROBE, flags, ("-lmvec", "-lm"))
    if build.library is None:
        return False
    try:
        fn = _load(build.library).gg_probe
    except OSError:
        return False
    values = np.linspace(-130.0, 130.0, 64, dtype=np.float32)
    out = np.zeros(64, dtype=np.float32)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn(out.ctypes.data, values.ctypes.data)
    with np.errstate(over="ignore"):
        expected = np.exp2(values)
    return bool(np.allclose(out, expected, rtol=4e-7, atol=0.0))


# the widest SIMD registers the flags let the compiler use, from its predefined macros (bytes); 16 (SSE2, NEON, or
# nothing known) otherwise
SIMD_MACROS = (("__AVX512F__", 64), ("__AVX__", 32))
# which compiler it is, from the same macros (clang defines __GNUC__ too, so it is asked first): the optimisation
# level a kernel kind measured fastest at depends on it (codegen/opt/heuristic.py, `_level_for_kind`)
FAMILY_MACROS = (("__clang__", "clang"), ("__GNUC__", "gcc"))


def _predefined_macros(path: str, flags: tuple[str, ...]) -> set[str]:
    """The names of the macros the compiler predefines with these flags (empty if it cannot say)."""
    try:
        proc = subprocess.run([path, *[f for f in flags if f != "-shared"], "-dM", "-E", "-x", "c", "-"], input=b"",
                              capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split()[1] for line in proc.stdout.decode(errors="replace").splitlines()
            if line.startswith("#define ") and len(line.split()) > 1}


def _vector_bytes(defined: set[str]) -> int:
    """How wide the SIMD registers the kernels may use are, in bytes (`-march=native` decides): the heuristic's
    register tiles are sized by it (codegen/opt/heuristic.py)."""
    return next((width for macro, width in SIMD_MACROS if macro in defined), 16)


def _family(defined: set[str]) -> str:
    """'gcc', 'clang', or '' for a compiler that is neither."""
    return next((family for macro, family in FAMILY_MACROS if macro in defined), "")


def _version(path: str) -> str:
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = proc.stdout.strip().splitlines()
    return lines[0].strip() if lines else ""


def probe(command: str, path: str) -> CCompilerInfo:
    """Run the probes for one compiler (no caching: see `compiler_info`)."""
    version = _version(path)
    flags: tuple[str, ...] = BASE_FLAGS
    libs: tuple[str, ...] = ("-lm",)
    info = CCompilerInfo(command, path, version, flags, libs)
    problem = _kernel_problem(path, flags, libs)
    if problem:
        return dataclasses.replace(info, problem=problem)
    everything = tuple(f for group in OPTIONAL_FLAGS for f in group)
    accepted: tuple[str, ...] = everything
    if not _accepts(path, flags, everything, libs):
        accepted = tuple(f for group in OPTIONAL_FLAGS if _accepts(path, flags, group, libs) for f in group)
    flags = (*flags, *accepted)
    checks: list[Callable[[], bool]] = [lambda: _has_native_half(path, flags, libs),
                                        lambda: _has_bfloat16(path, flags), lambda: _has_vector_math(path, flags),
                                        lambda: _has_svml_libmvec(path, flags)]
    with ThreadPoolExecutor(max_workers=len(checks)) as pool:
        native_half, native_bfloat16, vector_math, svml = (f.result() for f in [pool.submit(c) for c in checks])
    if vector_math:  # the renderer declares glibc's SIMD math functions under this macro
        flags, libs = (*flags, "-DGG_VECTOR_MATH"), ("-lmvec", "-lm")
    svml = svml and vector_math
    if svml:  # ... and defines SVML's names as them under this one
        flags = (*flags, *SVML_FLAGS)
    defined = _predefined_macros(path, flags)
    return dataclasses.replace(info, flags=flags, libs=libs, native_half=native_half, native_bfloat16=native_bfloat16,
                               omp_simd="-fopenmp-simd" in flags, march_native="-march=native" in flags,
                               vector_math=vector_math, svml_libmvec=svml, vector_bytes=_vector_bytes(defined),
                               family=_family(defined))


# ---------- caching: in memory, and on disk keyed by the compiler's identity ----------

_PROBES_KEY = hashlib.sha256("\n".join([*BASE_FLAGS, *map(" ".join, OPTIONAL_FLAGS), KERNEL_PROBE, SIMD_PROBE,
                                        HALF_PROBE, BFLOAT16_PROBE, VECTOR_MATH_PROBE, SVML_PROBE, *SVML_FLAGS,
                                        repr(HALF_CHECKS.tolist()), repr(SIMD_MACROS),
                                        repr(FAMILY_MACROS)]).encode())
_MEMORY: dict[str, CCompilerInfo] = {}


def _identity(command: str, path: str) -> str:
    stat = os.stat(path)
    return "\n".join([command, path, str(stat.st_size), str(stat.st_mtime_ns), platform.machine(), platform.node(),
                      _PROBES_KEY.hexdigest()])


def _disk_path(identity: str) -> pathlib.Path:
    return cache_dir() / "ccompiler" / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"


def _read_disk(identity: str) -> CCompilerInfo | None:
    if CACHELEVEL < 1:
        return None
    try:
        with open(_disk_path(identity)) as f:
            fields: dict[str, Any] = json.load(f)
        fields.update(flags=tuple(fields["flags"]), libs=tuple(fields["libs"]))
        return CCompilerInfo(**fields)
    except (OSError, ValueError, TypeError, KeyError):  # none yet, or unreadable: probe again
        return None


def _write_disk(identity: str, info: CCompilerInfo) -> None:
    if CACHELEVEL >= 1:
        path = _disk_path(identity)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(dataclasses.asdict(info), indent=1).encode())


def compiler_info(command: str) -> CCompilerInfo:
    """What the compiler `command` (a name on PATH or a path) can do: from memory, else from disk, else probed.
    Raises CCompilerError when no such program exists."""
    path = shutil.which(command)
    if path is None:
        raise CCompilerError(f"the C compiler {command!r} was not found on PATH")
    path = os.path.realpath(path)
    identity = _identity(command, path)
    if identity not in _MEMORY:
        info = _read_disk(identity)
        if info is None:
            info = probe(command, path)
            _write_disk(identity, info)
        _MEMORY[identity] = info
    return _MEMORY[identity]


def find_c_compiler() -> CCompilerInfo:
    """The compiler named by `CC`, which must be usable; else the first usable one of gcc, clang and cc."""
    chosen = os.environ.get("CC")
    if chosen:
        return compiler_info(chosen).check_usable()
    unusable: list[CCompilerInfo] = []
    for command in CANDIDATES:
        if shutil.which(command) is None:
            continue
        info = compiler_info(command)
        if not info.problem:
            return info
        unusable.append(info)
    if not unusable:
        raise CCompilerError("no C compiler found for the CPU backend: install gcc or clang (e.g. "
                             "`apt-get install gcc`), or name one with CC=...")
    details = "\n".join(f"* {info.describe()}: {info.problem}" for info in unusable)
    raise CCompilerError(f"no usable C compiler for the CPU backend (set CC to pick one):\n{details}")
