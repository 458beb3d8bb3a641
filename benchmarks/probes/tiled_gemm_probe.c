/* Prototype: a blocked float32 GEMM with the linear-layer epilog applied per register tile (probe only).
 * Built and timed by tiled_gemm_probe.py (see its --help). */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef MR
#define MR 14
#endif
#define NR 32

#define AVX512 __attribute__((target("avx512f,avx512vl,fma")))

/* column panels: the first `lead` columns (0: none) so that the rest start on a 64-byte line of c, then NR each */
static long
panel_start(long p, long lead)
{
    return lead == 0 ? p * NR : p == 0 ? 0 : lead + (p - 1) * NR;
}

/* bp: packed b, panels of NR columns: panel p holds k rows of NR floats (zero past its width) */
static void
pack_b(const float *b, long k, long n, long ldb, long lead, float *bp)
{
    for (long p = 0; panel_start(p, lead) < n; p++) {
        long j0 = panel_start(p, lead), j1 = panel_start(p + 1, lead);
        long w = (j1 < n ? j1 : n) - j0;
        float *dst = bp + p * NR * k;
        for (long p = 0; p < k; p++) {
            const float *src = b + p * ldb + j0;
            for (long j = 0; j < w; j++)
                dst[p * NR + j] = src[j];
            for (long j = w; j < NR; j++)
                dst[p * NR + j] = 0.0f;
        }
    }
}

/* ap: MR rows of a (row-major, lda) as k groups of MR (zero past rows) */
static void
pack_a(const float *a, long rows, long k, long lda, float *ap)
{
    if (rows == MR) {
        for (long p0 = 0; p0 < k; p0 += 16) {
            long e = k - p0 < 16 ? k - p0 : 16;
            for (long r = 0; r < MR; r++) {
                const float *src = a + r * lda + p0;
                for (long p = 0; p < e; p++)
                    ap[(p0 + p) * MR + r] = src[p];
            }
        }
        return;
    }
    for (long p = 0; p < k; p++)
        for (long r = 0; r < MR; r++)
            ap[p * MR + r] = r < rows ? a[r * lda + p] : 0.0f;
}

AVX512 static inline __attribute__((always_inline)) void
kernel_t(long k, const float *ap, const float *bp, float *c, long ldc, const float *bias, float alpha, int relu,
       long rows, long cols, int nt, const int two)
{
    __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        acc0[r] = _mm512_setzero_ps();
        acc1[r] = _mm512_setzero_ps();
    }
    for (long p = 0; p < k; p++) {
        __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            __m512 av = _mm512_set1_ps(ap[r]);
            acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
            if (two)
                acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
        }
        ap += MR;
        bp += NR;
    }
    __m512 al = _mm512_set1_ps(alpha), zero = _mm512_setzero_ps();
    __mmask16 m0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    __mmask16 m1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    __m512 bi0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : zero;
    __m512 bi1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : zero;
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        if (r >= rows)
            break;
        __m512 v0 = _mm512_fmadd_ps(acc0[r], al, bi0), v1 = _mm512_fmadd_ps(acc1[r], al, bi1);
        if (relu) {
            v0 = _mm512_max_ps(zero, v0); /* second operand out when NaN: NaN stays */
            v1 = _mm512_max_ps(zero, v1);
        }
        float *o = c + r * ldc;
        if (nt) {
            _mm512_stream_ps(o, v0);
            _mm512_stream_ps(o + 16, v1);
        }
        else {
            _mm512_mask_storeu_ps(o, m0, v0);
            if (two)
                _mm512_mask_storeu_ps(o + 16, m1, v1);
        }
    }
}

AVX512 static void
kernel(long k, const float *ap, const float *bp, float *c, long ldc, const float *bias, float alpha, int relu,
       long rows, long cols, int nt)
{
    if (cols > 16)
        kernel_t(k, ap, bp, c, ldc, bias, alpha, relu, rows, cols, nt, 1);
    else
        kernel_t(k, ap, bp, c, ldc, bias, alpha, relu, rows, cols, nt, 0);
}

typedef struct {
    const float *a;
    long lda, m0, m1, n, k;
    const float *bp;
    float *c;
    long ldc, lead;
    const float *bias;
    float alpha;
    int relu, nt;
} job_t;

static void *
run_rows(void *arg)
{
    job_t *j = arg;
    float *ap = aligned_alloc(64, (size_t)((j->k * MR * 4 + 63) / 64 * 64));
    int aligned = j->ldc % 16 == 0;
    for (long i = j->m0; i < j->m1; i += MR) {
        long rows = j->m1 - i < MR ? j->m1 - i : MR;
        pack_a(j->a + i * j->lda, rows, j->k, j->lda, ap);
        for (long p = 0; panel_start(p, j->lead) < j->n; p++) {
            long j0 = panel_start(p, j->lead), j1 = panel_start(p + 1, j->lead);
            long cols = (j1 < j->n ? j1 : j->n) - j0;
            kernel(j->k, ap, j->bp + p * NR * j->k, j->c + i * j->ldc + j0, j->ldc, j->bias ? j->bias + j0 : NULL,
                   j->alpha, j->relu, rows, cols,
                   j->nt && aligned && cols == NR && (uintptr_t)(j->c + i * j->ldc + j0) % 64 == 0);
        }
    }
    free(ap);
    return NULL;
}

/* c = act(alpha a @ b + bias); a m x k row-major, b k x n row-major */
int
tiled_sgemm(const float *a, long lda, const float *b, long ldb, float *c, long ldc, long m, long n, long k,
            const float *bias, float alpha, int relu, int threads, int nt)
{
    long lead = 0;
    if (getenv("PROBE_SHIFT") && ((uintptr_t)c % 4 == 0) && ldc % 16 == 0)
        lead = (long)((64 - (uintptr_t)c % 64) % 64 / 4);
    long panels = (n + NR - 1) / NR + 1;
    float *bp = aligned_alloc(64, (size_t)(panels * NR * k * 4 + 64));
    pack_b(b, k, n, ldb, lead, bp);
    if (threads < 1)
        threads = 1;
    if (threads > 64)
        threads = 64;
    job_t jobs[64];
    pthread_t tid[64];
    long strips = (m + MR - 1) / MR;
    for (int t = 0; t < threads; t++) {
        long s0 = strips * t / threads, s1 = strips * (t + 1) / threads;
        jobs[t] = (job_t){a, lda, s0 * MR, s1 * MR < m ? s1 * MR : m, n, k, bp, c, ldc, lead, bias, alpha, relu, nt};
    }
    for (int t = 1; t < threads; t++)
        pthread_create(&tid[t], NULL, run_rows, &jobs[t]);
    run_rows(&jobs[0]);
    for (int t = 1; t < threads; t++)
        pthread_join(tid[t], NULL);
    if (nt)
        _mm_sfence();
    free(bp);
    return 0;
}
