/* A cuFFT plan's direct call, compiled (part of nvdispatch._hotpath; _hotpath.c adds these functions).
 *
 * make_cufft_direct: direct(x) -> result for a cached cuFFT plan of one launch (executors/cuda_fft.py,
 * CudaFFTPlan.direct): the device's context bound once per thread, the result made as the operand's adapter
 * says (a method of the operand, x.new_empty(...), or a function, cupy.empty(...): the framework's allocator on
 * its current stream), both pointers read by the adapter's reader, the current stream set on the cuFFT handle
 * when it changed (the handle's stream is the plan's CufftPlan.stream, which the Python launch reads and writes
 * too), cufftExec* called through the address ctypes found, then the normalisation as one in-place multiply
 * (out *= scale) on the same stream. Each step is the one the Python direct call takes; compiled, they cost no
 * Python frames. The GIL is held from setting the stream to the launch's return: no other Python thread sets
 * the handle's stream in between. An input pointer not aligned as cuFFT requires (F_ALIGN: the complex type's
 * size; a real view of complex data starts mid-element) is handed to the Python call, which copies it to
 * aligned scratch first.
 */
#include "_hotpath.h"

#if defined(_MSC_VER)
#define NVD_THREAD_LOCAL __declspec(thread)
#else
#define NVD_THREAD_LOCAL _Thread_local
#endif

typedef int (*exec_c2c_fn)(int, void *, void *, int);
typedef int (*exec_real_fn)(int, void *, void *);
typedef int (*set_stream_fn)(int, void *);

/* the integers make_cufft_direct takes, in this order */
enum {
    F_EXEC,       /* cufftExec*'s address */
    F_SET_STREAM, /* cufftSetStream's address */
    F_DIRECTION,  /* c2c: CUFFT_FORWARD (-1) or CUFFT_INVERSE (1); 0: a real transform (no direction argument) */
    F_DEVICE,     /* the plan's device ordinal */
    F_ALIGN,      /* the byte alignment cuFFT requires of the input pointer (>= 1) */
    N_FFT_INTS
};

typedef struct {
    void *exec;
    set_stream_fn set_stream;
    int direction, device;
    size_t align;
    PyObject *cufft;                        /* the CufftPlan: its handle (None once destroyed) and stream */
    PyObject *maker, *make_args, *make_kw;  /* the result: x.<maker>(*args, **kw) (maker a str) or maker(...) */
    PyObject *pointer;                      /* pointer(array) -> its device address */
    PyObject *stream_fn;                    /* stream_fn() -> the current stream */
    PyObject *bind;                         /* bind(device): this thread's context made current */
    PyObject *scale;                        /* None, or the factor the result is multiplied by in place */
    PyObject *check;                        /* check(status, what) raises cuFFT's error */
    PyObject *fallback;                     /* the plan's direct call in Python (it holds no reference to us) */
} CufftDirect;

#define CUFFT_DIRECT_CAPSULE "nvdispatch._hotpath.CufftDirect"

static PyObject *s_handle, *s_stream, *s_exec_what, *s_stream_what;
static NVD_THREAD_LOCAL int bound_device = -1; /* the device bind() last made current on this thread */

static void
cufft_direct_free(PyObject *capsule)
{
    CufftDirect *d = PyCapsule_GetPointer(capsule, CUFFT_DIRECT_CAPSULE);
    if (d == NULL)
        return;
    PyObject *objs[] = {d->cufft, d->maker, d->make_args, d->make_kw, d->pointer, d->stream_fn,
                        d->bind,  d->scale, d->check,     d->fallback};
    for (size_t i = 0; i < sizeof(objs) / sizeof(objs[0]); i++)
        Py_XDECREF(objs[i]);
    free(d);
}

/* pointer(x) as an address; (void *)-1 with an error set when it fails */
static void *
read_pointer(CufftDirect *d, PyObject *x)
{
    PyObject *r = PyObject_CallFunctionObjArgs(d->pointer, x, NULL);
    if (r == NULL)
        return (void *)-1;
    void *p = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    return p == NULL && PyErr_Occurred() ? (void *)-1 : p;
}

