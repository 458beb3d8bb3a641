/* cuBLASLt launches, compiled (part of nvdispatch._hotpath; _hotpath.c adds these functions to the module).
 *
 * make_lt_matmul: cublasLtMatmul called with its 16 integer arguments directly, sparing the conversion ctypes
 * makes on every launch.
 *
 * make_lt_direct: a cuBLASLt plan's whole direct call, direct(a, b[, x]) -> result, for operands that make
 * their results like themselves (a method of the operand, as the adapter's result_maker says) and give their
 * pointers by x.data_ptr() (Torch tensors): the result, and the extra output of an epilogue that writes one (its
 * aux, or its bias gradient), allocated like a; the operands' pointers; the current stream; the workspace where
 * the algorithm needs one (the plan's own for the stream); the epilogue's pointers (the bias or aux input x, the
 * extra output) set on the call's own descriptor where they changed; one cublasLtMatmul. The return value is the
 * Python path's: the result, or (result, {name: output}). Compiled, these steps cost less host time than in
 * Python (the Python side is nvdispatch/_cuda/lt_direct.py). A call it does not serve (an operand or the result
 * not 256-byte aligned: the plan then asks the heuristic again for the alignment; a stream being captured where
 * the algorithm needs a workspace) goes to the plan's Python direct call.
 */
#include "_hotpath_lt.h"
#include <stdlib.h>

#define LT_ARGS 16
#define LT_WS_SIZE 14 /* workspaceSizeInBytes, a size_t; every other argument is a pointer (an int, or None) */

/* -- cublasLtMatmul, called directly ------------------------------------------------------------------------
 * The same function pointer ctypes found, with the same integers. The GIL is released around the launch, as
 * ctypes does. */
static PyObject *
lt_matmul(PyObject *address, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != LT_ARGS) {
        PyErr_Format(PyExc_TypeError, "cublasLtMatmul takes %d arguments, got %zd", LT_ARGS, nargs);
        return NULL;
    }
    void *p[LT_ARGS];
    size_t ws_size = 0;
    for (int i = 0; i < LT_ARGS; i++) {
        if (i == LT_WS_SIZE)
            ws_size = PyLong_AsSize_t(args[i]);
        else
            p[i] = args[i] == Py_None ? NULL : PyLong_AsVoidPtr(args[i]);
        if (PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "cublasLtMatmul argument %d: expected an int address%s", i,
                         i == LT_WS_SIZE ? " size" : " or None");
            return NULL;
        }
    }
    lt_matmul_fn fn = (lt_matmul_fn)PyLong_AsVoidPtr(address);
    if (fn == NULL)
        return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = fn(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], ws_size,
                p[15]);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyMethodDef lt_matmul_def = {"cublasLtMatmul", (PyCFunction)(void (*)(void))lt_matmul, METH_FASTCALL,
                                    "cublasLtMatmul(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, "
                                    "Ddesc, algo, workspace, workspace_size, stream) -> status (ints)"};

static PyObject *
make_lt_matmul(PyObject *module, PyObject *address)
{
    if (!PyLong_Check(address) || PyLong_AsVoidPtr(address) == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "make_lt_matmul: expected cublasLtMatmul's address, a non-zero int");
        return NULL;
    }
    return PyCFunction_NewEx(&lt_matmul_def, address, NULL);
}

/* -- the one launch (see _hotpath_lt.h) ------------------------------------------------------------------ */

int
nvd_lt_launch_init(NvdLtLaunch *l)
{
    l->lock = PyThread_allocate_lock();
    return l->lock == NULL ? -1 : 0;
}

void
nvd_lt_launch_free(NvdLtLaunch *l)
{
    if (l->lock != NULL)
        PyThread_free_lock(l->lock);
    l->lock = NULL;
}

/* the slot of `attr` in what the descriptor holds (a free one where it holds none) */
static NvdLtPointer *
held_slot(NvdLtLaunch *l, int attr)
{
    NvdLtPointer *free_slot = NULL;
    for (int i = 0; i < NVD_LT_MAX_POINTERS; i++) {
        if (l->held[i].attr == attr)
            return &l->held[i];
        if (l->held[i].attr == 0 && free_slot == NULL)
            free_slot = &l->held[i];
    }
    return free_slot;
}

