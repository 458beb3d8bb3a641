/* The CPU linear-layer epilog in one sweep, compiled (part of nvdispatch._hotpath; _hotpath.c adds this function).
 *
 * bias_activation(out, bias, rows, cols, ld, wide, relu): out[i, j] = act(out[i, j] + bias[j]) over a row-major
 * float32 (wide = 0) or float64 (wide = 1) matrix of `rows` x `cols` elements, `ld` elements from one row's start
 * to the next, in place; bias None for no bias, relu 0 for no activation. One read and one write of each element,
 * where NumPy's in-place ufuncs make a pass per step. The GIL is released around the sweep. RELU keeps NaN (as
 * np.maximum and cuBLASLt's RELU do): x < 0 is false for NaN.
 *
 * The addresses are ints the caller took from arrays it owns and keeps alive for the call (the executor's
 * numpy_matmul_engines checks dtype, layout and shapes); nothing here can check them. Plain C, vectorised by the
 * compiler for the build's baseline instruction set and, where the loader can choose at run time, AVX2/AVX-512.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>

/* Where the compiler and the loader can dispatch at run time (GCC/Clang on x86-64 glibc: ifunc; musl has none),
 * each sweep is also built for AVX2 and AVX-512 and the loader picks the widest the processor has: in cache, the
 * baseline build's 4-wide SSE sweep was slower than NumPy's own run-time dispatched in-place ufuncs (figures:
 * benchmarks/README.md, CPU matmul). */
#if defined(__x86_64__) && defined(__ELF__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define NVD_WIDEST __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef NVD_WIDEST
#define NVD_WIDEST
#endif

#define SWEEP(T, NAME)                                                                                             \
    NVD_WIDEST static void NAME(T *out, const T *bias, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t ld, int relu)             \
    {                                                                                                              \
        for (Py_ssize_t i = 0; i < rows; i++) {                                                                    \
            T *restrict o = out + i * ld;                                                                          \
            if (bias != NULL && relu) {                                                                            \
                const T *restrict b = bias;                                                                        \
                for (Py_ssize_t j = 0; j < cols; j++) {                                                            \
                    T v = o[j] + b[j];                                                                             \
                    o[j] = v < (T)0 ? (T)0 : v;                                                                    \
                }                                                                                                  \
            }                                                                                                      \
            else if (bias != NULL) {                                                                               \
                const T *restrict b = bias;                                                                        \
                for (Py_ssize_t j = 0; j < cols; j++)                                                              \
                    o[j] += b[j];                                                                                  \
            }                                                                                                      \
            else if (relu) {                                                                                       \
                for (Py_ssize_t j = 0; j < cols; j++)                                                              \
                    o[j] = o[j] < (T)0 ? (T)0 : o[j];                                                              \
            }                                                                                                      \
        }                                                                                                          \
    }

SWEEP(float, sweep_f32)
SWEEP(double, sweep_f64)

/* The product and the epilog in one call: NumPy's own BLAS (its cblas_?gemm, whose address the caller found in
 * the library NumPy loaded; nothing is linked) writes row panels of the result, each finished by the sweep above
 * at once, while it is still in the cores' caches. A panel of all the rows is the whole product, then the sweep.
 *
 * The result must hold beta * (its prior values) on entry, the caller having chosen beta: beta = 1 into a result
 * that is already zero (a large np.zeros is untouched memory the kernel hands over zeroed, page by page, as the
 * product first writes it) spares the BLAS its own pass that clears the result where beta = 0.
 *
 * kind: 0 float32, 1 float64, 2 complex64, 3 complex128 (complex: bias only, added as pairs of reals).
 * ilp64: the cblas interface takes 64-bit integers (OpenBLAS built with INTERFACE64, as NumPy's wheels).
 * trans_a/trans_b: the operand is stored transposed (an F-contiguous array), lda/ldb its leading dimension. */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*gemm32_t)(int, int, int, int, int, int, const void *, const void *, int, const void *, int,
                         const void *, void *, int);
typedef void (*gemm64_t)(int, int, int, long long, long long, long long, const void *, const void *, long long,
                         const void *, long long, const void *, void *, long long);
