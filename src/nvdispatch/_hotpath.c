/* The first step of nvdispatch.matmul's route, compiled: a repeated call served from the plan cache.
 *
 * nvdispatch.linalg._route is the route, in Python; this is its hit for the short forms of call key that
 * nvdispatch._call_key builds (a plain product, a bias epilog; alpha 1, no c, options or scales) for array
 * classes whose arrays executors take as they are (ClassKeys.plain: no view, no wrap). The part a repeated call
 * takes: the call's form (operand classes, epilog, alpha's class, backend state, the reading of the framework's
 * precision settings), then for a class with a guard
 * (Torch) the plan handles remembered for that form (nvdispatch._call_key_memo) behind their guards and the plan
 * cache's acquire_handle, for one without (NumPy, CuPy) the call key (form and signatures) and acquire; then the
 * plan's direct call (or execute) and let_go, as the run step (nvdispatch._execute.run) does. Any call it does
 * not serve this way (another form or class, no handle whose guard passes, a stale handle, a miss, an argument
 * it cannot hash) goes to the Python route, which serves it as it serves every call. So there is one route:
 * this is its hit, compiled, where the Python route's own bytecode costs more than Torch's fused op on a small
 * matrix.
 *
 * make_matmul_front receives ONE object (linalg._FrontParts) and reads its documented attributes once:
 * route, classes, backends, acquire, acquire_handle, let_go, log_levels, log_hit, raise_if_out_of_memory,
 * current_state, operands. Per call it reads the attributes of the objects they hold that the Python route reads
 * too: ClassKeys' fields plain, signature, memo, precision, precision_of (a named tuple: by position),
 * CallKeyMemo.handles, the backend registry's global_key and the current state's key, a handle entry's pinless, a
 * plan's direct.
 *
 * A repeated call's form is built once: the front keeps its last few forms (KEPT_FORMS) and looks a call up under
 * the kept one whose items are the call's own objects (classes, epilog, alpha's class, backend keys, and the
 * precision reading, which _hotpath_reading.c returns as the same tuple while the settings stay the same).
 *
 * The module also holds _hotpath_lt.c's cuBLASLt launches (make_lt_matmul, make_lt_direct), _hotpath_ffi.c's
 * XLA FFI handler (ffi_handler and its plan table), _hotpath_reading.c's precision readings (make_reading) and
 * make_bias_last (a plan's direct call over an op taking the bias first).
 *
 * The stable ABI (Py_LIMITED_API 3.10): one build serves every CPython from 3.10 on.
 */
#include "_hotpath.h"

/* the attributes of the parts object the front reads, in this order (its self tuple) */
static const char *const PART_NAMES[] = {
    "route",   "classes",  "backends", "acquire", "acquire_handle", "let_go", "log_levels", "log_hit",
    "raise_if_out_of_memory", "current_state", "operands",
};
/* the route's arguments (route(a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream,
 * quantization_scales, memo_checked)) and the run step's operands (linalg._operands) follow the common parts */
enum { OPERANDS = N_COMMON_PARTS, N_PARTS, KEPT = N_PARTS /* the kept forms (make_matmul_front adds them) */ };
enum {
    ROUTE = P_ROUTE,
    CLASSES = P_CLASSES,
    BACKENDS = P_BACKENDS,
    ACQUIRE = P_ACQUIRE,
    ACQUIRE_HANDLE = P_ACQUIRE_HANDLE,
    LET_GO = P_LET_GO,
    LOG_LEVELS = P_LOG_LEVELS,
    LOG_HIT = P_LOG_HIT,
    RAISE_IF_OOM = P_RAISE_IF_OOM,
};

#define N_ARGS 11 /* a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, scales */

static PyObject *s_bias, *s_handles, *s_pinless, *s_direct, *s_execute, *s_key, *s_global_key, *s_matmul, *i_debug;

/* the whole call through the Python route; memo_checked: the form's handles were tried already */
static PyObject *
to_route(PyObject *parts, PyObject *const *args, int memo_checked)
{
    PyObject *call = PyTuple_New(N_ARGS + 1);
    if (call == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < N_ARGS; i++) {
        Py_INCREF(args[i]);
        PyTuple_SetItem(call, i, args[i]);
    }
    PyObject *flag = memo_checked ? Py_True : Py_False;
    Py_INCREF(flag);
    PyTuple_SetItem(call, N_ARGS, flag);
    PyObject *result = PyObject_Call(PyTuple_GetItem(parts, ROUTE), call, NULL);
    Py_DECREF(call);
    return result;
}

