/* nvdispatch's cuBLASLt plans as an XLA FFI handler (part of nvdispatch._hotpath; _hotpath.c adds these
 * functions to the module). Python side: nvdispatch/integrations/jax_ffi.py.
 *
 * A JAX program staged with jax.ffi.ffi_call("nvdispatch_lt_matmul", ...) calls ffi_matmul on XLA's thread with
 * XLA's device buffers, its stream and one attribute, `plan` (a scalar int64): the id of a plan group that
 * Python registered while tracing (ffi_new_plan, then ffi_set_plan for each GPU the program may run on). The
 * handler picks the device's entry, the algorithm for the buffers' alignment, sets the bias/aux pointers and
 * queues one cublasLtMatmul through the launch every compiled path shares (_hotpath_lt.h). The last result buffer
 * is the workspace XLA allocates for the call. No Python object is touched and the GIL is never taken.
 *
 * Entries are never freed: an XLA executable may keep a plan id as long as the process lives. An entry holds
 * its own descriptor and layouts (Python keeps their owners alive, with the host scalars), so the plan cache
 * may evict and release the plan it came from without any executable launching freed memory.
 *
 * Built against the XLA FFI C API header of the jaxlib installed at build time (setup.py defines
 * NVD_XLA_FFI and adds jaxlib's include directory); without it the module says so (ffi_info) and the handler
 * is absent. The handler reports the header's API version in XLA's metadata query, so an XLA that does not
 * support it refuses the registration with its own error; at run time it checks the call frame and API
 * structs it reads and returns an error (never reads past them) where they are older than its header's.
 */
#include "_hotpath_lt.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVD_FFI_MAX_DEVICES 64
#define NVD_FFI_MAX_BUFFERS 8
#define NVD_FFI_MAX_ALGOS 8
#define NVD_FFI_ALGO_BYTES 64 /* sizeof(cublasLtMatmulAlgo_t) */
#define NVD_FFI_CHUNK 256
#define NVD_FFI_CHUNKS 256 /* at most 65536 plan groups in a process */

/* what each operand and result buffer is to the launch (Python passes these codes) */
enum { ROLE_A, ROLE_B, ROLE_C, ROLE_BIAS, ROLE_AUX, N_IN_ROLES };
enum { ROLE_D, ROLE_AUX_OUT, ROLE_BGRAD, N_OUT_ROLES };

/* the algorithms of one entry, best alignment first; immutable once published (autotune publishes a new set) */
typedef struct {
    int n;
    int64_t alignment[NVD_FFI_MAX_ALGOS];
    int64_t workspace[NVD_FFI_MAX_ALGOS];
    unsigned char algo[NVD_FFI_MAX_ALGOS][NVD_FFI_ALGO_BYTES];
} NvdFfiAlgos;

/* what an entry's launches did, for probes comparing routes (ffi_launch_record): written by the handler on XLA's
 * thread without a lock (counters atomically; the last launch's fields may be read mid-update, probes read them
 * once the program has finished) */
typedef struct {
    int64_t calls;      /* launches queued by the handler (one per handler call that reached cuBLASLt) */
    int64_t captured;   /* of those, launches on a stream being captured into a CUDA graph (where asked) */
    int64_t uncaptured; /* of those, launches the capture query answered "not capturing" */
    int index;          /* the last launch: which of the entry's algorithms (best alignment first) */
    int64_t alignment;  /* ... the buffers' alignment (bytes, at most 256) */
    int64_t workspace;  /* ... the workspace bytes given to cublasLtMatmul */
    int64_t capacity;   /* ... the bytes of the workspace buffer XLA allocated */
    void *stream;       /* ... the stream */
    unsigned char algo[NVD_FFI_ALGO_BYTES]; /* ... the cublasLtMatmulAlgo_t */
} NvdFfiRecord;

/* cuStreamIsCapturing (CUresult (CUstream, CUstreamCaptureStatus *)), set by a probe: launches then count those on
 * a stream being captured; NULL (the default) asks nothing */