int
nvd_lt_launch(NvdLtLaunch *l, const void *algo, const void *alpha, const void *beta, void *ptr_a, void *ptr_b,
              void *ptr_c, void *ptr_d, const NvdLtPointer *pointers, int n_pointers, void *workspace,
              size_t workspace_size, void *stream, int *failed_pointer)
{
    void *A = l->a_first ? ptr_a : ptr_b, *B = l->a_first ? ptr_b : ptr_a;
    int status = 0;
    *failed_pointer = 0;
    PyThread_acquire_lock(l->lock, WAIT_LOCK);
    for (int i = 0; i < n_pointers && status == 0; i++) {
        NvdLtPointer *slot = held_slot(l, pointers[i].attr);
        if (slot != NULL && slot->attr == pointers[i].attr && slot->value == pointers[i].value)
            continue;
        status = l->set_attribute(l->desc, pointers[i].attr, &pointers[i].value, sizeof(void *));
        if (status == 0 && slot != NULL)
            *slot = pointers[i];
        else if (status != 0)
            *failed_pointer = 1;
    }
    if (status == 0)
        status = l->matmul(l->handle, l->desc, (void *)alpha, A, l->a_layout, B, l->b_layout, (void *)beta, ptr_c,
                           l->c_layout, ptr_d, l->d_layout, (void *)algo, workspace, workspace_size, stream);
    PyThread_release_lock(l->lock);
    return status;
}

/* -- a plan's direct call -------------------------------------------------------------------------------- */

/* the integers make_lt_direct takes, in this order */
enum {
    L_MATMUL,        /* cublasLtMatmul's address */
    L_SET_ATTRIBUTE, /* cublasLtMatmulDescSetAttribute's address */
    L_HANDLE,
    L_DESC, /* the direct call's own descriptor (no other launch sets its pointers) */
    L_A_LAYOUT,
    L_B_LAYOUT,
    L_C_LAYOUT,
    L_D_LAYOUT,
    L_ALGO,       /* address of the cublasLtMatmulAlgo_t */
    L_ALPHA,      /* host pointer to 1 in the scale type */
    L_BETA,       /* host pointer to 0 */
    L_A_FIRST,    /* 1: cuBLASLt's A is a (column orientation); 0: it is b (row orientation, D^T = B^T A^T) */
    L_IN_ATTR,    /* the pointer attribute of the call's third array (the bias, or the aux a DRELU/DGELU reads);
                     -1: the epilogue reads none */
    L_OUT_ATTR,   /* the pointer attribute of the extra output (the aux a *_AUX epilogue writes, or the bias
                     gradient a BGRAD one writes); -1: the epilogue writes none */
    L_WS_SIZE,    /* the algorithm's workspace need in bytes (0: none) */
    L_IS_CAPTURING, /* the driver's cuStreamIsCapturing, asked before a launch with a workspace (0: workspace_fn
                       asks itself) */
    N_INTS
};

/* cuStreamIsCapturing(stream, &status) -> CUresult; status 0: not capturing */
typedef int (*stream_is_capturing_fn)(void *, int *);

typedef struct {
    NvdLtLaunch launch;
    void *algo, *alpha, *beta;
    int in_attr, out_attr;
    size_t ws_size;
    stream_is_capturing_fn is_capturing; /* NULL: workspace_fn tells a capture itself */
    PyObject *keep;                      /* what owns the descriptor, layouts, algorithm and scalars */
    PyObject *maker;                     /* the name of a's method making the result and the extra output */
    PyObject *alloc_args, *alloc_kwargs; /* the result: a.<maker>(*alloc_args, **alloc_kwargs) */
    PyObject *out_name;                  /* the extra output: returned as (result, {out_name: output}) */
    PyObject *out_args, *out_kwargs;     /* ... made as a.<maker>(*out_args, **out_kwargs) */
    PyObject *out_view;                  /* ... and seen as out_view(made) (None: as made) */
    PyObject *workspace_fn;              /* workspace_fn(stream) -> the workspace's address, or None: the call
                                            goes to the fallback (a stream being captured); None where the
                                            algorithm needs none. A captured launch takes a workspace of its
                                            own from the graph's pool: the fallback's way */
    PyObject *stream_fn;                 /* the current stream: stream_fn(), or 0 (stream_fn None) */
    PyObject *check;                     /* check(status, what) raises the library's error */
    PyObject *fallback;                  /* a WeakMethod of the plan's Python direct call */
} LtDirect;