typedef void (*sgemm32_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                          float *, int);
typedef void (*sgemm64_t)(int, int, int, long long, long long, long long, float, const float *, long long,
                          const float *, long long, float, float *, long long);
typedef void (*dgemm32_t)(int, int, int, int, int, int, double, const double *, int, const double *, int, double,
                          double *, int);
typedef void (*dgemm64_t)(int, int, int, long long, long long, long long, double, const double *, long long,
                          const double *, long long, double, double *, long long);

static void
gemm_rows(void *gemm, int ilp64, int kind, int ta, int tb, Py_ssize_t rows, Py_ssize_t n, Py_ssize_t k,
          const double *alpha, const char *a, Py_ssize_t lda, const void *b, Py_ssize_t ldb, const double *beta,
          void *out, Py_ssize_t ldo)
{
    int oa = ta ? TRANS : NO_TRANS, ob = tb ? TRANS : NO_TRANS;
    if (kind == 0) {
        float al = (float)alpha[0], be = (float)beta[0];
        if (ilp64)
            ((sgemm64_t)gemm)(ROW_MAJOR, oa, ob, rows, n, k, al, (const float *)a, lda, b, ldb, be, out, ldo);
        else
            ((sgemm32_t)gemm)(ROW_MAJOR, oa, ob, (int)rows, (int)n, (int)k, al, (const float *)a, (int)lda, b,
                              (int)ldb, be, out, (int)ldo);
    }
    else if (kind == 1) {
        if (ilp64)
            ((dgemm64_t)gemm)(ROW_MAJOR, oa, ob, rows, n, k, alpha[0], (const double *)a, lda, b, ldb, beta[0], out,
                              ldo);
        else
            ((dgemm32_t)gemm)(ROW_MAJOR, oa, ob, (int)rows, (int)n, (int)k, alpha[0], (const double *)a, (int)lda,
                              b, (int)ldb, beta[0], out, (int)ldo);
    }
    else {
        float alf[2] = {(float)alpha[0], (float)alpha[1]}, bef[2] = {(float)beta[0], (float)beta[1]};
        const void *al = kind == 2 ? (const void *)alf : (const void *)alpha;
        const void *be = kind == 2 ? (const void *)bef : (const void *)beta;
        if (ilp64)
            ((gemm64_t)gemm)(ROW_MAJOR, oa, ob, rows, n, k, al, a, lda, b, ldb, be, out, ldo);
        else
            ((gemm32_t)gemm)(ROW_MAJOR, oa, ob, (int)rows, (int)n, (int)k, al, a, (int)lda, b, (int)ldb, be, out,
                             (int)ldo);
    }
}

#define GEMM_ARGS 19

