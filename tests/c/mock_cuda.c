/* mock_cuda.c -- a stand-in for the CUDA driver (libcuda.so.1) that runs on
 * the CPU, built as build/$MODE/tests/libmockcuda.so. test_device loads it
 * through the CUDA backend (STOKER_LIBCUDA), so src/device/cuda.c runs for
 * real: every entry point it resolves by name, its context push/pop, its
 * kernel launch (the parameters are unpacked here and the grid-stride loop
 * of kernels.cu is run thread by thread with the same ops/convert.h), its
 * fatbin loading and its error paths.
 *
 * Work completes when it is queued (the fake backend covers late and
 * out-of-order completion). It counts live objects and per-thread context
 * depth, so the test can check the backend leaves nothing behind and pops
 * every context it pushes. MOCK_CUDA_FAIL=NAME makes the entry point NAME
 * fail with CUDA_ERROR_ILLEGAL_ADDRESS (700) from then on, as a real failed
 * copy or kernel poisons a context. */
#include "ops/convert.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#define EXPORT          __attribute__((visibility("default")))
#define ILLEGAL_ADDRESS 700
#define NOT_FOUND       500
#define INVALID_VALUE   1

static atomic_long g_live;        /* allocations, streams, events, modules, retained contexts */
static atomic_long g_launches;    /* kernels run */
static _Thread_local int t_depth; /* contexts pushed on this thread */
static atomic_int g_depth_errors; /* pops without a push */
static int g_ctx_token;

/* Calls that need a current context check for one, as the driver does. */
#define NEED_CTX()                                                                                 \
    do {                                                                                           \
        if (t_depth == 0)                                                                          \
            return 201; /* CUDA_ERROR_INVALID_CONTEXT */                                           \
    } while (0)

static int failing(const char *name)
{
    const char *f = getenv("MOCK_CUDA_FAIL");
    return f && !strcmp(f, name);
}

#define FAIL_IF(name)                                                                              \
    do {                                                                                           \
        if (failing(name))                                                                         \
            return ILLEGAL_ADDRESS;                                                                \
    } while (0)

EXPORT long mock_cuda_live(void)
{
    return atomic_load(&g_live);
}

EXPORT long mock_cuda_launches(void)
{
    return atomic_load(&g_launches);
}

EXPORT int mock_cuda_depth(void)
{
    return t_depth;
}

EXPORT int mock_cuda_depth_errors(void)
{
    return atomic_load(&g_depth_errors);
}

EXPORT CUresult cuInit(unsigned flags)
{
    return flags ? INVALID_VALUE : 0;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
    *n = 1;
    return 0;
}

EXPORT CUresult cuDeviceGet(int *d, int i)
{
    if (i != 0)
        return INVALID_VALUE;
    *d = i;
    return 0;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, int d)
{
    (void)d;
    strncpy(name, "mock GPU", (size_t)len);
    return 0;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(void **ctx, int d)
{
    (void)d;
    *ctx = &g_ctx_token;
    atomic_fetch_add(&g_live, 1);
    return 0;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int d)
{
    (void)d;
    atomic_fetch_sub(&g_live, 1);
    return 0;
}

EXPORT CUresult cuCtxPushCurrent_v2(void *ctx)
{
    if (ctx != &g_ctx_token)
        return INVALID_VALUE;
    t_depth++;
    return 0;
}

EXPORT CUresult cuCtxPopCurrent_v2(void **ctx)
{
    if (t_depth == 0) {
        atomic_fetch_add(&g_depth_errors, 1);
        return INVALID_VALUE;
    }
    t_depth--;
    if (ctx)
        *ctx = &g_ctx_token;
    return 0;
}

EXPORT CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    NEED_CTX();
    *p = malloc(n);
    if (!*p)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    atomic_fetch_add(&g_live, 1);
    return 0;
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    NEED_CTX();
    free(p);
    atomic_fetch_sub(&g_live, 1);
    return 0;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    NEED_CTX();
    void *m = malloc(n);
    if (!m)
        return 2;
    *p = (CUdeviceptr)(uintptr_t)m;
    atomic_fetch_add(&g_live, 1);
    return 0;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    NEED_CTX();
    free((void *)(uintptr_t)p);
    atomic_fetch_sub(&g_live, 1);
    return 0;
}