typedef int (*capture_query_fn)(void *stream, int *status);
static capture_query_fn capture_query;

typedef struct {
    NvdLtLaunch launch;
    NvdFfiAlgos *algos; /* read with acquire, replaced whole with release */
    void *alpha, *beta; /* host scalars in the scale type */
    int bias_attr, aux_attr;
    int n_in, n_out; /* operand buffers; result buffers, the workspace not counted */
    int role_in[NVD_FFI_MAX_BUFFERS], role_out[NVD_FFI_MAX_BUFFERS];
    int64_t count_in[NVD_FFI_MAX_BUFFERS], count_out[NVD_FFI_MAX_BUFFERS]; /* elements each buffer holds */
    PyObject *keep; /* the owners of the descriptor, layouts and scalars (never released) */
    NvdFfiRecord record; /* what its launches did (ffi_launch_record) */
} NvdFfiEntry;

typedef struct {
    NvdFfiEntry *by_device[NVD_FFI_MAX_DEVICES];
} NvdFfiGroup;

static NvdFfiGroup **groups[NVD_FFI_CHUNKS]; /* chunks of NVD_FFI_CHUNK groups; written under the GIL only */
static int64_t n_groups;

#define LOAD(p) __atomic_load_n(&(p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n(&(p), (v), __ATOMIC_RELEASE)

static NvdFfiGroup *
find_group(int64_t id)
{
    if (id < 0 || id >= (int64_t)NVD_FFI_CHUNK * NVD_FFI_CHUNKS)
        return NULL;
    NvdFfiGroup **chunk = LOAD(groups[id / NVD_FFI_CHUNK]);
    return chunk == NULL ? NULL : LOAD(chunk[id % NVD_FFI_CHUNK]);
}

/* -- Python side: the plan table ---------------------------------------------------------------------------- */

/* ffi_new_plan() -> id: a new plan group, with no device entry yet */
static PyObject *
ffi_new_plan(PyObject *module, PyObject *unused)
{
    int64_t id = n_groups;
    if (id >= (int64_t)NVD_FFI_CHUNK * NVD_FFI_CHUNKS) {
        PyErr_SetString(PyExc_OverflowError, "nvdispatch's XLA FFI plan table is full");
        return NULL;
    }
    NvdFfiGroup **chunk = groups[id / NVD_FFI_CHUNK];
    if (chunk == NULL) {
        chunk = calloc(NVD_FFI_CHUNK, sizeof(NvdFfiGroup *));
        if (chunk == NULL)
            return PyErr_NoMemory();
        STORE(groups[id / NVD_FFI_CHUNK], chunk);
    }
    NvdFfiGroup *g = calloc(1, sizeof(NvdFfiGroup));
    if (g == NULL)
        return PyErr_NoMemory();
    STORE(chunk[id % NVD_FFI_CHUNK], g);
    n_groups = id + 1;
    return PyLong_FromLongLong(id);
}

/* algos: a sequence of (alignment, algorithm bytes, workspace bytes), best alignment first */
static NvdFfiAlgos *
parse_algos(PyObject *seq)
{
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0)
        return NULL;
    if (n < 1 || n > NVD_FFI_MAX_ALGOS) {
        PyErr_Format(PyExc_ValueError, "algorithms: expected 1 to %d, got %zd", NVD_FFI_MAX_ALGOS, n);
        return NULL;
    }
    NvdFfiAlgos *a = calloc(1, sizeof(NvdFfiAlgos));
    if (a == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    a->n = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        long long alignment, workspace;
        const char *bytes;
        Py_ssize_t len;
        int ok = item != NULL && PyArg_ParseTuple(item, "Ly#L", &alignment, &bytes, &len, &workspace);
        if (ok) {
            a->alignment[i] = alignment;
            a->workspace[i] = workspace;
            if (len == NVD_FFI_ALGO_BYTES)
                memcpy(a->algo[i], bytes, NVD_FFI_ALGO_BYTES);
        }
        Py_XDECREF(item);
        if (!ok || len != NVD_FFI_ALGO_BYTES || alignment < 1 || workspace < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "algorithm %zd: expected (alignment >= 1, %d bytes, workspace >= 0)",
                             i, NVD_FFI_ALGO_BYTES);
            free(a);
            return NULL;
        }
    }
    return a;
}

