/* The one cuBLASLt launch of the compiled paths (part of nvdispatch._hotpath): the descriptor's pointer
 * attributes set where they changed since the last launch, then cublasLtMatmul, both under the launch's lock so
 * that threads sharing a descriptor never launch with each other's pointers. Used by a plan's direct call
 * (_hotpath_lt.c) and by the XLA FFI handler (_hotpath_ffi.c). It never touches Python objects: callers run it
 * without the GIL. */
#ifndef NVD_HOTPATH_LT_H
#define NVD_HOTPATH_LT_H

#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stddef.h>

typedef int (*lt_matmul_fn)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *,
                            void *, void *, void *, size_t, void *);
typedef int (*lt_set_attribute_fn)(void *, int, const void *, size_t);

#define NVD_LT_MAX_POINTERS 2 /* pointer attributes a launch sets: the bias and the epilogue's aux */

/* a pointer attribute of the descriptor (cublasLtMatmulDescAttributes_t) and its value */
typedef struct {
    int attr;
    void *value;
} NvdLtPointer;

typedef struct {
    lt_matmul_fn matmul;
    lt_set_attribute_fn set_attribute;
    void *handle, *desc, *a_layout, *b_layout, *c_layout, *d_layout;
    int a_first;              /* 1: cuBLASLt's A is our a (column orientation); 0: it is b (row orientation) */
    PyThread_type_lock lock;  /* held from setting the pointers to the launch's return */
    NvdLtPointer held[NVD_LT_MAX_POINTERS]; /* what the descriptor holds (attr 0: a free slot) */
} NvdLtLaunch;

/* the lock; 0, or -1 when it cannot be allocated */
int nvd_lt_launch_init(NvdLtLaunch *l);
void nvd_lt_launch_free(NvdLtLaunch *l);

/* Queue D = alpha op(A) op(B) + beta C with algorithm `algo` (a cublasLtMatmulAlgo_t) on `stream`: ptr_a/ptr_b
 * are our a and b (cuBLASLt's order follows a_first). Returns cuBLASLt's status; *failed_pointer is 1 when the
 * status is that of setting a pointer attribute (nothing launched), else 0. */
int nvd_lt_launch(NvdLtLaunch *l, const void *algo, const void *alpha, const void *beta, void *ptr_a, void *ptr_b,
                  void *ptr_c, void *ptr_d, const NvdLtPointer *pointers, int n_pointers, void *workspace,
                  size_t workspace_size, void *stream, int *failed_pointer);

#endif
