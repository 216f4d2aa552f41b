/*
 * _stoker.c -- the CPython extension under the stoker package: a thin, zero-
 * copy wrapper of libstoker's C API (include/stoker.h).
 *
 * Three types:
 *   Engine  one stk_loader. Its methods take the GIL off while C works or
 *           waits; next() waits in short slices and checks for signals
 *           between them, so Ctrl-C stops a blocked iteration promptly.
 *   Batch   owns one delivered stk_batch. stk_batch_release() runs in its
 *           dealloc, that is only once no Python object references it.
 *   View    one array inside a batch (the dense data, one variable-size
 *           sample, the labels, the indices). It keeps its Batch alive and
 *           exports the memory through the buffer protocol (NumPy) and through
 *           DLPack (torch), both without copying.
 *
 * Ownership chain: numpy array -> memoryview -> View -> Batch -> ring buffer;
 * torch tensor -> DLManagedTensor -> View -> Batch -> ring buffer. The ring
 * buffer returns to the loader when the last link goes.
 *
 * Threads: the C API forbids concurrent consumer calls on one loader, and
 * next() runs without the GIL, so each Engine has its own lock that every
 * method takes (waiting without the GIL). stk_batch_release() needs no lock:
 * the library allows it from any thread at any time.
 *
 * Fork: the loader's threads do not exist in a forked child and its locks may
 * be held there. The library answers STK_EMISUSE to a child without touching
 * its locks; the Engine checks the pid before its own lock for the same
 * reason, and a Batch inherited by a child is never released by the child
 * (its parent owns the ring).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include "stoker.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* ---- DLPack --------------------------------------------------------------
 * The unversioned ABI (DLPack 0.6/0.7) that torch 1.13 consumes: a PyCapsule
 * named "dltensor" holding a DLManagedTensor; the consumer renames it
 * "used_dltensor" and calls the deleter when its tensor dies. Written from
 * the DLPack specification. */
enum { kDLCPU = 1, kDLCUDA = 2 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };

typedef struct {
    int32_t device_type; /* DLDeviceType, an int-sized enum in dlpack.h */
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* ---- element types of views --------------------------------------------- */
enum vtype {
    VT_UINT8,
    VT_FLOAT32,
    VT_FLOAT16,
    VT_BFLOAT16,
    VT_INT64,
    VT_UINT64,
    /* Fields' scalars and .npy arrays (stk_field): */
    VT_FLOAT64,
    VT_INT8,
    VT_INT16,
    VT_INT32,
    VT_UINT16,
    VT_UINT32,
    VT_BOOL,
    VT_COUNT
};

static const struct {
    const char *name;
    const char *format; /* struct-module format for the buffer protocol */
    Py_ssize_t itemsize;
    DLDataType dl;
} k_vtypes[VT_COUNT] = {
    {"uint8", "B", 1, {kDLUInt, 8, 1}},     {"float32", "f", 4, {kDLFloat, 32, 1}},
    {"float16", "e", 2, {kDLFloat, 16, 1}}, {"bfloat16", NULL, 2, {kDLBfloat, 16, 1}},
    {"int64", "q", 8, {kDLInt, 64, 1}},     {"uint64", "Q", 8, {kDLUInt, 64, 1}},
    {"float64", "d", 8, {kDLFloat, 64, 1}}, {"int8", "b", 1, {kDLInt, 8, 1}},
    {"int16", "h", 2, {kDLInt, 16, 1}},     {"int32", "i", 4, {kDLInt, 32, 1}},
    {"uint16", "H", 2, {kDLUInt, 16, 1}},   {"uint32", "I", 4, {kDLUInt, 32, 1}},
    {"bool", "?", 1, {kDLBool, 8, 1}},
};

static int vtype_of_dtype(int dtype)
{
    switch (dtype) {
    case STK_DTYPE_FLOAT32: return VT_FLOAT32;
    case STK_DTYPE_FLOAT16: return VT_FLOAT16;
    case STK_DTYPE_BFLOAT16: return VT_BFLOAT16;
    case STK_DTYPE_INT64: return VT_INT64;
    case STK_DTYPE_FLOAT64: return VT_FLOAT64;
    case STK_DTYPE_INT8: return VT_INT8;
    case STK_DTYPE_INT16: return VT_INT16;
    case STK_DTYPE_INT32: return VT_INT32;
    case STK_DTYPE_UINT16: return VT_UINT16;
    case STK_DTYPE_UINT32: return VT_UINT32;
    case STK_DTYPE_UINT64: return VT_UINT64;
    case STK_DTYPE_BOOL: return VT_BOOL;
    default: return VT_UINT8;
    }
}

/* A batch of .npy arrays stacked: the batch dim plus STK_FIELD_MAXDIM. */
#define MAX_NDIM (STK_FIELD_MAXDIM + 1)

/* ---- module state: exception types -------------------------------------- */
static PyObject *g_Error;       /* stoker.Error(RuntimeError) */
static PyObject *g_SampleError; /* stoker.SampleError(stoker.Error) */
static PyObject *g_Warning;     /* stoker.StokerWarning(RuntimeWarning) */

/* A code's name as Python shows it: the library's (stk_errname) without the
 * C prefix, STK_EIO -> "EIO". */
static const char *code_name(int code)
{
    const char *name = stk_errname(code);
    return name ? name + strlen("STK_") : "?";
}

/* Raises the exception for a library error: message = the handle's detailed
 * message (or the code's text), type by code. Every stoker exception carries
 * .code (the STK_E* number) and .code_name. Returns NULL for convenience. */
static PyObject *raise_code(int code, const char *msg)
{
    PyObject *type;
    switch (code) {
    case STK_EINVAL: type = PyExc_ValueError; break;
    case STK_ENOENT: type = PyExc_FileNotFoundError; break;
    case STK_ENOMEM: type = PyExc_MemoryError; break;
    case STK_ESAMPLE: type = g_SampleError; break;
    default: type = g_Error; break;
    }
    char text[1024];
    if (msg && *msg)
        snprintf(text, sizeof text, "%s [%s]", msg, stk_strerror(code));
    else
        snprintf(text, sizeof text, "%s", stk_strerror(code));
    /* Messages hold file names (any bytes) and may be cut mid-character:
     * decode leniently, so the error raised is always the stoker one. */
    PyObject *str = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    PyObject *exc = str ? PyObject_CallOneArg(type, str) : NULL;
    Py_XDECREF(str);
    if (!exc)
        return NULL;
    /* Builtin exceptions take attributes too; failures here only lose the
     * extra fields, never the error itself. */
    PyObject *c = PyLong_FromLong(code), *cn = PyUnicode_FromString(code_name(code));
    if (!c || !cn || PyObject_SetAttrString(exc, "code", c) < 0 ||
        PyObject_SetAttrString(exc, "code_name", cn) < 0)
        PyErr_Clear();
    Py_XDECREF(c);
    Py_XDECREF(cn);
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* ---- Batch ---------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    stk_batch *b;
    pid_t pid;          /* the process that holds the batch */
    void *stream;       /* device batches: the consumer's stream (the last one
                           given to __dlpack__), where the release is recorded;
                           streams added with record_stream() are recorded too */
    PyObject *weakrefs; /* Loader.record_stream finds a batch by address */
} BatchObject;

static PyTypeObject Batch_Type;

static void Batch_dealloc(BatchObject *self)
{
    /* A child inherits a copy of the ring and none of its threads; the
     * parent's copy is the real one, so the child leaves it alone. A device
     * batch's memory is reused only after the work queued so far on the
     * stream that consumed it (PyTorch frees a tensor when Python drops it,
     * with its kernels possibly still queued). */
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->b && self->pid == getpid())
        (void)stk_batch_release_stream(self->b, self->stream);
    self->b = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- View ----------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    PyObject *owner; /* the Batch whose memory this is */
    int on_device;   /* the batch's data on its device (not labels) */
    char *ptr;
    int vt;
    int ndim;
    Py_ssize_t shape[MAX_NDIM];
    Py_ssize_t strides[MAX_NDIM]; /* bytes, C-contiguous */
    int exports;                  /* live buffer-protocol exports */
} ViewObject;

static PyTypeObject View_Type;

static PyObject *view_new(PyObject *owner, void *ptr, int vt, int ndim, const int64_t *shape)
{
    ViewObject *v = PyObject_New(ViewObject, &View_Type);
    if (!v)
        return NULL;
    Py_INCREF(owner);
    v->owner = owner;
    v->on_device = 0;
    v->ptr = ptr;
    v->vt = vt;
    v->ndim = ndim;
    v->exports = 0;
    Py_ssize_t stride = k_vtypes[vt].itemsize;
    for (int k = ndim - 1; k >= 0; k--) {
        v->shape[k] = (Py_ssize_t)shape[k];
        v->strides[k] = stride;
        stride *= v->shape[k];
    }
    return (PyObject *)v;
}

static void View_dealloc(ViewObject *self)
{
    Py_XDECREF(self->owner);
    PyObject_Free(self);
}

static stk_batch *view_batch(const ViewObject *self)
{
    return ((BatchObject *)self->owner)->b;
}

static PyObject *device_error(const stk_batch *b, int rc)
{
    char msg[256];
    snprintf(msg, sizeof msg,
             "batch %llu of epoch %llu: the device copy or conversion failed (%s); the "
             "loader's next call names the cause",
             (unsigned long long)b->index, (unsigned long long)b->epoch, stk_strerror(rc));
    return raise_code(rc, msg);
}

/* The host waits for a device batch's data (the fake device, whose memory
 * the host reads). */
static int view_sync(ViewObject *self)
{
    stk_batch *b = view_batch(self);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = stk_batch_sync(b);
    Py_END_ALLOW_THREADS
    if (rc) {
        device_error(b, rc);
        return -1;
    }
    return 0;
}

static int View_getbuffer(ViewObject *self, Py_buffer *view, int flags)
{
    if (self->on_device) {
        if (view_batch(self)->device == STK_DEVICE_CUDA) {
            PyErr_SetString(PyExc_BufferError,
                            "this batch is in CUDA device memory: take it through DLPack "
                            "(output=\"torch\"), not the buffer protocol");
            view->obj = NULL;
            return -1;
        }
        if (view_sync(self) < 0) {
            view->obj = NULL;
            return -1;
        }
    }
    const char *fmt = k_vtypes[self->vt].format;
    if (!fmt) {
        PyErr_SetString(PyExc_BufferError,
                        "NumPy has no bfloat16 type: use output=\"torch\", or dtype "
                        "\"float16\"/\"float32\"");
        view->obj = NULL;
        return -1;
    }
    Py_ssize_t len = k_vtypes[self->vt].itemsize;
    int dims_over_one = 0;
    for (int k = 0; k < self->ndim; k++) {
        len *= self->shape[k];
        dims_over_one += self->shape[k] > 1;
    }
    /* The memory is C-ordered: a consumer that needs Fortran order is served
     * only when the two coincide (at most one dimension over 1). */
    if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && dims_over_one > 1) {
        PyErr_SetString(PyExc_BufferError, "stoker batches are C-contiguous, not Fortran");
        view->obj = NULL;
        return -1;
    }
    view->buf = self->ptr;
    view->obj = (PyObject *)self;
    Py_INCREF(self);
    view->len = len;
    view->readonly = 0;
    view->itemsize = k_vtypes[self->vt].itemsize;
    /* The buffer protocol's char* fields predate const; consumers only read
     * format, shape and strides. */
    view->format = (flags & PyBUF_FORMAT) ? (char *)(uintptr_t)fmt : NULL;
    view->ndim = self->ndim;
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? self->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    self->exports++;
    return 0;
}

static void View_releasebuffer(ViewObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

static PyBufferProcs View_as_buffer = {
    (getbufferproc)View_getbuffer,
    (releasebufferproc)View_releasebuffer,
};

/* The DLManagedTensor and its shape/strides in one allocation; manager_ctx is
 * a strong reference to the View, dropped by the deleter. */
typedef struct {
    DLManagedTensor mt;
    int64_t shape[MAX_NDIM];
    int64_t strides[MAX_NDIM];
} dl_block;

static void dl_deleter(DLManagedTensor *mt)
{
    /* The consumer may free its tensor on any thread, with or without the
     * GIL. After interpreter shutdown the reference is simply dropped: the
     * process is ending and the ring is freed with it. */
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_XDECREF((PyObject *)mt->manager_ctx);
        PyGILState_Release(g);
    }
    free(mt);
}

static void dl_capsule_destructor(PyObject *cap)
{
    /* Only a capsule nobody consumed still has its original name; a consumer
     * renames it and owns the tensor from then on. */
    if (!PyCapsule_IsValid(cap, "dltensor"))
        return;
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (mt && mt->deleter)
        mt->deleter(mt);
}

