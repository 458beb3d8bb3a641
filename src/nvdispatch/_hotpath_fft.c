/* The first step of the transforms' route (nvdispatch.fft.fft, fft2, ...), compiled: a call served from the plan
 * cache, a repeated one or one whose plan serves every extent (part of nvdispatch._hotpath; _hotpath.c adds these
 * functions to the module).
 *
 * nvdispatch.fft._route is the route, in Python (call_transform, then _run's hit); this is that hit for the
 * calls whose key nvdispatch._call_key.fft_form builds as they come (the front takes call_transform's
 * arguments and hands it every call it does not serve): no out, stream or callbacks, no s, axes
 * None or a tuple of ints, arrays of a class whose arrays executors take as they are (ClassKeys.plain). The
 * part such a call takes, in _run's order: the call's form ("fft", func, class, n, axis, s, axes, norm, backend
 * state, global key); for a class with a guard (Torch) the plan handles remembered for that form behind their
 * guards; for a class with a rank signature (NumPy) and an operand whose extents are all >= 2, the plan kept for
 * every extent (the any-length key: form, parts.any_length, rank signature), so that a length not seen before
 * is served here too; for a class without a guard (NumPy, CuPy) the call key (form, signature); each through
 * the plan cache; then the plan's direct call (or execute) and let_go, as the run step does. Every other call
 * (another form or class, no handle whose guard passes, a stale handle, a miss, an argument it cannot hash)
 * goes to the Python route, which serves it as it serves every call.
 *
 * make_fft_front receives ONE object (fft._route.TransformFrontParts) and reads its documented attributes once.
 */
#include "_hotpath.h"

static const char *const FFT_PART_NAMES[] = {
    "route", "classes", "backends", "acquire", "acquire_handle", "let_go", "log_levels", "log_hit",
    "raise_if_out_of_memory", "current_state", "any_length",
};
/* after the common parts: the middle of an any-length key (nvdispatch._call_key.any_length_key) */
enum { ANY_LENGTH = N_COMMON_PARTS, N_FFT_PARTS };

enum { A_FUNC, A_X, A_N, A_AXIS, A_S, A_AXES, A_NORM, A_OUT, A_STREAM, A_CONVENTION, A_CALLBACKS, N_FFT_ARGS };

static PyObject *s_fft, *s_direct, *s_execute, *s_x, *s_shape, *s_any_length_key;

/* the whole call through the Python route (call_transform, which takes the front's arguments) */
static PyObject *
to_route(PyObject *self, PyObject *const *args)
{
    PyObject *call = PyTuple_New(N_FFT_ARGS);
    if (call == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < N_FFT_ARGS; i++)
        PyTuple_SetItem(call, i, Py_NewRef(args[i]));
    PyObject *result = PyObject_Call(PyTuple_GetItem(self, P_ROUTE), call, NULL);
    Py_DECREF(call);
    return result;
}

/* whether v is None or a tuple of exact ints (what nvdispatch._call_key.int_seq keeps as it is) */
static int
int_tuple_or_none(PyObject *v)
{
    if (v == Py_None)
        return 1;
    if (!PyTuple_CheckExact(v))
        return 0;
    Py_ssize_t n = PyTuple_Size(v);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyLong_CheckExact(PyTuple_GetItem(v, i)))
            return 0;
    return 1;
}

/* whether callbacks is None or a tuple of Nones (a transform without prolog or epilog) */
static int
no_callbacks(PyObject *callbacks)
{
    if (callbacks == Py_None)
        return 1;
    if (!PyTuple_CheckExact(callbacks))
        return 0;
    Py_ssize_t n = PyTuple_Size(callbacks);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyTuple_GetItem(callbacks, i) != Py_None)
            return 0;
    return 1;
}

/* whether every extent of x (at least 1-D) is >= 2: where the plan of every extent may run it (each extent a
 * valid transform length, none empty); -1 with an error */
