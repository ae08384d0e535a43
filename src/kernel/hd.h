// ATTEND_HD marks the small functions of the shared kernel headers (masks,
// positions, addressing, the Philox mask) that device kernels call too: under
// nvcc they compile for host and device, elsewhere they are plain functions.
#pragma once

#if defined(__CUDACC__)
#define ATTEND_HD __host__ __device__
#else
#define ATTEND_HD
#endif