/* raise cuFFT's error for status (check raises it); NULL */
static PyObject *
raise_status(CufftDirect *d, int status, PyObject *what)
{
    PyObject *code = PyLong_FromLong(status);
    if (code == NULL)
        return NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(d->check, code, what, NULL);
    if (r != NULL) { /* check returned: it took the status for success, which it is not */
        Py_DECREF(r);
        PyErr_Format(PyExc_RuntimeError, "cuFFT status %d", status);
    }
    return NULL;
}

/* the call, served by the plan's Python direct call (which raises the plan's error once it is released) */
static PyObject *
to_fallback(CufftDirect *d, PyObject *x)
{
    return PyObject_CallFunctionObjArgs(d->fallback, x, NULL);
}

/* direct(x) -> result */
static PyObject *
cufft_direct(PyObject *capsule, PyObject *x)
{
    CufftDirect *d = PyCapsule_GetPointer(capsule, CUFFT_DIRECT_CAPSULE);
    if (d == NULL)
        return NULL;
    PyObject *handle_obj = PyObject_GetAttr(d->cufft, s_handle);
    if (handle_obj == NULL)
        return NULL;
    if (handle_obj == Py_None) { /* destroyed: the Python call raises the plan's error */
        Py_DECREF(handle_obj);
        return to_fallback(d, x);
    }
    long handle = PyLong_AsLong(handle_obj);
    Py_DECREF(handle_obj);
    if (handle == -1 && PyErr_Occurred())
        return NULL;
    if (bound_device != d->device) {
        PyObject *dev = PyLong_FromLong(d->device);
        PyObject *r = dev == NULL ? NULL : PyObject_CallFunctionObjArgs(d->bind, dev, NULL);
        Py_XDECREF(dev);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
        bound_device = d->device;
    }
    void *in = read_pointer(d, x);
    if (in == (void *)-1)
        return NULL;
    if ((size_t)in % d->align != 0) /* cuFFT rejects it: the Python call stages it in aligned scratch */
        return to_fallback(d, x);
    PyObject *out;
    if (PyUnicode_Check(d->maker)) {
        PyObject *method = PyObject_GetAttr(x, d->maker);
        if (method == NULL)
            return NULL;
        out = PyObject_Call(method, d->make_args, d->make_kw);
        Py_DECREF(method);
    }
    else {
        out = PyObject_Call(d->maker, d->make_args, d->make_kw);
    }
    if (out == NULL)
        return NULL;
    void *o = read_pointer(d, out);
    void *stream = NULL;
    PyObject *s = o == (void *)-1 ? NULL : PyObject_CallNoArgs(d->stream_fn);
    if (s != NULL) {
        stream = PyLong_AsVoidPtr(s);
        if (stream == NULL && PyErr_Occurred())
            Py_CLEAR(s);
    }
    if (s == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    /* the handle's stream: set when it changed (CufftPlan.stream, shared with the Python launch) */
    PyObject *held = PyObject_GetAttr(d->cufft, s_stream);
    if (held == NULL) {
        Py_DECREF(s);
        Py_DECREF(out);
        return NULL;
    }
    int same = PyObject_RichCompareBool(held, s, Py_EQ);
    Py_DECREF(held);
    int status = 0;
    if (same == 0) {
        status = d->set_stream((int)handle, stream);
        if (status == 0 && PyObject_SetAttr(d->cufft, s_stream, s) < 0)
            same = -1;
    }
    Py_DECREF(s);
    if (same < 0) {
        Py_DECREF(out);
        return NULL;
    }
    if (status != 0) {
        Py_DECREF(out);
        return raise_status(d, status, s_stream_what);
    }
    status = d->direction != 0 ? ((exec_c2c_fn)d->exec)((int)handle, in, o, d->direction)
                               : ((exec_real_fn)d->exec)((int)handle, in, o);
    if (status != 0) {
        Py_DECREF(out);
        return raise_status(d, status, s_exec_what);
    }
    if (d->scale != Py_None) { /* on the current stream, where the transform was queued */
        PyObject *scaled = PyNumber_InPlaceMultiply(out, d->scale);
        Py_DECREF(out);
        return scaled;
    }
    return out;
}

static PyMethodDef cufft_direct_def = {"direct", (PyCFunction)cufft_direct, METH_O,
                                       "direct(x) -> result: one cufftExec* (see _hotpath_cufft.c)."};

/* make_cufft_direct(ints, cufft, maker, make_args, make_kw, pointer, stream_fn, bind, scale, check, fallback) */
static PyObject *
make_cufft_direct(PyObject *module, PyObject *args)
{
    PyObject *ints, *cufft, *maker, *make_args, *make_kw, *pointer, *stream_fn, *bind, *scale, *check, *fallback;
    if (!PyArg_ParseTuple(args, "O!OOO!O!OOOOOO:make_cufft_direct", &PyTuple_Type, &ints, &cufft, &maker,
                          &PyTuple_Type, &make_args, &PyDict_Type, &make_kw, &pointer, &stream_fn, &bind, &scale,
                          &check, &fallback))
        return NULL;
    if (PyTuple_Size(ints) != N_FFT_INTS) {
        PyErr_Format(PyExc_TypeError, "make_cufft_direct: expected %d ints, got %zd", N_FFT_INTS,
                     PyTuple_Size(ints));
        return NULL;
    }
    void *exec = PyLong_AsVoidPtr(PyTuple_GetItem(ints, F_EXEC));
    void *set_stream = exec == NULL ? NULL : PyLong_AsVoidPtr(PyTuple_GetItem(ints, F_SET_STREAM));
    long direction = PyLong_AsLong(PyTuple_GetItem(ints, F_DIRECTION));
    long device = PyLong_AsLong(PyTuple_GetItem(ints, F_DEVICE));
    long align = PyLong_AsLong(PyTuple_GetItem(ints, F_ALIGN));
    if (PyErr_Occurred())
        return NULL;
    if (exec == NULL || set_stream == NULL || device < 0 || (direction != 0 && direction != -1 && direction != 1) ||
        align < 1) {
        PyErr_SetString(PyExc_ValueError, "make_cufft_direct: expected non-zero addresses, a direction of -1, 1 "
                                          "or 0, a device >= 0, an alignment >= 1");
        return NULL;
    }
    if (scale != Py_None && !PyFloat_Check(scale)) {
        PyErr_SetString(PyExc_TypeError, "make_cufft_direct: scale must be None or a float");
        return NULL;
    }
    CufftDirect *d = calloc(1, sizeof(CufftDirect));
    if (d == NULL)
        return PyErr_NoMemory();
    d->exec = exec;
    d->set_stream = (set_stream_fn)set_stream;
    d->direction = (int)direction;
    d->device = (int)device;
    d->align = (size_t)align;
    d->cufft = Py_NewRef(cufft);
    d->maker = Py_NewRef(maker);
    d->make_args = Py_NewRef(make_args);
    d->make_kw = Py_NewRef(make_kw);
    d->pointer = Py_NewRef(pointer);
    d->stream_fn = Py_NewRef(stream_fn);
    d->bind = Py_NewRef(bind);
    d->scale = Py_NewRef(scale);
    d->check = Py_NewRef(check);
    d->fallback = Py_NewRef(fallback);
    PyObject *capsule = PyCapsule_New(d, CUFFT_DIRECT_CAPSULE, cufft_direct_free);
    if (capsule == NULL) { /* not made: free by hand */
        PyObject *objs[] = {cufft, maker, make_args, make_kw, pointer, stream_fn, bind, scale, check, fallback};
        for (size_t i = 0; i < sizeof(objs) / sizeof(objs[0]); i++)
            Py_DECREF(objs[i]);
        free(d);
        return NULL;
    }
    PyObject *fn = PyCFunction_NewEx(&cufft_direct_def, capsule, NULL);
    Py_DECREF(capsule);
    return fn;
}

/* -- probes: functions of cuFFT's shapes that record their arguments, for tests where no GPU is ------------ */

static size_t probe_exec_args[5]; /* the last probe exec call: handle, in, out, direction (0: real), calls */
static size_t probe_stream_args[3]; /* the last probe_set_stream call: handle, stream, calls */

/* cufftExecC2C's shape; handle 13 fails with status 13 */
static int
probe_exec_c2c(int handle, void *in, void *out, int direction)
{
    probe_exec_args[0] = (size_t)handle;
    probe_exec_args[1] = (size_t)in;
    probe_exec_args[2] = (size_t)out;
    probe_exec_args[3] = (size_t)(direction + 2); /* -1 -> 1, 1 -> 3 */
    probe_exec_args[4]++;
    return handle == 13 ? 13 : 0;
}

/* cufftExecR2C's shape */
static int
probe_exec_real(int handle, void *in, void *out)
{
    probe_exec_args[0] = (size_t)handle;
    probe_exec_args[1] = (size_t)in;
    probe_exec_args[2] = (size_t)out;
    probe_exec_args[3] = 0;
    probe_exec_args[4]++;
    return handle == 13 ? 13 : 0;
}

static int
probe_set_stream(int handle, void *stream)
{
    probe_stream_args[0] = (size_t)handle;
    probe_stream_args[1] = (size_t)stream;
    probe_stream_args[2]++;
    return 0;
}

/* probe_cufft_record() -> ((handle, in, out, direction + 2 or 0), exec calls, (handle, stream), stream calls) */
static PyObject *
probe_cufft_record(PyObject *module, PyObject *unused)
{
    return Py_BuildValue("(nnnn)n(nn)n", (Py_ssize_t)probe_exec_args[0], (Py_ssize_t)probe_exec_args[1],
                         (Py_ssize_t)probe_exec_args[2], (Py_ssize_t)probe_exec_args[3],
                         (Py_ssize_t)probe_exec_args[4], (Py_ssize_t)probe_stream_args[0],
                         (Py_ssize_t)probe_stream_args[1], (Py_ssize_t)probe_stream_args[2]);
}

static PyMethodDef cufft_methods[] = {
    {"make_cufft_direct", make_cufft_direct, METH_VARARGS,
     "make_cufft_direct(ints, cufft, maker, make_args, make_kw, pointer, stream_fn, bind, scale, check, "
     "fallback) -> direct(x) (see executors/cuda_fft.py)"},
    {"probe_cufft_record", probe_cufft_record, METH_NOARGS, "the cuFFT probes' last recorded calls (tests)"},
    {NULL, NULL, 0, NULL},
};

static int
add_address(PyObject *module, const char *name, void *fn)
{
    PyObject *v = PyLong_FromVoidPtr(fn);
    if (v == NULL || PyModule_AddObject(module, name, v) < 0) {
        Py_XDECREF(v);
        return -1;
    }
    return 0;
}

int
nvd_add_cufft(PyObject *module)
{
    s_handle = PyUnicode_InternFromString("handle");
    s_stream = PyUnicode_InternFromString("stream");
    s_exec_what = PyUnicode_InternFromString("cufftExec");
    s_stream_what = PyUnicode_InternFromString("cufftSetStream");
    if (!s_handle || !s_stream || !s_exec_what || !s_stream_what)
        return -1;
    if (PyModule_AddFunctions(module, cufft_methods) < 0)
        return -1;
    if (add_address(module, "CUFFT_EXEC_C2C_PROBE", (void *)probe_exec_c2c) < 0 ||
        add_address(module, "CUFFT_EXEC_REAL_PROBE", (void *)probe_exec_real) < 0 ||
        add_address(module, "CUFFT_SET_STREAM_PROBE", (void *)probe_set_stream) < 0)
        return -1;
    return 0;
}