static int
extents_above_one(PyObject *x)
{
    PyObject *shape = PyObject_GetAttr(x, s_shape);
    if (shape == NULL)
        return -1;
    int above = PyTuple_Check(shape) && PyTuple_Size(shape) > 0;
    for (Py_ssize_t i = 0; above && i < PyTuple_Size(shape); i++) {
        Py_ssize_t extent = PyLong_AsSsize_t(PyTuple_GetItem(shape, i));
        if (extent == -1 && PyErr_Occurred()) {
            Py_DECREF(shape);
            return -1;
        }
        above = extent > 1;
    }
    Py_DECREF(shape);
    return above;
}

/* the plan kept for every extent of x's rank signature (form, any_length, ranked(x)), acquired, where x's
 * extents are all >= 2; NULL with no error when there is none */
static PyObject *
any_length_hit(PyObject *self, PyObject *form, PyObject *ranked, PyObject *x)
{
    int above = extents_above_one(x);
    if (above <= 0)
        return NULL;
    PyObject *rank = PyObject_CallFunctionObjArgs(ranked, x, NULL);
    if (rank == NULL)
        return NULL;
    PyObject *key = PyTuple_Pack(3, form, PyTuple_GetItem(self, ANY_LENGTH), rank);
    Py_DECREF(rank);
    if (key == NULL)
        return NULL;
    PyObject *plan = PyObject_CallFunctionObjArgs(PyTuple_GetItem(self, P_ACQUIRE), key, NULL);
    Py_DECREF(key);
    if (plan == Py_None) {
        Py_DECREF(plan);
        return NULL;
    }
    return plan;
}

/* run an acquired plan on x: its direct call where it has one, else execute({"x": x}, None) */
static PyObject *
run_plan(PyObject *plan, PyObject *x)
{
    PyObject *direct = PyObject_GetAttr(plan, s_direct);
    if (direct == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
    }
    else if (direct != Py_None) {
        PyObject *result = PyObject_CallFunctionObjArgs(direct, x, NULL);
        Py_DECREF(direct);
        return result;
    }
    Py_XDECREF(direct);
    PyObject *operands = PyDict_New();
    if (operands == NULL || PyDict_SetItem(operands, s_x, x) < 0) {
        Py_XDECREF(operands);
        return NULL;
    }
    PyObject *result = PyObject_CallMethodObjArgs(plan, s_execute, operands, Py_None, NULL);
    Py_DECREF(operands);
    return result;
}