#define LT_DIRECT_CAPSULE "nvdispatch._hotpath.LtDirect"
#define LT_DIRECT_OBJECTS 12 /* the PyObject members above, from keep to fallback */

static PyObject *s_data_ptr, *s_matmul_what, *s_attr_what;

/* the addresses of the struct's object members, in declaration order */
static void
lt_direct_objects(LtDirect *d, PyObject ***slots)
{
    PyObject **all[LT_DIRECT_OBJECTS] = {&d->keep,     &d->maker,      &d->alloc_args, &d->alloc_kwargs,
                                         &d->out_name, &d->out_args,   &d->out_kwargs, &d->out_view,
                                         &d->workspace_fn, &d->stream_fn, &d->check, &d->fallback};
    for (int i = 0; i < LT_DIRECT_OBJECTS; i++)
        slots[i] = all[i];
}

static void
lt_direct_clear(LtDirect *d)
{
    PyObject **slots[LT_DIRECT_OBJECTS];
    lt_direct_objects(d, slots);
    for (int i = 0; i < LT_DIRECT_OBJECTS; i++)
        Py_CLEAR(*slots[i]);
    nvd_lt_launch_free(&d->launch);
    free(d);
}

static void
lt_direct_free(PyObject *capsule)
{
    LtDirect *d = PyCapsule_GetPointer(capsule, LT_DIRECT_CAPSULE);
    if (d != NULL)
        lt_direct_clear(d);
}

/* x.data_ptr() as an address; (void *)-1 with an error set when it fails */
static void *
data_ptr(PyObject *x)
{
    PyObject *r = PyObject_CallMethodObjArgs(x, s_data_ptr, NULL);
    if (r == NULL)
        return (void *)-1;
    void *p = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    return p == NULL && PyErr_Occurred() ? (void *)-1 : p;
}

/* a new array made by operand a's maker method */
static PyObject *
make_like(LtDirect *d, PyObject *a, PyObject *args, PyObject *kwargs)
{
    PyObject *method = PyObject_GetAttr(a, d->maker);
    if (method == NULL)
        return NULL;
    PyObject *out = PyObject_Call(method, args, kwargs);
    Py_DECREF(method);
    return out;
}

/* the call, served by the plan's Python direct call */
static PyObject *
to_fallback(LtDirect *d, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *fn = PyObject_CallNoArgs(d->fallback);
    if (fn == NULL)
        return NULL;
    if (fn == Py_None) {
        Py_DECREF(fn);
        PyErr_SetString(PyExc_RuntimeError, "the cuBLASLt plan of this direct call is gone");
        return NULL;
    }
    PyObject *result = nargs == 2 ? PyObject_CallFunctionObjArgs(fn, args[0], args[1], NULL)
                                  : PyObject_CallFunctionObjArgs(fn, args[0], args[1], args[2], NULL);
    Py_DECREF(fn);
    return result;
}

/* raise the library's error for status (check raises it); NULL */
static PyObject *
raise_status(LtDirect *d, int status, PyObject *what)
{
    PyObject *code = PyLong_FromLong(status);
    if (code == NULL)
        return NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(d->check, code, what, NULL);
    Py_DECREF(code);
    if (r != NULL) { /* check returned: it took the status for success, which it is not */
        Py_DECREF(r);
        PyErr_Format(PyExc_RuntimeError, "cuBLASLt status %d", status);
    }
    return NULL;
}

/* the workspace for a launch on `stream`: *ws set (NULL where the algorithm needs none); 1 when the call goes
 * to the fallback instead, -1 on an error */