/* attribute `name` of obj (NULL when obj is: an error is set already), as a new reference */
static PyObject *
attr(PyObject *obj, PyObject *name)
{
    return obj == NULL ? NULL : PyObject_GetAttr(obj, name);
}

/* ClassKeys field `field` of class cls (borrowed); NULL with no error set when the class has no entry yet */
static PyObject *
class_field(PyObject *classes, PyObject *cls, Py_ssize_t field)
{
    PyObject *entry = PyDict_GetItemWithError(classes, cls);
    return entry == NULL || !PyTuple_Check(entry) ? NULL : PyTuple_GetItem(entry, field);
}

/* the classes part of a form: cls when every array is of it, else the tuple of their classes when each has
 * the same signature function (a Torch Parameter beside tensors); NULL (no error) otherwise */
static PyObject *
classes_of(PyObject *classes, PyObject *sig, PyObject *a, PyObject *b, PyObject *bias)
{
    PyObject *cls = (PyObject *)Py_TYPE(a);
    PyObject *bc = (PyObject *)Py_TYPE(b);
    PyObject *biasc = bias == NULL ? cls : (PyObject *)Py_TYPE(bias);
    if (bc == cls && biasc == cls) {
        Py_INCREF(cls);
        return cls;
    }
    PyObject *others[2] = {bc, biasc};
    for (int i = 0; i < (bias == NULL ? 1 : 2); i++) {
        if (others[i] == cls)
            continue;
        PyObject *s = class_field(classes, others[i], KEYS_SIGNATURE);
        if (s != sig)
            return NULL; /* an error, if any, stays set for the caller */
    }
    return bias == NULL ? PyTuple_Pack(2, cls, bc) : PyTuple_Pack(3, cls, bc, biasc);
}

/* the backend part of a form: the current state's key and the registry's global key (new references) */
int
nvd_backend_keys(PyObject *self, PyObject **state_key, PyObject **global_key)
{
    PyObject *backends = PyTuple_GetItem(self, P_BACKENDS);
    PyObject *state = PyObject_CallNoArgs(PyTuple_GetItem(self, P_CURRENT_STATE));
    *state_key = attr(state, s_key);
    Py_XDECREF(state);
    *global_key = *state_key == NULL ? NULL : PyObject_GetAttr(backends, s_global_key);
    if (*global_key == NULL) {
        Py_CLEAR(*state_key);
        return -1;
    }
    return 0;
}

/* forms kept per front: a call's form is built once while what it holds stays the same objects */
#define KEPT_FORMS 4

/* whether x and y are the same object, or tuples of the same objects (a form's classes part: Parameters beside
 * tensors) */
static int
same_part(PyObject *x, PyObject *y)
{
    if (x == y)
        return 1;
    if (!PyTuple_CheckExact(x) || !PyTuple_CheckExact(y) || PyTuple_Size(x) != PyTuple_Size(y))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_Size(x); i++)
        if (PyTuple_GetItem(x, i) != PyTuple_GetItem(y, i))
            return 0;
    return 1;
}

/* the form a hit is looked up under, the tuple of items[0..n): one the front kept (self[KEPT]) where its items
 * are these objects (a tuple item: one holding these objects), else a new one, then kept (a new reference; NULL
 * with an error) */
static PyObject *
form_from(PyObject *self, PyObject *const *items, Py_ssize_t n)
{
    /* A kept form equal item by item (by identity: no code runs) is the same key: looking it up hashes it as a new
     * one would be, and the dict's comparison of it with the key it finds is one of identity. */
    static Py_ssize_t next; /* the slot a new form replaces (round robin; any slot would do) */
    PyObject *forms = PyTuple_GetItem(self, KEPT);
    for (Py_ssize_t i = 0; i < KEPT_FORMS; i++) {
        PyObject *form = PyList_GetItem(forms, i);
        if (form == NULL)
            return NULL;
        if (!PyTuple_CheckExact(form) || PyTuple_Size(form) != n)
            continue; /* an empty slot (None), or a form of another size */
        Py_ssize_t j = 0;
        while (j < n && same_part(PyTuple_GetItem(form, j), items[j]))
            j++;
        if (j == n)
            return Py_NewRef(form);
    }
    PyObject *form = PyTuple_New(n);
    if (form == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < n; j++)
        PyTuple_SetItem(form, j, Py_NewRef(items[j]));
    next = (next + 1) % KEPT_FORMS;
    if (PyList_SetItem(forms, next, Py_NewRef(form)) < 0) { /* the slot's old form is let go after the swap */
        Py_DECREF(form);
        return NULL;
    }
    return form;
}

