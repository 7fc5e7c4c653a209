// gcz/detail/hd.h — GCZ_HD marks functions compiled for both host and device (CUDA) code.
#pragma once

#if defined(__CUDACC__)
#define GCZ_HD __host__ __device__ __forceinline__
#else
#define GCZ_HD inline
#endif