/* roles and element counts of a sequence of (role, count) */
static int
parse_buffers(PyObject *seq, int n_roles, int *roles, int64_t *counts, int *n, const char *what)
{
    Py_ssize_t size = PySequence_Size(seq);
    if (size < 0)
        return -1;
    if (size > NVD_FFI_MAX_BUFFERS) {
        PyErr_Format(PyExc_ValueError, "%s: at most %d buffers, got %zd", what, NVD_FFI_MAX_BUFFERS, size);
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        int role;
        long long count;
        PyObject *item = PySequence_GetItem(seq, i);
        int ok = item != NULL && PyArg_ParseTuple(item, "iL", &role, &count);
        Py_XDECREF(item);
        if (!ok || role < 0 || role >= n_roles || count < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "%s %zd: expected (role in [0, %d), elements >= 0)", what, i, n_roles);
            return -1;
        }
        roles[i] = role;
        counts[i] = count;
    }
    *n = (int)size;
    return 0;
}

/* the integers ffi_set_plan takes, in this order */
enum {
    F_MATMUL,        /* cublasLtMatmul's address */
    F_SET_ATTRIBUTE, /* cublasLtMatmulDescSetAttribute's address */
    F_HANDLE,
    F_DESC, /* the entry's own descriptor (no other launch sets its pointers) */
    F_A_LAYOUT,
    F_B_LAYOUT,
    F_C_LAYOUT,
    F_D_LAYOUT,
    F_ALPHA, /* host pointer to alpha in the scale type */
    F_BETA,  /* host pointer to beta (0 without c) */
    F_A_FIRST,
    F_BIAS_ATTR, /* CUBLASLT_MATMUL_DESC_BIAS_POINTER */
    F_AUX_ATTR,  /* CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER */
    N_FFI_INTS
};

/* ffi_set_plan(id, device, ints, inputs, outputs, algorithms, keep): the entry of plan group id for CUDA device
 * `device` (inputs/outputs: (role, elements) per buffer, in the call's order; keep: what owns the descriptor,
 * layouts and scalars, held for the process) */
