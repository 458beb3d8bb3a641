/* Prepared kernel launches, compiled (part of nvdispatch._hotpath; _hotpath.c adds these functions).
 *
 * make_kernel_launches: a plan's fixed sequence of kernel launches (its compiled kernels, grids, blocks, dynamic
 * shared memory and packed parameters: nvdispatch/_cuda/kernel_launch.py) made once; each call hands the stream
 * and the operands' device pointers only. Per launch the parameters are copied to the stack, the operands'
 * pointers written into their slots and cuLaunchKernel called with the GIL released, on the caller's stream, in
 * the plan's context (pushed for the call where another one is current, as Numba's launch does). The parameters
 * are copied per call, so concurrent calls of one prepared sequence do not share mutable state.
 */
#include "_hotpath.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LAUNCH_MAX_PARAMS 256 /* kernel parameters of one launch (a 2-D array takes 9) */
#define LAUNCH_MAX_OPERANDS 32
#define LAUNCH_SLOT 8 /* bytes per packed parameter (nvdispatch/_cuda/kernel_params.py: SLOT) */

typedef int (*launch_kernel_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned shared, void *stream, void **params, void **extra);
typedef int (*ctx_get_fn)(void **ctx);
typedef int (*ctx_push_fn)(void *ctx);
typedef int (*ctx_pop_fn)(void **ctx);

typedef struct {
    void *function; /* a CUfunction, or a CUkernel (launched in the current context) */
    unsigned grid[3], block[3], shared;
    int nparams, npatches;
    unsigned char *values;  /* nparams slots */
    int *patch_param;       /* the slot of patch i ... */
    int *patch_operand;     /* ... takes the pointer of operand patch_operand[i] */
} Launch;

typedef struct {
    launch_kernel_fn launch_kernel;
    ctx_get_fn ctx_get;
    ctx_push_fn ctx_push;
    ctx_pop_fn ctx_pop;
    void *context; /* the plan's context; NULL: launch in whichever is current */
    int noperands, nlaunches;
    Launch *launches;
} Launches;

#define LAUNCHES_CAPSULE "nvdispatch._hotpath.KernelLaunches"

static void
launches_free(Launches *ls)
{
    if (ls == NULL)
        return;
    for (int i = 0; ls->launches != NULL && i < ls->nlaunches; i++) {
        free(ls->launches[i].values);
        free(ls->launches[i].patch_param);
        free(ls->launches[i].patch_operand);
    }
    free(ls->launches);
    free(ls);
}

static void
launches_capsule_free(PyObject *capsule)
{
    launches_free(PyCapsule_GetPointer(capsule, LAUNCHES_CAPSULE));
}