static int
workspace_for(LtDirect *d, void *stream, void **ws)
{
    *ws = NULL;
    if (d->workspace_fn == Py_None)
        return 0;
    if (d->is_capturing != NULL) {
        int capture = 0;
        if (d->is_capturing(stream, &capture) != 0 || capture != 0)
            return 1; /* being captured, or the driver cannot tell: the Python path decides */
    }
    PyObject *s = PyLong_FromVoidPtr(stream);
    if (s == NULL)
        return -1;
    PyObject *r = PyObject_CallFunctionObjArgs(d->workspace_fn, s, NULL);
    Py_DECREF(s);
    if (r == NULL)
        return -1;
    if (r == Py_None) {
        Py_DECREF(r);
        return 1;
    }
    *ws = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    return *ws == NULL && PyErr_Occurred() ? -1 : 0;
}

/* (result, {out_name: the extra output seen through out_view}); steals out and extra */
static PyObject *
with_extra(LtDirect *d, PyObject *out, PyObject *extra)
{
    PyObject *seen = extra;
    if (d->out_view != Py_None) {
        seen = PyObject_CallFunctionObjArgs(d->out_view, extra, NULL);
        Py_DECREF(extra);
    }
    PyObject *outputs = seen == NULL ? NULL : PyDict_New();
    if (outputs == NULL || PyDict_SetItem(outputs, d->out_name, seen) < 0) {
        Py_XDECREF(outputs);
        Py_XDECREF(seen);
        Py_DECREF(out);
        return NULL;
    }
    Py_DECREF(seen);
    PyObject *pair = PyTuple_Pack(2, out, outputs);
    Py_DECREF(out);
    Py_DECREF(outputs);
    return pair;
}

/* direct(a, b[, x]) -> result, or (result, {name: output}) for an epilogue with an extra output; x is the bias
 * or the aux input, as the epilogue reads */
static PyObject *
lt_direct(PyObject *capsule, PyObject *const *args, Py_ssize_t nargs)
{
    LtDirect *d = PyCapsule_GetPointer(capsule, LT_DIRECT_CAPSULE);
    if (d == NULL)
        return NULL;
    if (nargs == 3 && args[2] == Py_None)
        nargs = 2;
    if (nargs != 2 + (d->in_attr >= 0)) {
        if (nargs < 2 || nargs > 3) {
            PyErr_Format(PyExc_TypeError, "direct(a, b[, x]) takes 2 or 3 arguments, got %zd", nargs);
            return NULL;
        }
        return to_fallback(d, args, nargs); /* an epilogue input missing, or one too many: as Python does */
    }
    void *pa = data_ptr(args[0]);
    void *pb = pa == (void *)-1 ? pa : data_ptr(args[1]);
    void *px = pb == (void *)-1 || nargs == 2 ? NULL : data_ptr(args[2]);
    if (pa == (void *)-1 || pb == (void *)-1 || px == (void *)-1)
        return NULL;
    if (((size_t)pa | (size_t)pb) & 255) /* another alignment: another algorithm (the plan asks for it) */
        return to_fallback(d, args, nargs);
    void *stream = NULL;
    if (d->stream_fn != Py_None) {
        PyObject *s = PyObject_CallNoArgs(d->stream_fn);
        if (s == NULL)
            return NULL;
        stream = PyLong_AsVoidPtr(s);
        Py_DECREF(s);
        if (stream == NULL && PyErr_Occurred())
            return NULL;
    }
    void *ws;
    int declined = workspace_for(d, stream, &ws);
    if (declined != 0)
        return declined < 0 ? NULL : to_fallback(d, args, nargs);
    PyObject *out = make_like(d, args[0], d->alloc_args, d->alloc_kwargs);
    if (out == NULL)
        return NULL;
    void *pd = data_ptr(out);
    if (pd == (void *)-1 || ((size_t)pd & 255)) {
        Py_DECREF(out);
        return pd == (void *)-1 ? NULL : to_fallback(d, args, nargs);
    }
    NvdLtPointer pointers[NVD_LT_MAX_POINTERS];
    int n_pointers = 0;
    if (nargs == 3)
        pointers[n_pointers++] = (NvdLtPointer){d->in_attr, px};
    PyObject *extra = NULL;
    if (d->out_attr >= 0) {
        extra = make_like(d, args[0], d->out_args, d->out_kwargs);
        void *pe = extra == NULL ? (void *)-1 : data_ptr(extra);
        if (pe == (void *)-1) {
            Py_XDECREF(extra);
            Py_DECREF(out);
            return NULL;
        }
        pointers[n_pointers++] = (NvdLtPointer){d->out_attr, pe};
    }
    int status, failed_pointer;
    Py_BEGIN_ALLOW_THREADS
    status = nvd_lt_launch(&d->launch, d->algo, d->alpha, d->beta, pa, pb, pd, pd, pointers, n_pointers, ws,
                           ws == NULL ? 0 : d->ws_size, stream, &failed_pointer);
    Py_END_ALLOW_THREADS
    if (status != 0) {
        Py_XDECREF(extra);
        Py_DECREF(out);
        return raise_status(d, status, failed_pointer ? s_attr_what : s_matmul_what);
    }
    return extra == NULL ? out : with_extra(d, out, extra);
}

