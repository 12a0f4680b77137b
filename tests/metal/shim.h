// shim.h -- TEST-ONLY: compiles Metal Shading Language (MSL) kernels as ordinary C++17, so that the kernels
// glassgrad's MetalRenderer writes can be checked (and run, by the emulator in metal_emulator.py) without a Mac.
//
// In:  MSL source as MetalRenderer renders it (`#include <metal_stdlib>` resolves to tests/metal/metal_stdlib,
//      which includes this file). Compile with g++ or clang++: -std=c++17 -fsigned-char and -Wno-attributes (g++)
//      or -Wno-unknown-attributes (clang++), because `[[buffer(0)]]`-style attributes are left for C++ to ignore.
// Out: a C++ translation unit. What the shim provides, and how faithfully:
//   * address spaces `device`, `constant`, `thread`, `threadgroup` are empty macros. With GG_METAL_EMULATOR
//     defined, `threadgroup` becomes `static`: the emulator runs a synchronising kernel one threadgroup at a time,
//     so a function-static array is exactly "one array shared by the threads of the running group";
//   * `kernel` is `extern "C"`; the thread-id parameters are `uint3` structs;
//   * scalar types uchar/ushort/uint/ulong (long is 64 bits, as in MSL), `half` (_Float16, or with GG_HALF_STORAGE
//     a 16-bit struct with exact conversions, for compilers without _Float16) and `bfloat` (a 16-bit struct
//     converting to/from float with round-to-nearest-even); the structs convert explicitly only;
//   * vector types float2/3/4, half2/3/4, int2/3/4, uint2/3/4 with .x/.y/.z/.w, MSL-style constructors and
//     element-wise + - * /; no swizzles (MetalRenderer uses only `gid.x` and `lid.x`);
//   * metal:: math with precise:: and fast:: variants, INFINITY and NAN, computed by the host's libm through the
//     compiler's builtins (so the emulator does NOT model the precision of Apple's GPU math);
//   * `as_type<T>(x)` (same-size bit copy), `mem_flags`, `threadgroup_barrier` (calls the emulator's barrier for
//     the current thread; a no-op when no emulator runs the kernel);
//   * what MSL does not have is poisoned: `double` and C's f-suffixed math functions fail to compile.
// No standard header is included: parsing <cmath> would cost more than compiling a kernel.
// What it cannot check: rules of Apple's own compiler (e.g. which implicit conversions it accepts, bfloat needing
// MSL 3.1). Only a Mac can.
#pragma once

static_assert(sizeof(long) == 8, "MSL's long is 64 bits: the shim needs an LP64 host");
static_assert(static_cast<char>(-1) < 0, "MSL's char is signed: compile with -fsigned-char");

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

