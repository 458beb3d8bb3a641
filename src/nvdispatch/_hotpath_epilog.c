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
    {NULL, NULL, 0, NULL},
};

int
nvd_add_epilog(PyObject *module)
{
    return PyModule_AddFunctions(module, epilog_methods);
}