static PyObject *View_dlpack(ViewObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$O:__dlpack__", kwlist, &stream))
        return NULL;
    stk_batch *b = view_batch(self);
    int cuda = self->on_device && b->device == STK_DEVICE_CUDA;
    if (cuda) {
        /* The DLPack stream protocol for CUDA: None or 1 is the legacy
         * default stream, 2 the per-thread default, any other integer a
         * cudaStream_t; -1 asks for no synchronisation. The consumer's
         * stream waits on the device for the batch's copy; the batch is
         * released on it later. */
        long long sv = 1;
        if (stream != Py_None) {
            sv = PyLong_AsLongLong(stream);
            if (sv == -1 && PyErr_Occurred())
                return NULL;
            if (sv == 0 || sv < -1) {
                PyErr_Format(PyExc_ValueError,
                             "__dlpack__: stream %lld is not a CUDA stream (None, -1, 1, 2 or a "
                             "cudaStream_t)",
                             sv);
                return NULL;
            }
        }
        if (sv != -1) {
            void *st = (void *)(uintptr_t)sv;
            int rc = stk_batch_wait(b, st);
            if (rc)
                return device_error(b, rc);
            ((BatchObject *)self->owner)->stream = st;
        }
    } else {
        if (stream != Py_None && !(PyLong_Check(stream) && PyLong_AsLong(stream) == -1)) {
            PyErr_SetString(PyExc_BufferError,
                            "stoker batches are in CPU memory: stream must be None");
            return NULL;
        }
        if (self->on_device && view_sync(self) < 0)
            return NULL;
    }
    dl_block *blk = calloc(1, sizeof *blk);
    if (!blk)
        return PyErr_NoMemory();
    int64_t isz = k_vtypes[self->vt].itemsize;
    for (int k = 0; k < self->ndim; k++) {
        blk->shape[k] = (int64_t)self->shape[k];
        blk->strides[k] = (int64_t)self->strides[k] / isz;
    }
    DLTensor *t = &blk->mt.dl_tensor;
    t->data = self->ptr;
    t->device.device_type = cuda ? kDLCUDA : kDLCPU;
    t->device.device_id = cuda ? b->device_id : 0;
    t->ndim = self->ndim;
    t->dtype = k_vtypes[self->vt].dl;
    t->shape = blk->shape;
    t->strides = blk->strides;
    t->byte_offset = 0;
    blk->mt.manager_ctx = self;
    blk->mt.deleter = dl_deleter;
    Py_INCREF(self);
    PyObject *cap = PyCapsule_New(&blk->mt, "dltensor", dl_capsule_destructor);
    if (!cap) {
        Py_DECREF(self);
        free(blk);
    }
    return cap;
}

static PyObject *View_dlpack_device(ViewObject *self, PyObject *unused)
{
    (void)unused;
    const stk_batch *b = view_batch(self);
    if (self->on_device && b->device == STK_DEVICE_CUDA)
        return Py_BuildValue("(ii)", kDLCUDA, b->device_id);
    return Py_BuildValue("(ii)", kDLCPU, 0);
}

static PyObject *View_get_shape(ViewObject *self, void *closure)
{
    (void)closure;
    PyObject *t = PyTuple_New(self->ndim);
    if (!t)
        return NULL;
    for (int k = 0; k < self->ndim; k++) {
        PyObject *n = PyLong_FromSsize_t(self->shape[k]);
        if (!n) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, k, n);
    }
    return t;
}

static PyObject *View_get_dtype(ViewObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(k_vtypes[self->vt].name);
}

static PyObject *View_get_address(ViewObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(self->ptr);
}

static PyMethodDef View_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))View_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(stream=None): a DLPack capsule viewing this memory (no copy)."},
    {"__dlpack_device__", (PyCFunction)View_dlpack_device, METH_NOARGS,
     "(device_type, device_id): (kDLCPU, 0), or (kDLCUDA, id) for a CUDA batch."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef View_getset[] = {
    {"shape", (getter)View_get_shape, NULL, "shape in elements", NULL},
    {"dtype", (getter)View_get_dtype, NULL, "element type name", NULL},
    {"address", (getter)View_get_address, NULL, "address of the first element", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject View_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoker._stoker.View",
    .tp_basicsize = sizeof(ViewObject),
    .tp_dealloc = (destructor)View_dealloc,
    .tp_as_buffer = &View_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An array inside a batch: buffer protocol and DLPack, no copy.",
    .tp_methods = View_methods,
    .tp_getset = View_getset,
};

/* ---- Batch methods --------------------------------------------------------- */
static PyObject *Batch_data(BatchObject *self, PyObject *unused)
{
    (void)unused;
    const stk_batch *b = self->b;
    if (b->kind != STK_BATCH_DENSE) {
        PyErr_SetString(PyExc_TypeError, "a variable-size batch has no dense data; use samples()");
        return NULL;
    }
    int64_t shape[MAX_NDIM];
    unsigned nd = b->ndim > MAX_NDIM - 1 ? MAX_NDIM - 1 : b->ndim;
    shape[0] = (int64_t)b->size;
    for (unsigned k = 0; k < nd; k++)
        shape[k + 1] = b->shape[k];
    PyObject *v = view_new((PyObject *)self, b->data, vtype_of_dtype(b->dtype), (int)nd + 1, shape);
    if (v)
        ((ViewObject *)v)->on_device = b->device != STK_DEVICE_CPU;
    return v;
}

/* Per-sample views of a variable batch: (h, w, c) when the sample is a
 * decoded image whose dims match its length, else its raw bytes. */
static PyObject *Batch_samples(BatchObject *self, PyObject *unused)
{
    (void)unused;
    const stk_batch *b = self->b;
    PyObject *list = PyList_New((Py_ssize_t)b->size);
    if (!list)
        return NULL;
    for (size_t k = 0; k < b->size; k++) {
        PyObject *v;
        char *p = (char *)b->data + b->offsets[k];
        if (b->kind == STK_BATCH_DENSE) {
            int64_t shape[MAX_NDIM];
            unsigned nd = b->ndim > MAX_NDIM ? MAX_NDIM : b->ndim;
            for (unsigned d = 0; d < nd; d++)
                shape[d] = b->shape[d];
            v = view_new((PyObject *)self, (char *)b->data + k * b->sample_bytes,
                         vtype_of_dtype(b->dtype), (int)nd, shape);
            if (v)
                ((ViewObject *)v)->on_device = b->device != STK_DEVICE_CPU;
        } else {
            const int32_t *d = &b->dims[3 * k];
            uint64_t len = b->lengths[k];
            if (d[0] > 0 && d[1] > 0 && d[2] > 0 &&
                (uint64_t)d[0] * (uint64_t)d[1] * (uint64_t)d[2] == len) {
                int64_t shape[3] = {d[0], d[1], d[2]};
                v = view_new((PyObject *)self, p, VT_UINT8, 3, shape);
            } else {
                int64_t shape[1] = {(int64_t)len};
                v = view_new((PyObject *)self, p, VT_UINT8, 1, shape);
            }
        }
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)k, v);
    }
    return list;
}

static PyObject *Batch_labels(BatchObject *self, PyObject *unused)
{
    (void)unused;
    int64_t n = (int64_t)self->b->size;
    /* The labels array is the ring's own memory; the cast drops the const
     * the C API puts on it, and the view is read-write only because the
     * batch is the consumer's until it is released. */
    return view_new((PyObject *)self, (void *)(uintptr_t)self->b->labels, VT_INT64, 1, &n);
}

static PyObject *Batch_indices(BatchObject *self, PyObject *unused)
{
    (void)unused;
    int64_t n = (int64_t)self->b->size;
    return view_new((PyObject *)self, (void *)(uintptr_t)self->b->indices, VT_UINT64, 1, &n);
}

static PyObject *Batch_get(BatchObject *self, void *closure)
{
    const stk_batch *b = self->b;
    const char *what = closure;
    if (!strcmp(what, "epoch"))
        return PyLong_FromUnsignedLongLong(b->epoch);
    if (!strcmp(what, "index"))
        return PyLong_FromUnsignedLongLong(b->index);
    if (!strcmp(what, "size"))
        return PyLong_FromSize_t(b->size);
    if (!strcmp(what, "dense"))
        return PyBool_FromLong(b->kind == STK_BATCH_DENSE);
    if (!strcmp(what, "dtype"))
        return PyUnicode_FromString(k_vtypes[vtype_of_dtype(b->dtype)].name);
    if (!strcmp(what, "address"))
        return PyLong_FromVoidPtr(b->data);
    if (!strcmp(what, "nfields"))
        return PyLong_FromSize_t(b->nfields);
    if (!strcmp(what, "sample_shape")) {
        unsigned nd = b->kind == STK_BATCH_DENSE ? b->ndim : 0;
        PyObject *t = PyTuple_New((Py_ssize_t)nd);
        for (unsigned k = 0; t && k < nd; k++) {
            PyObject *n = PyLong_FromLongLong(b->shape[k]);
            if (!n) {
                Py_CLEAR(t);
                break;
            }
            PyTuple_SET_ITEM(t, (Py_ssize_t)k, n);
        }
        return t;
    }
    Py_RETURN_NONE;
}

/* record_stream(stream): for a device batch used on more than one stream.
 * The release is recorded on the stream given to __dlpack__ (the last one);
 * each stream added here is recorded too, and the batch's device memory is
 * reused only after the work queued on all of them up to the release has
 * run (stk_batch_record_stream). stream: a cudaStream_t as an int (0 or
 * None: the legacy default stream); None only for batches in host memory,
 * where it does nothing. */
static PyObject *Batch_record_stream(BatchObject *self, PyObject *arg)
{
    stk_batch *b = self->b;
    void *st = NULL;
    if (b->device == STK_DEVICE_CUDA) {
        if (arg != Py_None) {
            unsigned long long sv = PyLong_AsUnsignedLongLong(arg);
            if (sv == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError,
                             "record_stream: %R is not a CUDA stream (a cudaStream_t as an "
                             "int, or None for the default stream)",
                             arg);
                return NULL;
            }
            st = (void *)(uintptr_t)sv;
        }
    } else if (arg != Py_None) {
        PyErr_Format(PyExc_ValueError,
                     "record_stream: this batch is in %s memory, which no stream uses: stream "
                     "must be None",
                     b->device == STK_DEVICE_CPU ? "host" : "the fake device's (host)");
        return NULL;
    }
    if (self->pid != getpid())
        return raise_code(STK_EMISUSE, "record_stream: this batch belongs to the parent "
                                       "process; a forked child cannot use it");
    int rc = stk_batch_record_stream(b, st);
    if (rc == STK_EINVAL)
        return raise_code(rc, "record_stream: a batch can wait for at most "
                              "STK_BATCH_MAX_STREAMS (8) streams");
    if (rc)
        return raise_code(rc, "record_stream: the device could not record the stream");
    Py_RETURN_NONE;
}

/* ---- Batch fields (samples with several fields, docs/multimodal.md) --------
 * One method per way a field's column reaches Python; loader.py picks by the
 * field's kind. Every view holds the Batch, so the ring buffer stays the
 * consumer's while any of them lives. Lists are built here, one loop per
 * batch, so no per-sample Python code runs for a field. */

/* Field k of the batch, or NULL with IndexError. */
static const stk_field *batch_field(const BatchObject *self, PyObject *arg)
{
    Py_ssize_t k = PyLong_AsSsize_t(arg);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    if (k < 0 || (size_t)k >= self->b->nfields) {
        PyErr_Format(PyExc_IndexError, "batch field %zd out of range (the batch has %zu)", k,
                     self->b->nfields);
        return NULL;
    }
    return &self->b->fields[k];
}

static int field_absent(const stk_field *f, size_t s)
{
    return f->present && !f->present[s];
}

/* A view of sample s of a variable IMAGE or NPY field: its dtype and shape
 * from the column, when they account for exactly its bytes; else its bytes
 * (an image without a transform is its encoded file). */
static PyObject *field_sample_view(BatchObject *self, const stk_field *f, size_t s)
{
    char *p = (char *)f->data + f->offsets[s];
    uint64_t len = f->lengths[s];
    const int64_t *sh = f->shapes ? &f->shapes[s * (STK_FIELD_MAXDIM + 1)] : NULL;
    int vt = f->dtypes ? vtype_of_dtype(f->dtypes[s]) : VT_UINT8;
    if (sh && sh[0] > 0 && sh[0] <= STK_FIELD_MAXDIM) {
        uint64_t n = (uint64_t)k_vtypes[vt].itemsize;
        int ok = 1;
        for (int64_t d = 1; d <= sh[0]; d++) {
            if (sh[d] < 0 || (sh[d] && n > UINT64_MAX / (uint64_t)sh[d]))
                ok = 0;
            else
                n *= (uint64_t)sh[d];
        }
        if (ok && n == len)
            return view_new((PyObject *)self, p, vt, (int)sh[0], sh + 1);
    } else if (sh && sh[0] == 0 && f->kind == STK_FIELD_NPY &&
               len == (uint64_t)k_vtypes[vt].itemsize) {
        return view_new((PyObject *)self, p, vt, 0, sh); /* a 0-d array */
    }
    int64_t n1 = (int64_t)len;
    return view_new((PyObject *)self, p, VT_UINT8, 1, &n1);
}

