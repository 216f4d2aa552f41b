/*
 * cuda.c -- the CUDA backend (backend.h) over the CUDA driver API, loaded at
 * run time with dlopen("libcuda.so.1").
 *
 * Why the driver API and not the runtime (libcudart): libcuda.so.1 is what
 * any machine with an NVIDIA driver has, its ABI has been stable since CUDA
 * 4 (the _v2 entry points named below), so nothing here is tied to one
 * toolkit's libcudart.so.N, and the library links and loads on machines with
 * no CUDA at all. The device's primary context is the one the CUDA runtime
 * (and so PyTorch) uses, so streams, events and memory are shared with a
 * PyTorch process without any conversion: a torch stream's cuda_stream is a
 * CUstream here.
 *
 * The conversion kernel (kernels.cu, from ops/convert.h) is compiled by nvcc
 * at build time into a fatbin (SASS for a range of architectures plus PTX
 * for later ones) that the build links in as bytes (kernels_blob.S); it is
 * loaded with cuModuleLoadData when a device is opened. A build without nvcc
 * has no kernels: uint8 output (no conversion) still works on a GPU, and a
 * float dtype with device="cuda" is refused at open with a message saying so.
 */
#include "device/backend.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS_             0
#define CUDA_ERROR_NOT_READY_     600
#define CU_STREAM_NON_BLOCKING_   0x1
#define CU_EVENT_DISABLE_TIMING_  0x2
#define CU_MEMHOSTALLOC_PORTABLE_ 0x1

#ifdef STK_HAVE_CUDA_KERNELS
/* kernels_blob.S */
extern const unsigned char stk__cuda_fatbin[];
extern const uint64_t stk__cuda_fatbin_size;
#endif

int stk__cuda_have_kernels(void)
{
#ifdef STK_HAVE_CUDA_KERNELS
    return 1;
#else
    return 0;
#endif
}

/* The entry points used, with the names libcuda exports them under. */
#define CU_FUNCS(X)                                                                                \
    X(cuInit, "cuInit", CUresult (*)(unsigned))                                                    \
    X(cuDeviceGetCount, "cuDeviceGetCount", CUresult (*)(int *))                                   \
    X(cuDeviceGet, "cuDeviceGet", CUresult (*)(CUdevice *, int))                                   \
    X(cuDeviceGetName, "cuDeviceGetName", CUresult (*)(char *, int, CUdevice))                     \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult (*)(CUcontext *, CUdevice))   \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult (*)(CUdevice))           \
    X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", CUresult (*)(CUcontext))                            \
    X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", CUresult (*)(CUcontext *))                            \
    X(cuMemHostAlloc, "cuMemHostAlloc", CUresult (*)(void **, size_t, unsigned))                   \
    X(cuMemFreeHost, "cuMemFreeHost", CUresult (*)(void *))                                        \
    X(cuMemAlloc, "cuMemAlloc_v2", CUresult (*)(CUdeviceptr *, size_t))                            \
    X(cuMemFree, "cuMemFree_v2", CUresult (*)(CUdeviceptr))                                        \
    X(cuStreamCreate, "cuStreamCreate", CUresult (*)(CUstream *, unsigned))                        \
    X(cuStreamDestroy, "cuStreamDestroy_v2", CUresult (*)(CUstream))                               \
    X(cuEventCreate, "cuEventCreate", CUresult (*)(CUevent *, unsigned))                           \
    X(cuEventDestroy, "cuEventDestroy_v2", CUresult (*)(CUevent))                                  \
    X(cuEventRecord, "cuEventRecord", CUresult (*)(CUevent, CUstream))                             \
    X(cuEventQuery, "cuEventQuery", CUresult (*)(CUevent))                                         \
    X(cuEventSynchronize, "cuEventSynchronize", CUresult (*)(CUevent))                             \
    X(cuStreamWaitEvent, "cuStreamWaitEvent", CUresult (*)(CUstream, CUevent, unsigned))           \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                                                   \
      CUresult (*)(CUdeviceptr, const void *, size_t, CUstream))                                   \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", CUresult (*)(void *, CUdeviceptr, size_t))                  \
    X(cuModuleLoadData, "cuModuleLoadData", CUresult (*)(CUmodule *, const void *))                \
    X(cuModuleUnload, "cuModuleUnload", CUresult (*)(CUmodule))                                    \
    X(cuModuleGetFunction, "cuModuleGetFunction",                                                  \
      CUresult (*)(CUfunction *, CUmodule, const char *))                                          \
    X(cuLaunchKernel, "cuLaunchKernel",                                                            \
      CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,         \
                   unsigned, CUstream, void **, void **))                                          \
    X(cuGetErrorString, "cuGetErrorString", CUresult (*)(CUresult, const char **))

