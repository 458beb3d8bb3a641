/* The CPU linear layer as one blocked GEMM with the epilog applied per register tile (part of
 * nvdispatch._hotpath; _hotpath.c adds these functions).
 *
 * tiled_gemm(kind, isa, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, out, ldo, bias, relu, threads,
 * block_bytes, pool): out = act(alpha op(a) @ op(b) + bias), row-major out (ldo elements from a row to the
 * next), float32 (kind 0) or float64 (kind 1); op(x) is x stored row-major with leading dimension ldx, or its transpose
 * where trans_x (an F-contiguous array read as it lies); bias None or n values; relu 0 for no activation. b is
 * packed once per call in panels of columns, a in strips of rows; each micro-kernel keeps a tile of the result
 * in registers over the whole of k, then adds alpha, the bias and RELU and stores it, so the result is written
 * once and never read (an engine running the BLAS's product, then a sweep, reads and writes it again).
 *
 * Kernels, picked at run time: AVX-512F (14 rows x 2 zmm vectors), AVX2 + FMA (6 rows x 2 ymm vectors), and a
 * portable C one wherever neither is (another architecture or compiler): the extension builds everywhere; the
 * engine is timed against the others by the calibration, which keeps it only where it is the faster.
 * isa: None for the best this processor runs, or a name of tiled_isas() (the tests run each).
 *
 * Threads: the tiles (a strip of rows by a group of column panels each) are taken one at a time by up to
 * `threads` threads, the GIL released; a thread slowed by other load on its core takes fewer. Where `pool` is
 * given (an OpenBLAS's gotoblas_pthread and its get_num_threads, by address: the BLAS NumPy runs) the threads
 * are that BLAS's own workers, as many as it runs now: a worker still spinning after the BLAS's last call
 * takes a share at once, where a thread of our own would share its core with it, and a limit the caller put on
 * the BLAS's threads (threadpoolctl, OPENBLAS_NUM_THREADS) holds here too. Elsewhere POSIX threads are started
 * for the call and joined before it returns (none is left behind, none waits busily). The
 * addresses are ints the caller took from arrays it owns and keeps alive for the call (numpy_matmul_engines
 * checks dtype, layout and shapes); nothing here can check them. RELU keeps NaN (as np.maximum does).
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NVD_X86_SIMD 1
#include <immintrin.h>
#else
#define NVD_X86_SIMD 0
#endif
#if !defined(_WIN32) && (defined(__GNUC__) || defined(__clang__))
#define NVD_THREADS 1
#include <pthread.h>
/* the next unit of work, taken by one thread of several */
#define NVD_TAKE(p) __atomic_fetch_add((p), 1, __ATOMIC_RELAXED)
#else
#define NVD_THREADS 0
#define NVD_TAKE(p) ((*(p))++)
#endif

/* a BLAS's thread pool: run(n, function, args, stride) calls function(args + i * stride) for i < n, the first on
 * the calling thread, the others on its workers, and returns when all have (OpenBLAS's gotoblas_pthread, its
 * pthread-compatible entry point since GotoBLAS2); size() is how many threads it runs now */
typedef struct {
    int (*run)(int, void *, void *, int);
    int (*size)(void);
} nvd_pool_t;

enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
static const char *const isa_names[] = {"portable", "avx2", "avx512"};
#define MAX_THREADS 256
/* the least work a thread is started for (its start and join cost some tens of microseconds) */
#define MIN_FLOPS_PER_THREAD 4.0e6

#if NVD_THREADS && defined(__linux__) && defined(__GLIBC__)
#define NVD_AFFINITY 1
#include <sched.h>
#else
#define NVD_AFFINITY 0
#endif

/* the CPUs this thread may run on other than the one it runs on, at most `most` of them, into cpus (how many):
 * each thread started for a call is held to one of them, so that the call's threads never crowd onto one core
 * while another is left to a thread merely waiting (such as a BLAS's worker spinning after its last call) */