EXPORT CUresult cuStreamCreate(void **s, unsigned flags)
{
    NEED_CTX();
    if (flags != 1) /* the loader's streams must not block on stream 0 */
        return INVALID_VALUE;
    *s = malloc(1);
    atomic_fetch_add(&g_live, 1);
    return 0;
}

EXPORT CUresult cuStreamDestroy_v2(void *s)
{
    NEED_CTX();
    free(s);
    atomic_fetch_sub(&g_live, 1);
    return 0;
}

EXPORT CUresult cuEventCreate(void **e, unsigned flags)
{
    NEED_CTX();
    (void)flags;
    *e = malloc(1);
    atomic_fetch_add(&g_live, 1);
    return 0;
}

EXPORT CUresult cuEventDestroy_v2(void *e)
{
    NEED_CTX();
    free(e);
    atomic_fetch_sub(&g_live, 1);
    return 0;
}

EXPORT CUresult cuEventRecord(void *e, void *s)
{
    (void)e;
    (void)s;
    NEED_CTX();
    FAIL_IF("cuEventRecord");
    return 0;
}

EXPORT CUresult cuEventQuery(void *e)
{
    NEED_CTX();
    (void)e;
    FAIL_IF("cuEventQuery");
    return 0;
}

EXPORT CUresult cuEventSynchronize(void *e)
{
    NEED_CTX();
    (void)e;
    FAIL_IF("cuEventSynchronize");
    return 0;
}

EXPORT CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags)
{
    (void)s;
    (void)e;
    NEED_CTX();
    return flags ? INVALID_VALUE : 0;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s)
{
    (void)s;
    NEED_CTX();
    FAIL_IF("cuMemcpyHtoDAsync_v2");
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    NEED_CTX();
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}

EXPORT CUresult cuModuleLoadData(void **m, const void *image)
{
    NEED_CTX();
    /* A fatbin starts with its magic, 0xBA55ED50 little-endian. */
    uint32_t magic;
    memcpy(&magic, image, 4);
    if (magic != 0xBA55ED50u)
        return 200; /* CUDA_ERROR_INVALID_IMAGE */
    *m = malloc(1);
    atomic_fetch_add(&g_live, 1);
    return 0;
}

EXPORT CUresult cuModuleUnload(void *m)
{
    NEED_CTX();
    free(m);
    atomic_fetch_sub(&g_live, 1);
    return 0;
}

static int g_kernel_token;

EXPORT CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
    (void)m;
    if (strcmp(name, "stk_convert_kernel"))
        return NOT_FOUND;
    *f = &g_kernel_token;
    return 0;
}

/* kernels.cu's stk_convert_kernel(stk__convert cv, const uint8_t *src,
 * void *dst, uint64_t total), one (block, thread) at a time. */
EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shmem, void *s, void **params,
                               void **extra)
{
    (void)s;
    NEED_CTX();
    FAIL_IF("cuLaunchKernel");
    if (f != &g_kernel_token || gy != 1 || gz != 1 || by != 1 || bz != 1 || shmem || extra || !gx ||
        !bx || bx > 1024 || gx > 2147483647u)
        return INVALID_VALUE;
    const stk__convert *cv = params[0];
    const uint8_t *src = (const uint8_t *)(uintptr_t) * (const CUdeviceptr *)params[1];
    void *dst = (void *)(uintptr_t) * (const CUdeviceptr *)params[2];
    uint64_t total = *(const uint64_t *)params[3];
    uint64_t stride = (uint64_t)bx * gx;
    for (uint64_t t = 0; t < stride && t < total; t++)
        for (uint64_t i = t; i < total; i += stride)
            stk__convert_element(cv, src, dst, (size_t)i);
    atomic_fetch_add(&g_launches, 1);
    return 0;
}

EXPORT CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = r == ILLEGAL_ADDRESS ? "an illegal memory access was encountered (mock)" : "mock error";
    return 0;
}
