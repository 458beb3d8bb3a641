/* The plan cache's per-call steps, compiled (part of nvdispatch._hotpath; _hotpath.c adds these functions).
 *
 * nvdispatch._plan_cache.PlanCache defines acquire, acquire_handle, pin and let_go in Python; where the extension
 * is built, an instance uses these compiled forms instead (make_cache_calls), so a cached call's lookup and
 * release cost no Python frames: the compiled fronts (_hotpath.c) call them on every hit, and so does the
 * Python route. They follow the Python methods step by step on the same objects: the cache's _keys, _lru
 * and _users, and an entry's documented slots (plan, users, retired, released, pinless, epoch); they count their
 * hits in C, which the cache's hits property adds to those of its Python steps. The rare steps stay the Python methods' own: releasing a retired plan when its last user lets go
 * (PlanCache._unpin) and counting a user under the lock (PlanCache._count_user).
 *
 * Every step is a C call holding the GIL: a KeyboardInterrupt cannot land between a pin and its check.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *s_plan, *s_users, *s_retired, *s_released, *s_pinless, *s_epoch, *s_move_to_end,
    *s_unpin, *s_count_user, *s_needs_release, *s_release_if_unused;

/* the cache's parts, the functions' self tuple, in this order: the cache, its _keys, _lru and _users, _lru's
 * move_to_end (bound once), and the count of hits these steps made (a capsule of a long long: read by the
 * cache's hits property through the fifth function make_cache_calls returns) */
enum { C_CACHE, C_KEYS, C_LRU, C_USERS, C_MOVE_TO_END, C_HITS, N_CACHE_PARTS };

static const char *const HITS_NAME = "nvdispatch._hotpath_cache.hits";