static PyObject *
ffi_set_plan(PyObject *module, PyObject *args)
{
    long long id;
    int device;
    PyObject *ints, *inputs, *outputs, *algos, *keep;
    if (!PyArg_ParseTuple(args, "LiO!OOOO:ffi_set_plan", &id, &device, &PyTuple_Type, &ints, &inputs, &outputs,
                          &algos, &keep))
        return NULL;
    NvdFfiGroup *g = find_group(id);
    if (g == NULL || device < 0 || device >= NVD_FFI_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "ffi_set_plan: no plan group %lld or device %d out of range", id, device);
        return NULL;
    }
    if (g->by_device[device] != NULL) {
        PyErr_Format(PyExc_ValueError, "ffi_set_plan: plan group %lld has an entry for device %d", id, device);
        return NULL;
    }
    if (PyTuple_Size(ints) != N_FFI_INTS) {
        PyErr_Format(PyExc_TypeError, "ffi_set_plan: expected %d ints, got %zd", N_FFI_INTS, PyTuple_Size(ints));
        return NULL;
    }
    void *p[N_FFI_INTS];
    long small[N_FFI_INTS];
    for (int i = 0; i < N_FFI_INTS; i++) {
        PyObject *v = PyTuple_GetItem(ints, i);
        if (i >= F_A_FIRST) {
            small[i] = PyLong_AsLong(v);
            p[i] = NULL;
        } else {
            p[i] = PyLong_AsVoidPtr(v);
            if (p[i] == NULL && !PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "ffi_set_plan: int %d is a null address", i);
        }
        if (PyErr_Occurred())
            return NULL;
    }
    NvdFfiEntry *e = calloc(1, sizeof(NvdFfiEntry));
    if (e == NULL)
        return PyErr_NoMemory();
    if (parse_buffers(inputs, N_IN_ROLES, e->role_in, e->count_in, &e->n_in, "input") < 0 ||
        parse_buffers(outputs, N_OUT_ROLES, e->role_out, e->count_out, &e->n_out, "output") < 0) {
        free(e);
        return NULL;
    }
    e->algos = parse_algos(algos);
    if (e->algos == NULL) {
        free(e);
        return NULL;
    }
    if (nvd_lt_launch_init(&e->launch) < 0) {
        free(e->algos);
        free(e);
        return PyErr_NoMemory();
    }
    e->launch.matmul = (lt_matmul_fn)p[F_MATMUL];
    e->launch.set_attribute = (lt_set_attribute_fn)p[F_SET_ATTRIBUTE];
    e->launch.handle = p[F_HANDLE];
    e->launch.desc = p[F_DESC];
    e->launch.a_layout = p[F_A_LAYOUT];
    e->launch.b_layout = p[F_B_LAYOUT];
    e->launch.c_layout = p[F_C_LAYOUT];
    e->launch.d_layout = p[F_D_LAYOUT];
    e->launch.a_first = small[F_A_FIRST] != 0;
    e->alpha = p[F_ALPHA];
    e->beta = p[F_BETA];
    e->bias_attr = (int)small[F_BIAS_ATTR];
    e->aux_attr = (int)small[F_AUX_ATTR];
    Py_INCREF(keep);
    e->keep = keep;
    STORE(g->by_device[device], e);
    Py_RETURN_NONE;
}

/* ffi_set_algorithms(id, device, algorithms): the algorithms launches of an entry use from now on (autotune) */
static PyObject *
ffi_set_algorithms(PyObject *module, PyObject *args)
{
    long long id;
    int device;
    PyObject *algos;
    if (!PyArg_ParseTuple(args, "LiO:ffi_set_algorithms", &id, &device, &algos))
        return NULL;
    NvdFfiGroup *g = find_group(id);
    NvdFfiEntry *e = g == NULL || device < 0 || device >= NVD_FFI_MAX_DEVICES ? NULL : g->by_device[device];
    if (e == NULL) {
        PyErr_Format(PyExc_ValueError, "ffi_set_algorithms: no entry for plan %lld on device %d", id, device);
        return NULL;
    }
    NvdFfiAlgos *a = parse_algos(algos);
    if (a == NULL)
        return NULL;
    STORE(e->algos, a); /* the previous set stays allocated: a launch may be reading it */
    Py_RETURN_NONE;
}

/* ffi_set_capture_query(address): cuStreamIsCapturing's address (0: none), consulted by every launch from now on
 * to count those under CUDA-graph capture (ffi_launch_record's "captured"); for probes, not for production */