/* the form a hit is remembered under (nvdispatch._call_key.short_form builds the same tuples) */
static PyObject *
form_of(PyObject *parts, PyObject *entry, PyObject *classes, PyObject *epilog, PyObject *a, PyObject *alpha,
        int with_bias)
{
    /* the reading of the framework's precision settings: ClassKeys.precision_of(a) where the adapter reads them
     * per device, else ClassKeys.precision() (None where it has none) */
    PyObject *read_of = PyTuple_Size(entry) > KEYS_PRECISION_OF ? PyTuple_GetItem(entry, KEYS_PRECISION_OF) : Py_None;
    PyObject *read = PyTuple_GetItem(entry, KEYS_PRECISION);
    if (read == NULL || read_of == NULL)
        return NULL;
    PyObject *precision;
    if (read_of != Py_None) {
        precision = PyObject_CallFunctionObjArgs(read_of, a, NULL);
        if (precision == NULL)
            return NULL;
    }
    else if (read == Py_None) {
        precision = Py_NewRef(Py_None);
    }
    else {
        precision = PyObject_CallNoArgs(read);
        if (precision == NULL)
            return NULL;
    }
    PyObject *skey, *gkey, *form = NULL;
    if (nvd_backend_keys(parts, &skey, &gkey) == 0) {
        PyObject *acls = (PyObject *)Py_TYPE(alpha);
        PyObject *biased[] = {classes, epilog, s_bias, acls, skey, gkey, precision};
        PyObject *plain[] = {classes, epilog, acls, skey, gkey, precision};
        form = with_bias ? form_from(parts, biased, 7) : form_from(parts, plain, 6);
        Py_DECREF(skey);
        Py_DECREF(gkey);
    }
    Py_DECREF(precision);
    return form;
}

/* run an acquired plan: its direct call where it has one, else execute(operands, None) */
static PyObject *
run_plan(PyObject *parts, PyObject *plan, PyObject *const *args, PyObject *bias)
{
    PyObject *direct = PyObject_GetAttr(plan, s_direct);
    if (direct == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
    }
    else if (direct != Py_None) {
        PyObject *result = PyObject_CallFunctionObjArgs(direct, args[0], args[1], bias, NULL);
        Py_DECREF(direct);
        return result;
    }
    Py_XDECREF(direct);
    PyObject *operands = PyObject_CallFunctionObjArgs(
        PyTuple_GetItem(parts, OPERANDS), args[0], args[1], args[2], args[3], args[4], args[6], args[10], NULL);
    if (operands == NULL)
        return NULL;
    PyObject *result = PyObject_CallMethodObjArgs(plan, s_execute, operands, Py_None, NULL);
    Py_DECREF(operands);
    return result;
}

/* a failed run: an out-of-memory error becomes nvdispatch's OutOfMemoryError (raised from it), as the route's
 * `except Exception: raise_if_out_of_memory(exc); raise` does */
void
nvd_reraise(PyObject *self)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *r = PyObject_CallFunctionObjArgs(PyTuple_GetItem(self, P_RAISE_IF_OOM), value, NULL);
    if (r == NULL) { /* it raised its own error, from this one */
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return;
    }
    Py_DECREF(r);
    PyErr_Restore(type, value, tb);
}