/* launches(stream, *pointers) -> CUresult of the first launch that failed, else 0 */
static PyObject *
run_launches(PyObject *capsule, PyObject *const *args, Py_ssize_t nargs)
{
    Launches *ls = PyCapsule_GetPointer(capsule, LAUNCHES_CAPSULE);
    if (ls == NULL)
        return NULL;
    if (nargs != 1 + ls->noperands) {
        PyErr_Format(PyExc_TypeError, "kernel launches take a stream and %d pointers, got %zd arguments",
                     ls->noperands, nargs);
        return NULL;
    }
    void *stream = PyLong_AsVoidPtr(args[0]);
    if (stream == NULL && PyErr_Occurred())
        return NULL;
    uint64_t pointers[LAUNCH_MAX_OPERANDS];
    for (int i = 0; i < ls->noperands; i++) {
        pointers[i] = (uint64_t)(uintptr_t)PyLong_AsVoidPtr(args[1 + i]);
        if (pointers[i] == 0 && PyErr_Occurred())
            return NULL;
    }
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    void *current = NULL;
    int pushed = 0;
    if (ls->context != NULL) {
        status = ls->ctx_get(&current);
        if (status == 0 && current != ls->context) {
            status = ls->ctx_push(ls->context);
            pushed = status == 0;
        }
    }
    uint64_t slots[LAUNCH_MAX_PARAMS];
    void *params[LAUNCH_MAX_PARAMS];
    for (int k = 0; status == 0 && k < ls->nlaunches; k++) {
        const Launch *l = &ls->launches[k];
        memcpy(slots, l->values, (size_t)l->nparams * LAUNCH_SLOT);
        for (int j = 0; j < l->npatches; j++)
            slots[l->patch_param[j]] = pointers[l->patch_operand[j]];
        for (int j = 0; j < l->nparams; j++)
            params[j] = &slots[j];
        status = ls->launch_kernel(l->function, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
                                   l->block[2], l->shared, stream, params, NULL);
    }
    if (pushed) {
        void *popped;
        int pop_status = ls->ctx_pop(&popped);
        if (status == 0)
            status = pop_status;
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyMethodDef launches_def = {"kernel_launches", (PyCFunction)(void (*)(void))run_launches, METH_FASTCALL,
                                   "launches(stream, *pointers) -> CUresult (0: every launch queued)"};

/* three positive extents of a sequence of ints into out; -1 with an error */
static int
read_dims(PyObject *seq, unsigned *out, const char *what)
{
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL)
        return -1;
    if (PyTuple_Size(t) != 3) {
        Py_DECREF(t);
        PyErr_Format(PyExc_ValueError, "make_kernel_launches: %s must have 3 extents", what);
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GetItem(t, i));
        if (PyErr_Occurred() || v == 0 || v > 0xFFFFFFFFul) {
            Py_DECREF(t);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "make_kernel_launches: %s extents must be positive", what);
            return -1;
        }
        out[i] = (unsigned)v;
    }
    Py_DECREF(t);
    return 0;
}

static void *
read_address(PyObject *o, const char *what)
{
    void *p = PyLong_AsVoidPtr(o);
    if (p == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "make_kernel_launches: %s must be a non-zero address", what);
    return p;
}

/* one launch from (function, grid, block, shared, values, patches); -1 with an error */
static int
read_launch(PyObject *item, Launch *l, int noperands)
{
    PyObject *function, *grid, *block, *shared, *values, *patches;
    if (!PyArg_ParseTuple(item, "OOOOOO", &function, &grid, &block, &shared, &values, &patches))
        return -1;
    l->function = read_address(function, "a launch's function");
    if (l->function == NULL)
        return -1;
    if (read_dims(grid, l->grid, "grid") < 0 || read_dims(block, l->block, "block") < 0)
        return -1;
    unsigned long sh = PyLong_AsUnsignedLong(shared);
    if (PyErr_Occurred() || sh > 0xFFFFFFFFul) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "make_kernel_launches: shared memory must be a byte count");
        return -1;
    }
    l->shared = (unsigned)sh;
    char *buffer;
    Py_ssize_t nbytes;
    if (PyBytes_AsStringAndSize(values, &buffer, &nbytes) < 0)
        return -1;
    if (nbytes % LAUNCH_SLOT || nbytes / LAUNCH_SLOT > LAUNCH_MAX_PARAMS) {
        PyErr_Format(PyExc_ValueError, "make_kernel_launches: values must be up to %d slots of %d bytes",
                     LAUNCH_MAX_PARAMS, LAUNCH_SLOT);
        return -1;
    }
    l->nparams = (int)(nbytes / LAUNCH_SLOT);
    l->values = malloc(nbytes > 0 ? (size_t)nbytes : 1);
    PyObject *pt = PySequence_Tuple(patches);
    if (l->values == NULL || pt == NULL) {
        Py_XDECREF(pt);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    memcpy(l->values, buffer, (size_t)nbytes);
    l->npatches = (int)PyTuple_Size(pt);
    l->patch_param = malloc(sizeof(int) * (l->npatches + 1));
    l->patch_operand = malloc(sizeof(int) * (l->npatches + 1));
    if (l->patch_param == NULL || l->patch_operand == NULL) {
        Py_DECREF(pt);
        PyErr_NoMemory();
        return -1;
    }
    for (int j = 0; j < l->npatches; j++) {
        int param = -1, operand = -1;
        if (!PyArg_ParseTuple(PyTuple_GetItem(pt, j), "ii", &param, &operand)) {
            Py_DECREF(pt);
            return -1;
        }
        if (param < 0 || param >= l->nparams || operand < 0 || operand >= noperands) {
            Py_DECREF(pt);
            PyErr_Format(PyExc_ValueError, "make_kernel_launches: patch (%d, %d) out of range", param, operand);
            return -1;
        }
        l->patch_param[j] = param;
        l->patch_operand[j] = operand;
    }
    Py_DECREF(pt);
    return 0;
}