/* front(func, a, n, axis, s, axes, norm, out, stream, convention, callbacks): call_transform's arguments */
static PyObject *
fft_front(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != N_FFT_ARGS) {
        PyErr_Format(PyExc_TypeError, "the transforms' front takes %d arguments, got %zd", N_FFT_ARGS, nargs);
        return NULL;
    }
    PyObject *x = args[A_X];
    if (args[A_OUT] != Py_None || args[A_STREAM] != Py_None || args[A_S] != Py_None ||
        !int_tuple_or_none(args[A_AXES]) || !no_callbacks(args[A_CALLBACKS]))
        return to_route(self, args);
    PyObject *classes = PyTuple_GetItem(self, P_CLASSES);
    PyObject *cls = (PyObject *)Py_TYPE(x);
    PyObject *entry = PyDict_GetItemWithError(classes, cls);
    if (entry == NULL || !PyTuple_Check(entry) || PyTuple_Size(entry) <= KEYS_RANK_SIGNATURE ||
        PyTuple_GetItem(entry, KEYS_PLAIN) != Py_True || PyTuple_GetItem(entry, KEYS_SIGNATURE) == Py_None) {
        PyErr_Clear(); /* a class the route has not met yet, or one the route serves itself */
        return to_route(self, args);
    }
    PyObject *sig = Py_NewRef(PyTuple_GetItem(entry, KEYS_SIGNATURE)); /* ours: the entry may be replaced */
    PyObject *memo = Py_NewRef(PyTuple_GetItem(entry, KEYS_MEMO));
    PyObject *ranked = Py_NewRef(PyTuple_GetItem(entry, KEYS_RANK_SIGNATURE));
    PyObject *skey, *gkey, *form = NULL;
    if (nvd_backend_keys(self, &skey, &gkey) == 0) {
        form = PyTuple_Pack(10, s_fft, args[A_FUNC], cls, args[A_N], args[A_AXIS], Py_None, args[A_AXES],
                            args[A_NORM], skey, gkey);
        Py_DECREF(skey);
        Py_DECREF(gkey);
    }
    int pinned = 1, tried = 0;
    PyObject *plan = NULL, *hit = NULL, *held = NULL; /* hit: what found the plan, NULL for the call key */
    if (form != NULL && memo != Py_None)
        plan = nvd_memo_hit(self, memo, form, &x, 1, &pinned, &held, &tried);
    if (form != NULL && plan == NULL && !PyErr_Occurred() && ranked != Py_None) {
        plan = any_length_hit(self, form, ranked, x);
        hit = plan != NULL ? s_any_length_key : NULL;
    }
    if (form != NULL && plan == NULL && !PyErr_Occurred() && memo == Py_None)
        plan = nvd_key_hit(self, sig, form, &x, 1);
    Py_DECREF(sig);
    Py_DECREF(memo);
    Py_DECREF(ranked);
    Py_XDECREF(form);
    if (plan == NULL) {
        /* no hit: the route serves the call; a TypeError (an unhashable argument) is the route's to report */
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError))
                return NULL;
            PyErr_Clear();
        }
        return to_route(self, args);
    }
    PyObject *result = NULL;
    if (nvd_log_hit(self, s_fft, plan, hit) == 0) {
        result = run_plan(plan, x);
        if (result == NULL)
            nvd_reraise(self);
    }
    if (pinned)
        result = nvd_let_go(self, plan, held, result);
    Py_XDECREF(held);
    Py_DECREF(plan);
    return result;
}

static PyMethodDef fft_front_def = {"fft_front", (PyCFunction)(void (*)(void))fft_front, METH_FASTCALL,
                                    "nvdispatch.fft's route with its hit compiled (see _hotpath_fft.c)."};

/* make_fft_front(parts): the front, reading the documented attributes of parts (FFT_PART_NAMES) once */
static PyObject *
make_fft_front(PyObject *module, PyObject *parts)
{
    PyObject *self = nvd_read_parts(parts, FFT_PART_NAMES, N_FFT_PARTS, "make_fft_front");
    if (self == NULL)
        return NULL;
    PyObject *front_fn = PyCFunction_NewEx(&fft_front_def, self, NULL);
    Py_DECREF(self);
    return front_fn;
}

static PyMethodDef fft_methods[] = {
    {"make_fft_front", make_fft_front, METH_O,
     "make_fft_front(parts) -> front(func, a, n, axis, s, axes, norm, out, stream, convention, callbacks): the "
     "transforms' "
     "route with its hit compiled; parts has the attributes route, classes, backends, acquire, acquire_handle, "
     "let_go, log_levels, log_hit, raise_if_out_of_memory, current_state, any_length "
     "(nvdispatch.fft._route.TransformFrontParts)"},
    {NULL, NULL, 0, NULL},
};

int
nvd_add_fft(PyObject *module)
{
    s_fft = PyUnicode_InternFromString("fft");
    s_direct = PyUnicode_InternFromString("direct");
    s_execute = PyUnicode_InternFromString("execute");
    s_x = PyUnicode_InternFromString("x");
    s_shape = PyUnicode_InternFromString("shape");
    s_any_length_key = PyUnicode_InternFromString("any-length key");
    if (!s_fft || !s_direct || !s_execute || !s_x || !s_shape || !s_any_length_key)
        return -1;
    return PyModule_AddFunctions(module, fft_methods);
}
