// Builds one region of a file for a wider instruction set: the kernels of the
// isa_avx2.cpp / isa_avx512.cpp files, which run only where dispatch found the
// CPU able to. GCC takes `#pragma GCC target`; clang ignores that pragma and
// instead attaches a target attribute to every function declared in the region.
// Either way only the region is widened, never the whole file: headers shared
// with other files must be included before ATTEND_TARGET_REGION_BEGIN, so no
// inline function that the linker may merge with a baseline copy carries wider
// instructions (tests/backends/check_isa_objects.py checks the objects for it).
// Regions do not nest: end one before beginning a wider one.
#pragma once

// The instruction sets of the kernel families (dispatch checks the CPU for the
// same ones at run time: cpu::supports).
#define ATTEND_FEATURES_AVX2 "avx2,fma,bmi,bmi2,f16c"
#define ATTEND_FEATURES_AVX512 "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,bmi,bmi2,f16c"
#define ATTEND_FEATURES_AVX512_BF16_AMX \
  "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,bmi,bmi2,f16c,avx512bf16,amx-tile,amx-bf16"

#define ATTEND_PRAGMA(...) _Pragma(#__VA_ARGS__)

#if defined(__clang__)
#define ATTEND_TARGET_REGION_BEGIN(features) \
  ATTEND_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define ATTEND_TARGET_REGION_END() ATTEND_PRAGMA(clang attribute pop)
#else
#define ATTEND_TARGET_REGION_BEGIN(features) ATTEND_PRAGMA(GCC push_options) ATTEND_PRAGMA(GCC target(features))
#define ATTEND_TARGET_REGION_END() ATTEND_PRAGMA(GCC pop_options)
#endif

// GCC 12 flags _mm512_reduce_*_ps and the unpack intrinsics (built on
// _mm512_undefined_*) as (maybe-)uninitialized; clang has no such warning.
#if defined(__clang__)
#define ATTEND_AVX512_WARNINGS_BEGIN()
#define ATTEND_AVX512_WARNINGS_END()
#else
#define ATTEND_AVX512_WARNINGS_BEGIN()                          \
  ATTEND_PRAGMA(GCC diagnostic push)                            \
  ATTEND_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized") \
  ATTEND_PRAGMA(GCC diagnostic ignored "-Wuninitialized")
#define ATTEND_AVX512_WARNINGS_END() ATTEND_PRAGMA(GCC diagnostic pop)
#endif