/* Text as str, in one loop (the library checked it is UTF-8). */
static PyObject *field_text(const stk_field *f, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t s = 0; list && s < n; s++) {
        PyObject *v;
        if (field_absent(f, s)) {
            v = Py_None;
            Py_INCREF(v);
        } else {
            v = PyUnicode_DecodeUTF8((const char *)f->data + f->offsets[s],
                                     (Py_ssize_t)f->lengths[s], "strict");
        }
        if (!v)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)s, v);
    }
    return list;
}

static PyObject *field_bytes(const stk_field *f, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t s = 0; list && s < n; s++) {
        PyObject *v;
        if (field_absent(f, s)) {
            v = Py_None;
            Py_INCREF(v);
        } else {
            v = PyBytes_FromStringAndSize((const char *)f->data + f->offsets[s],
                                          (Py_ssize_t)f->lengths[s]);
        }
        if (!v)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)s, v);
    }
    return list;
}

/* The batch's JSON texts as one JSON array, "[a,b,null,...]" (null where an
 * optional field is absent), for one json.loads per batch. Each text is a
 * whole JSON value (the library checked), so the array is valid JSON. */
static PyObject *field_json(const stk_field *f, size_t n)
{
    size_t total = 2 + (n ? n - 1 : 0);
    for (size_t s = 0; s < n; s++)
        total += field_absent(f, s) ? 4 : (size_t)f->lengths[s];
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!out)
        return NULL;
    char *w = PyBytes_AS_STRING(out);
    *w++ = '[';
    for (size_t s = 0; s < n; s++) {
        if (s)
            *w++ = ',';
        if (field_absent(f, s)) {
            memcpy(w, "null", 4);
            w += 4;
        } else {
            memcpy(w, (const char *)f->data + f->offsets[s], (size_t)f->lengths[s]);
            w += f->lengths[s];
        }
    }
    *w = ']';
    return out;
}

/* field(k): field k's values. Dense: a View (size, *shape); TEXT: a list of
 * str; JSON: bytes of one JSON array of the batch's values; BYTES: a list
 * of bytes; variable IMAGE and NPY: a list of Views. None where an optional
 * field is absent. */
static PyObject *Batch_field(BatchObject *self, PyObject *arg)
{
    const stk_field *f = batch_field(self, arg);
    if (!f)
        return NULL;
    size_t n = self->b->size;
    if (f->layout == STK_BATCH_DENSE) {
        int64_t shape[MAX_NDIM];
        unsigned nd = f->ndim > MAX_NDIM - 1 ? MAX_NDIM - 1 : f->ndim;
        shape[0] = (int64_t)n;
        for (unsigned d = 0; d < nd; d++)
            shape[d + 1] = f->shape[d];
        PyObject *v =
            view_new((PyObject *)self, f->data, vtype_of_dtype(f->dtype), (int)nd + 1, shape);
        if (v)
            ((ViewObject *)v)->on_device = f->device != STK_DEVICE_CPU;
        return v;
    }
    switch (f->kind) {
    case STK_FIELD_TEXT: return field_text(f, n);
    case STK_FIELD_JSON: return field_json(f, n);
    case STK_FIELD_IMAGE:
    case STK_FIELD_NPY: break;
    default: return field_bytes(f, n);
    }
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t s = 0; list && s < n; s++) {
        PyObject *v;
        if (field_absent(f, s)) {
            v = Py_None;
            Py_INCREF(v);
        } else {
            v = field_sample_view(self, f, s);
        }
        if (!v)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)s, v);
    }
    return list;
}

/* field_info(k) -> {"name", "source", "kind", "dense", "optional"}. */
static PyObject *Batch_field_info(BatchObject *self, PyObject *arg)
{
    const stk_field *f = batch_field(self, arg);
    if (!f)
        return NULL;
    const char *kind = stk_field_kind_name(f->kind);
    return Py_BuildValue("{s:s,s:s,s:s,s:O,s:O}", "name", f->name, "source",
                         f->source ? f->source : "", "kind", kind ? kind : "?", "dense",
                         f->layout == STK_BATCH_DENSE ? Py_True : Py_False, "optional",
                         f->present ? Py_True : Py_False);
}

/* field_present(k): a uint8 View (size,), 1 where the sample has the
 * field; None for a field that is not optional. */
static PyObject *Batch_field_present(BatchObject *self, PyObject *arg)
{
    const stk_field *f = batch_field(self, arg);
    if (!f)
        return NULL;
    if (!f->present)
        Py_RETURN_NONE;
    int64_t n = (int64_t)self->b->size;
    return view_new((PyObject *)self, (void *)(uintptr_t)f->present, VT_UINT8, 1, &n);
}

/* field_ragged(k) -> (data, offsets, lengths): a variable field's bytes with
 * no copy: sample s is data[offsets[s] : offsets[s] + lengths[s]]; data is a
 * uint8 View that ends at the field's last byte, offsets and lengths uint64
 * Views (size,). */
static PyObject *Batch_field_ragged(BatchObject *self, PyObject *arg)
{
    const stk_field *f = batch_field(self, arg);
    if (!f)
        return NULL;
    if (f->layout == STK_BATCH_DENSE) {
        PyErr_Format(PyExc_TypeError, "field '%s' is dense: it has no offsets", f->name);
        return NULL;
    }
    int64_t n = (int64_t)self->b->size, end = 0;
    for (int64_t s = 0; s < n; s++)
        if ((int64_t)(f->offsets[s] + f->lengths[s]) > end)
            end = (int64_t)(f->offsets[s] + f->lengths[s]);
    PyObject *d = view_new((PyObject *)self, f->data, VT_UINT8, 1, &end);
    PyObject *o = view_new((PyObject *)self, (void *)(uintptr_t)f->offsets, VT_UINT64, 1, &n);
    PyObject *l = view_new((PyObject *)self, (void *)(uintptr_t)f->lengths, VT_UINT64, 1, &n);
    PyObject *t = d && o && l ? PyTuple_Pack(3, d, o, l) : NULL;
    Py_XDECREF(d);
    Py_XDECREF(o);
    Py_XDECREF(l);
    return t;
}

/* field_uniform(k) -> (dtype name, shape) when every sample of an NPY field
 * is present with the same dtype and shape (the batch stacks into one
 * array), else None. */
static PyObject *Batch_field_uniform(BatchObject *self, PyObject *arg)
{
    const stk_field *f = batch_field(self, arg);
    if (!f)
        return NULL;
    size_t n = self->b->size;
    if (f->kind != STK_FIELD_NPY || f->layout == STK_BATCH_DENSE || !f->dtypes || !f->shapes ||
        n == 0)
        Py_RETURN_NONE;
    const size_t stride = STK_FIELD_MAXDIM + 1;
    for (size_t s = 0; s < n; s++) {
        if (field_absent(f, s) || f->dtypes[s] != f->dtypes[0] || f->lengths[s] != f->lengths[0] ||
            memcmp(&f->shapes[s * stride], f->shapes, stride * sizeof *f->shapes))
            Py_RETURN_NONE;
    }
    const int64_t *sh = f->shapes;
    if (sh[0] < 0 || sh[0] > STK_FIELD_MAXDIM)
        Py_RETURN_NONE;
    uint64_t bytes = (uint64_t)k_vtypes[vtype_of_dtype(f->dtypes[0])].itemsize;
    for (int64_t d = 1; d <= sh[0]; d++)
        bytes *= (uint64_t)sh[d];
    if (bytes != f->lengths[0])
        Py_RETURN_NONE;
    PyObject *shape = PyTuple_New((Py_ssize_t)sh[0]);
    for (int64_t d = 0; shape && d < sh[0]; d++) {
        PyObject *v = PyLong_FromLongLong(sh[d + 1]);
        if (!v)
            Py_CLEAR(shape);
        else
            PyTuple_SET_ITEM(shape, (Py_ssize_t)d, v);
    }
    if (!shape)
        return NULL;
    const char *name = k_vtypes[vtype_of_dtype(f->dtypes[0])].name;
    PyObject *t = Py_BuildValue("(sN)", name, shape);
    return t;
}

/* field_gather(k, out): copies every sample of a variable field, in order,
 * into the writable C-contiguous buffer out, which must hold exactly their
 * bytes (field_uniform's stacked array). */
