/* What the compiled fronts share (_hotpath.c: matmul's, _hotpath_fft.c: the transforms'): the parts they are
 * handed, in the same order at the start of each front's self tuple, and the steps of a cached call they take
 * alike (the memo's handles behind their guards, the call key, the backend part of a form, the release). */
#ifndef NVD_HOTPATH_H
#define NVD_HOTPATH_H

#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* the parts every front reads, by position in its self tuple (a front may read more after these) */
enum {
    P_ROUTE,          /* the Python route: every call the front does not serve */
    P_CLASSES,        /* class -> ClassKeys (a dict) */
    P_BACKENDS,       /* the backend registry: current_state(), global_key */
    P_ACQUIRE,        /* plan_cache.acquire */
    P_ACQUIRE_HANDLE, /* plan_cache.acquire_handle */
    P_LET_GO,         /* plan_cache.let_go */
    P_LOG_LEVELS,     /* the nvdispatch logger's level cache (a dict) */
    P_LOG_HIT,        /* _route.log_hit */
    P_RAISE_IF_OOM,   /* _execute.raise_if_out_of_memory */
    P_CURRENT_STATE,  /* the backend registry's current_state (a ContextVar's get), bound once */
    N_COMMON_PARTS
};

/* the fields of nvdispatch._call_key.ClassKeys (a named tuple) the fronts read, by position */
enum { KEYS_PLAIN, KEYS_SIGNATURE, KEYS_MEMO, KEYS_PRECISION = 6, KEYS_RANK_SIGNATURE = 7, KEYS_PRECISION_OF = 8 };

/* self: a tuple of the attributes `names` (n of them) of parts, read once; dict-checked where they must be */
PyObject *nvd_read_parts(PyObject *parts, const char *const *names, Py_ssize_t n, const char *who);

/* the backend part of a form: new references to the current state's key and the registry's global key */
int nvd_backend_keys(PyObject *self, PyObject **state_key, PyObject **global_key);

/* a repeated call whose guard passes on arrays[0..n): its plan acquired by handle; NULL with no error when none
 * (*tried: the form's handles were all tried), *pinned: whether to let go, *held: where it is, a new reference to
 * the plan-cache entry the plan was pinned by (nvd_let_go unpins it) */
PyObject *nvd_memo_hit(PyObject *self, PyObject *memo, PyObject *form, PyObject *const *arrays, Py_ssize_t n,
                       int *pinned, PyObject **held, int *tried);

/* the plan cached under the call key (form, sig(arrays[0]), ...), acquired; NULL with no error on a miss */
PyObject *nvd_key_hit(PyObject *self, PyObject *sig, PyObject *form, PyObject *const *arrays, Py_ssize_t n);

/* the hit's DEBUG record where the logger wants it (what: the operation's name; key: what found the plan, NULL
 * for the call key); 0, or -1 with an error */
int nvd_log_hit(PyObject *self, PyObject *what, PyObject *plan, PyObject *key);

/* a failed run: an out-of-memory error becomes nvdispatch's OutOfMemoryError, raised from it */
void nvd_reraise(PyObject *self);

/* let go of plan (pinned by entry `held`, or NULL where the call key found it) with the run's error (if any) put
 * aside; result, or NULL when let_go itself failed */
PyObject *nvd_let_go(PyObject *self, PyObject *plan, PyObject *held, PyObject *result);

/* _hotpath_cache.c's steps for the fronts, where the parts are its compiled functions (else the calls, as any
 * callable's): acquire_handle(entry, epoch) telling whether the entry is pinless (the plan then needs no let go;
 * no attribute read again), and let_go by the entry a call pinned (no lookup of the plan's entry); 0 or -1 */
PyObject *nvd_acquire_handle(PyObject *fn, PyObject *entry, PyObject *epoch, int *pinless);
int nvd_let_go_entry(PyObject *fn, PyObject *entry, PyObject *plan);

#endif