static PyObject *
ffi_set_capture_query(PyObject *module, PyObject *address)
{
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    __atomic_store_n(&capture_query, (capture_query_fn)p, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* ffi_launch_record(id, device) -> dict: what the entry's launches did (see NvdFfiRecord) */
static PyObject *
ffi_launch_record(PyObject *module, PyObject *args)
{
    long long id;
    int device;
    if (!PyArg_ParseTuple(args, "Li:ffi_launch_record", &id, &device))
        return NULL;
    NvdFfiGroup *g = find_group(id);
    NvdFfiEntry *e = g == NULL || device < 0 || device >= NVD_FFI_MAX_DEVICES ? NULL : LOAD(g->by_device[device]);
    if (e == NULL) {
        PyErr_Format(PyExc_ValueError, "ffi_launch_record: no entry for plan %lld on device %d", id, device);
        return NULL;
    }
    NvdFfiRecord r = e->record;
    r.calls = __atomic_load_n(&e->record.calls, __ATOMIC_RELAXED);
    r.captured = __atomic_load_n(&e->record.captured, __ATOMIC_RELAXED);
    r.uncaptured = __atomic_load_n(&e->record.uncaptured, __ATOMIC_RELAXED);
    int seen = r.calls > 0;
    return Py_BuildValue("{s:L,s:L,s:L,s:i,s:L,s:L,s:L,s:K,s:y#}", "calls", (long long)r.calls, "captured",
                         (long long)r.captured, "uncaptured", (long long)r.uncaptured, "index", seen ? r.index : -1,
                         "alignment", (long long)r.alignment, "workspace", (long long)r.workspace, "capacity",
                         (long long)r.capacity, "stream", (unsigned long long)(uintptr_t)r.stream, "algorithm",
                         (const char *)r.algo, (Py_ssize_t)(seen ? NVD_FFI_ALGO_BYTES : 0));
}

#ifdef NVD_XLA_FFI
#include "xla/ffi/api/c_api.h"

/* note a launch of algorithm k of `algos` in `r` (see NvdFfiRecord) */
static void
record_launch(NvdFfiRecord *r, const NvdFfiAlgos *algos, int k, int64_t alignment, int64_t capacity, void *stream)
{
    __atomic_add_fetch(&r->calls, 1, __ATOMIC_RELAXED);
    capture_query_fn query = __atomic_load_n(&capture_query, __ATOMIC_ACQUIRE);
    int capture_status = 0;
    if (query != NULL && stream != NULL && query(stream, &capture_status) == 0)
        __atomic_add_fetch(capture_status != 0 ? &r->captured : &r->uncaptured, 1, __ATOMIC_RELAXED);
    r->index = k;
    r->alignment = alignment;
    r->workspace = algos->workspace[k];
    r->capacity = capacity;
    r->stream = stream;
    memcpy(r->algo, algos->algo[k], NVD_FFI_ALGO_BYTES);
}

/* what the handler reads of the call frame and the API: present in every version it accepts */
#define FRAME_NEEDS (offsetof(XLA_FFI_CallFrame, attrs) + sizeof(XLA_FFI_Attrs))
#define API_HAS(api, field) ((api)->struct_size >= offsetof(XLA_FFI_Api, field) + sizeof((api)->field))

static XLA_FFI_Error *
ffi_error(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *message)
{
    if (api == NULL || !API_HAS(api, XLA_FFI_Error_Create))
        return NULL; /* nothing to report through */
    XLA_FFI_Error_Create_Args args;
    memset(&args, 0, sizeof(args));
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = message;
    args.errc = code;
    return api->XLA_FFI_Error_Create(&args);
}

/* XLA's metadata query (at registration): the API version of the header the handler was built against */
static XLA_FFI_Error *
fill_metadata(XLA_FFI_CallFrame *frame, XLA_FFI_Handler_Traits traits)
{
    XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)frame->extension_start;
    if (ext->extension_base.struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE || ext->metadata == NULL ||
        ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE)
        return ffi_error(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                         "nvdispatch's XLA FFI handler: XLA's metadata structs are older than the handler's header "
                         "(rebuild nvdispatch's extension against the installed jaxlib)");
    XLA_FFI_Metadata *m = ext->metadata;
    m->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    m->api_version.extension_start = NULL;
    m->api_version.major_version = XLA_FFI_API_MAJOR;
    m->api_version.minor_version = XLA_FFI_API_MINOR;
    m->traits = traits;
    return NULL;
}

/* the int64 scalar attribute `plan`; -1 where absent or of another type */
static int64_t
plan_attribute(const XLA_FFI_Attrs *attrs)
{
    for (int64_t i = 0; i < attrs->size; i++) {
        const XLA_FFI_ByteSpan *name = attrs->names[i];
        if (name->len != 4 || memcmp(name->ptr, "plan", 4) != 0)
            continue;
        if (attrs->types[i] != XLA_FFI_AttrType_SCALAR)
            return -1;
        const XLA_FFI_Scalar *s = (const XLA_FFI_Scalar *)attrs->attrs[i];
        return s->dtype == XLA_FFI_DataType_S64 ? *(const int64_t *)s->value : -1;
    }
    return -1;
}

/* the buffer i of args/rets when its element count is `count`; NULL otherwise */
static XLA_FFI_Buffer *
buffer(void *p, int is_buffer, int64_t count)
{
    if (!is_buffer)
        return NULL;
    XLA_FFI_Buffer *b = (XLA_FFI_Buffer *)p;
    if (b->struct_size < XLA_FFI_Buffer_STRUCT_SIZE)
        return NULL;
    int64_t n = 1;
    for (int64_t d = 0; d < b->rank; d++)
        n *= b->dims[d];
    return n == count ? b : NULL;
}

static XLA_FFI_Error *
run_matmul(XLA_FFI_CallFrame *frame, int on_device, XLA_FFI_Handler_Traits traits)
{
    if (frame->extension_start != NULL && frame->extension_start->type == XLA_FFI_Extension_Metadata)
        return fill_metadata(frame, traits);
    const XLA_FFI_Api *api = frame->api;
    char msg[320];
    if (frame->struct_size < FRAME_NEEDS || api == NULL || !API_HAS(api, XLA_FFI_DeviceOrdinal_Get) ||
        api->api_version.major_version != XLA_FFI_API_MAJOR) {
        snprintf(msg, sizeof(msg),
                 "nvdispatch's XLA FFI handler was built against XLA FFI API %d.%d, which this XLA (API %d.%d) "
                 "does not serve: rebuild nvdispatch's extension against the installed jaxlib, or set "
                 "NVDISPATCH_JAX_ROUTE=callback",
                 XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR, api == NULL ? -1 : api->api_version.major_version,
                 api == NULL ? -1 : api->api_version.minor_version);
        return ffi_error(api, XLA_FFI_Error_Code_FAILED_PRECONDITION, msg);
    }
    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL; /* nothing to instantiate, prepare or initialize */
    int64_t id = plan_attribute(&frame->attrs);
    NvdFfiGroup *g = find_group(id);
    int32_t device = 0;
    if (on_device) {
        XLA_FFI_DeviceOrdinal_Get_Args oargs;
        memset(&oargs, 0, sizeof(oargs));
        oargs.struct_size = XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE;
        oargs.ctx = frame->ctx;
        XLA_FFI_Error *err = api->XLA_FFI_DeviceOrdinal_Get(&oargs);
        if (err != NULL)
            return err;
        device = oargs.device_ordinal;
    }
    NvdFfiEntry *e = g == NULL || device < 0 || device >= NVD_FFI_MAX_DEVICES ? NULL : LOAD(g->by_device[device]);
    if (e == NULL) {
        snprintf(msg, sizeof(msg),
                 "nvdispatch: no cuBLASLt plan %lld for device %d (the attribute 'plan' of this call names none: "
                 "a program traced in another process, or for other devices)",
                 (long long)id, (int)device);
        return ffi_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
    }
    if (frame->args.size != e->n_in || frame->rets.size != e->n_out + 1) {
        snprintf(msg, sizeof(msg), "nvdispatch: plan %lld takes %d operands and %d results, got %lld and %lld",
                 (long long)id, e->n_in, e->n_out + 1, (long long)frame->args.size, (long long)frame->rets.size);
        return ffi_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
    }
    void *in[N_IN_ROLES] = {NULL}, *out[N_OUT_ROLES] = {NULL};
    for (int i = 0; i < e->n_in; i++) {
        XLA_FFI_Buffer *b = buffer(frame->args.args[i], frame->args.types[i] == XLA_FFI_ArgType_BUFFER, e->count_in[i]);
        if (b == NULL)
            goto wrong_buffer;
        in[e->role_in[i]] = b->data;
    }
    for (int i = 0; i < e->n_out; i++) {
        XLA_FFI_Buffer *b =
            buffer(frame->rets.rets[i], frame->rets.types[i] == XLA_FFI_RetType_BUFFER, e->count_out[i]);
        if (b == NULL)
            goto wrong_buffer;
        out[e->role_out[i]] = b->data;
    }
    XLA_FFI_Buffer *ws = (XLA_FFI_Buffer *)frame->rets.rets[e->n_out];
    if (frame->rets.types[e->n_out] != XLA_FFI_RetType_BUFFER || ws->rank != 1)
        goto wrong_buffer;
    void *stream = NULL;
    if (on_device) {
        XLA_FFI_Stream_Get_Args sargs;
        memset(&sargs, 0, sizeof(sargs));
        sargs.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
        sargs.ctx = frame->ctx;
        XLA_FFI_Error *err = api->XLA_FFI_Stream_Get(&sargs);
        if (err != NULL)
            return err;
        stream = sargs.stream;
    }
    void *c = in[ROLE_C] != NULL ? in[ROLE_C] : out[ROLE_D];
    uintptr_t mixed = (uintptr_t)in[ROLE_A] | (uintptr_t)in[ROLE_B] | (uintptr_t)c | (uintptr_t)out[ROLE_D];
    int64_t alignment = (mixed & 255) ? (int64_t)(mixed & (~mixed + 1)) : 256;
    const NvdFfiAlgos *algos = LOAD(e->algos);
    int k = 0;
    while (k < algos->n && algos->alignment[k] > alignment)
        k++;
    if (k == algos->n || algos->workspace[k] > ws->dims[0]) {
        snprintf(msg, sizeof(msg),
                 "nvdispatch: plan %lld has no cuBLASLt algorithm for %lld-byte aligned buffers within the %lld-byte "
                 "workspace",
                 (long long)id, (long long)alignment, (long long)ws->dims[0]);
        return ffi_error(api, XLA_FFI_Error_Code_FAILED_PRECONDITION, msg);
    }
    NvdLtPointer pointers[NVD_LT_MAX_POINTERS];
    int n_pointers = 0;
    void *bias = out[ROLE_BGRAD] != NULL ? out[ROLE_BGRAD] : in[ROLE_BIAS];
    void *aux = out[ROLE_AUX_OUT] != NULL ? out[ROLE_AUX_OUT] : in[ROLE_AUX];
    if (bias != NULL) {
        pointers[n_pointers].attr = e->bias_attr;
        pointers[n_pointers++].value = bias;
    }
    if (aux != NULL) {
        pointers[n_pointers].attr = e->aux_attr;
        pointers[n_pointers++].value = aux;
    }
    int failed_pointer;
    int status = nvd_lt_launch(&e->launch, algos->algo[k], e->alpha, e->beta, in[ROLE_A], in[ROLE_B], c, out[ROLE_D],
                               pointers, n_pointers, ws->data, (size_t)algos->workspace[k], stream, &failed_pointer);
    if (status != 0) {
        snprintf(msg, sizeof(msg), "nvdispatch: %s failed with cuBLASLt status %d (plan %lld)",
                 failed_pointer ? "cublasLtMatmulDescSetAttribute" : "cublasLtMatmul", status, (long long)id);
        return ffi_error(api, XLA_FFI_Error_Code_INTERNAL, msg);
    }
    record_launch(&e->record, algos, k, alignment, ws->dims[0], stream);
    return NULL;

wrong_buffer:
    snprintf(msg, sizeof(msg),
             "nvdispatch: the buffers of this call are not those plan %lld was made for (types or element counts)",
             (long long)id);
    return ffi_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
}

/* the handler XLA's GPU backend calls, outside its command buffers (CUDA graphs) */
static XLA_FFI_Error *
ffi_matmul(XLA_FFI_CallFrame *frame)
{
    return run_matmul(frame, 1, 0);
}

/* the same, declared command-buffer compatible: XLA may capture it into its CUDA graphs (a launch depends on
 * the plan and the buffers only) and replay it without calling the handler */
static XLA_FFI_Error *
ffi_matmul_graphs(XLA_FFI_CallFrame *frame)
{
    return run_matmul(frame, 1, XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE);
}

/* the same for XLA's CPU backend, with no stream and device 0: only for launch probes in tests */
static XLA_FFI_Error *
ffi_matmul_host(XLA_FFI_CallFrame *frame)
{
    return run_matmul(frame, 0, 0);
}

/* ffi_handler(kind) -> the handler as a PyCapsule for jax.ffi.register_ffi_target: kind "gpu", "gpu-graphs"
 * (command-buffer compatible) or "host" (tests) */
static PyObject *
ffi_handler(PyObject *module, PyObject *kind)
{
    const char *name = PyUnicode_Check(kind) ? PyUnicode_AsUTF8AndSize(kind, NULL) : NULL;
    if (name == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "ffi_handler: expected 'gpu', 'gpu-graphs' or 'host'");
        return NULL;
    }
    void *fn = strcmp(name, "gpu") == 0          ? (void *)ffi_matmul
               : strcmp(name, "gpu-graphs") == 0 ? (void *)ffi_matmul_graphs
               : strcmp(name, "host") == 0       ? (void *)ffi_matmul_host
                                                 : NULL;
    if (fn == NULL) {
        PyErr_Format(PyExc_ValueError, "ffi_handler: expected 'gpu', 'gpu-graphs' or 'host', got %R", kind);
        return NULL;
    }
    return PyCapsule_New(fn, NULL, NULL);
}