static PyObject *Batch_field_gather(BatchObject *self, PyObject *args)
{
    PyObject *k, *out;
    if (!PyArg_ParseTuple(args, "OO:field_gather", &k, &out))
        return NULL;
    const stk_field *f = batch_field(self, k);
    if (!f)
        return NULL;
    if (f->layout == STK_BATCH_DENSE) {
        PyErr_Format(PyExc_TypeError, "field '%s' is dense: nothing to gather", f->name);
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(out, &buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    size_t n = self->b->size, total = 0;
    for (size_t s = 0; s < n; s++)
        total += (size_t)f->lengths[s];
    if ((size_t)buf.len != total) {
        PyBuffer_Release(&buf);
        PyErr_Format(PyExc_ValueError, "field_gather: out holds %zd bytes, field '%s' has %zu",
                     buf.len, f->name, total);
        return NULL;
    }
    char *w = buf.buf;
    for (size_t s = 0; s < n; s++) {
        memcpy(w, (const char *)f->data + f->offsets[s], (size_t)f->lengths[s]);
        w += f->lengths[s];
    }
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

static PyMethodDef Batch_methods[] = {
    {"record_stream", (PyCFunction)Batch_record_stream, METH_O,
     "record_stream(stream): the release also waits for the work queued on stream."},
    {"data", (PyCFunction)Batch_data, METH_NOARGS, "View of a dense batch: (size, *shape)."},
    {"samples", (PyCFunction)Batch_samples, METH_NOARGS, "A View per sample."},
    {"labels", (PyCFunction)Batch_labels, METH_NOARGS, "View of the int64 labels."},
    {"indices", (PyCFunction)Batch_indices, METH_NOARGS, "View of the uint64 dataset indices."},
    {"field", (PyCFunction)Batch_field, METH_O,
     "field(k): field k's values (a View, a list, or a JSON array's bytes)."},
    {"field_info", (PyCFunction)Batch_field_info, METH_O,
     "field_info(k) -> {name, source, kind, dense, optional}."},
    {"field_present", (PyCFunction)Batch_field_present, METH_O,
     "field_present(k): uint8 View, 1 where present; None if not optional."},
    {"field_ragged", (PyCFunction)Batch_field_ragged, METH_O,
     "field_ragged(k) -> (data, offsets, lengths) Views of a variable field."},
    {"field_uniform", (PyCFunction)Batch_field_uniform, METH_O,
     "field_uniform(k) -> (dtype, shape) when an npy field stacks, else None."},
    {"field_gather", (PyCFunction)Batch_field_gather, METH_VARARGS,
     "field_gather(k, out): copies a variable field's samples into out."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Batch_getset[] = {
    {"epoch", (getter)Batch_get, NULL, NULL, "epoch"},
    {"index", (getter)Batch_get, NULL, NULL, "index"},
    {"size", (getter)Batch_get, NULL, NULL, "size"},
    {"dense", (getter)Batch_get, NULL, NULL, "dense"},
    {"dtype", (getter)Batch_get, NULL, NULL, "dtype"},
    {"address", (getter)Batch_get, NULL, NULL, "address"},
    {"sample_shape", (getter)Batch_get, NULL, NULL, "sample_shape"},
    {"nfields", (getter)Batch_get, NULL, NULL, "nfields"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Batch_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoker._stoker.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One delivered batch; its ring buffer is released when this object dies.",
    .tp_weaklistoffset = offsetof(BatchObject, weakrefs),
    .tp_methods = Batch_methods,
    .tp_getset = Batch_getset,
};

/* ---- Engine --------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    stk_loader *l;
    PyThread_type_lock lock;
    unsigned long owner; /* thread holding lock, 0 when free (GIL-protected) */
    pid_t pid;
    int closing; /* close() asked; a waiting next() gives up (GIL-protected) */
    /* The iteration turn: bumped (under the lock) whenever the position stops
     * belonging to the epoch an iterator was started on: the epoch's end
     * (STK_END), set_epoch, set_state and begin(). An iterator passes the
     * turn it was started with to next(), which answers "ended" without
     * asking the library once the turn has moved on. Checking and moving it
     * under the same lock as stk_loader_next is what keeps several threads
     * sharing one iterator from running on into the next epoch: the end
     * seen by one of them is seen by all. */
    unsigned long long turn;
} EngineObject;

static PyTypeObject Engine_Type;

/* Raises the library's fork message if called from a forked child. */
static int check_pid(EngineObject *self)
{
    if (self->pid == getpid())
        return 0;
    stk_state st = {.struct_size = sizeof st};
    int rc = stk_loader_get_state(self->l, &st); /* STK_EMISUSE without locking */
    raise_code(rc ? rc : STK_EMISUSE,
               self->l ? stk_loader_errmsg(self->l)
                       : "this loader belongs to the parent process; open a new one in the child");
    return -1;
}

/* Takes the engine's lock (waiting without the GIL) and checks that the
 * loader is open. Returns 0, or -1 with an exception set. */
/* One failed sample as a dict. The path is decoded as os.fsdecode does
 * (surrogateescape: os.fsencode gives the exact bytes back); the reason
 * leniently, as it may quote bytes of the file. */
static PyObject *error_dict(const stk_sample_error *e)
{
    PyObject *path = PyUnicode_DecodeFSDefault(e->path);
    PyObject *reason = PyUnicode_DecodeUTF8(e->reason, (Py_ssize_t)strlen(e->reason), "replace");
    PyObject *d = NULL;
    if (path && reason)
        d = Py_BuildValue("{s:K,s:K,s:i,s:s,s:O,s:O}", "sample", (unsigned long long)e->sample,
                          "epoch", (unsigned long long)e->epoch, "code", e->code, "code_name",
                          code_name(e->code), "path", path, "reason", reason);
    Py_XDECREF(path);
    Py_XDECREF(reason);
    return d;
}

/* Appends one failure's dict to list. Returns 0, or -1 with an exception. */
static int append_error(PyObject *list, const stk_sample_error *e)
{
    PyObject *d = error_dict(e);
    int rc = d ? PyList_Append(list, d) : -1;
    Py_XDECREF(d);
    return rc;
}

/* The failures of the batch a STK_ESAMPLE reported, from the loader's kept
 * list: the named sample's entry and the nfailed - 1 after it (the list is
 * in sample order). When the list no longer holds it (its first 1024 of the
 * epoch are kept; with a device it follows the copy thread, which may be in
 * the next epoch already), the named sample alone. New reference or NULL. */
static PyObject *batch_errors(stk_loader *l, const stk_error_info *info)
{
    PyObject *errs = PyList_New(0);
    size_t n = stk_loader_error_count(l), at = n;
    stk_sample_error e;
    for (size_t i = n; errs && i-- > 0;) {
        if (stk_loader_error_get(l, i, &e) == STK_OK && e.sample == info->sample &&
            e.epoch == info->epoch) {
            at = i;
            break;
        }
    }
    if (errs && at == n) {
        e = (stk_sample_error){.sample = info->sample,
                               .epoch = info->epoch,
                               .code = info->sample_code,
                               .path = info->path,
                               .reason = info->reason};
        if (append_error(errs, &e) < 0)
            Py_CLEAR(errs);
    }
    for (size_t i = at; errs && i < n && i - at < info->nfailed; i++) {
        if (stk_loader_error_get(l, i, &e) == STK_OK && append_error(errs, &e) < 0)
            Py_CLEAR(errs);
    }
    return errs;
}

/* Raises stoker.SampleError for a STK_ESAMPLE from next(), its attributes
 * the fields of stk_loader_last_error (never parsed from the message):
 * .sample, .epoch, .path, .reason, .field name the batch's first failed
 * sample; .errors lists the batch's failures, that one first. */
static void raise_sample(stk_loader *l)
{
    stk_error_info info = {.struct_size = sizeof info};
    if (stk_loader_last_error(l, &info) != STK_OK || !info.has_sample) {
        raise_code(STK_ESAMPLE, stk_loader_errmsg(l));
        return;
    }
    raise_code(info.code, info.message);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (!ev) {
        PyErr_Restore(et, ev, tb);
        return;
    }
    /* Failures here only lose attributes, never the error itself. */
    PyObject *vals[6] = {
        PyLong_FromUnsignedLongLong((unsigned long long)info.sample),
        PyLong_FromUnsignedLongLong((unsigned long long)info.epoch),
        PyUnicode_DecodeFSDefault(info.path),
        PyUnicode_DecodeUTF8(info.reason, (Py_ssize_t)strlen(info.reason), "replace"),
        PyUnicode_FromString(info.field),
        batch_errors(l, &info),
    };
    static const char *const names[6] = {"sample", "epoch", "path", "reason", "field", "errors"};
    for (int k = 0; k < 6; k++) {
        if (!vals[k] || PyObject_SetAttrString(ev, names[k], vals[k]) < 0)
            PyErr_Clear();
        Py_XDECREF(vals[k]);
    }
    PyErr_Restore(et, ev, tb);
}

static int engine_enter(EngineObject *self)
{
    if (check_pid(self))
        return -1;
    if (!self->l) {
        PyErr_SetString(g_Error, "the loader is closed");
        return -1;
    }
    unsigned long me = PyThread_get_thread_ident();
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        if (self->owner == me) {
            PyErr_SetString(PyExc_RuntimeError,
                            "re-entrant call into a stoker loader (from a signal handler or "
                            "finalizer while it was busy)");
            return -1;
        }
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    self->owner = me;
    if (!self->l) {
        self->owner = 0;
        PyThread_release_lock(self->lock);
        PyErr_SetString(g_Error, "the loader is closed");
        return -1;
    }
    return 0;
}

static void engine_leave(EngineObject *self)
{
    self->owner = 0;
    PyThread_release_lock(self->lock);
}

static int engine_raise(EngineObject *self, int rc)
{
    raise_code(rc, stk_loader_errmsg(self->l));
    return -1;
}

/* A setter's result: 0, or -1 with the exception set. The library's reason
 * (stk_options_errmsg: the setting, its range, the value given) when it
 * gave one, else "invalid WHAT". */
static int set_or_raise_o(const stk_options *o, int rc, const char *what)
{
    if (rc == STK_OK)
        return 0;
    if (rc == STK_ENOMEM) {
        PyErr_NoMemory();
        return -1;
    }
    const char *why = o ? stk_options_errmsg(o) : "";
    if (why && *why)
        PyErr_SetString(PyExc_ValueError, why);
    else
        PyErr_Format(PyExc_ValueError, "invalid %s", what);
    return -1;
}

static int set_or_raise(int rc, const char *what)
{
    return set_or_raise_o(NULL, rc, what);
}

/* A mixture's source k (docs/mixing.md): (path, weight, samples[,
 * transforms[, options]]), transforms a list of (field or None, spec),
 * options a list of (key, value) for stk_options_source_set. 0, or -1 with
 * the exception set. */
static int add_mix_source(stk_options *o, size_t k, PyObject *item)
{
    PyObject *path_obj = NULL, *tfs = Py_None, *opts = Py_None;
    double weight;
    unsigned long long samples;
    if (!PyArg_ParseTuple(item, "O&dK|OO:sources", PyUnicode_FSConverter, &path_obj, &weight,
                          &samples, &tfs, &opts))
        return -1;
    int rc = stk_options_add_source(o, PyBytes_AS_STRING(path_obj), weight, samples);
    Py_DECREF(path_obj);
    if (set_or_raise(rc, "sources (a path, a weight >= 0; at most 256)"))
        return -1;
    PyObject *lists[2] = {tfs, opts};
    for (int w = 0; w < 2; w++) {
        if (lists[w] == Py_None)
            continue;
        PyObject *seq = PySequence_Fast(lists[w], "a source's transforms and options are lists");
        if (!seq)
            return -1;
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
            const char *key, *value;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, j),
                                  w ? "ss:options" : "zs:transforms", &key, &value)) {
                Py_DECREF(seq);
                return -1;
            }
            rc = w ? stk_options_source_set(o, k, key, value)
                   : stk_options_source_transform(o, k, key, value);
            if (set_or_raise_o(o, rc, w ? "a source's option" : "a source's transform")) {
                Py_DECREF(seq);
                return -1;
            }
        }
        Py_DECREF(seq);
    }
    return 0;
}

/* Engine(source, batch_size, shuffle, seed, drop_last, transform, threads,
 *        depth, on_error_skip, rank, world_size, records, options,
 *        max_sample_bytes)
 * records: None or (record_bytes, header_bytes, label_bytes).
 * options: dict of str -> str for stk_options_set. */
/* stk_loader_open on a thread of its own, so that the Python thread can
 * wait for it in slices and take signals (Ctrl-C) meanwhile, as next()
 * does: an open against a server that never answers takes until its
 * requests run out of attempts. On a signal the caller gives the open up:
 * the thread then closes the loader it gets and frees what it holds. */
typedef struct opener {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    stk_options *o; /* owned by the opener from the thread's start */
    stk_loader *l;
    int rc;
    int done, abandoned;
    /* The open's warnings (warn_queue), each ending in '\0'. */
    char *warnings;
    size_t warn_len;
} opener;

/* The most bytes of warnings one open keeps (more are dropped). */
#define WARN_QUEUE_MAX (64u << 10)

/* The open's warning channel (stk_options_set_warning). It runs on the
 * opener's thread without the GIL, so it only queues the message (under
 * op->mu); the Python thread turns the queue into stoker.StokerWarning
 * after the open (warn_deliver). */
static void warn_queue(void *user, const char *msg)
{
    opener *op = user;
    size_t n = strlen(msg) + 1;
    pthread_mutex_lock(&op->mu);
    char *p = op->warn_len + n <= WARN_QUEUE_MAX ? realloc(op->warnings, op->warn_len + n) : NULL;
    if (p) {
        memcpy(p + op->warn_len, msg, n);
        op->warnings = p;
        op->warn_len += n;
    }
    pthread_mutex_unlock(&op->mu);
}

/* Issues the n bytes of queued warnings w as stoker.StokerWarning, in
 * order. Returns 0, or -1 with the exception a filter made of one. */
static int warn_deliver(const char *w, size_t n)
{
    for (size_t at = 0; at < n; at += strlen(w + at) + 1)
        if (PyErr_WarnEx(g_Warning, w + at, 2) < 0) /* the line that made the Loader */
            return -1;
    return 0;
}

static void opener_free(opener *op)
{
    free(op->warnings);
    stk_options_destroy(op->o);
    pthread_cond_destroy(&op->cv);
    pthread_mutex_destroy(&op->mu);
    free(op);
}

static void *opener_main(void *arg)
{
    opener *op = arg;
    stk_loader *l = NULL;
    int rc = stk_loader_open(&l, op->o);
    pthread_mutex_lock(&op->mu);
    op->l = l;
    op->rc = rc;
    op->done = 1;
    int abandoned = op->abandoned;
    pthread_cond_signal(&op->cv);
    pthread_mutex_unlock(&op->mu);
    if (abandoned) {
        stk_loader_close(l);
        opener_free(op);
    }
    return NULL;
}

/* Opens a loader from *o (which it takes: *o is NULL after), interruptibly.
 * Returns 0 with *rc and *out set, or -1 with a Python exception (the
 * signal's, MemoryError, or a warning a filter turned into an error: the
 * loader is closed then). The open's warnings are issued as
 * stoker.StokerWarning before it returns. */
static int open_interruptibly(stk_options **o, stk_loader **out, int *rc)
{
    opener *op = calloc(1, sizeof *op);
    pthread_attr_t attr;
    pthread_t th;
    if (!op) {
        PyErr_NoMemory();
        return -1;
    }
    if (pthread_mutex_init(&op->mu, NULL)) {
        free(op);
        PyErr_NoMemory();
        return -1;
    }
    if (pthread_cond_init(&op->cv, NULL)) {
        pthread_mutex_destroy(&op->mu);
        free(op);
        PyErr_NoMemory();
        return -1;
    }
    op->o = *o;
    *o = NULL;
    stk_options_set_warning(op->o, warn_queue, op);
    int started = !pthread_attr_init(&attr);
    if (started) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        started = !pthread_create(&th, &attr, opener_main, op);
        pthread_attr_destroy(&attr);
    }
    if (!started) {
        /* No thread: open here, uninterruptibly. */
        Py_BEGIN_ALLOW_THREADS
        opener_main(op);
        Py_END_ALLOW_THREADS
    }
    for (;;) {
        int done;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&op->mu);
        if (!op->done) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&op->cv, &op->mu, &ts);
        }
        done = op->done;
        pthread_mutex_unlock(&op->mu);
        Py_END_ALLOW_THREADS
        if (done)
            break;
        if (PyErr_CheckSignals() < 0) {
            pthread_mutex_lock(&op->mu);
            done = op->done;
            op->abandoned = !done;
            pthread_mutex_unlock(&op->mu);
            if (done) {
                stk_loader_close(op->l);
                opener_free(op);
            }
            return -1;
        }
    }
    /* The thread is done: the queue is the Python thread's alone. */
    if (warn_deliver(op->warnings, op->warn_len) < 0) {
        stk_loader_close(op->l);
        opener_free(op);
        return -1;
    }
    *out = op->l;
    *rc = op->rc;
    opener_free(op);
    return 0;
}