PyObject *
nvd_let_go(PyObject *self, PyObject *plan, PyObject *held, PyObject *result)
{
    /* let_go runs with the run's error, if any, put aside (a finally block) */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (nvd_let_go_entry(PyTuple_GetItem(self, P_LET_GO), held, plan) < 0) {
        Py_XDECREF(result);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    PyErr_Restore(type, value, tb);
    return result;
}

int
nvd_log_hit(PyObject *self, PyObject *what, PyObject *plan, PyObject *key)
{
    PyObject *level = PyDict_GetItemWithError(PyTuple_GetItem(self, P_LOG_LEVELS), i_debug);
    if (level == Py_False || PyErr_Occurred())
        return PyErr_Occurred() ? -1 : 0;
    PyObject *r = PyObject_CallFunctionObjArgs(PyTuple_GetItem(self, P_LOG_HIT), what, plan, key, NULL); /* it checks */
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* a repeated call whose guard passes: its plan, acquired (pinned where the cache pins it); NULL with no error
 * set when there is none (the route then serves the call); *pinned tells whether to let go (the route skips
 * let_go, a no-op, for a plan the cache does not pin), *held the entry to let go by (a new reference) */
PyObject *
nvd_memo_hit(PyObject *self, PyObject *memo, PyObject *form, PyObject *const *arrays, Py_ssize_t n, int *pinned,
             PyObject **held, int *tried)
{
    PyObject *handles = PyObject_GetAttr(memo, s_handles);
    if (handles == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(handles, form);
    Py_XINCREF(found); /* ours while guards run (another thread may replace the form's handles) */
    Py_DECREF(handles);
    if (found == NULL) {
        *tried = !PyErr_Occurred(); /* no handle for the form */
        return NULL;
    }
    PyObject *plan = NULL;
    Py_ssize_t count = PyTuple_Size(found);
    for (Py_ssize_t i = 0; i < count && plan == NULL && !PyErr_Occurred(); i++) {
        PyObject *rec = PyTuple_GetItem(found, i);
        PyObject *check = PyTuple_GetItem(rec, 0), *entry = PyTuple_GetItem(rec, 1), *epoch = PyTuple_GetItem(rec, 2);
        PyObject *ok = PyObject_CallFunctionObjArgs(check, arrays[0], n > 1 ? arrays[1] : NULL,
                                                    n > 2 ? arrays[2] : NULL, NULL);
        int passed = ok == NULL ? -1 : PyObject_IsTrue(ok);
        Py_XDECREF(ok);
        if (passed < 0)
            break;
        if (passed) {
            int pinless;
            plan = nvd_acquire_handle(PyTuple_GetItem(self, P_ACQUIRE_HANDLE), entry, epoch, &pinless);
            if (plan == Py_None) { /* stale: the route takes the call's key and remembers the new handle */
                Py_DECREF(plan);
                plan = NULL;
            }
            else if (plan != NULL) {
                /* let_go is a no-op for a plan the cache does not pin: skipping it is only a saving */
                *pinned = !pinless;
                *held = pinless ? NULL : Py_NewRef(entry);
            }
            break;
        }
    }
    *tried = !PyErr_Occurred();
    Py_DECREF(found);
    return plan;
}

/* a repeated call of a class without a guard (its signatures are cheap to read: NumPy's, CuPy's): the plan
 * cached under its call key (form, signatures), acquired; NULL with no error set when there is none */
PyObject *
nvd_key_hit(PyObject *self, PyObject *sig, PyObject *form, PyObject *const *arrays, Py_ssize_t n)
{
    PyObject *key = PyTuple_New(n + 1);
    if (key == NULL)
        return NULL;
    PyTuple_SetItem(key, 0, Py_NewRef(form));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *signature = PyObject_CallFunctionObjArgs(sig, arrays[i], NULL);
        if (signature == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SetItem(key, i + 1, signature);
    }
    PyObject *plan = PyObject_CallFunctionObjArgs(PyTuple_GetItem(self, P_ACQUIRE), key, NULL);
    Py_DECREF(key);
    if (plan == Py_None) { /* a miss: the route plans the call */
        Py_DECREF(plan);
        return NULL;
    }
    return plan;
}

/* front(a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, quantization_scales) */
static PyObject *
front(PyObject *parts, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != N_ARGS) {
        PyErr_Format(PyExc_TypeError, "the matmul front takes %d arguments, got %zd", N_ARGS, nargs);
        return NULL;
    }
    PyObject *a = args[0], *b = args[1], *alpha = args[3], *epilog = args[5], *inputs = args[6];
    /* the forms served here: no c, beta, options, preferences, scales; alpha the int 1; default stream; no
     * epilog inputs or a dict of the bias alone */
    if (args[2] != Py_None || args[4] != Py_None || args[7] != Py_None || args[8] != Py_None ||
        args[9] != Py_None || args[10] != Py_None || !PyLong_CheckExact(alpha))
        return to_route(parts, args, 0);
    int overflow = 0;
    if (PyLong_AsLongAndOverflow(alpha, &overflow) != 1 || overflow)
        return to_route(parts, args, 0);
    PyObject *bias = NULL;
    if (inputs != Py_None) {
        if (!PyDict_CheckExact(inputs) || PyDict_Size(inputs) != 1)
            return to_route(parts, args, 0);
        bias = PyDict_GetItemWithError(inputs, s_bias);
        if (bias == NULL) {
            PyErr_Clear();
            return to_route(parts, args, 0);
        }
    }
    /* the class's ClassKeys: served here when its arrays go to plans as they are (plain) and have a signature */
    PyObject *classes = PyTuple_GetItem(parts, CLASSES);
    PyObject *entry = PyDict_GetItemWithError(classes, (PyObject *)Py_TYPE(a));
    if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GetItem(entry, KEYS_PLAIN) != Py_True ||
        PyTuple_GetItem(entry, KEYS_SIGNATURE) == Py_None) {
        /* a class the route has not met yet, or one the route serves itself */
        PyErr_Clear();
        return to_route(parts, args, 0);
    }
    PyObject *sig = PyTuple_GetItem(entry, KEYS_SIGNATURE);
    PyObject *memo = PyTuple_GetItem(entry, KEYS_MEMO);
    Py_INCREF(sig); /* ours for the call (another thread may replace the class's entry) */
    Py_INCREF(memo);
    Py_XINCREF(bias); /* ours for the call: the dict is the caller's */
    PyObject *which = classes_of(classes, sig, a, b, bias);
    Py_INCREF(entry);
    PyObject *form = which == NULL ? NULL : form_of(parts, entry, which, epilog, a, alpha, bias != NULL);
    Py_DECREF(entry);
    Py_XDECREF(which);
    int pinned = 1, tried = 0;
    PyObject *plan = NULL, *held = NULL; /* held: the entry a memo hit pinned its plan by */
    PyObject *arrays[3] = {a, b, bias};
    Py_ssize_t narrays = bias == NULL ? 2 : 3;
    if (form != NULL) /* the memo's handles, behind their guards; else the call key */
        plan = memo != Py_None ? nvd_memo_hit(parts, memo, form, arrays, narrays, &pinned, &held, &tried)
                               : nvd_key_hit(parts, sig, form, arrays, narrays);
    Py_DECREF(sig);
    Py_DECREF(memo);
    Py_XDECREF(form);
    if (plan == NULL) {
        /* no hit: the route serves the call. A TypeError here (an unhashable epilog, a guard refusing an
         * argument) is the route's to handle as it does (the full path reports it); any other error is the
         * call's, as it would be in the route. */
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
                Py_XDECREF(bias);
                return NULL;
            }
            PyErr_Clear();
        }
        PyObject *result = to_route(parts, args, tried);
        Py_XDECREF(bias);
        return result;
    }
    PyObject *result = NULL;
    if (nvd_log_hit(parts, s_matmul, plan, NULL) == 0) {
        result = run_plan(parts, plan, args, bias);
        if (result == NULL)
            nvd_reraise(parts);
    }
    Py_XDECREF(bias);
    if (pinned)
        result = nvd_let_go(parts, plan, held, result);
    Py_XDECREF(held);
    Py_DECREF(plan);
    return result;
}

