/*
 * kernels.cu -- the device stage's conversion kernel: one thread an output
 * element (grid-stride), running the very function the CPU reference runs
 * (ops/convert.h), so the two agree bit for bit.
 *
 * Built by nvcc into a fatbin (see the Makefile: SASS for a range of
 * architectures and PTX for later ones), linked into the library as bytes
 * and loaded by the CUDA backend (cuda.c) with cuModuleLoadData. Never built
 * with fast math: the division must stay correctly rounded.
 */
#include "ops/convert.h"

extern "C" __global__ void stk_convert_kernel(stk__convert cv, const uint8_t *src, void *dst,
                                              uint64_t total)
{
    uint64_t stride = (uint64_t)blockDim.x * gridDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
        stk__convert_element(&cv, src, dst, (size_t)i);
}