typedef struct cuapi {
#define X(field, sym, type) __typeof__(type) field;
    CU_FUNCS(X)
#undef X
} cuapi;

typedef struct cudev {
    stk__dev base;
    void *lib;
    cuapi f;
    CUdevice dev;
    CUcontext ctx;
    bool ctx_retained;
    CUmodule mod;
    CUfunction kernel;
} cudev;

static void cu_err(const cudev *c, CUresult r, const char *call, char *err, size_t errlen)
{
    const char *s = NULL;
    if (c->f.cuGetErrorString)
        c->f.cuGetErrorString(r, &s);
    stk__fmt(err, errlen, "%s: CUDA error %d (%s)", call, r, s ? s : "unknown");
}

static void c_enter(stk__dev *d)
{
    cudev *c = (cudev *)d;
    c->f.cuCtxPushCurrent(c->ctx);
}

static void c_leave(stk__dev *d)
{
    cudev *c = (cudev *)d;
    CUcontext old;
    c->f.cuCtxPopCurrent(&old);
}

/* Every call runs with the device's primary context current (pushed and
 * popped around it, so the caller's own current context is left alone:
 * a push of the context already current costs next to nothing). */
#define CU_CALL(c, call, args, err, errlen)                                                        \
    do {                                                                                           \
        c_enter(&(c)->base);                                                                       \
        CUresult r_ = (c)->f.call args;                                                            \
        c_leave(&(c)->base);                                                                       \
        if (r_ != CUDA_SUCCESS_) {                                                                 \
            cu_err((c), r_, #call, (err), (errlen));                                               \
            return STK_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)

/* A call whose failure has no one to report to (frees, destroys). */
#define CU_QUIET(c, call, args)                                                                    \
    do {                                                                                           \
        c_enter(&(c)->base);                                                                       \
        (void)(c)->f.call args;                                                                    \
        c_leave(&(c)->base);                                                                       \
    } while (0)

static int c_host_alloc(stk__dev *d, size_t n, void **out, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    *out = NULL;
    CU_CALL(c, cuMemHostAlloc, (out, n ? n : 1, CU_MEMHOSTALLOC_PORTABLE_), err, errlen);
    return STK_OK;
}

static void c_host_free(stk__dev *d, void *p)
{
    cudev *c = (cudev *)d;
    if (p)
        CU_QUIET(c, cuMemFreeHost, (p));
}

static int c_dev_alloc(stk__dev *d, size_t n, stk__dptr *out, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    CUdeviceptr p = 0;
    CU_CALL(c, cuMemAlloc, (&p, n ? n : 1), err, errlen);
    *out = p;
    return STK_OK;
}

static void c_dev_free(stk__dev *d, stk__dptr p)
{
    cudev *c = (cudev *)d;
    CU_QUIET(c, cuMemFree, (p));
}

static int c_stream_create(stk__dev *d, stk__stream *out, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    CUstream s = NULL;
    CU_CALL(c, cuStreamCreate, (&s, CU_STREAM_NON_BLOCKING_), err, errlen);
    *out = s;
    return STK_OK;
}

static void c_stream_destroy(stk__dev *d, stk__stream s)
{
    cudev *c = (cudev *)d;
    CU_QUIET(c, cuStreamDestroy, (s));
}

static int c_event_create(stk__dev *d, stk__event *out, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    CUevent e = NULL;
    CU_CALL(c, cuEventCreate, (&e, CU_EVENT_DISABLE_TIMING_), err, errlen);
    *out = e;
    return STK_OK;
}

static void c_event_destroy(stk__dev *d, stk__event e)
{
    cudev *c = (cudev *)d;
    CU_QUIET(c, cuEventDestroy, (e));
}

static int c_copy(stk__dev *d, stk__dptr dst, const void *src, size_t n, stk__stream s, char *err,
                  size_t errlen)
{
    cudev *c = (cudev *)d;
    CU_CALL(c, cuMemcpyHtoDAsync, (dst, src, n, s), err, errlen);
    return STK_OK;
}

static int c_copy_d2h(stk__dev *d, void *dst, stk__dptr src, size_t n, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    CU_CALL(c, cuMemcpyDtoH, (dst, src, n), err, errlen);
    return STK_OK;
}

#define THREADS_PER_BLOCK 256u

static int c_convert(stk__dev *d, const stk__convert *cv, stk__dptr src, stk__dptr dst, size_t n,
                     stk__stream s, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    if (!c->kernel) {
        stk__fmt(err, errlen,
                 "this build of stoker has no CUDA kernels (nvcc was not found "
                 "when it was built)");
        return STK_EUNSUPPORTED;
    }
    stk__convert arg = *cv;
    CUdeviceptr a = src, b = dst;
    uint64_t total = (uint64_t)n * cv->h * cv->w * 3;
    /* A grid-stride loop: enough blocks to fill any GPU, capped so the
     * grid's x dimension is always valid. */
    uint64_t blocks = (total + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK;
    if (blocks > 65535u * 16u)
        blocks = 65535u * 16u;
    void *params[] = {&arg, &a, &b, &total};
    CU_CALL(c, cuLaunchKernel,
            (c->kernel, (unsigned)blocks, 1, 1, THREADS_PER_BLOCK, 1, 1, 0, s, params, NULL), err,
            errlen);
    return STK_OK;
}

static int c_event_record(stk__dev *d, stk__event e, stk__stream s, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    CU_CALL(c, cuEventRecord, (e, s), err, errlen);
    return STK_OK;
}

static int c_event_query(stk__dev *d, stk__event e, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    c_enter(d);
    CUresult r = c->f.cuEventQuery(e);
    c_leave(d);
    if (r == CUDA_SUCCESS_)
        return STK_OK;
    if (r == CUDA_ERROR_NOT_READY_)
        return 1;
    cu_err(c, r, "cuEventQuery", err, errlen);
    return STK_EDEVICE;
}

static int c_event_sync(stk__dev *d, stk__event e, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    CU_CALL(c, cuEventSynchronize, (e), err, errlen);
    return STK_OK;
}

static int c_stream_wait(stk__dev *d, stk__stream s, stk__event e, char *err, size_t errlen)
{
    cudev *c = (cudev *)d;
    CU_CALL(c, cuStreamWaitEvent, (s, e, 0), err, errlen);
    return STK_OK;
}

static void c_close(stk__dev *d)
{
    cudev *c = (cudev *)d;
    if (c->mod)
        CU_QUIET(c, cuModuleUnload, (c->mod));
    if (c->ctx_retained)
        c->f.cuDevicePrimaryCtxRelease(c->dev);
    if (c->lib)
        dlclose(c->lib);
    stk__free(c);
}

static const stk__dev_ops cuda_ops = {
    .name = "cuda",
    .host_alloc = c_host_alloc,
    .host_free = c_host_free,
    .dev_alloc = c_dev_alloc,
    .dev_free = c_dev_free,
    .stream_create = c_stream_create,
    .stream_destroy = c_stream_destroy,
    .event_create = c_event_create,
    .event_destroy = c_event_destroy,
    .copy_h2d = c_copy,
    .copy_d2h = c_copy_d2h,
    .convert = c_convert,
    .event_record = c_event_record,
    .event_query = c_event_query,
    .event_sync = c_event_sync,
    .stream_wait_event = c_stream_wait,
    .enter = c_enter,
    .leave = c_leave,
    .close = c_close,
};

/* The library's file name: STOKER_LIBCUDA overrides it (tests point it at a
 * library that is not CUDA to check the failure path). */
static const char *libcuda_name(void)
{
    const char *env = getenv("STOKER_LIBCUDA");
    return env && *env ? env : "libcuda.so.1";
}

int stk__dev_open_cuda(stk__dev **out, int id, char *err, size_t errlen)
{
    *out = NULL;
    cudev *c = stk__calloc(1, sizeof *c);
    if (!c) {
        stk__fmt(err, errlen, "out of memory opening CUDA");
        return STK_ENOMEM;
    }
    c->base.ops = &cuda_ops;
    c->base.id = id;
    c->base.kind = STK_DEVICE_CUDA;
    int rc = STK_EUNSUPPORTED;
    const char *name = libcuda_name();
    c->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!c->lib) {
        const char *why = dlerror();
        stk__fmt(err, errlen,
                 "device \"cuda:%d\": cannot load the CUDA driver (%s: %s); is an NVIDIA "
                 "driver installed and a GPU present?",
                 id, name, why ? why : "not found");
        goto fail;
    }
#define X(field, sym, type)                                                                        \
    {                                                                                              \
        void *p_ = dlsym(c->lib, sym);                                                             \
        if (!p_) {                                                                                 \
            stk__fmt(err, errlen, "device \"cuda:%d\": %s has no %s: the driver is too old", id,   \
                     name, sym);                                                                   \
            goto fail;                                                                             \
        }                                                                                          \
        memcpy(&c->f.field, &p_, sizeof p_);                                                       \
    }
    CU_FUNCS(X)
#undef X
    CUresult r = c->f.cuInit(0);
    if (r != CUDA_SUCCESS_) {
        cu_err(c, r, "cuInit", err, errlen);
        stk__fmt(err + strlen(err), errlen - strlen(err), " (device \"cuda:%d\": no usable GPU)",
                 id);
        goto fail;
    }
    int count = 0;
    if ((r = c->f.cuDeviceGetCount(&count)) != CUDA_SUCCESS_ || id < 0 || id >= count) {
        stk__fmt(err, errlen, "device \"cuda:%d\": this machine has %d CUDA device(s)", id, count);
        goto fail;
    }
    rc = STK_EDEVICE;
    if ((r = c->f.cuDeviceGet(&c->dev, id)) != CUDA_SUCCESS_) {
        cu_err(c, r, "cuDeviceGet", err, errlen);
        goto fail;
    }
    if ((r = c->f.cuDevicePrimaryCtxRetain(&c->ctx, c->dev)) != CUDA_SUCCESS_) {
        cu_err(c, r, "cuDevicePrimaryCtxRetain", err, errlen);
        goto fail;
    }
    c->ctx_retained = true;
#ifdef STK_HAVE_CUDA_KERNELS
    c_enter(&c->base);
    r = c->f.cuModuleLoadData(&c->mod, stk__cuda_fatbin);
    if (r == CUDA_SUCCESS_)
        r = c->f.cuModuleGetFunction(&c->kernel, c->mod, "stk_convert_kernel");
    c_leave(&c->base);
    if (r != CUDA_SUCCESS_) {
        /* No kernel for this GPU (too new for the SASS and the PTX, or too
         * old): copies still work, conversions are refused at open. */
        c->kernel = NULL;
    }
#endif
    *out = &c->base;
    return STK_OK;
fail:
    c_close(&c->base);
    return rc;
}

int stk__cuda_device_has_kernel(const stk__dev *d)
{
    return d->kind == STK_DEVICE_CUDA && ((const cudev *)d)->kernel != NULL;
}