/* bias_last(a, b, bias) -> fn(bias, a, b): a plan's direct call (bias last) over an op taking the bias first
 * (Torch's addmm, _addmm_activation), without the Python frame of a lambda reordering them */
static PyObject *
bias_last(PyObject *fn, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "direct(a, b, bias) takes 3 arguments, got %zd", nargs);
        return NULL;
    }
    return PyObject_CallFunctionObjArgs(fn, args[2], args[0], args[1], NULL);
}

static PyMethodDef bias_last_def = {"direct", (PyCFunction)(void (*)(void))bias_last, METH_FASTCALL,
                                    "direct(a, b, bias) -> fn(bias, a, b) (see nvdispatch._hotpath.make_bias_last)"};

/* make_bias_last(fn) -> direct */
static PyObject *
make_bias_last(PyObject *module, PyObject *fn)
{
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "make_bias_last: expected a callable");
        return NULL;
    }
    return PyCFunction_NewEx(&bias_last_def, fn, NULL);
}

static PyMethodDef front_def = {"matmul_front", (PyCFunction)(void (*)(void))front, METH_FASTCALL,
                                "nvdispatch.matmul's route with its hit compiled (see _hotpath.c)."};

PyObject *
nvd_read_parts(PyObject *parts, const char *const *names, Py_ssize_t n, const char *who)
{
    PyObject *self = PyTuple_New(n);
    if (self == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyObject_GetAttrString(parts, names[i]);
        if (value == NULL) {
            Py_DECREF(self);
            return NULL;
        }
        PyTuple_SetItem(self, i, value);
    }
    if (!PyDict_Check(PyTuple_GetItem(self, P_CLASSES)) || !PyDict_Check(PyTuple_GetItem(self, P_LOG_LEVELS))) {
        Py_DECREF(self);
        PyErr_Format(PyExc_TypeError, "%s: parts.classes and parts.log_levels must be dicts", who);
        return NULL;
    }
    return self;
}