static PyMethodDef lt_direct_def = {"direct", (PyCFunction)(void (*)(void))lt_direct, METH_FASTCALL,
                                    "direct(a, b[, x]) -> result, or (result, {name: output}): one "
                                    "cublasLtMatmul (see _hotpath_lt.c)."};

/* make_lt_direct(ints, keep, maker, alloc_args, alloc_kwargs, extra, workspace_fn, stream_fn, check, fallback),
 * extra: None, or (out_name, out_args, out_kwargs, out_view) */
static PyObject *
make_lt_direct(PyObject *module, PyObject *args)
{
    PyObject *ints, *keep, *maker, *alloc_args, *alloc_kwargs, *extra, *workspace_fn, *stream_fn, *check, *fallback;
    if (!PyArg_ParseTuple(args, "O!OUO!O!OOOOO:make_lt_direct", &PyTuple_Type, &ints, &keep, &maker, &PyTuple_Type,
                          &alloc_args, &PyDict_Type, &alloc_kwargs, &extra, &workspace_fn, &stream_fn, &check,
                          &fallback))
        return NULL;
    if (PyTuple_Size(ints) != N_INTS) {
        PyErr_Format(PyExc_TypeError, "make_lt_direct: expected %d ints, got %zd", N_INTS, PyTuple_Size(ints));
        return NULL;
    }
    PyObject *out_name = Py_None, *out_args = Py_None, *out_kwargs = Py_None, *out_view = Py_None;
    if (extra != Py_None &&
        !PyArg_ParseTuple(extra, "UO!O!O:make_lt_direct extra", &out_name, &PyTuple_Type, &out_args, &PyDict_Type,
                          &out_kwargs, &out_view))
        return NULL;
    void *p[N_INTS];
    for (int i = 0; i < N_INTS; i++) {
        int is_address = i < L_A_FIRST;
        p[i] = is_address ? PyLong_AsVoidPtr(PyTuple_GetItem(ints, i)) : NULL;
        if (PyErr_Occurred())
            return NULL;
        if (is_address && p[i] == NULL) {
            PyErr_Format(PyExc_ValueError, "make_lt_direct: int %d is a null address", i);
            return NULL;
        }
    }
    long a_first = PyLong_AsLong(PyTuple_GetItem(ints, L_A_FIRST));
    long in_attr = PyLong_AsLong(PyTuple_GetItem(ints, L_IN_ATTR));
    long out_attr = PyLong_AsLong(PyTuple_GetItem(ints, L_OUT_ATTR));
    size_t ws_size = PyLong_AsSize_t(PyTuple_GetItem(ints, L_WS_SIZE));
    void *is_capturing = PyErr_Occurred() ? NULL : PyLong_AsVoidPtr(PyTuple_GetItem(ints, L_IS_CAPTURING));
    if (PyErr_Occurred())
        return NULL;
    if ((out_attr >= 0) != (extra != Py_None) || in_attr == 0 || out_attr == 0 || (in_attr > 0 && in_attr == out_attr)
        || (ws_size > 0) == (workspace_fn == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "make_lt_direct: an extra output goes with its attribute, a workspace "
                                          "need with workspace_fn, and the two attributes differ");
        return NULL;
    }
    LtDirect *d = calloc(1, sizeof(LtDirect));
    if (d == NULL)
        return PyErr_NoMemory();
    if (nvd_lt_launch_init(&d->launch) < 0) {
        free(d);
        return PyErr_NoMemory();
    }
    d->launch.matmul = (lt_matmul_fn)p[L_MATMUL];
    d->launch.set_attribute = (lt_set_attribute_fn)p[L_SET_ATTRIBUTE];
    d->launch.handle = p[L_HANDLE];
    d->launch.desc = p[L_DESC];
    d->launch.a_layout = p[L_A_LAYOUT];
    d->launch.b_layout = p[L_B_LAYOUT];
    d->launch.c_layout = p[L_C_LAYOUT];
    d->launch.d_layout = p[L_D_LAYOUT];
    d->launch.a_first = a_first != 0;
    d->algo = p[L_ALGO];
    d->alpha = p[L_ALPHA];
    d->beta = p[L_BETA];
    d->in_attr = (int)in_attr;
    d->out_attr = (int)out_attr;
    d->ws_size = ws_size;
    d->is_capturing = (stream_is_capturing_fn)is_capturing;
    PyObject *objs[LT_DIRECT_OBJECTS] = {keep,     maker,    alloc_args, alloc_kwargs, out_name,  out_args,
                                         out_kwargs, out_view, workspace_fn, stream_fn, check, fallback};
    PyObject **slots[LT_DIRECT_OBJECTS];
    lt_direct_objects(d, slots);
    for (int i = 0; i < LT_DIRECT_OBJECTS; i++)
        *slots[i] = Py_NewRef(objs[i]);
    PyObject *capsule = PyCapsule_New(d, LT_DIRECT_CAPSULE, lt_direct_free);
    if (capsule == NULL) {
        lt_direct_clear(d);
        return NULL;
    }
    PyObject *fn = PyCFunction_NewEx(&lt_direct_def, capsule, NULL);
    Py_DECREF(capsule);
    return fn;
}