static PyObject *
gemm_bias_activation(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != GEMM_ARGS) {
        PyErr_Format(PyExc_TypeError, "gemm_bias_activation takes %d arguments, got %zd", GEMM_ARGS, nargs);
        return NULL;
    }
    void *gemm = PyLong_AsVoidPtr(args[0]);
    int ilp64 = PyObject_IsTrue(args[1]);
    int kind = PyLong_AsLong(args[2]);
    int ta = PyObject_IsTrue(args[3]), tb = PyObject_IsTrue(args[4]);
    Py_ssize_t m = PyLong_AsSsize_t(args[5]), n = PyLong_AsSsize_t(args[6]), k = PyLong_AsSsize_t(args[7]);
    double al[2] = {PyComplex_RealAsDouble(args[8]), PyComplex_ImagAsDouble(args[8])};
    char *a = PyLong_AsVoidPtr(args[9]);
    Py_ssize_t lda = PyLong_AsSsize_t(args[10]);
    void *b = PyLong_AsVoidPtr(args[11]);
    Py_ssize_t ldb = PyLong_AsSsize_t(args[12]);
    double be[2] = {PyComplex_RealAsDouble(args[13]), PyComplex_ImagAsDouble(args[13])};
    char *out = PyLong_AsVoidPtr(args[14]);
    Py_ssize_t ldo = PyLong_AsSsize_t(args[15]);
    void *bias = args[16] == Py_None ? NULL : PyLong_AsVoidPtr(args[16]);
    int relu = PyObject_IsTrue(args[17]);
    Py_ssize_t panel = PyLong_AsSsize_t(args[18]);
    if (PyErr_Occurred())
        return NULL;
    if (gemm == NULL || a == NULL || b == NULL || out == NULL || kind < 0 || kind > 3 || m < 1 || n < 1 || k < 1 ||
        ldo < n || lda < 1 || ldb < 1 || panel < 1 || (relu && kind > 1)) {
        PyErr_SetString(PyExc_ValueError, "gemm_bias_activation: expected addresses, a kind 0..3, m, n, k >= 1, "
                                          "ldo >= n, panel >= 1 (relu: real kinds only)");
        return NULL;
    }
    if (!ilp64 && (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldo > INT_MAX)) {
        PyErr_SetString(PyExc_OverflowError, "gemm_bias_activation: sizes beyond this BLAS's 32-bit integers");
        return NULL;
    }
    Py_ssize_t item = (Py_ssize_t)(kind == 0 ? 4 : kind == 3 ? 16 : 8);
    Py_ssize_t a_row = ta ? item : lda * item; /* bytes from one row of op(a) to the next */
    int sweep = bias != NULL || relu;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r0 = 0; r0 < m; r0 += panel) {
        Py_ssize_t rows = m - r0 < panel ? m - r0 : panel;
        char *o = out + r0 * ldo * item;
        gemm_rows(gemm, ilp64, kind, ta, tb, rows, n, k, al, a + r0 * a_row, lda, b, ldb, be, o, ldo);
        if (!sweep)
            continue;
        if (kind == 0 || kind == 2) /* complex: (re, im) pairs of floats, the bias's pairs alike */
            sweep_f32((float *)o, (const float *)bias, rows, kind == 2 ? 2 * n : n, kind == 2 ? 2 * ldo : ldo,
                      relu);
        else
            sweep_f64((double *)o, (const double *)bias, rows, kind == 3 ? 2 * n : n, kind == 3 ? 2 * ldo : ldo,
                      relu);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

#define N_ARGS 7

static PyObject *
bias_activation(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != N_ARGS) {
        PyErr_Format(PyExc_TypeError, "bias_activation takes %d arguments, got %zd", N_ARGS, nargs);
        return NULL;
    }
    void *out = PyLong_AsVoidPtr(args[0]);
    void *bias = args[1] == Py_None ? NULL : PyLong_AsVoidPtr(args[1]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[2]);
    Py_ssize_t cols = PyLong_AsSsize_t(args[3]);
    Py_ssize_t ld = PyLong_AsSsize_t(args[4]);
    int wide = PyObject_IsTrue(args[5]);
    int relu = PyObject_IsTrue(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (out == NULL || rows < 0 || cols < 0 || ld < cols) {
        PyErr_SetString(PyExc_ValueError, "bias_activation: expected an address, rows >= 0, cols >= 0, ld >= cols");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (wide)
        sweep_f64((double *)out, (const double *)bias, rows, cols, ld, relu);
    else
        sweep_f32((float *)out, (const float *)bias, rows, cols, ld, relu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef epilog_methods[] = {
    {"bias_activation", (PyCFunction)(void (*)(void))bias_activation, METH_FASTCALL,
     "bias_activation(out, bias, rows, cols, ld, wide, relu) -> None: out = act(out + bias) in place, one sweep "
     "(addresses as ints, bias None for none; float64 where wide, else float32; relu: RELU, else none)"},
    {"gemm_bias_activation", (PyCFunction)(void (*)(void))gemm_bias_activation, METH_FASTCALL,
     "gemm_bias_activation(gemm, ilp64, kind, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out, ldo, "
     "bias, relu, panel_rows) -> None: out = act(alpha op(a) @ op(b) + beta out + bias), row-major, by the cblas "
     "gemm at address gemm, panel_rows rows at a time, each panel swept at once (kind 0..3: float32, float64, "
     "complex64, complex128; complex: bias only)"},
    {NULL, NULL, 0, NULL},
};

int
nvd_add_epilog(PyObject *module)
{
    return PyModule_AddFunctions(module, epilog_methods);
}