#if NVD_AFFINITY
static int
nvd_other_cpus(int *cpus, int most)
{
    int n = 0;
    cpu_set_t allowed;
    int here = sched_getcpu();
    if (here < 0 || sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && n < most; cpu++)
        if (cpu != here && CPU_ISSET(cpu, &allowed))
            cpus[n++] = cpu;
    return n;
}
#endif

/* size bytes aligned to 64 (loads of packed panels are aligned); *raw is what to free */
static void *
nvd_aligned(size_t size, void **raw)
{
    *raw = malloc(size + 64);
    if (*raw == NULL)
        return NULL;
    return (void *)(((uintptr_t)*raw + 63) & ~(uintptr_t)63);
}

#if NVD_X86_SIMD
/* A full strip of 14 rows of a row-major float32 a into ap (k groups of 14), 16 columns at a time through a
 * 16 x 16 transpose in zmm registers (rows 14 and 15 zero); each group stored as 16 values, the 2 past the
 * group overwritten by the next (ap holds 16 values past its k groups). The columns past the last 16 one by one. */
__attribute__((target("avx512f"))) static void
pack_a_x_f32(const float *a, Py_ssize_t lda, Py_ssize_t r0, Py_ssize_t k, float *ap)
{
    const float *base = a + r0 * lda;
    Py_ssize_t p0 = 0;
    for (; p0 + 16 <= k; p0 += 16) {
        __m512 r[16], t[16];
        for (int i = 0; i < 14; i++)
            r[i] = _mm512_loadu_ps(base + i * lda + p0);
        r[14] = r[15] = _mm512_setzero_ps();
        for (int i = 0; i < 16; i += 2) { /* pairs of rows interleaved */
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4) { /* fours of rows, by 4-value lanes */
            r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
            r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
            r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
            r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        for (int i = 0; i < 4; i++) { /* eights of rows, by 128-bit lanes */
            t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
            t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
            t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
            t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
        }
        for (int i = 0; i < 8; i++) { /* all 16 rows: columns i and i + 8 of the block */
            r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
            r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        }
        float *dst = ap + p0 * 14; /* r[j]: column p0 + j, in order (each store's 2 extra values overwritten) */
        for (int j = 0; j < 16; j++)
            _mm512_storeu_ps(dst + 14 * j, r[j]);
    }
    for (; p0 < k; p0++)
        for (int i = 0; i < 14; i++)
            ap[p0 * 14 + i] = base[i * lda + p0];
}

/* columns 0..7 of the 8 rows r[0..7] of float64 into col[0..7] (an 8 x 8 transpose in zmm registers) */
__attribute__((target("avx512f"))) static inline void
transpose8_f64(const __m512d *r, __m512d *col)
{
    __m512d t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_pd(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_pd(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm512_shuffle_f64x2(t[i], t[i + 2], 0x88);
        u[i + 1] = _mm512_shuffle_f64x2(t[i], t[i + 2], 0xdd);
        u[i + 2] = _mm512_shuffle_f64x2(t[i + 1], t[i + 3], 0x88);
        u[i + 3] = _mm512_shuffle_f64x2(t[i + 1], t[i + 3], 0xdd);
    }
    /* u[0]: columns 0 and 4 of rows 0-3, u[1]: 2 and 6, u[2]: 1 and 5, u[3]: 3 and 7; u[4..7]: rows 4-7 */
    static const int first[4] = {0, 2, 1, 3};
    for (int i = 0; i < 4; i++) {
        col[first[i]] = _mm512_shuffle_f64x2(u[i], u[i + 4], 0x88);
        col[first[i] + 4] = _mm512_shuffle_f64x2(u[i], u[i + 4], 0xdd);
    }
}

/* pack_a_x_f32 for float64: 8 columns at a time, rows 0-7 and rows 8-13 (14, 15 zero) each through an 8 x 8
 * transpose; a group is stored as 8 + 8 values, the 2 past it overwritten by the next (ap holds 16 values past
 * its k groups). */
__attribute__((target("avx512f"))) static void
pack_a_x_f64(const double *a, Py_ssize_t lda, Py_ssize_t r0, Py_ssize_t k, double *ap)
{
    const double *base = a + r0 * lda;
    Py_ssize_t p0 = 0;
    for (; p0 + 8 <= k; p0 += 8) {
        __m512d r[8], top[8], bottom[8];
        for (int i = 0; i < 8; i++)
            r[i] = _mm512_loadu_pd(base + i * lda + p0);
        transpose8_f64(r, top);
        for (int i = 0; i < 6; i++)
            r[i] = _mm512_loadu_pd(base + (8 + i) * lda + p0);
        r[6] = r[7] = _mm512_setzero_pd();
        transpose8_f64(r, bottom);
        double *dst = ap + p0 * 14;
        for (int j = 0; j < 8; j++) {
            _mm512_storeu_pd(dst + 14 * j, top[j]);
            _mm512_storeu_pd(dst + 14 * j + 8, bottom[j]);
        }
    }
    for (; p0 < k; p0++)
        for (int i = 0; i < 14; i++)
            ap[p0 * 14 + i] = base[i * lda + p0];
}

/* The same for the AVX2 kernel's strips of 6 rows: 8 columns at a time through an 8 x 8 transpose in ymm registers
 * (rows 6 and 7 zero), each group stored as 8 values (ap holds 8 values past its k groups). */
__attribute__((target("avx2"))) static void
pack_a_y_f32(const float *a, Py_ssize_t lda, Py_ssize_t r0, Py_ssize_t k, float *ap)
{
    const float *base = a + r0 * lda;
    Py_ssize_t p0 = 0;
    for (; p0 + 8 <= k; p0 += 8) {
        __m256 r[8], t[8];
        for (int i = 0; i < 6; i++)
            r[i] = _mm256_loadu_ps(base + i * lda + p0);
        r[6] = r[7] = _mm256_setzero_ps();
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 8; i += 4) {
            r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
            r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
            r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
            r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        for (int i = 0; i < 4; i++) { /* t[j]: column p0 + j */
            t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
            t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
        }
        float *dst = ap + p0 * 6;
        for (int j = 0; j < 8; j++)
            _mm256_storeu_ps(dst + 6 * j, t[j]);
    }
    for (; p0 < k; p0++)
        for (int i = 0; i < 6; i++)
            ap[p0 * 6 + i] = base[i * lda + p0];
}
#endif

/* float32 */
#define T float
#define S(x) x##_f32
#if NVD_X86_SIMD
#define X_PACK_A pack_a_x_f32
#define Y_PACK_A pack_a_y_f32
#define X_VEC __m512
#define X_LANES 16
#define X_MASK __mmask16
#define X_ZERO _mm512_setzero_ps
#define X_LOAD _mm512_load_ps
#define X_SET1 _mm512_set1_ps
#define X_FMA _mm512_fmadd_ps
#define X_MAX _mm512_max_ps
#define X_FIRST(n) ((X_MASK)((n) >= 16 ? 0xFFFFu : (n) <= 0 ? 0u : (1u << (n)) - 1u))
#define X_MLOADZ(m, p) _mm512_maskz_loadu_ps((m), (p))
#define X_MSTORE(p, m, v) _mm512_mask_storeu_ps((p), (m), (v))
#define Y_VEC __m256
#define Y_LANES 8
#define Y_MASK __m256i
#define Y_ZERO _mm256_setzero_ps
#define Y_LOAD _mm256_load_ps
#define Y_SET1 _mm256_set1_ps
#define Y_FMA _mm256_fmadd_ps
#define Y_MAX _mm256_max_ps
#define Y_FIRST(n) _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define Y_MLOAD(p, m) _mm256_maskload_ps((p), (m))
#define Y_MSTORE(p, m, v) _mm256_maskstore_ps((p), (m), (v))
#define Y_STOREU _mm256_storeu_ps
#endif
#include "_hotpath_tiled_body.h"
#undef T
#undef S
#if NVD_X86_SIMD
#undef X_PACK_A
#undef Y_PACK_A
#undef X_VEC
#undef X_LANES
#undef X_MASK
#undef X_ZERO
#undef X_LOAD
#undef X_SET1
#undef X_FMA
#undef X_MAX
#undef X_FIRST
#undef X_MLOADZ
#undef X_MSTORE
#undef Y_VEC
#undef Y_LANES
#undef Y_MASK
#undef Y_ZERO
#undef Y_LOAD
#undef Y_SET1
#undef Y_FMA
#undef Y_MAX
#undef Y_FIRST
#undef Y_MLOAD
#undef Y_MSTORE
#undef Y_STOREU
#endif

/* float64 */
#define T double
#define S(x) x##_f64
#if NVD_X86_SIMD
#define X_PACK_A pack_a_x_f64
#define Y_PACK_A NULL
#define X_VEC __m512d
#define X_LANES 8
#define X_MASK __mmask8
#define X_ZERO _mm512_setzero_pd
#define X_LOAD _mm512_load_pd
#define X_SET1 _mm512_set1_pd
#define X_FMA _mm512_fmadd_pd
#define X_MAX _mm512_max_pd
#define X_FIRST(n) ((X_MASK)((n) >= 8 ? 0xFFu : (n) <= 0 ? 0u : (1u << (n)) - 1u))
#define X_MLOADZ(m, p) _mm512_maskz_loadu_pd((m), (p))
#define X_MSTORE(p, m, v) _mm512_mask_storeu_pd((p), (m), (v))
#define Y_VEC __m256d
#define Y_LANES 4
#define Y_MASK __m256i
#define Y_ZERO _mm256_setzero_pd
#define Y_LOAD _mm256_load_pd
#define Y_SET1 _mm256_set1_pd
#define Y_FMA _mm256_fmadd_pd
#define Y_MAX _mm256_max_pd
#define Y_FIRST(n) _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)(n)), _mm256_setr_epi64x(0, 1, 2, 3))
#define Y_MLOAD(p, m) _mm256_maskload_pd((p), (m))
#define Y_MSTORE(p, m, v) _mm256_maskstore_pd((p), (m), (v))
#define Y_STOREU _mm256_storeu_pd
#endif
#include "_hotpath_tiled_body.h"
#undef T
#undef S

/* whether this processor (and its OS) runs each kernel */
static int
isa_supported(int isa)
{
    if (isa == ISA_PORTABLE)
        return 1;
#if NVD_X86_SIMD
    __builtin_cpu_init();
    if (isa == ISA_AVX512)
        return __builtin_cpu_supports("avx512f");
    if (isa == ISA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return 0;
}

static PyObject *
tiled_isas(PyObject *module, PyObject *unused)
{
    PyObject *names = PyList_New(0);
    for (int isa = ISA_AVX512; names != NULL && isa >= ISA_PORTABLE; isa--) {
        if (!isa_supported(isa))
            continue;
        PyObject *name = PyUnicode_FromString(isa_names[isa]);
        if (name == NULL || PyList_Append(names, name) < 0)
            Py_CLEAR(names);
        Py_XDECREF(name);
    }
    if (names == NULL)
        return NULL;
    PyObject *result = PyList_AsTuple(names);
    Py_DECREF(names);
    return result;
}

#define TILED_ARGS 19

static PyObject *
tiled_gemm(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != TILED_ARGS) {
        PyErr_Format(PyExc_TypeError, "tiled_gemm takes %d arguments, got %zd", TILED_ARGS, nargs);
        return NULL;
    }
    int isa = -1;
    if (args[1] == Py_None) {
        for (isa = ISA_AVX512; !isa_supported(isa); isa--)
            ;
    }
    else {
        for (int i = ISA_PORTABLE; i <= ISA_AVX512; i++)
            if (PyUnicode_Check(args[1]) && PyUnicode_CompareWithASCIIString(args[1], isa_names[i]) == 0)
                isa = i;
        if (isa < 0 || !isa_supported(isa)) {
            PyErr_Format(PyExc_ValueError, "tiled_gemm: isa must be None or one of tiled_isas(), got %R", args[1]);
            return NULL;
        }
    }
    int kind = PyLong_AsLong(args[0]);
    int ta = PyObject_IsTrue(args[2]), tb = PyObject_IsTrue(args[3]);
    Py_ssize_t m = PyLong_AsSsize_t(args[4]), n = PyLong_AsSsize_t(args[5]), k = PyLong_AsSsize_t(args[6]);
    double alpha = PyFloat_AsDouble(args[7]);
    void *a = PyLong_AsVoidPtr(args[8]);
    Py_ssize_t lda = PyLong_AsSsize_t(args[9]);
    void *b = PyLong_AsVoidPtr(args[10]);
    Py_ssize_t ldb = PyLong_AsSsize_t(args[11]);
    void *out = PyLong_AsVoidPtr(args[12]);
    Py_ssize_t ldo = PyLong_AsSsize_t(args[13]);
    void *bias = args[14] == Py_None ? NULL : PyLong_AsVoidPtr(args[14]);
    int relu = PyObject_IsTrue(args[15]);
    long threads = PyLong_AsLong(args[16]);
    Py_ssize_t block_bytes = PyLong_AsSsize_t(args[17]);
    nvd_pool_t pool = {NULL, NULL};
    if (args[18] != Py_None) {
        if (!PyTuple_Check(args[18]) || PyTuple_Size(args[18]) != 2) {
            PyErr_Format(PyExc_TypeError, "tiled_gemm: pool must be None or (run address, size address), got %R",
                         args[18]);
            return NULL;
        }
        pool.run = (int (*)(int, void *, void *, int))PyLong_AsVoidPtr(PyTuple_GetItem(args[18], 0));
        pool.size = (int (*)(void))PyLong_AsVoidPtr(PyTuple_GetItem(args[18], 1));
    }
    if (PyErr_Occurred())
        return NULL;
    if (args[18] != Py_None && (pool.run == NULL || pool.size == NULL)) {
        PyErr_SetString(PyExc_ValueError, "tiled_gemm: pool's addresses must not be 0");
        return NULL;
    }
    const nvd_pool_t *pooled = pool.run != NULL ? &pool : NULL;
    if (a == NULL || b == NULL || out == NULL || (kind != 0 && kind != 1) || m < 1 || n < 1 || k < 1 ||
        ldo < n || lda < (ta ? m : k) || ldb < (tb ? k : n) || threads < 1 || block_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "tiled_gemm: expected addresses, kind 0 or 1, m, n, k >= 1, ldo >= n, "
                                          "lda and ldb at least a row of their operand, threads >= 1, "
                                          "block_bytes >= 0");
        return NULL;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    if (kind == 0)
        failed = tiled_f32(isa, ta, tb, m, n, k, (float)alpha, a, lda, b, ldb, out, ldo, bias, relu, (int)threads,
                           block_bytes, pooled);
    else
        failed = tiled_f64(isa, ta, tb, m, n, k, alpha, a, lda, b, ldb, out, ldo, bias, relu, (int)threads,
                           block_bytes, pooled);
    Py_END_ALLOW_THREADS
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef tiled_methods[] = {
    {"tiled_gemm", (PyCFunction)(void (*)(void))tiled_gemm, METH_FASTCALL,
     "tiled_gemm(kind, isa, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, out, ldo, bias, relu, threads, "
     "block_bytes, pool) -> None: out = act(alpha op(a) @ op(b) + bias) by a blocked GEMM applying the epilog per "
     "register tile (kind 0 float32, 1 float64; isa None for the best, or a name of tiled_isas(); addresses as "
     "ints, bias None for none; up to `threads` threads; block_bytes: packed b kept per core's cache; pool None "
     "for threads of its own, or (run, size) addresses of a BLAS's thread pool)"},
    {"tiled_isas", tiled_isas, METH_NOARGS,
     "tiled_isas() -> tuple[str, ...]: the tiled GEMM's kernels this processor runs, the fastest first"},
    {NULL, NULL, 0, NULL},
};

int
nvd_add_tiled(PyObject *module)
{
    return PyModule_AddFunctions(module, tiled_methods);
}