/* -- probes: functions of cuBLASLt's shapes that record their arguments, for tests where no GPU is --------- */

static size_t probe_calls[LT_ARGS + 1]; /* the last probe_matmul call's arguments, then a call count */
static size_t probe_attr[4];            /* the last probe_set_attribute call: desc, attribute, value, calls */
#define PROBE_ATTRS 64
static size_t probe_values[PROBE_ATTRS]; /* the last value probe_set_attribute set for each attribute */

static int
probe_matmul(void *a0, void *a1, void *a2, void *a3, void *a4, void *a5, void *a6, void *a7, void *a8, void *a9,
             void *a10, void *a11, void *a12, void *a13, size_t ws, void *a15)
{
    void *p[] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, (void *)ws, a15};
    size_t sum = 0;
    for (int i = 0; i < LT_ARGS; i++) {
        probe_calls[i] = (size_t)p[i];
        sum += (size_t)(i + 1) * (size_t)p[i];
    }
    probe_calls[LT_ARGS]++;
    return (int)(sum % 1000003); /* a checksum (tests of make_lt_matmul compare it) */
}

/* probe_matmul that succeeds (status 0), except on handle 13: status 13 */
static int
probe_launch(void *a0, void *a1, void *a2, void *a3, void *a4, void *a5, void *a6, void *a7, void *a8, void *a9,
             void *a10, void *a11, void *a12, void *a13, size_t ws, void *a15)
{
    probe_matmul(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, ws, a15);
    return a0 == (void *)13 ? 13 : 0;
}

static int
probe_set_attribute(void *desc, int attr, const void *buf, size_t size)
{
    probe_attr[0] = (size_t)desc;
    probe_attr[1] = (size_t)attr;
    probe_attr[2] = size == sizeof(void *) ? (size_t) * (void *const *)buf : 0;
    probe_attr[3]++;
    if (attr >= 0 && attr < PROBE_ATTRS)
        probe_values[attr] = probe_attr[2];
    return 0;
}