/* make_matmul_front(parts): the front, reading the documented attributes of parts (PART_NAMES) once */
static PyObject *
make_matmul_front(PyObject *module, PyObject *parts)
{
    PyObject *read = nvd_read_parts(parts, PART_NAMES, N_PARTS, "make_matmul_front");
    PyObject *forms = PyList_New(KEPT_FORMS); /* the kept forms, none yet (see form_from) */
    PyObject *self = read == NULL || forms == NULL ? NULL : PyTuple_New(N_PARTS + 1);
    for (Py_ssize_t i = 0; self != NULL && i < N_PARTS; i++)
        PyTuple_SetItem(self, i, Py_NewRef(PyTuple_GetItem(read, i)));
    for (Py_ssize_t i = 0; self != NULL && i < KEPT_FORMS; i++)
        PyList_SetItem(forms, i, Py_NewRef(Py_None));
    if (self != NULL)
        PyTuple_SetItem(self, KEPT, Py_NewRef(forms));
    Py_XDECREF(read);
    Py_XDECREF(forms);
    if (self == NULL)
        return NULL;
    PyObject *front_fn = PyCFunction_NewEx(&front_def, self, NULL); /* self: the parts, the front's self */
    Py_DECREF(self);
    return front_fn;
}

int nvd_add_lt(PyObject *module);    /* _hotpath_lt.c: the cuBLASLt launches */
int nvd_add_cache(PyObject *module); /* _hotpath_cache.c: the plan cache's per-call steps */
int nvd_add_fft(PyObject *module);   /* _hotpath_fft.c: the transforms' front */
int nvd_add_cufft(PyObject *module); /* _hotpath_cufft.c: the cuFFT launch */
int nvd_add_ffi(PyObject *module);   /* _hotpath_ffi.c: the XLA FFI handler and its plan table */
int nvd_add_epilog(PyObject *module); /* _hotpath_epilog.c: the CPU bias + activation sweep */
int nvd_add_launch(PyObject *module); /* _hotpath_launch.c: prepared kernel launches (cuLaunchKernel) */
int nvd_add_reading(PyObject *module); /* _hotpath_reading.c: precision settings read without a Python frame */
int nvd_add_tiled(PyObject *module);  /* _hotpath_tiled.c: the CPU linear layer's tiled GEMM */
int nvd_add_cores(PyObject *module);  /* _hotpath_cores.c: whether another thread of the process is running */

static PyMethodDef methods[] = {
    {"make_bias_last", make_bias_last, METH_O,
     "make_bias_last(fn) -> direct: direct(a, b, bias) calls fn(bias, a, b) (a plan's direct call over an op "
     "taking the bias first, with no Python frame)"},
    {"make_matmul_front", make_matmul_front, METH_O,
     "make_matmul_front(parts) -> front: matmul's route with its hit compiled; parts has the attributes route, "
     "classes, backends, acquire, acquire_handle, let_go, log_levels, log_hit, raise_if_out_of_memory, "
     "current_state, operands "
     "(nvdispatch.linalg._FrontParts)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "nvdispatch._hotpath",
    "nvdispatch's compiled hot paths: matmul's cached hit, the cuBLASLt launch, the CPU epilog sweep.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    s_bias = PyUnicode_InternFromString("bias");
    s_handles = PyUnicode_InternFromString("handles");
    s_pinless = PyUnicode_InternFromString("pinless");
    s_direct = PyUnicode_InternFromString("direct");
    s_execute = PyUnicode_InternFromString("execute");
    s_key = PyUnicode_InternFromString("key");
    s_global_key = PyUnicode_InternFromString("global_key");
    s_matmul = PyUnicode_InternFromString("matmul");
    i_debug = PyLong_FromLong(10); /* logging.DEBUG */
    if (!s_bias || !s_handles || !s_pinless || !s_direct || !s_execute || !s_key || !s_global_key ||
        !s_matmul || !i_debug)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (nvd_add_lt(module) < 0 || nvd_add_cache(module) < 0 || nvd_add_fft(module) < 0 ||
        nvd_add_cufft(module) < 0 || nvd_add_ffi(module) < 0 || nvd_add_epilog(module) < 0 ||
        nvd_add_launch(module) < 0 || nvd_add_reading(module) < 0 || nvd_add_tiled(module) < 0 ||
        nvd_add_cores(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