/* make_kernel_launches(driver, context, noperands, launches) -> launches(stream, *pointers) */
static PyObject *
make_kernel_launches(PyObject *module, PyObject *args)
{
    PyObject *driver, *context, *launches;
    int noperands;
    if (!PyArg_ParseTuple(args, "OOiO", &driver, &context, &noperands, &launches))
        return NULL;
    if (noperands < 0 || noperands > LAUNCH_MAX_OPERANDS) {
        PyErr_Format(PyExc_ValueError, "make_kernel_launches: up to %d operands", LAUNCH_MAX_OPERANDS);
        return NULL;
    }
    PyObject *entries = PySequence_Tuple(driver);
    PyObject *items = entries == NULL ? NULL : PySequence_Tuple(launches);
    if (items == NULL) {
        Py_XDECREF(entries);
        return NULL;
    }
    Launches *ls = calloc(1, sizeof(Launches));
    if (ls == NULL) {
        Py_DECREF(entries);
        Py_DECREF(items);
        return PyErr_NoMemory();
    }
    ls->noperands = noperands;
    ls->nlaunches = (int)PyTuple_Size(items);
    ls->launches = calloc((size_t)ls->nlaunches + 1, sizeof(Launch));
    int ok = ls->launches != NULL;
    if (!ok)
        PyErr_NoMemory();
    if (ok && PyTuple_Size(entries) != 4) {
        PyErr_SetString(PyExc_ValueError, "make_kernel_launches: driver must be the addresses of cuLaunchKernel, "
                                          "cuCtxGetCurrent, cuCtxPushCurrent, cuCtxPopCurrent");
        ok = 0;
    }
    if (ok) {
        ls->launch_kernel = (launch_kernel_fn)read_address(PyTuple_GetItem(entries, 0), "cuLaunchKernel");
        ls->ctx_get = (ctx_get_fn)read_address(PyTuple_GetItem(entries, 1), "cuCtxGetCurrent");
        ls->ctx_push = (ctx_push_fn)read_address(PyTuple_GetItem(entries, 2), "cuCtxPushCurrent");
        ls->ctx_pop = (ctx_pop_fn)read_address(PyTuple_GetItem(entries, 3), "cuCtxPopCurrent");
        ok = !PyErr_Occurred();
    }
    if (ok) {
        ls->context = PyLong_AsVoidPtr(context);
        ok = !PyErr_Occurred();
    }
    for (int i = 0; ok && i < ls->nlaunches; i++)
        ok = read_launch(PyTuple_GetItem(items, i), &ls->launches[i], noperands) == 0;
    Py_DECREF(entries);
    Py_DECREF(items);
    if (!ok) {
        launches_free(ls);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(ls, LAUNCHES_CAPSULE, launches_capsule_free);
    if (capsule == NULL) {
        launches_free(ls);
        return NULL;
    }
    PyObject *fn = PyCFunction_NewEx(&launches_def, capsule, NULL);
    Py_DECREF(capsule);
    return fn;
}

static PyMethodDef launch_methods[] = {
    {"make_kernel_launches", make_kernel_launches, METH_VARARGS,
     "make_kernel_launches(driver, context, noperands, launches) -> launches(stream, *pointers) -> CUresult. "
     "driver: the addresses of cuLaunchKernel, cuCtxGetCurrent, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2; "
     "context: the CUcontext to launch in (0: the current one); launches: (function, grid, block, shared, values, "
     "patches) each, values the packed parameters (8 bytes each), patches (parameter, operand) pairs"},
    {NULL, NULL, 0, NULL},
};

int
nvd_add_launch(PyObject *module)
{
    return PyModule_AddFunctions(module, launch_methods);
}