#ifndef GG_HALF_STORAGE
typedef _Float16 half;
#else
// ---------- half as its 16 bits, for a C++ compiler without _Float16 (clang 14 on x86-64) ----------
// The emulator defines GG_HALF_STORAGE when its probe finds no _Float16 (metal_emulator.cxx_flags). Conversions
// are exact and give the native type's bits: float -> half rounds to nearest even (overflow to infinity at 65520,
// NaNs kept quiet with their top payload bits); half -> float is exact. Explicit conversions only.
struct half {
  ushort bits;
  half() = default;
  explicit half(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }
  static ushort from_float(float f) {
    uint u;
    __builtin_memcpy(&u, &f, sizeof u);
    uint sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<ushort>(sign | 0x7e00u | ((a >> 13) & 0x1ffu));  // NaN
    if (a >= 0x477ff000u) return static_cast<ushort>(sign | 0x7c00u);  // 65520 and more: infinity
    if (a >= 0x38800000u) {  // a normal half: rebias the exponent, round 23 -> 10 mantissa bits
      uint m = a - 0x38000000u;
      return static_cast<ushort>(sign | ((m + 0xfffu + ((m >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u) return static_cast<ushort>(sign);  // 2^-25 or less: zero
    int shift = 126 - static_cast<int>(a >> 23);  // a subnormal half: the value in units of 2^-24, rounded
    uint mantissa = (a & 0x7fffffu) | 0x800000u;
    uint q = mantissa >> shift, r = mantissa & ((1u << shift) - 1u), tie = 1u << (shift - 1);
    return static_cast<ushort>(sign | (q + ((r > tie || (r == tie && (q & 1u))) ? 1u : 0u)));
  }
  static float to_float(ushort h) {
    uint sign = static_cast<uint>(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, u;
    float f;
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
      f = static_cast<float>(mantissa) * 0x1p-24f;
      __builtin_memcpy(&u, &f, sizeof u);
      u |= sign;
    } else if (exponent == 31) {
      u = sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u);
    } else {
      u = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
  }
};
#endif

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")

// ---------- bfloat: 16-bit brain float (storage; math happens in float) ----------
struct bfloat {
  ushort bits;
  bfloat() = default;
  explicit bfloat(float f) : bits(from_float(f)) {}
  explicit operator float() const {
    uint u = static_cast<uint>(bits) << 16;
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
  }
  static ushort from_float(float f) {
    uint u;
    __builtin_memcpy(&u, &f, sizeof u);
    if (f != f) return 0x7fc0;  // a quiet NaN
    return static_cast<ushort>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
  }
};
static_assert(sizeof(bfloat) == 2 && sizeof(half) == 2, "half and bfloat are 16 bits");

// ---------- vector types ----------
template <class T, int N> struct gg_vec;
template <class T> struct gg_vec<T, 2> {
  T x, y;
  gg_vec() = default;
  explicit gg_vec(T s) : x(s), y(s) {}
  gg_vec(T a, T b) : x(a), y(b) {}
  T& operator[](int i) { return (&x)[i]; }
};
template <class T> struct gg_vec<T, 3> {
  T x, y, z;
  gg_vec() = default;
  explicit gg_vec(T s) : x(s), y(s), z(s) {}
  gg_vec(T a, T b, T c) : x(a), y(b), z(c) {}
  T& operator[](int i) { return (&x)[i]; }
};
template <class T> struct gg_vec<T, 4> {
  T x, y, z, w;
  gg_vec() = default;
  explicit gg_vec(T s) : x(s), y(s), z(s), w(s) {}
  gg_vec(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
  T& operator[](int i) { return (&x)[i]; }
};
#define GG_VEC_OP(op)                                                                   \
  template <class T, int N> gg_vec<T, N> operator op(gg_vec<T, N> a, gg_vec<T, N> b) {  \
    for (int i = 0; i < N; i++) a[i] = a[i] op b[i];                                    \
    return a;                                                                           \
  }
GG_VEC_OP(+)
GG_VEC_OP(-)
GG_VEC_OP(*)
GG_VEC_OP(/)
#undef GG_VEC_OP
typedef gg_vec<float, 2> float2;
typedef gg_vec<float, 3> float3;
typedef gg_vec<float, 4> float4;
typedef gg_vec<half, 2> half2;
typedef gg_vec<half, 3> half3;
typedef gg_vec<half, 4> half4;
typedef gg_vec<int, 2> int2;
typedef gg_vec<int, 3> int3;
typedef gg_vec<int, 4> int4;
typedef gg_vec<uint, 2> uint2;
typedef gg_vec<uint, 3> uint3;
typedef gg_vec<uint, 4> uint4;

// ---------- the metal namespace: math, bit casts, barriers ----------
namespace metal {
// float and half overloads; half is computed in float, as Apple GPUs may
#define GG_MATH_1(name, builtin)                                            \
  inline float name(float x) { return builtin(x); }                         \
  inline half name(half x) { return static_cast<half>(builtin(static_cast<float>(x))); }
#define GG_MATH_2(name, builtin)                                            \
  inline float name(float x, float y) { return builtin(x, y); }             \
  inline half name(half x, half y) {                                        \
    return static_cast<half>(builtin(static_cast<float>(x), static_cast<float>(y))); }
#define GG_MATH_ALL                                                                              \
  GG_MATH_1(exp2, __builtin_exp2f) GG_MATH_1(log2, __builtin_log2f) GG_MATH_1(sin, __builtin_sinf) \
  GG_MATH_1(cos, __builtin_cosf) GG_MATH_1(sqrt, __builtin_sqrtf) GG_MATH_1(trunc, __builtin_truncf) \
  GG_MATH_1(fabs, __builtin_fabsf) GG_MATH_2(pow, __builtin_powf) GG_MATH_2(fmod, __builtin_fmodf)
GG_MATH_ALL
namespace precise {
GG_MATH_ALL
}  // namespace precise
namespace fast {
GG_MATH_ALL
}  // namespace fast
#undef GG_MATH_ALL
#undef GG_MATH_1
#undef GG_MATH_2

template <class T, class F> inline T as_type(F x) {
  static_assert(sizeof(T) == sizeof(F), "as_type<T>(x) needs types of the same size");
  T out;
  __builtin_memcpy(&out, &x, sizeof out);
  return out;
}

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

// atomics on device memory (what MetalRenderer's scatters use): MSL's atomic_int, atomic_uint and (Metal 3)
// atomic_float, reached by casting a `device T*` to `device atomic_T*`; only relaxed order exists. The emulator runs
// a group's threads concurrently, so these are real atomics (the host compiler's __atomic builtins; a float adds in
// a compare-and-swap loop over its bits).
enum memory_order { memory_order_relaxed = __ATOMIC_RELAXED };
template <class T> struct gg_atomic { T value; };
typedef gg_atomic<int> atomic_int;
typedef gg_atomic<uint> atomic_uint;
typedef gg_atomic<float> atomic_float;
inline int atomic_fetch_add_explicit(volatile atomic_int* object, int operand, memory_order) {
  return __atomic_fetch_add(&object->value, operand, __ATOMIC_RELAXED);
}
inline uint atomic_fetch_add_explicit(volatile atomic_uint* object, uint operand, memory_order) {
  return __atomic_fetch_add(&object->value, operand, __ATOMIC_RELAXED);
}
inline float atomic_fetch_add_explicit(volatile atomic_float* object, float operand, memory_order) {
  volatile uint* bits = reinterpret_cast<volatile uint*>(&object->value);
  uint seen = __atomic_load_n(bits, __ATOMIC_RELAXED);
  while (true) {
    float old = as_type<float>(seen);
    uint want = as_type<uint>(old + operand);
    if (__atomic_compare_exchange_n(bits, &seen, want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return old;
  }
}
}  // namespace metal

namespace gg {
// set by the emulator for each OS thread it runs a Metal thread on
inline thread_local void (*barrier_hook)(void*) = nullptr;
inline thread_local void* barrier_context = nullptr;
}  // namespace gg

namespace metal {
inline void threadgroup_barrier(mem_flags) {
  if (gg::barrier_hook != nullptr) gg::barrier_hook(gg::barrier_context);
}
}  // namespace metal

#ifdef GG_METAL_EMULATOR
// ---------- for the emulator's generated entry point (metal_emulator.py) ----------
namespace gg {
// a buffer argument: converts to whatever pointer type the kernel's parameter has
struct Buffer {
  void* address;
  template <class T> operator T*() const { return static_cast<T*>(address); }
};
inline void enter(const unsigned* ids, void (*barrier)(void*), void* context, uint3& gid, uint3& lid) {
  barrier_hook = barrier;
  barrier_context = context;
  gid = uint3(ids[0], ids[1], ids[2]);
  lid = uint3(ids[3], ids[4], ids[5]);
}
}  // namespace gg
#endif

// ---------- MSL's spelling ----------
#define kernel extern "C"
#define device
#define constant
#define thread
#ifdef GG_METAL_EMULATOR
#define threadgroup static
#else
#define threadgroup
#endif

// ---------- what MSL does not have must not compile ----------
#pragma GCC poison double exp2f log2f sinf sqrtf powf fmodf truncf