/* cuStreamIsCapturing's shape: stream 99 is being captured, stream 98 an error */
static int
probe_is_capturing(void *stream, int *status)
{
    *status = stream == (void *)99;
    return stream == (void *)98 ? 1 : 0;
}

/* probe_values() -> {attribute: the last value probe_set_attribute set for it} */
static PyObject *
probe_values_of(PyObject *module, PyObject *unused)
{
    PyObject *values = PyDict_New();
    for (int i = 0; values != NULL && i < PROBE_ATTRS; i++) {
        if (probe_values[i] == 0)
            continue;
        PyObject *k = PyLong_FromLong(i), *v = PyLong_FromSize_t(probe_values[i]);
        if (k == NULL || v == NULL || PyDict_SetItem(values, k, v) < 0)
            Py_CLEAR(values);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return values;
}

/* probe_record() -> (the last probe_matmul call's 16 arguments, its call count, the last probe_set_attribute
 * call's (desc, attribute, value), its call count) */
static PyObject *
probe_record(PyObject *module, PyObject *unused)
{
    PyObject *calls = PyTuple_New(LT_ARGS);
    if (calls == NULL)
        return NULL;
    for (int i = 0; i < LT_ARGS; i++)
        PyTuple_SetItem(calls, i, PyLong_FromSize_t(probe_calls[i]));
    return Py_BuildValue("(Nn(nnn)n)", calls, (Py_ssize_t)probe_calls[LT_ARGS], (Py_ssize_t)probe_attr[0],
                         (Py_ssize_t)probe_attr[1], (Py_ssize_t)probe_attr[2], (Py_ssize_t)probe_attr[3]);
}

static PyMethodDef lt_methods[] = {
    {"make_lt_matmul", make_lt_matmul, METH_O,
     "make_lt_matmul(address) -> cublasLtMatmul(...) calling the function at address (see lt_launch)"},
    {"make_lt_direct", make_lt_direct, METH_VARARGS,
     "make_lt_direct(ints, keep, maker, alloc_args, alloc_kwargs, extra, workspace_fn, stream_fn, check, "
     "fallback) -> direct(a, b[, x]) (see lt_direct)"},
    {"probe_record", probe_record, METH_NOARGS, "the probes' last recorded calls (tests)"},
    {"probe_values", probe_values_of, METH_NOARGS, "the probe's last value set for each attribute (tests)"},
    {NULL, NULL, 0, NULL},
};

/* add this file's functions and the probes' addresses to the module */
int
nvd_add_lt(PyObject *module)
{
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_matmul_what = PyUnicode_InternFromString("cublasLtMatmul");
    s_attr_what = PyUnicode_InternFromString("cublasLtMatmulDescSetAttribute");
    if (!s_data_ptr || !s_matmul_what || !s_attr_what)
        return -1;
    if (PyModule_AddFunctions(module, lt_methods) < 0)
        return -1;
    PyObject *m = PyLong_FromVoidPtr((void *)probe_matmul);
    if (m == NULL || PyModule_AddObject(module, "LT_MATMUL_PROBE", m) < 0) {
        Py_XDECREF(m);
        return -1;
    }
    PyObject *l = PyLong_FromVoidPtr((void *)probe_launch);
    if (l == NULL || PyModule_AddObject(module, "LT_LAUNCH_PROBE", l) < 0) {
        Py_XDECREF(l);
        return -1;
    }
    PyObject *s = PyLong_FromVoidPtr((void *)probe_set_attribute);
    if (s == NULL || PyModule_AddObject(module, "LT_SET_ATTRIBUTE_PROBE", s) < 0) {
        Py_XDECREF(s);
        return -1;
    }
    PyObject *c = PyLong_FromVoidPtr((void *)probe_is_capturing);
    if (c == NULL || PyModule_AddObject(module, "STREAM_IS_CAPTURING_PROBE", c) < 0) {
        Py_XDECREF(c);
        return -1;
    }
    return 0;
}
