/* A framework's precision settings read without a Python frame (part of nvdispatch._hotpath; _hotpath.c adds
 * this function).
 *
 * Every matmul call key holds the reading of its framework's precision settings (an adapter's precision_key:
 * nvdispatch._call_key), so every call reads them, the compiled front's hit included. Where those settings are
 * native getters (Torch's C functions), make_reading(gate, steps, fallback) gives the reading as one C call:
 *
 *   reading()  ->  fallback()                     where gate() is true (or raises an Exception)
 *              ->  (step0(*args0), step1(*args1), ...)  otherwise; fallback() where a step raises an Exception
 *
 * so the common case (Torch outside any autocast region: TF32 switch, CPU matmul precision) costs the getters'
 * own calls, and every other case (an autocast region, a legacy switch that refuses to be read alone) is the
 * adapter's Python reading, which must give the same tuple where it reads the same settings. A reading equal to
 * the previous one is returned as that same tuple object: a call key holding it then compares by identity, and
 * the compiled front reuses the form it built around it (_hotpath.c).
 *
 * The steps run in order, under the GIL; the kept tuple is replaced whole (a reading running meanwhile on another
 * thread reads or keeps a complete tuple).
 *
 * make_reading_by(attribute, if_true, if_false) chooses between two readings by an operand's attribute (Torch's
 * is_cuda): a call key then holds only the settings a product on that operand's device depends on.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* the reading's self: (gate, steps, fallback, kept) with kept a one-item list holding the last tuple (or None) */
enum { R_GATE, R_STEPS, R_FALLBACK, R_KEPT, N_READING };

#define MAX_STEPS 8

/* the fallback's reading, after clearing an Exception (any other error stays the caller's); NULL with an error */
static PyObject *
fall_back(PyObject *self)
{
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    return PyObject_CallNoArgs(PyTuple_GetItem(self, R_FALLBACK));
}

static PyObject *
reading(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *gate = PyObject_CallNoArgs(PyTuple_GetItem(self, R_GATE));
    int open = gate == NULL ? -1 : PyObject_IsTrue(gate);
    Py_XDECREF(gate);
    if (open != 0)
        return fall_back(self);
    PyObject *steps = PyTuple_GetItem(self, R_STEPS);
    Py_ssize_t n = PyTuple_Size(steps);
    PyObject *values[MAX_STEPS];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *step = PyTuple_GetItem(steps, i);
        PyObject *args = PyTuple_GetItem(step, 1);
        values[i] = PyTuple_Size(args) == 0 ? PyObject_CallNoArgs(PyTuple_GetItem(step, 0))
                                            : PyObject_Call(PyTuple_GetItem(step, 0), args, NULL);
        if (values[i] == NULL) {
            for (Py_ssize_t j = 0; j < i; j++)
                Py_DECREF(values[j]);
            return fall_back(self);
        }
    }
    /* the kept tuple where it holds these values (compared with the getters' own values: bools, strings) */
    PyObject *kept_list = PyTuple_GetItem(self, R_KEPT);
    PyObject *kept = PyList_GetItem(kept_list, 0);
    Py_INCREF(kept); /* ours while comparing: a comparison may run code, and another thread replace it */
    int same = PyTuple_Check(kept) && PyTuple_Size(kept) == n;
    for (Py_ssize_t i = 0; same > 0 && i < n; i++)
        same = PyObject_RichCompareBool(PyTuple_GetItem(kept, i), values[i], Py_EQ);
    if (same != 0) {
        for (Py_ssize_t i = 0; i < n; i++)
            Py_DECREF(values[i]);
        if (same < 0)
            Py_CLEAR(kept);
        return kept;
    }
    Py_DECREF(kept);
    PyObject *result = PyTuple_New(n);
    if (result == NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            Py_DECREF(values[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SetItem(result, i, values[i]);
    Py_INCREF(result);
    if (PyList_SetItem(kept_list, 0, result) < 0) { /* steals the new reference; the old tuple is let go */
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyMethodDef reading_def = {"reading", reading, METH_NOARGS,
                                  "the framework's precision settings, read (see nvdispatch._hotpath.make_reading)"};

/* make_reading(gate, steps, fallback) -> reading */
static PyObject *
make_reading(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "make_reading(gate, steps, fallback) takes 3 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *steps = args[1];
    int ok = PyTuple_Check(steps) && PyTuple_Size(steps) <= MAX_STEPS && PyCallable_Check(args[0]) &&
             PyCallable_Check(args[2]);
    for (Py_ssize_t i = 0; ok && i < PyTuple_Size(steps); i++) {
        PyObject *step = PyTuple_GetItem(steps, i);
        ok = PyTuple_Check(step) && PyTuple_Size(step) == 2 && PyCallable_Check(PyTuple_GetItem(step, 0)) &&
             PyTuple_Check(PyTuple_GetItem(step, 1));
    }
    if (!ok) {
        PyErr_Format(PyExc_TypeError,
                     "make_reading: expected a callable gate, a tuple of at most %d (callable, args tuple) steps and a "
                     "callable fallback",
                     MAX_STEPS);
        return NULL;
    }
    PyObject *kept = PyList_New(1);
    if (kept == NULL)
        return NULL;
    Py_INCREF(Py_None);
    PyList_SetItem(kept, 0, Py_None);
    PyObject *self = PyTuple_Pack(N_READING, args[0], steps, args[2], kept);
    Py_DECREF(kept);
    if (self == NULL)
        return NULL;
    PyObject *fn = PyCFunction_NewEx(&reading_def, self, NULL);
    Py_DECREF(self);
    return fn;
}

/* reading_by(x): self is (attribute, if_true, if_false): if_true() where x.<attribute> is true, else if_false() */
static PyObject *
reading_by(PyObject *self, PyObject *x)
{
    PyObject *v = PyObject_GetAttr(x, PyTuple_GetItem(self, 0));
    int which = v == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    if (which < 0)
        return NULL;
    return PyObject_CallNoArgs(PyTuple_GetItem(self, which ? 1 : 2));
}

static PyMethodDef reading_by_def = {"reading_by", reading_by, METH_O,
                                     "the reading for a call on x (see nvdispatch._hotpath.make_reading_by)"};

/* make_reading_by(attribute, if_true, if_false) -> reading_by */
static PyObject *
make_reading_by(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyUnicode_Check(args[0]) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "make_reading_by(attribute, if_true, if_false): a str and two callables");
        return NULL;
    }
    PyObject *self = PyTuple_Pack(3, args[0], args[1], args[2]);
    if (self == NULL)
        return NULL;
    PyObject *fn = PyCFunction_NewEx(&reading_by_def, self, NULL);
    Py_DECREF(self);
    return fn;
}

static PyMethodDef reading_methods[] = {
    {"make_reading_by", (PyCFunction)(void (*)(void))make_reading_by, METH_FASTCALL,
     "make_reading_by(attribute, if_true, if_false) -> reading(x): if_true() where x.<attribute> is true, else "
     "if_false() (a reading for the settings a call on x's device depends on)"},
    {"make_reading", (PyCFunction)(void (*)(void))make_reading, METH_FASTCALL,
     "make_reading(gate, steps, fallback) -> reading: reading() is fallback() where gate() is true, else the "
     "tuple of each step's fn(*args) (steps: ((fn, args), ...); fallback() where a step raises), the previous "
     "tuple again where its values are equal"},
    {NULL, NULL, 0, NULL},
};

int
nvd_add_reading(PyObject *module)
{
    return PyModule_AddFunctions(module, reading_methods);
}