/* fields: a list of (name, sources, kind, transform, optional) with str or
 * None for the middle three (None: the library's default) and a bool. The
 * library checks them; its reason (stk_options_errmsg) is the ValueError's
 * message. Returns 0, or -1 with an exception. */
static int add_fields(stk_options *o, PyObject *fields)
{
    PyObject *seq = PySequence_Fast(fields, "fields must be a list of tuples");
    if (!seq)
        return -1;
    int ret = -1;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        const char *name, *sources, *kind_name, *transform;
        int optional;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "szzzp:fields", &name, &sources,
                              &kind_name, &transform, &optional))
            goto out;
        int kind = STK_FIELD_AUTO;
        if (kind_name && (kind = stk_field_kind_parse(kind_name)) < 0) {
            /* The kinds the library knows, from the library. */
            char known[160] = "";
            size_t used = 0;
            for (int kd = STK_FIELD_AUTO + 1; stk_field_kind_name(kd) && used < sizeof known;
                 kd++) {
                snprintf(known + used, sizeof known - used, "%s%s", used ? ", " : "",
                         stk_field_kind_name(kd));
                used += strlen(known + used);
            }
            PyErr_Format(PyExc_ValueError, "fields: '%s' has kind '%s', which is none (%s)", name,
                         kind_name, known);
            goto out;
        }
        int rc = stk_options_add_field(o, name, sources, kind, transform,
                                       optional ? STK_FIELD_OPTIONAL : 0u);
        if (rc == STK_ENOMEM) {
            PyErr_NoMemory();
            goto out;
        }
        if (rc) {
            /* The library's message starts with "fields: " already. */
            PyErr_Format(PyExc_ValueError, "%s", stk_options_errmsg(o));
            goto out;
        }
    }
    ret = 0;
out:
    Py_DECREF(seq);
    return ret;
}

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"source",
                             "batch_size",
                             "shuffle",
                             "seed",
                             "drop_last",
                             "transform",
                             "threads",
                             "depth",
                             "on_error_skip",
                             "rank",
                             "world_size",
                             "records",
                             "options",
                             "max_sample_bytes",
                             "fields",
                             "sources",
                             NULL};
    PyObject *source_obj, *sources = Py_None;
    Py_ssize_t batch_size;
    int shuffle = 1, drop_last = 0, skip = 0;
    unsigned long long seed = 0, max_sample_bytes = 0;
    const char *transform = NULL;
    unsigned int threads = 0, depth = 2, rank = 0, world = 1;
    PyObject *records = Py_None, *options = Py_None, *fields = Py_None;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "O&n|pKpzIIpIIOOKOO:Engine", kwlist, PyUnicode_FSConverter, &source_obj,
            &batch_size, &shuffle, &seed, &drop_last, &transform, &threads, &depth, &skip, &rank,
            &world, &records, &options, &max_sample_bytes, &fields, &sources))
        return -1;
    if (self->l) {
        Py_DECREF(source_obj);
        PyErr_SetString(PyExc_RuntimeError, "Engine is already open");
        return -1;
    }
    int ret = -1, rc;
    stk_options *o = NULL;
    const char *source = PyBytes_AS_STRING(source_obj);
    if (batch_size < 1) {
        PyErr_SetString(PyExc_ValueError, "batch_size must be >= 1");
        goto out;
    }
    if ((rc = stk_options_create(&o))) {
        PyErr_NoMemory();
        goto out;
    }
    if (sources != Py_None) {
        /* A mixture (docs/mixing.md): a list of sources (add_mix_source). */
        PyObject *seq = PySequence_Fast(sources, "sources must be a list");
        if (!seq)
            goto out;
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
            if (add_mix_source(o, (size_t)k, PySequence_Fast_GET_ITEM(seq, k))) {
                Py_DECREF(seq);
                goto out;
            }
        }
        Py_DECREF(seq);
    } else if (set_or_raise_o(o, stk_options_set_source(o, source), "source"))
        goto out;
    if (set_or_raise_o(o, stk_options_set_batch_size(o, (size_t)batch_size), "batch_size") ||
        set_or_raise_o(o, stk_options_set_shuffle(o, shuffle), "shuffle") ||
        set_or_raise_o(o, stk_options_set_seed(o, seed), "seed") ||
        set_or_raise_o(o, stk_options_set_drop_last(o, drop_last), "drop_last") ||
        set_or_raise_o(o, stk_options_set_threads(o, threads), "threads") ||
        set_or_raise_o(o, stk_options_set_depth(o, depth), "depth") ||
        set_or_raise_o(o,
                       stk_options_set_on_error(o, skip ? STK_ON_ERROR_SKIP : STK_ON_ERROR_RAISE),
                       "on_error") ||
        set_or_raise_o(o, stk_options_set_partition(o, rank, world), "rank/world_size"))
        goto out;
    if (transform && set_or_raise(stk_options_set_transform(o, transform), "transform"))
        goto out;
    if (max_sample_bytes &&
        set_or_raise_o(o, stk_options_set_max_sample_bytes(o, (size_t)max_sample_bytes),
                       "max_sample_bytes"))
        goto out;
    if (records != Py_None) {
        unsigned long long rb, hb;
        unsigned int lb;
        if (!PyArg_ParseTuple(records, "KKI:records", &rb, &hb, &lb))
            goto out;
        if (stk_options_set_records(o, (size_t)rb, (size_t)hb, lb)) {
            PyErr_Format(PyExc_ValueError,
                         "invalid records: record_bytes=%llu, label_bytes=%u (label_bytes must "
                         "be 0, 1, 2, 4 or 8 and smaller than record_bytes)",
                         rb, lb);
            goto out;
        }
    }
    if (options != Py_None) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        if (!PyDict_Check(options)) {
            PyErr_SetString(PyExc_TypeError, "options must be a dict of str to str");
            goto out;
        }
        while (PyDict_Next(options, &pos, &key, &value)) {
            const char *k = PyUnicode_AsUTF8(key), *v = k ? PyUnicode_AsUTF8(value) : NULL;
            if (!k || !v)
                goto out;
            if (stk_options_set(o, k, v)) {
                PyErr_Format(PyExc_ValueError, "options: %s", stk_options_errmsg(o));
                goto out;
            }
        }
    }
    if (fields != Py_None && add_fields(o, fields) < 0)
        goto out;
    stk_loader *l = NULL;
    if (open_interruptibly(&o, &l, &rc) < 0)
        goto out;
    if (rc != STK_OK) {
        if (!l) {
            PyErr_NoMemory();
        } else {
            raise_code(rc, stk_loader_errmsg(l));
            stk_loader_close(l);
        }
        goto out;
    }
    self->l = l;
    self->pid = getpid();
    ret = 0;
out:
    stk_options_destroy(o);
    Py_DECREF(source_obj);
    return ret;
}

static PyObject *Engine_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    EngineObject *self = (EngineObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->pid = getpid();
    return (PyObject *)self;
}