/* attribute name of obj as a truth value; -1 with an error set */
static int
flag(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* PlanCache._unpin(entry), the Python method (the release of a retired plan is its); 0, or -1 with an error */
static int
unpin_in_python(PyObject *self, PyObject *entry)
{
    PyObject *r = PyObject_CallMethodObjArgs(PyTuple_GetItem(self, C_CACHE), s_unpin, entry, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* an error after a pin: undo the pin (PlanCache._unpin) and keep the error, unless the undoing fails, whose error
 * then replaces it; always -1 */
static int
unpin_keeping_error(PyObject *self, PyObject *entry)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (unpin_in_python(self, entry) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    PyErr_Restore(type, value, tb);
    return -1;
}

/* entry.users.append(None): a pin (list.append is atomic); 0, or -1 with an error */
static int
append_user(PyObject *entry)
{
    PyObject *users = PyObject_GetAttr(entry, s_users);
    if (users == NULL)
        return -1;
    int r = PyList_Check(users) ? PyList_Append(users, Py_None) : -1;
    if (r < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "a plan-cache entry's users must be a list");
    Py_DECREF(users);
    return r;
}

/* the end of a hit, as the Python methods end theirs: recency refreshed (an entry retired meanwhile is no longer
 * in the LRU: the caller's pin keeps its plan usable), the hit counted; entry.plan as a new reference */
static PyObject *
hit(PyObject *self, PyObject *entry)
{
    PyObject *r = PyObject_CallFunctionObjArgs(PyTuple_GetItem(self, C_MOVE_TO_END), entry, NULL);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return NULL;
        PyErr_Clear();
    }
    Py_XDECREF(r);
    long long *hits = PyCapsule_GetPointer(PyTuple_GetItem(self, C_HITS), HITS_NAME);
    if (hits == NULL)
        return NULL;
    ++*hits; /* under the GIL, as the Python steps' `self._hits += 1` */
    return PyObject_GetAttr(entry, s_plan);
}

/* pin entry unless it is pinless, then check it is still good (retired: no; epoch, where given, unchanged):
 * 1 pinned or pinless and good, 0 not good (unpinned again), -1 with an error */
static int
pin_and_check(PyObject *self, PyObject *entry, PyObject *epoch, int *was_pinless)
{
    int pinless = flag(entry, s_pinless);
    *was_pinless = pinless > 0;
    if (pinless)
        return pinless < 0 ? -1 : 1;
    if (append_user(entry) < 0) /* pin first, then check: eviction sets `retired` first, then reads users */
        return -1;
    int bad = flag(entry, s_retired);
    if (bad == 0 && epoch != NULL) {
        PyObject *now = PyObject_GetAttr(entry, s_epoch);
        bad = now == NULL ? -1 : PyObject_RichCompareBool(now, epoch, Py_NE);
        Py_XDECREF(now);
    }
    if (bad == 0)
        return 1;
    if (bad > 0)
        return unpin_in_python(self, entry) < 0 ? -1 : 0;
    return unpin_keeping_error(self, entry);
}

/* acquire(key): PlanCache.acquire */
static PyObject *
cache_acquire(PyObject *self, PyObject *key)
{
    PyObject *entry = PyDict_GetItemWithError(PyTuple_GetItem(self, C_KEYS), key);
    if (entry == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(entry); /* ours for the call: another thread may drop the key meanwhile */
    int pinless;
    int good = pin_and_check(self, entry, NULL, &pinless);
    PyObject *plan = good > 0 ? hit(self, entry) : NULL;
    Py_DECREF(entry);
    if (good == 0)
        Py_RETURN_NONE;
    return plan;
}

/* PlanCache.acquire_handle's steps: the plan or None (new references; NULL with an error), *pinless: whether
 * the entry is one the cache does not pin (its plan then needs no let go) */
static PyObject *
acquire_by_handle(PyObject *self, PyObject *entry, PyObject *epoch, int *pinless)
{
    *pinless = 0;
    PyObject *now = PyObject_GetAttr(entry, s_epoch);
    int stale = now == NULL ? -1 : PyObject_RichCompareBool(now, epoch, Py_NE);
    Py_XDECREF(now);
    if (stale)
        return stale < 0 ? NULL : Py_NewRef(Py_None);
    int good = pin_and_check(self, entry, epoch, pinless);
    if (good <= 0)
        return good < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *plan = hit(self, entry);
    if (plan == NULL && !*pinless)
        unpin_keeping_error(self, entry);
    return plan;
}

/* acquire_handle(entry, epoch): PlanCache.acquire_handle */
static PyObject *
cache_acquire_handle(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "acquire_handle(entry, epoch) takes 2 arguments, got %zd", nargs);
        return NULL;
    }
    int pinless;
    return acquire_by_handle(self, args[0], args[1], &pinless);
}

/* the entry of plan in the cache's users (borrowed), when it is plan's; NULL with or without an error */
static PyObject *
entry_of(PyObject *self, PyObject *plan)
{
    PyObject *id = PyLong_FromVoidPtr(plan);
    if (id == NULL)
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(PyTuple_GetItem(self, C_USERS), id);
    Py_DECREF(id);
    if (entry == NULL)
        return NULL;
    PyObject *its = PyObject_GetAttr(entry, s_plan);
    if (its == NULL)
        return NULL;
    Py_DECREF(its);
    return its == plan ? entry : NULL;
}

/* let_go's steps on the entry a call pinned: 0, or -1 with an error */
static int
unpin_entry(PyObject *self, PyObject *entry)
{
    Py_INCREF(entry);
    int pinless = flag(entry, s_pinless);
    int done = 0;
    if (pinless == 0) {
        PyObject *users = PyObject_GetAttr(entry, s_users);
        Py_ssize_t n = users == NULL || !PyList_Check(users) ? -1 : PyList_Size(users);
        Py_ssize_t i = n - 1; /* users.remove(None), from the end: a call's pin (holds count by tokens) */
        while (i >= 0 && PyList_GetItem(users, i) != Py_None)
            i--;
        if (n > 0 && i >= 0) {
            done = PyList_SetSlice(users, i, i + 1, NULL); /* nothing runs in between */
            int retired = done < 0 ? -1 : flag(entry, s_retired);
            if (retired > 0) /* the last user of a retired plan releases it: the Python method's step */
{
                PyObject *r = PyObject_CallMethodObjArgs(PyTuple_GetItem(self, C_CACHE), s_release_if_unused,
                                                         entry, NULL);
                done = r == NULL ? -1 : 0;
                Py_XDECREF(r);
            }
            else if (retired < 0)
                done = -1;
        }
        else if (n < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a plan-cache entry's users must be a list");
            done = -1;
        }
        Py_XDECREF(users);
    }
    Py_DECREF(entry);
    return pinless < 0 || done < 0 ? -1 : 0;
}

/* let_go(plan): PlanCache.let_go */
static PyObject *
cache_let_go(PyObject *self, PyObject *plan)
{
    PyObject *entry = entry_of(self, plan);
    if (entry == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    if (unpin_entry(self, entry) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* pin(plan): PlanCache.pin (a user counted under the cache's lock, where the fast step cannot, by the Python
 * method _count_user) */
static PyObject *
cache_pin(PyObject *self, PyObject *plan)
{
    PyObject *needs = PyObject_GetAttr(plan, s_needs_release);
    if (needs == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
    }
    else {
        int skip = needs == Py_False;
        Py_DECREF(needs);
        if (skip)
            Py_RETURN_NONE;
    }
    PyObject *entry = entry_of(self, plan);
    if (entry == NULL && PyErr_Occurred())
        return NULL;
    if (entry != NULL) {
        Py_INCREF(entry);
        PyObject *users = PyObject_GetAttr(entry, s_users);
        int used = users == NULL ? -1 : PyObject_IsTrue(users);
        int released = used <= 0 ? 1 : flag(entry, s_released);
        int r = used > 0 && released == 0 ? PyList_Append(users, Py_None) : 1;
        Py_XDECREF(users);
        Py_DECREF(entry);
        if (used < 0 || released < 0 || r < 0)
            return NULL;
        if (r == 0) /* the caller's own use keeps the entry alive: counted without the lock */
            Py_RETURN_NONE;
    }
    return PyObject_CallMethodObjArgs(PyTuple_GetItem(self, C_CACHE), s_count_user, plan, NULL);
}

/* the self of fn where fn is this file's compiled `which` (a function of make_cache_calls), else NULL */
static PyObject *
compiled_self(PyObject *fn, PyCFunction which)
{
    return PyCFunction_Check(fn) && PyCFunction_GetFunction(fn) == which ? PyCFunction_GetSelf(fn) : NULL;
}

PyObject *
nvd_acquire_handle(PyObject *fn, PyObject *entry, PyObject *epoch, int *pinless)
{
    PyObject *self = compiled_self(fn, (PyCFunction)(void (*)(void))cache_acquire_handle);
    if (self != NULL)
        return acquire_by_handle(self, entry, epoch, pinless);
    PyObject *plan = PyObject_CallFunctionObjArgs(fn, entry, epoch, NULL);
    *pinless = 0;
    if (plan != NULL && plan != Py_None) { /* an acquire_handle of Python's: the entry says */
        PyObject *v = PyObject_GetAttr(entry, s_pinless);
        *pinless = v == Py_True;
        if (v == NULL)
            PyErr_Clear();
        Py_XDECREF(v);
    }
    return plan;
}

int
nvd_let_go_entry(PyObject *fn, PyObject *entry, PyObject *plan)
{
    PyObject *self = compiled_self(fn, cache_let_go);
    if (self != NULL && entry != NULL)
        return unpin_entry(self, entry);
    PyObject *r = PyObject_CallFunctionObjArgs(fn, plan, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static void
free_hits(PyObject *capsule)
{
    PyMem_Free(PyCapsule_GetPointer(capsule, HITS_NAME));
}

/* hits(): the hits these steps counted */
static PyObject *
cache_hits(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    long long *hits = PyCapsule_GetPointer(PyTuple_GetItem(self, C_HITS), HITS_NAME);
    return hits == NULL ? NULL : PyLong_FromLongLong(*hits);
}

static PyMethodDef hits_def = {"hits", cache_hits, METH_NOARGS, "the hits the compiled steps counted"};

static PyMethodDef acquire_def = {"acquire", cache_acquire, METH_O, "PlanCache.acquire, compiled"};
static PyMethodDef acquire_handle_def = {"acquire_handle", (PyCFunction)(void (*)(void))cache_acquire_handle,
                                         METH_FASTCALL, "PlanCache.acquire_handle, compiled"};
static PyMethodDef pin_def = {"pin", cache_pin, METH_O, "PlanCache.pin, compiled"};
static PyMethodDef let_go_def = {"let_go", cache_let_go, METH_O, "PlanCache.let_go, compiled"};

/* make_cache_calls(cache) -> (acquire, acquire_handle, pin, let_go, hits) working on cache's _keys, _lru, _users;
 * hits() is the count of hits they made (the cache's hits property adds those its Python steps made) */
static PyObject *
make_cache_calls(PyObject *module, PyObject *cache)
{
    PyObject *self = PyTuple_New(N_CACHE_PARTS);
    if (self == NULL)
        return NULL;
    Py_INCREF(cache);
    PyTuple_SetItem(self, C_CACHE, cache);
    const char *names[] = {"_keys", "_lru", "_users"};
    for (int i = 0; i < 3; i++) {
        PyObject *part = PyObject_GetAttrString(cache, names[i]);
        if (part == NULL || !PyDict_Check(part)) { /* an OrderedDict is a dict */
            if (part != NULL)
                PyErr_Format(PyExc_TypeError, "make_cache_calls: cache.%s must be a dict", names[i]);
            Py_XDECREF(part);
            Py_DECREF(self);
            return NULL;
        }
        PyTuple_SetItem(self, i + 1, part);
    }
    PyObject *move = PyObject_GetAttr(PyTuple_GetItem(self, C_LRU), s_move_to_end);
    if (move == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    PyTuple_SetItem(self, C_MOVE_TO_END, move);
    long long *hits = PyMem_Calloc(1, sizeof(long long));
    PyObject *counter = hits == NULL ? PyErr_NoMemory() : PyCapsule_New(hits, HITS_NAME, free_hits);
    if (counter == NULL) {
        PyMem_Free(hits);
        Py_DECREF(self);
        return NULL;
    }
    PyTuple_SetItem(self, C_HITS, counter);
    PyObject *calls = PyTuple_New(5);
    PyMethodDef *defs[] = {&acquire_def, &acquire_handle_def, &pin_def, &let_go_def, &hits_def};
    for (int i = 0; calls != NULL && i < 5; i++) {
        PyObject *fn = PyCFunction_NewEx(defs[i], self, NULL);
        if (fn == NULL)
            Py_CLEAR(calls);
        else
            PyTuple_SetItem(calls, i, fn);
    }
    Py_DECREF(self);
    return calls;
}

static PyMethodDef cache_methods[] = {
    {"make_cache_calls", make_cache_calls, METH_O,
     "make_cache_calls(cache) -> (acquire, acquire_handle, pin, let_go, hits): a PlanCache's per-call steps "
     "compiled, and the count of hits they made"},
    {NULL, NULL, 0, NULL},
};

/* add this file's functions to the module */
int
nvd_add_cache(PyObject *module)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_plan, "plan"},         {&s_users, "users"},         {&s_retired, "retired"},
        {&s_released, "released"}, {&s_pinless, "pinless"},     {&s_epoch, "epoch"},
        {&s_move_to_end, "move_to_end"}, {&s_unpin, "_unpin"},
        {&s_count_user, "_count_user"}, {&s_needs_release, "needs_release"},
        {&s_release_if_unused, "_release_if_unused"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL)
            return -1;
    }
    return PyModule_AddFunctions(module, cache_methods);
}
