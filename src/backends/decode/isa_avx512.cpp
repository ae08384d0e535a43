// The decode kernels compiled for avx512. Standard and project headers come first,
// outside the target region, so only the kernel code below is built for avx512
// and no shared inline function can leak wider instructions into other paths.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "backends/decode/decode_params.h"
#include "backends/decode/dispatch.h"
#include "core/half.h"
#include <immintrin.h>

#pragma GCC push_options
// GCC 12 flags _mm512_reduce_*_ps (built on _mm512_undefined_ps) as (maybe-)uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,bmi,bmi2,f16c")

#define ATTEND_DECODE_ISA isa_avx512
#define ATTEND_DECODE_SIMD ::attend::flash::SimdAvx512
#include "backends/flash/simd_avx512.h"
#include "backends/decode/decode_impl.h"
#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace attend::decode {

KernelTable kernels_avx512() {
  using detail::bf16_t;
  using detail::f16_t;
  namespace k = isa_avx512;
  return {"avx512",
          {&k::split_task<float>, &k::combine_task<float>},
          {&k::split_task<bf16_t>, &k::combine_task<bf16_t>},
          {&k::split_task<f16_t>, &k::combine_task<f16_t>}};
}

}  // namespace attend::decode