static void Engine_dealloc(EngineObject *self)
{
    if (self->l) {
        stk_loader *l = self->l;
        self->l = NULL;
        /* Joining the workers can take a moment; other threads may run. In a
         * forked child the library leaves the parent's loader alone. */
        Py_BEGIN_ALLOW_THREADS
        stk_loader_close(l);
        Py_END_ALLOW_THREADS
    }
    if (self->lock && self->pid == getpid())
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* next(timeout_ms=100, turn=None): the next Batch, or None at the end of the
 * epoch. With turn (from begin()), None as soon as that turn is over, without
 * asking the library: the epoch it iterated has ended or was replaced.
 * Waits in slices of timeout_ms without the GIL, checking for signals (so a
 * KeyboardInterrupt is raised within about one slice) and for close(). */
static PyObject *Engine_next(EngineObject *self, PyObject *args)
{
    unsigned int slice = 100;
    PyObject *turn_obj = Py_None;
    unsigned long long turn = 0;
    if (!PyArg_ParseTuple(args, "|IO:next", &slice, &turn_obj))
        return NULL;
    if (turn_obj != Py_None) {
        turn = PyLong_AsUnsignedLongLong(turn_obj);
        if (PyErr_Occurred())
            return NULL;
    }
    if (slice == 0)
        slice = 1;
    if (engine_enter(self))
        return NULL;
    if (turn_obj != Py_None && turn != self->turn) {
        engine_leave(self);
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    int tried_gc = 0;
    for (;;) {
        stk_batch *b = NULL;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = stk_loader_next_timeout(self->l, &b, slice);
        Py_END_ALLOW_THREADS
        if (rc == STK_OK) {
            BatchObject *bo = PyObject_New(BatchObject, &Batch_Type);
            if (!bo) {
                /* The batch is lost to Python; give it back so the ring
                 * keeps moving. */
                (void)stk_batch_release(b);
                break;
            }
            bo->b = b;
            bo->pid = getpid();
            bo->stream = NULL;
            bo->weakrefs = NULL;
            result = (PyObject *)bo;
            break;
        }
        if (rc == STK_END) {
            self->turn++;
            result = Py_None;
            Py_INCREF(result);
            break;
        }
        if (rc == STK_TIMEOUT) {
            if (PyErr_CheckSignals() < 0)
                break;
            if (self->closing) {
                PyErr_SetString(g_Error, "the loader was closed while waiting for a batch");
                if (self->l && self->owner == PyThread_get_thread_ident()) {
                    /* A deferred close (see Engine_close): finish it here. */
                    stk_loader *l = self->l;
                    self->l = NULL;
                    Py_BEGIN_ALLOW_THREADS
                    stk_loader_close(l);
                    Py_END_ALLOW_THREADS
                }
                break;
            }
            continue;
        }
        if (rc == STK_EBUSY && !tried_gc) {
            /* Every buffer is held. Batches kept alive only by reference
             * cycles would be freed by a collection; try one before raising.
             * The lock is dropped meanwhile, as finalizers may call us. */
            tried_gc = 1;
            engine_leave(self);
            PyGC_Collect();
            if (engine_enter(self))
                return NULL;
            continue;
        }
        if (rc == STK_ESAMPLE) {
            raise_sample(self->l);
            break;
        }
        if (rc == STK_EBUSY) {
            char msg[1024];
            snprintf(msg, sizeof msg,
                     "%s. Batches are views of the ring, not copies, so every batch still "
                     "referenced holds a buffer: copy what you keep (x.clone(), np.array(x)) "
                     "or open the loader with a larger depth",
                     stk_loader_errmsg(self->l));
            raise_code(rc, msg);
            break;
        }
        engine_raise(self, rc);
        break;
    }
    engine_leave(self);
    return result;
}

static PyObject *Engine_set_epoch(EngineObject *self, PyObject *args)
{
    unsigned long long e;
    if (!PyArg_ParseTuple(args, "K:set_epoch", &e))
        return NULL;
    if (engine_enter(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = stk_loader_set_epoch(self->l, e);
    Py_END_ALLOW_THREADS
    if (rc)
        engine_raise(self, rc);
    if (!rc)
        self->turn++;
    engine_leave(self);
    if (rc)
        return NULL;
    Py_RETURN_NONE;
}

/* begin() -> turn: starts a new iteration turn (see EngineObject.turn), so
 * every earlier iterator's next() answers "ended"; the caller passes the
 * returned turn to its own next() calls. */
static PyObject *Engine_begin(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (engine_enter(self))
        return NULL;
    unsigned long long turn = ++self->turn;
    engine_leave(self);
    return PyLong_FromUnsignedLongLong(turn);
}

static PyObject *Engine_get_state(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (engine_enter(self))
        return NULL;
    stk_state st = {.struct_size = sizeof st};
    int rc = stk_loader_get_state(self->l, &st);
    if (rc)
        engine_raise(self, rc);
    engine_leave(self);
    if (rc)
        return NULL;
    return Py_BuildValue("(KKK)", (unsigned long long)st.seed, (unsigned long long)st.epoch,
                         (unsigned long long)st.batch);
}

/* The resume fingerprint's fields, as the keys of a Python state dict. */
static const struct {
    const char *key;
    size_t off;
    int wide; /* uint64_t; else uint32_t */
} fp_fields[] = {
    {"num_samples", offsetof(stk_state, num_samples), 1},
    {"batch_size", offsetof(stk_state, batch_size), 1},
    {"world_size", offsetof(stk_state, world_size), 0},
    {"rank", offsetof(stk_state, rank), 0},
    {"shuffle", offsetof(stk_state, shuffle), 0},
    {"drop_last", offsetof(stk_state, drop_last), 0},
    {"transform_hash", offsetof(stk_state, transform), 1},
    {"local_world_size", offsetof(stk_state, local_world_size), 0},
    {"mixture_hash", offsetof(stk_state, mixture), 1},
};
#define N_FP_FIELDS (sizeof fp_fields / sizeof fp_fields[0])

static unsigned long long fp_get(const stk_state *st, size_t k)
{
    const char *p = (const char *)st + fp_fields[k].off;
    if (fp_fields[k].wide) {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static PyObject *Engine_fingerprint(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (engine_enter(self))
        return NULL;
    stk_state st = {.struct_size = sizeof st};
    int rc = stk_loader_get_state(self->l, &st);
    if (rc)
        engine_raise(self, rc);
    engine_leave(self);
    if (rc)
        return NULL;
    PyObject *d = PyDict_New();
    for (size_t k = 0; d && k < N_FP_FIELDS; k++) {
        PyObject *v = PyLong_FromUnsignedLongLong(fp_get(&st, k));
        if (!v || PyDict_SetItemString(d, fp_fields[k].key, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    /* The worlds this epoch ran under before this one (elastic resume). */
    PyObject *h = d ? PyList_New(0) : NULL;
    for (uint32_t i = 0; h && i < st.history_len && i < STK_STATE_HISTORY; i++) {
        PyObject *g = Py_BuildValue("{s:I,s:I,s:K,s:K}", "world_size", st.history[i].world_size,
                                    "local_world_size", st.history[i].local_world_size,
                                    "batch_size", (unsigned long long)st.history[i].batch_size,
                                    "batches", (unsigned long long)st.history[i].batches);
        if (!g || PyList_Append(h, g) < 0)
            Py_CLEAR(h);
        Py_XDECREF(g);
    }
    if (!h || PyDict_SetItemString(d, "history", h) < 0)
        Py_CLEAR(d);
    Py_XDECREF(h);
    /* Where the state stands: the engine normalises an epoch it finished. */
    PyObject *e =
        d ? Py_BuildValue("(KK)", (unsigned long long)st.epoch, (unsigned long long)st.batch)
          : NULL;
    if (!e || PyDict_SetItemString(d, "position", e) < 0)
        Py_CLEAR(d);
    Py_XDECREF(e);
    return d;
}

/* Fills st's history from a list of dicts (world_size, local_world_size,
 * batch_size, batches). 0 or -1 with a ValueError/TypeError set. */
static int history_from(PyObject *list, stk_state *st)
{
    if (!PyList_Check(list) && !PyTuple_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "state dict history must be a list of dicts");
        return -1;
    }
    Py_ssize_t n = PySequence_Size(list);
    if (n > STK_STATE_HISTORY) {
        PyErr_Format(PyExc_ValueError,
                     "state dict history has %zd worlds; an epoch may change worlds at most %d "
                     "times",
                     n, STK_STATE_HISTORY);
        return -1;
    }
    static const char *const keys[4] = {"world_size", "local_world_size", "batch_size", "batches"};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *g = PySequence_GetItem(list, i);
        if (!g)
            return -1;
        unsigned long long v[4];
        for (int k = 0; k < 4; k++) {
            PyObject *x = PyDict_Check(g) ? PyDict_GetItemString(g, keys[k]) : NULL;
            PyObject *ix = x ? PyNumber_Index(x) : NULL;
            v[k] = ix ? PyLong_AsUnsignedLongLong(ix) : (unsigned long long)-1;
            Py_XDECREF(ix);
            if (!ix || PyErr_Occurred() || (k < 2 && v[k] > UINT32_MAX)) {
                PyErr_Clear();
                Py_DECREF(g);
                PyErr_Format(PyExc_ValueError,
                             "state dict history[%zd] needs an integer %s (world_size, "
                             "local_world_size, batch_size, batches)",
                             i, keys[k]);
                return -1;
            }
        }
        Py_DECREF(g);
        st->history[i] = (stk_state_generation){(uint32_t)v[0], (uint32_t)v[1], v[2], v[3]};
    }
    st->history_len = (uint32_t)n;
    return 0;
}

/* set_state(seed, epoch, batch, fingerprint=None): fingerprint is a dict with
 * any of fp_fields' keys; the engine checks those given, and a key left out
 * (a state dict saved before it existed) is taken as this loader's own. */
static PyObject *Engine_set_state(EngineObject *self, PyObject *args)
{
    unsigned long long seed, epoch, batch;
    PyObject *fp = Py_None;
    if (!PyArg_ParseTuple(args, "KKK|O:set_state", &seed, &epoch, &batch, &fp))
        return NULL;
    if (fp != Py_None && !PyDict_Check(fp)) {
        PyErr_SetString(PyExc_TypeError, "fingerprint must be a dict");
        return NULL;
    }
    if (engine_enter(self))
        return NULL;
    stk_state st = {.struct_size = sizeof st};
    int rc = stk_loader_get_state(self->l, &st);
    if (rc) {
        engine_raise(self, rc);
        goto out;
    }
    st.seed = seed;
    st.epoch = epoch;
    st.batch = batch;
    for (size_t k = 0; fp != Py_None && k < N_FP_FIELDS; k++) {
        PyObject *v = PyDict_GetItemString(fp, fp_fields[k].key); /* borrowed */
        if (!v)
            continue;
        unsigned long long x =
            PyLong_Check(v) ? PyLong_AsUnsignedLongLong(v) : (unsigned long long)-1;
        if ((!PyLong_Check(v) || PyErr_Occurred()) || (!fp_fields[k].wide && x > UINT32_MAX)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "state was saved with %s=%R but this loader has %s=%llu: resuming "
                         "would not give the same batches",
                         fp_fields[k].key, v, fp_fields[k].key, fp_get(&st, k));
            rc = STK_EINVAL;
            goto out;
        }
        char *p = (char *)&st + fp_fields[k].off;
        if (fp_fields[k].wide) {
            uint64_t w = x;
            memcpy(p, &w, sizeof w);
        } else {
            uint32_t w = (uint32_t)x;
            memcpy(p, &w, sizeof w);
        }
    }
    st.history_len = 0;
    if (fp != Py_None) {
        PyObject *h = PyDict_GetItemString(fp, "history"); /* borrowed */
        if (h && h != Py_None && history_from(h, &st) < 0) {
            rc = STK_EINVAL;
            goto out;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    rc = stk_loader_set_state(self->l, &st);
    Py_END_ALLOW_THREADS
    if (rc)
        engine_raise(self, rc);
    if (!rc)
        self->turn++;
out:
    engine_leave(self);
    if (rc)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Engine_info(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (engine_enter(self))
        return NULL;
    stk_info in = {.struct_size = sizeof in};
    int rc = stk_loader_info(self->l, &in);
    uint64_t bound = rc ? 0 : stk_loader_memory_bound(self->l);
    if (rc)
        engine_raise(self, rc);
    engine_leave(self);
    if (rc)
        return NULL;
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:I,s:I,s:I,s:n,s:s,s:s,s:K}", "num_samples",
        (unsigned long long)in.num_samples, "samples_per_epoch",
        (unsigned long long)in.samples_per_epoch, "batches_per_epoch",
        (unsigned long long)in.batches_per_epoch, "num_classes", (unsigned long long)in.num_classes,
        "threads", in.threads, "depth", in.depth, "ring_buffers", in.ring_buffers, "batch_size",
        (Py_ssize_t)in.batch_size, "kind", in.kind == STK_BATCH_DENSE ? "dense" : "variable",
        "source_kind", in.source_kind ? in.source_kind : "?", "memory_bound_bytes",
        (unsigned long long)bound);
}

/* {stage name: {"items", "busy_s"}} for every stage, summed over the threads
 * (thread < 0) or of one thread. */
static PyObject *stage_dict(stk_loader *l, int thread)
{
    PyObject *d = PyDict_New();
    for (int k = 0; d && k < stk_stage_count(); k++) {
        stk_stage_stats s = {.struct_size = sizeof s};
        int rc = thread < 0 ? stk_loader_stage_stats(l, k, &s)
                            : stk_loader_thread_stats(l, (unsigned)thread, k, &s);
        if (rc)
            continue;
        PyObject *x = Py_BuildValue("{s:K,s:d}", "items", (unsigned long long)s.items, "busy_s",
                                    (double)s.busy_ns * 1e-9);
        if (!x || PyDict_SetItemString(d, stk_stage_name(k), x) < 0)
            Py_CLEAR(d);
        Py_XDECREF(x);
    }
    return d;
}

/* The fetch stage's counters as a dict, or None for a local dataset. */
static PyObject *Engine_fetch_stats(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (engine_enter(self))
        return NULL;
    stk_fetch_stats f = {.struct_size = sizeof f};
    int rc = stk_loader_fetch_stats(self->l, &f);
    if (rc == STK_EUNSUPPORTED) {
        engine_leave(self);
        Py_RETURN_NONE;
    }
    if (rc) {
        engine_raise(self, rc);
        engine_leave(self);
        return NULL;
    }
    engine_leave(self);
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:d,s:d,s:K,s:K,s:K,"
        "s:K,s:K,s:K,s:K}",
        "requests", (unsigned long long)f.requests, "retries", (unsigned long long)f.retries,
        "failures", (unsigned long long)f.failures, "bytes", (unsigned long long)f.bytes,
        "sample_bytes", (unsigned long long)f.sample_bytes, "overfetch_bytes",
        (unsigned long long)f.overfetch_bytes, "inflight_peak", (unsigned long long)f.inflight_peak,
        "waits", (unsigned long long)f.waits, "wait_s", (double)f.wait_ns * 1e-9,
        "buffered_peak_bytes", (unsigned long long)f.buffered_peak, "cache_hits",
        (unsigned long long)f.cache_hits, "cache_misses", (unsigned long long)f.cache_misses,
        "cache_evictions", (unsigned long long)f.cache_evictions, "cache_fallbacks",
        (unsigned long long)f.cache_fallbacks, "cache_write_errors",
        (unsigned long long)f.cache_write_errors, "cache_dropped",
        (unsigned long long)f.cache_dropped, "io_busy_s", (double)f.io_busy_ns * 1e-9,
        "request_mean_s", f.completed ? (double)f.request_ns * 1e-9 / (double)f.completed : 0.0,
        "first_byte_mean_s",
        f.completed ? (double)f.first_byte_ns * 1e-9 / (double)f.completed : 0.0, "throttled",
        (unsigned long long)f.throttled, "rate_limit", (unsigned long long)f.rate_limit, "hedges",
        (unsigned long long)f.hedges, "hedge_wins", (unsigned long long)f.hedge_wins,
        "cache_partial_reads", (unsigned long long)f.cache_partial_reads, "cache_cold_ranged",
        (unsigned long long)f.cache_cold_ranged, "cache_download_parts",
        (unsigned long long)f.cache_download_parts);
}

/* A mixture's sources (docs/mixing.md): [(samples, failed, first_id)], one
 * per source; [] without a mixture. */
static PyObject *Engine_source_stats(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (engine_enter(self))
        return NULL;
    PyObject *res = PyList_New(0);
    size_t n = stk_loader_num_sources(self->l);
    uint64_t first = 0;
    for (size_t k = 0; res && k < n; k++) {
        uint64_t got = 0, failed = 0;
        (void)stk_loader_source_stats(self->l, k, &got, &failed);
        PyObject *t = Py_BuildValue("(KKK)", (unsigned long long)got, (unsigned long long)failed,
                                    (unsigned long long)first);
        if (!t || PyList_Append(res, t) < 0) {
            Py_XDECREF(t);
            Py_CLEAR(res);
            break;
        }
        Py_DECREF(t);
        /* The next source's first id: the first id past this one's. */
        size_t src;
        uint64_t local, lo = first, hi = UINT64_MAX;
        while (lo < hi) { /* the smallest id of a later source */
            uint64_t mid = lo + (hi - lo) / 2;
            if (stk_loader_sample_source(self->l, mid, &src, &local) == STK_OK && src <= k)
                lo = mid + 1;
            else
                hi = mid;
        }
        first = lo;
    }
    engine_leave(self);
    return res;
}

static PyObject *Engine_stats(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (engine_enter(self))
        return NULL;
    PyObject *res = NULL, *threads = NULL, *stages = NULL, *errors = NULL;
    stk_stats st = {.struct_size = sizeof st};
    stk_info in = {.struct_size = sizeof in};
    int rc = stk_loader_stats(self->l, &st);
    if (!rc)
        rc = stk_loader_info(self->l, &in);
    if (rc) {
        engine_raise(self, rc);
        goto out;
    }
    if (!(stages = stage_dict(self->l, -1)) || !(threads = PyList_New(0)) ||
        !(errors = PyList_New(0)))
        goto out;
    for (unsigned t = 0; t < in.threads && t <= INT_MAX; t++) {
        PyObject *d = stage_dict(self->l, (int)t);
        if (!d || PyList_Append(threads, d) < 0) {
            Py_XDECREF(d);
            goto out;
        }
        Py_DECREF(d);
    }
    size_t n = stk_loader_error_count(self->l);
    for (size_t i = 0; i < n; i++) {
        stk_sample_error e;
        if (stk_loader_error_get(self->l, i, &e))
            continue;
        PyObject *d = error_dict(&e);
        if (!d || PyList_Append(errors, d) < 0) {
            Py_XDECREF(d);
            goto out;
        }
        Py_DECREF(d);
    }
    res = Py_BuildValue("{s:O,s:O,s:K,s:K,s:d,s:K,s:K,s:K,s:O,s:I,s:I,s:K}", "stages", stages,
                        "threads", threads, "samples_delivered",
                        (unsigned long long)st.samples_delivered, "batches_delivered",
                        (unsigned long long)st.batches_delivered, "starvation_s",
                        (double)st.consumer_wait_ns * 1e-9, "samples_skipped",
                        (unsigned long long)st.samples_skipped, "samples_failed",
                        (unsigned long long)st.samples_failed, "memory_bound_bytes",
                        (unsigned long long)st.memory_bound_bytes, "errors", errors,
                        "threads_active", st.threads_active, "threads_max", st.threads_max,
                        "device_memory_bytes", (unsigned long long)st.device_memory_bytes);
out:
    engine_leave(self);
    Py_XDECREF(stages);
    Py_XDECREF(threads);
    Py_XDECREF(errors);
    return res;
}

/* close(): stops the threads and frees the loader. Held batches stay valid.
 * Harmless when already closed; in a forked child it only forgets the
 * parent's loader. */
static PyObject *Engine_close(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (self->pid != getpid()) {
        self->l = NULL; /* the parent's; the library would not touch it either */
        Py_RETURN_NONE;
    }
    if (!self->l)
        Py_RETURN_NONE;
    /* Set before taking the lock, so a next() waiting in another thread
     * gives up and lets us in. */
    self->closing = 1;
    if (engine_enter(self)) {
        /* Closed meanwhile by another thread: nothing left to do. */
        if (!self->l) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        /* Called from a signal handler (or finalizer) while this very thread
         * waits in next(): the close is deferred to that next(), which sees
         * `closing`, closes the loader and raises. */
        if (self->owner == PyThread_get_thread_ident()) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        self->closing = 0;
        return NULL;
    }
    stk_loader *l = self->l;
    self->l = NULL;
    Py_BEGIN_ALLOW_THREADS
    stk_loader_close(l);
    Py_END_ALLOW_THREADS
    engine_leave(self);
    Py_RETURN_NONE;
}

static PyObject *Engine_get_closed(EngineObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->l == NULL);
}

/* The dataset's class names from the library (stk_loader_class_name):
 * num_classes entries, None for an unnamed class; [] when it names none.
 * Names are file names: any bytes, decoded as os.fsdecode would. */
static PyObject *Engine_class_names(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (engine_enter(self))
        return NULL;
    stk_info in = {.struct_size = sizeof in};
    int rc = stk_loader_info(self->l, &in);
    PyObject *list = rc ? NULL : PyList_New(0);
    size_t named = 0;
    for (uint64_t c = 0; list && c < in.num_classes; c++) {
        const char *name = stk_loader_class_name(self->l, c);
        PyObject *v = name ? PyUnicode_DecodeFSDefault(name) : Py_NewRef(Py_None);
        named += name != NULL;
        if (!v || PyList_Append(list, v)) {
            Py_XDECREF(v);
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(v);
    }
    if (rc)
        engine_raise(self, rc);
    engine_leave(self);
    if (list && !named)
        PyList_SetSlice(list, 0, PyList_GET_SIZE(list), NULL);
    return list;
}

static PyMethodDef Engine_methods[] = {
    {"class_names", (PyCFunction)Engine_class_names, METH_NOARGS,
     "-> the dataset's class names (None where unnamed), or [] when it names none"},
    {"next", (PyCFunction)Engine_next, METH_VARARGS,
     "next(slice_ms=100, turn=None) -> Batch, or None at the end of the epoch (or once "
     "the turn from begin() is over)."},
    {"begin", (PyCFunction)Engine_begin, METH_NOARGS,
     "begin() -> turn: a new iteration turn; earlier turns' next() answer None."},
    {"set_epoch", (PyCFunction)Engine_set_epoch, METH_VARARGS, "set_epoch(e)"},
    {"get_state", (PyCFunction)Engine_get_state, METH_NOARGS, "-> (seed, epoch, batch)"},
    {"set_state", (PyCFunction)Engine_set_state, METH_VARARGS,
     "set_state(seed, epoch, batch, fingerprint=None): fingerprint keys left out are not "
     "checked"},
    {"fingerprint", (PyCFunction)Engine_fingerprint, METH_NOARGS,
     "-> dict: num_samples, batch_size, world_size, rank, shuffle, drop_last, transform_hash"},
    {"info", (PyCFunction)Engine_info, METH_NOARGS, "-> dict of static facts"},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS, "-> dict of counters"},
    {"source_stats", (PyCFunction)Engine_source_stats, METH_NOARGS,
     "-> [(samples, failed, first_id)] per mixture source"},
    {"fetch_stats", (PyCFunction)Engine_fetch_stats, METH_NOARGS, "fetch-stage counters or None"},
    {"close", (PyCFunction)Engine_close, METH_NOARGS,
     "Stops the threads; held batches stay valid."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Engine_getset[] = {
    {"closed", (getter)Engine_get_closed, NULL, "True once closed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Engine_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoker._stoker.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A libstoker loader (internal; use stoker.Loader).",
    .tp_methods = Engine_methods,
    .tp_getset = Engine_getset,
    .tp_init = (initproc)Engine_init,
    .tp_new = Engine_new,
};

/* ---- ShardWriter: one stk_writer (stoker.Writer wraps it) ------------------
 * Calls keep the GIL: each is short (a copy into the writer's buffer, now
 * and then a 1 MiB write), and holding it serialises the calls, which the C
 * writer requires. */
typedef struct {
    PyObject_HEAD
    stk_writer *w;
} ShardWriterObject;

static void ShardWriter_dealloc(ShardWriterObject *self)
{
    stk_writer_close(self->w); /* unfinished: takes back what it wrote */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ShardWriter_init(ShardWriterObject *self, PyObject *args, PyObject *kwargs)
{
    (void)kwargs;
    PyObject *dir = NULL;
    unsigned long long shard_size, num_classes;
    unsigned align, raw_h, raw_w, raw_c;
    if (self->w) {
        PyErr_SetString(PyExc_RuntimeError, "ShardWriter already open");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O&KIIIIK", PyUnicode_FSConverter, &dir, &shard_size, &align,
                          &raw_h, &raw_w, &raw_c, &num_classes))
        return -1;
    stk_writer_options o = {.struct_size = sizeof o};
    o.shard_size = shard_size;
    o.align = align;
    o.raw_h = raw_h;
    o.raw_w = raw_w;
    o.raw_c = raw_c;
    o.num_classes = num_classes;
    char err[1024] = "";
    int rc = stk_writer_open(&self->w, PyBytes_AS_STRING(dir), &o, err, sizeof err);
    Py_DECREF(dir);
    if (rc) {
        raise_code(rc, err);
        return -1;
    }
    return 0;
}

static stk_writer *writer_of(ShardWriterObject *self)
{
    if (!self->w)
        PyErr_SetString(g_Error, "the writer is closed");
    return self->w;
}

static PyObject *ShardWriter_add(ShardWriterObject *self, PyObject *args)
{
    Py_buffer buf;
    long long label;
    PyObject *key = Py_None, *kb = NULL;
    stk_writer *w = writer_of(self);
    if (!w || !PyArg_ParseTuple(args, "y*L|O", &buf, &label, &key))
        return NULL;
    if (key != Py_None && !PyUnicode_FSConverter(key, &kb)) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    int rc = stk_writer_add(w, buf.buf, (size_t)buf.len, label, kb ? PyBytes_AS_STRING(kb) : NULL);
    PyBuffer_Release(&buf);
    Py_XDECREF(kb);
    if (rc)
        return raise_code(rc, stk_writer_errmsg(w));
    Py_RETURN_NONE;
}

/* add_fields([(name, bytes_like, kind), ...], label, key=None): one sample of
 * named fields (stk_writer_add_fields). stoker.Writer.add turns a dict's
 * values into bytes first; kind -1 is a str's: text, unless the name says
 * JSON (then the name decides, so a JSON text stays JSON). */
static PyObject *ShardWriter_add_fields(ShardWriterObject *self, PyObject *args)
{
    PyObject *list, *key = Py_None, *kb = NULL, *res = NULL;
    long long label;
    stk_writer *w = writer_of(self);
    if (!w || !PyArg_ParseTuple(args, "O!L|O", &PyList_Type, &list, &label, &key))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n < 1 || n > 64) {
        PyErr_Format(PyExc_ValueError, "a sample has 1 to 64 fields, got %zd", n);
        return NULL;
    }
    stk_writer_field f[64];
    Py_buffer bufs[64];
    Py_ssize_t got = 0;
    if (key != Py_None && !PyUnicode_FSConverter(key, &kb))
        return NULL;
    for (; got < n; got++) {
        PyObject *t = PyList_GET_ITEM(list, got);
        const char *name;
        int kind;
        if (!PyArg_ParseTuple(t, "sy*i", &name, &bufs[got], &kind))
            goto out;
        if (kind == -1) /* a str: JSON text where the name says JSON */
            kind =
                stk_field_kind_for_name(name) == STK_FIELD_JSON ? STK_FIELD_AUTO : STK_FIELD_TEXT;
        f[got] = (stk_writer_field){name, bufs[got].buf, (size_t)bufs[got].len, kind};
    }
    int rc = stk_writer_add_fields(w, f, (size_t)n, label, kb ? PyBytes_AS_STRING(kb) : NULL);
    if (rc)
        raise_code(rc, stk_writer_errmsg(w));
    else
        res = Py_NewRef(Py_None);
out:
    for (Py_ssize_t k = 0; k < got; k++)
        PyBuffer_Release(&bufs[k]);
    Py_XDECREF(kb);
    return res;
}

static PyObject *ShardWriter_set_class_name(ShardWriterObject *self, PyObject *args)
{
    unsigned long long c;
    const char *name;
    stk_writer *w = writer_of(self);
    if (!w || !PyArg_ParseTuple(args, "Ks", &c, &name))
        return NULL;
    int rc = stk_writer_set_class_name(w, c, name);
    if (rc)
        return raise_code(rc, stk_writer_errmsg(w));
    Py_RETURN_NONE;
}

static PyObject *ShardWriter_finish(ShardWriterObject *self, PyObject *unused)
{
    (void)unused;
    stk_writer *w = writer_of(self);
    if (!w)
        return NULL;
    stk_pack_result r = {.struct_size = sizeof r};
    int rc = stk_writer_finish(w, &r);
    if (rc)
        return raise_code(rc, stk_writer_errmsg(w));
    static const char *const kinds[] = {"encoded", "resized", "raw", "fields"};
    return Py_BuildValue("{s:K,s:K,s:K,s:s}", "samples", (unsigned long long)r.samples, "shards",
                         (unsigned long long)r.shards, "bytes", (unsigned long long)r.bytes,
                         "payload", r.payload < 4 ? kinds[r.payload] : "unknown");
}

static PyObject *ShardWriter_close(ShardWriterObject *self, PyObject *unused)
{
    (void)unused;
    stk_writer_close(self->w);
    self->w = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef ShardWriter_methods[] = {
    {"add", (PyCFunction)ShardWriter_add, METH_VARARGS, "add(bytes_like, label, key=None)"},
    {"add_fields", (PyCFunction)ShardWriter_add_fields, METH_VARARGS,
     "add_fields([(name, bytes_like, kind), ...], label, key=None)"},
    {"set_class_name", (PyCFunction)ShardWriter_set_class_name, METH_VARARGS,
     "set_class_name(c, name)"},
    {"finish", (PyCFunction)ShardWriter_finish, METH_NOARGS, "-> dict of counts"},
    {"close", (PyCFunction)ShardWriter_close, METH_NOARGS,
     "Frees the writer; unfinished, it removes what it wrote."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ShardWriter_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoker._stoker.ShardWriter",
    .tp_basicsize = sizeof(ShardWriterObject),
    .tp_dealloc = (destructor)ShardWriter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A libstoker stk_writer (internal; use stoker.Writer).",
    .tp_methods = ShardWriter_methods,
    .tp_init = (initproc)ShardWriter_init,
    .tp_new = PyType_GenericNew,
};

/* ---- module --------------------------------------------------------------- */
static PyObject *mod_version(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyUnicode_FromString(stk_version());
}

static PyObject *mod_strerror(PyObject *m, PyObject *args)
{
    (void)m;
    int code;
    if (!PyArg_ParseTuple(args, "i:strerror", &code))
        return NULL;
    return PyUnicode_FromString(stk_strerror(code));
}

static PyObject *mod_errname(PyObject *m, PyObject *args)
{
    (void)m;
    int code;
    if (!PyArg_ParseTuple(args, "i:errname", &code))
        return NULL;
    const char *name = stk_errname(code);
    if (!name)
        Py_RETURN_NONE;
    return PyUnicode_FromString(name);
}

/* The exception raise_code() raises for a code, returned instead of raised:
 * lets the tests check every code's type and attributes. */
static PyObject *mod_exception(PyObject *m, PyObject *args)
{
    (void)m;
    int code;
    const char *msg;
    if (!PyArg_ParseTuple(args, "is:_exception", &code, &msg))
        return NULL;
    raise_code(code, msg);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    Py_XDECREF(et);
    Py_XDECREF(tb);
    return ev;
}

/* ---- pack ------------------------------------------------------------------
 * stk_pack runs without the GIL. Its progress callback comes on this same
 * thread: it takes the GIL back, checks for signals (Ctrl-C cancels the pack,
 * which removes what it wrote, and KeyboardInterrupt is raised), records a
 * skipped sample, and calls the user's progress function if any (an
 * exception there cancels too and is raised). */
typedef struct pack_ctx {
    PyThreadState *ts;
    PyObject *progress; /* callable or None (borrowed) */
    PyObject *skipped;  /* list of (index, key, reason) */
    int failed;         /* a Python exception is set */
} pack_ctx;

static PyObject *fs_str(const char *s)
{
    return PyUnicode_DecodeFSDefault(s);
}

static int pack_progress_cb(const stk_pack_progress *pr, void *user)
{
    pack_ctx *c = user;
    int stop = 0;
    PyEval_RestoreThread(c->ts);
    if (PyErr_CheckSignals() < 0) {
        c->failed = 1;
        stop = 1;
        goto out;
    }
    if (pr->skipped_key) {
        PyObject *t = Py_BuildValue("(KNN)", (unsigned long long)pr->skipped_index,
                                    fs_str(pr->skipped_key), fs_str(pr->skipped_reason));
        if (!t || PyList_Append(c->skipped, t) < 0) {
            Py_XDECREF(t);
            c->failed = 1;
            stop = 1;
            goto out;
        }
        Py_DECREF(t);
    }
    if (c->progress != Py_None) {
        PyObject *d =
            Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:d}", "done", (unsigned long long)pr->done,
                          "total", (unsigned long long)pr->total, "skipped",
                          (unsigned long long)pr->skipped, "bytes", (unsigned long long)pr->bytes,
                          "shards", (unsigned long long)pr->shards, "seconds", pr->seconds);
        PyObject *r = d ? PyObject_CallOneArg(c->progress, d) : NULL;
        Py_XDECREF(d);
        if (!r) {
            c->failed = 1;
            stop = 1;
            goto out;
        }
        /* A true return value asks to stop, as in C. */
        int truth = r == Py_None ? 0 : PyObject_IsTrue(r);
        Py_DECREF(r);
        if (truth < 0) {
            c->failed = 1;
            stop = 1;
        } else if (truth) {
            stop = 1;
        }
    }
out:
    c->ts = PyEval_SaveThread();
    return stop;
}

static PyObject *mod_pack(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *src = NULL, *out = NULL, *progress;
    unsigned long long shard_size, record_bytes, header_bytes;
    unsigned max_side, quality, raw_h, raw_w, raw_c, threads, align, label_bytes;
    int skip_bad, restart = 0;
    if (!PyArg_ParseTuple(args, "O&O&KIIIIIIIpKKIO|p", PyUnicode_FSConverter, &src,
                          PyUnicode_FSConverter, &out, &shard_size, &max_side, &quality, &raw_h,
                          &raw_w, &raw_c, &threads, &align, &skip_bad, &record_bytes, &header_bytes,
                          &label_bytes, &progress, &restart)) {
        Py_XDECREF(src);
        Py_XDECREF(out);
        return NULL;
    }
    PyObject *ret = NULL;
    pack_ctx c = {NULL, progress, PyList_New(0), 0};
    if (!c.skipped)
        goto done;
    stk_pack_options o = {.struct_size = sizeof o};
    o.shard_size = shard_size;
    o.max_side = max_side;
    o.quality = quality;
    o.raw_h = raw_h;
    o.raw_w = raw_w;
    o.raw_c = raw_c;
    o.threads = threads;
    o.align = align;
    o.skip_bad = skip_bad;
    o.record_bytes = (size_t)record_bytes;
    o.header_bytes = (size_t)header_bytes;
    o.label_bytes = label_bytes;
    o.restart = restart;
    o.progress = pack_progress_cb;
    o.progress_user = &c;
    stk_pack_result r = {.struct_size = sizeof r};
    char err[1024] = "";
    c.ts = PyEval_SaveThread();
    int rc = stk_pack(PyBytes_AS_STRING(src), PyBytes_AS_STRING(out), &o, &r, err, sizeof err);
    PyEval_RestoreThread(c.ts);
    if (c.failed) /* the exception from the callback (KeyboardInterrupt, ...) */
        goto done;
    if (rc) {
        raise_code(rc, err);
        goto done;
    }
    static const char *const kinds[] = {"encoded", "resized", "raw", "fields"};
    ret = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:s,s:d,s:O,s:K}", "samples", (unsigned long long)r.samples, "skipped",
        (unsigned long long)r.skipped, "shards", (unsigned long long)r.shards, "bytes",
        (unsigned long long)r.bytes, "payload", r.payload < 4 ? kinds[r.payload] : "unknown",
        "seconds", r.seconds, "skipped_samples", c.skipped, "restart_indexed",
        (unsigned long long)r.restart_indexed);
done:
    Py_XDECREF(c.skipped);
    Py_DECREF(src);
    Py_DECREF(out);
    return ret;
}

/* options() -> the library's option table (stk_option_next), one dict per
 * key, so Python's checks and messages come from the library. */
static PyObject *mod_options(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    static const char *const types[] = {"bool", "int", "uint", "size", "string", "enum"};
    PyObject *list = PyList_New(0);
    for (const stk_option_info *in = stk_option_next(NULL); list && in; in = stk_option_next(in)) {
        PyObject *d = Py_BuildValue(
            "{s:s,s:s,s:K,s:K,s:z,s:z,s:s,s:s,s:I}", "name", in->name, "type",
            in->type >= 0 && in->type <= STK_OPTION_ENUM ? types[in->type] : "?", "min",
            (unsigned long long)in->min, "max", (unsigned long long)in->max, "values", in->values,
            "unit", in->unit, "default", in->def, "doc", in->doc, "flags", in->flags);
        if (!d || PyList_Append(list, d)) {
            Py_XDECREF(d);
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(d);
    }
    return list;
}

/* option_error(key, value) -> None when stk_options_set takes value for key,
 * else the library's message (which key, which value, what it takes). */
static PyObject *mod_option_error(PyObject *self, PyObject *args)
{
    (void)self;
    const char *k, *v;
    if (!PyArg_ParseTuple(args, "ss:option_error", &k, &v))
        return NULL;
    stk_options *o = NULL;
    if (stk_options_create(&o) != STK_OK)
        return PyErr_NoMemory();
    PyObject *r = Py_None;
    if (stk_options_set(o, k, v) == STK_OK)
        Py_INCREF(r);
    else
        r = PyUnicode_FromString(stk_options_errmsg(o));
    stk_options_destroy(o);
    return r;
}

/* presets() -> [(name, sized)]: the transform presets and whether size=
 * sets their output size. */
static PyObject *mod_presets(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    PyObject *list = PyList_New(0);
    for (const char *p = stk_transform_preset_next(NULL); list && p;
         p = stk_transform_preset_next(p)) {
        PyObject *t = Py_BuildValue("(sO)", p, stk_transform_preset_sized(p) ? Py_True : Py_False);
        if (!t || PyList_Append(list, t))
            Py_CLEAR(list);
        Py_XDECREF(t);
    }
    return list;
}

static PyMethodDef module_methods[] = {
    {"options", mod_options, METH_NOARGS,
     "options() -> [dict]: every stk_options_set key (name, type, min, max, values, unit, "
     "default, doc, flags)."},
    {"option_error", mod_option_error, METH_VARARGS,
     "option_error(key, value) -> None, or why the library refuses value for key."},
    {"presets", mod_presets, METH_NOARGS,
     "presets() -> [(name, sized)]: transform presets, sized when size= sets their output."},
    {"pack", mod_pack, METH_VARARGS,
     "pack(src, out, shard_size, max_side, quality, raw_h, raw_w, raw_c, threads, align, "
     "skip_bad, record_bytes, header_bytes, label_bytes, progress, restart=False) -> dict (see "
     "stoker.pack)"},
    {"version", mod_version, METH_NOARGS, "The C library's version string."},
    {"strerror", mod_strerror, METH_VARARGS, "Static text of a return code."},
    {"errname", mod_errname, METH_VARARGS,
     "A return code's name (\"STK_EIO\"), or None for a number that is no code."},
    {"_exception", mod_exception, METH_VARARGS,
     "_exception(code, message) -> the exception a library error with that code raises."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_stoker",
    "C core of the stoker package (see stoker.Loader).",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__stoker(void);

PyMODINIT_FUNC PyInit__stoker(void)
{
    if (PyType_Ready(&View_Type) < 0 || PyType_Ready(&Batch_Type) < 0 ||
        PyType_Ready(&Engine_Type) < 0 || PyType_Ready(&ShardWriter_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    g_Error = PyErr_NewExceptionWithDoc(
        "stoker.Error",
        "A stoker loader error. .code is the C library's STK_E* code and .code_name its name.",
        PyExc_RuntimeError, NULL);
    g_SampleError = g_Error ? PyErr_NewExceptionWithDoc(
                                  "stoker.SampleError",
                                  "A sample failed under on_error=\"raise\". The message names "
                                  "it; .sample, .path, .reason and .errors (every failure of "
                                  "the batch) give details. Calling next() again on the same "
                                  "iterator delivers the batch without the failed samples.",
                                  g_Error, NULL)
                            : NULL;
    if (!g_SampleError)
        goto fail;
    g_Warning = PyErr_NewExceptionWithDoc(
        "stoker.StokerWarning",
        "A condition the library went on after (a remote dataset's damaged stoker.index, a "
        "damaged cached bucket listing): the library's warning channel, never stderr.",
        PyExc_RuntimeWarning, NULL);
    if (!g_Warning)
        goto fail;
    Py_INCREF(g_Error);
    Py_INCREF(g_SampleError);
    Py_INCREF(g_Warning);
    Py_INCREF(&Engine_Type);
    Py_INCREF(&Batch_Type);
    Py_INCREF(&View_Type);
    Py_INCREF(&ShardWriter_Type);
    if (PyModule_AddObject(m, "Error", g_Error) < 0 ||
        PyModule_AddObject(m, "ShardWriter", (PyObject *)&ShardWriter_Type) < 0 ||
        PyModule_AddObject(m, "SampleError", g_SampleError) < 0 ||
        PyModule_AddObject(m, "StokerWarning", g_Warning) < 0 ||
        PyModule_AddObject(m, "Engine", (PyObject *)&Engine_Type) < 0 ||
        PyModule_AddObject(m, "Batch", (PyObject *)&Batch_Type) < 0 ||
        PyModule_AddObject(m, "View", (PyObject *)&View_Type) < 0 ||
        PyModule_AddIntConstant(m, "STK_END", STK_END) < 0 ||
        PyModule_AddIntConstant(m, "BATCH_SIZE_MAX", STK_BATCH_SIZE_MAX) < 0 ||
        PyModule_AddIntConstant(m, "THREADS_MAX", STK_THREADS_MAX) < 0 ||
        PyModule_AddStringConstant(m, "C_VERSION", STK_VERSION_STRING) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
