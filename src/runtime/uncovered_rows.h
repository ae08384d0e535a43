// Internal: rows of a packed (thd) batch that belong to no sequence.
#pragma once

#include "attend/backend.h"

namespace attend::detail {

// A packed batch may hold more tokens than its sequences cover: cu_seqlens[B]
// < total (the trailing padding of a fixed-size training batch). No kernel
// owns those rows, so without this their outputs would be whatever memory the
// caller's allocator returned — and through autograd, garbage in weight
// gradients. Run once after every backend's kernel, so every backend gives
// the same defined values: forward writes out 0 and LSE -inf there; backward
// writes dq 0 on query rows past cu_seqlens_q[B] and dk, dv 0 on key rows past
// cu_seqlens_kv[B] (unless spec.accumulate_grads, where adding zero means
// leaving them alone). Host tensors only: device memory is its backend's.
void define_uncovered_rows(const ForwardArgs& args);
void define_uncovered_rows(const BackwardArgs& args);

}  // namespace attend::detail