/* ffi_info() -> (built, major, minor): whether the handler is built, and its header's API version */
static PyObject *
ffi_info(PyObject *module, PyObject *unused)
{
    return Py_BuildValue("(Oii)", Py_True, XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
}

#else /* built without jaxlib's XLA FFI header */

static PyObject *
ffi_handler(PyObject *module, PyObject *kind)
{
    PyErr_SetString(PyExc_NotImplementedError,
                    "nvdispatch's extension was built without jaxlib's XLA FFI header (no jaxlib at build time)");
    return NULL;
}

static PyObject *
ffi_info(PyObject *module, PyObject *unused)
{
    return Py_BuildValue("(Oii)", Py_False, -1, -1);
}
#endif

static PyMethodDef ffi_methods[] = {
    {"ffi_info", ffi_info, METH_NOARGS,
     "ffi_info() -> (built, major, minor): whether the XLA FFI handler is built, and its XLA FFI API version"},
    {"ffi_handler", ffi_handler, METH_O, "ffi_handler(kind) -> the XLA FFI handler ('gpu', 'gpu-graphs', 'host'), a PyCapsule (see _hotpath_ffi.c)"},
    {"ffi_new_plan", ffi_new_plan, METH_NOARGS, "ffi_new_plan() -> id of a new plan group"},
    {"ffi_set_plan", ffi_set_plan, METH_VARARGS,
     "ffi_set_plan(id, device, ints, inputs, outputs, algorithms, keep): a plan group's entry for a device"},
    {"ffi_set_algorithms", ffi_set_algorithms, METH_VARARGS,
     "ffi_set_algorithms(id, device, algorithms): the algorithms of an entry from now on"},
    {"ffi_set_capture_query", ffi_set_capture_query, METH_O,
     "ffi_set_capture_query(address): cuStreamIsCapturing's address (0: none); launches then count those captured"},
    {"ffi_launch_record", ffi_launch_record, METH_VARARGS,
     "ffi_launch_record(id, device) -> dict: what the launches of an entry did (calls, captured, the last one's "
     "algorithm and workspace)"},
    {NULL, NULL, 0, NULL},
};

int
nvd_add_ffi(PyObject *module)
{
    return PyModule_AddFunctions(module, ffi_methods);
}
