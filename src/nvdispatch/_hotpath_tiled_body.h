/* The tiled GEMM's packing, micro-kernels and driver for one element type (included by _hotpath_tiled.c twice:
 * T float, S(x) x##_f32; T double, S(x) x##_f64, with the vector macros of that type defined around it).
 *
 * Shapes: op(a) is m x k, op(b) is k x n, c is m x n row-major with ldc elements from a row to the next. op(a)
 * is read in strips of MR rows, each packed as k groups of MR values (zero past the last row); op(b) in panels
 * of NR columns, each packed as k rows of NR values (zero past the last column). A micro-kernel keeps an MR x NR
 * tile of the product in registers over the whole of k, then applies alpha, the bias and RELU to it and stores
 * it: the result is written once and never read. */

/* rows r0 .. r0 + rows - 1 of op(a) into ap: k groups of mr values */
static void
S(pack_a)(const T *a, int ta, Py_ssize_t lda, Py_ssize_t r0, Py_ssize_t rows, Py_ssize_t k, int mr, T *ap)
{
    if (ta) { /* the rows of a strip lie side by side in each column of a */
        for (Py_ssize_t p = 0; p < k; p++) {
            const T *src = a + p * lda + r0;
            T *dst = ap + p * mr;
            for (int r = 0; r < mr; r++)
                dst[r] = r < rows ? src[r] : (T)0;
        }
        return;
    }
    for (Py_ssize_t p0 = 0; p0 < k; p0 += 64) { /* a block of each row at a time: reads stay on few lines */
        Py_ssize_t e = k - p0 < 64 ? k - p0 : 64;
        for (int r = 0; r < mr; r++) {
            T *dst = ap + p0 * mr + r;
            if (r < rows) {
                const T *src = a + (r0 + r) * lda + p0;
                for (Py_ssize_t p = 0; p < e; p++)
                    dst[p * mr] = src[p];
            }
            else {
                for (Py_ssize_t p = 0; p < e; p++)
                    dst[p * mr] = (T)0;
            }
        }
    }
}

/* columns j0 .. j0 + cols - 1 of op(b) into bp: k rows of nr values */
static void
S(pack_b)(const T *b, int tb, Py_ssize_t ldb, Py_ssize_t j0, Py_ssize_t cols, Py_ssize_t k, int nr, T *bp)
{
    if (tb) {
        for (int j = 0; j < nr; j++) {
            if (j < cols) {
                const T *src = b + (j0 + j) * ldb;
                for (Py_ssize_t p = 0; p < k; p++)
                    bp[p * nr + j] = src[p];
            }
            else {
                for (Py_ssize_t p = 0; p < k; p++)
                    bp[p * nr + j] = (T)0;
            }
        }
        return;
    }
    for (Py_ssize_t p = 0; p < k; p++) {
        T *dst = bp + p * nr;
        memcpy(dst, b + p * ldb + j0, (size_t)cols * sizeof(T));
        for (int j = (int)cols; j < nr; j++)
            dst[j] = (T)0;
    }
}

/* the portable kernel: plain C (vectorised by the compiler for the build's baseline, if at all) */
#define PMR 4
#define PNR 8
static void
S(kernel_portable)(Py_ssize_t k, const T *ap, const T *bp, T *c, Py_ssize_t ldc, const T *bias, T alpha, int relu,
                   Py_ssize_t rows, Py_ssize_t cols)
{
    T acc[PMR][PNR];
    memset(acc, 0, sizeof(acc));
    for (Py_ssize_t p = 0; p < k; p++) {
        for (int r = 0; r < PMR; r++) {
            T av = ap[r];
            for (int j = 0; j < PNR; j++)
                acc[r][j] += av * bp[j];
        }
        ap += PMR;
        bp += PNR;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        T *o = c + r * ldc;
        for (Py_ssize_t j = 0; j < cols; j++) {
            T v = acc[r][j] * alpha + (bias != NULL ? bias[j] : (T)0);
            o[j] = relu && v < (T)0 ? (T)0 : v; /* NaN < 0 is false: NaN stays */
        }
    }
}

#if NVD_X86_SIMD
/* AVX-512: a 14 x (2 vectors) tile in 28 zmm accumulators; b's two vectors loaded, a's values broadcast from
 * memory into the FMAs. `two`: 0 where the tile's columns fit one vector (the second is not computed). */
#define XMR 14
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
S(kernel_x_t)(Py_ssize_t k, const T *ap, const T *bp, T *c, Py_ssize_t ldc, const T *bias, T alpha, int relu,
              Py_ssize_t rows, Py_ssize_t cols, const int two)
{
    X_VEC acc0[XMR], acc1[XMR];
    for (int r = 0; r < XMR; r++) {
        acc0[r] = X_ZERO();
        acc1[r] = X_ZERO();
    }
    for (Py_ssize_t p = 0; p < k; p++) {
        X_VEC b0 = X_LOAD(bp);
        X_VEC b1 = two ? X_LOAD(bp + X_LANES) : b0;
        for (int r = 0; r < XMR; r++) {
            X_VEC av = X_SET1(ap[r]);
            acc0[r] = X_FMA(av, b0, acc0[r]);
            if (two)
                acc1[r] = X_FMA(av, b1, acc1[r]);
        }
        ap += XMR;
        bp += 2 * X_LANES;
    }
    X_MASK m0 = X_FIRST(cols), m1 = X_FIRST(cols - X_LANES);
    X_VEC al = X_SET1(alpha), zero = X_ZERO();
    X_VEC bi0 = bias != NULL ? X_MLOADZ(m0, bias) : zero;
    X_VEC bi1 = bias != NULL && two ? X_MLOADZ(m1, bias + X_LANES) : zero;
    for (int r = 0; r < XMR; r++) {
        if (r >= rows)
            break;
        X_VEC v0 = X_FMA(acc0[r], al, bi0);
        if (relu)
            v0 = X_MAX(zero, v0); /* (max returns its second operand where either is NaN: NaN stays) */
        X_MSTORE(c + r * ldc, m0, v0);
        if (two) {
            X_VEC v1 = X_FMA(acc1[r], al, bi1);
            if (relu)
                v1 = X_MAX(zero, v1);
            X_MSTORE(c + r * ldc + X_LANES, m1, v1);
        }
    }
}

__attribute__((target("avx512f"))) static void
S(kernel_x)(Py_ssize_t k, const T *ap, const T *bp, T *c, Py_ssize_t ldc, const T *bias, T alpha, int relu,
            Py_ssize_t rows, Py_ssize_t cols)
{
    if (cols > X_LANES)
        S(kernel_x_t)(k, ap, bp, c, ldc, bias, alpha, relu, rows, cols, 1);
    else
        S(kernel_x_t)(k, ap, bp, c, ldc, bias, alpha, relu, rows, cols, 0);
}

/* AVX2 + FMA: a 6 x (2 vectors) tile in 12 ymm accumulators */
#define YMR 6
__attribute__((target("avx2,fma"))) static void
S(kernel_y)(Py_ssize_t k, const T *ap, const T *bp, T *c, Py_ssize_t ldc, const T *bias, T alpha, int relu,
            Py_ssize_t rows, Py_ssize_t cols)
{
    Y_VEC acc0[YMR], acc1[YMR];
    for (int r = 0; r < YMR; r++) {
        acc0[r] = Y_ZERO();
        acc1[r] = Y_ZERO();
    }
    for (Py_ssize_t p = 0; p < k; p++) {
        Y_VEC b0 = Y_LOAD(bp), b1 = Y_LOAD(bp + Y_LANES);
        for (int r = 0; r < YMR; r++) {
            Y_VEC av = Y_SET1(ap[r]);
            acc0[r] = Y_FMA(av, b0, acc0[r]);
            acc1[r] = Y_FMA(av, b1, acc1[r]);
        }
        ap += YMR;
        bp += 2 * Y_LANES;
    }
    Y_MASK m0 = Y_FIRST(cols), m1 = Y_FIRST(cols - Y_LANES);
    Y_VEC al = Y_SET1(alpha), zero = Y_ZERO();
    Y_VEC bi0 = bias != NULL ? Y_MLOAD(bias, m0) : zero;
    Y_VEC bi1 = bias != NULL ? Y_MLOAD(bias + Y_LANES, m1) : zero;
    for (int r = 0; r < YMR; r++) {
        if (r >= rows)
            break;
        Y_VEC v0 = Y_FMA(acc0[r], al, bi0), v1 = Y_FMA(acc1[r], al, bi1);
        if (relu) {
            v0 = Y_MAX(zero, v0);
            v1 = Y_MAX(zero, v1);
        }
        if (cols >= 2 * Y_LANES) {
            Y_STOREU(c + r * ldc, v0);
            Y_STOREU(c + r * ldc + Y_LANES, v1);
        }
        else {
            Y_MSTORE(c + r * ldc, m0, v0);
            Y_MSTORE(c + r * ldc + Y_LANES, m1, v1);
        }
    }
}
#endif

typedef void (*S(kernel_t))(Py_ssize_t, const T *, const T *, T *, Py_ssize_t, const T *, T, int, Py_ssize_t,
                            Py_ssize_t);

/* the call's work, shared by its threads: units (group of panels, strip of rows), group by group, each taken by
 * whichever thread is free (`next`, atomically): a thread slowed by other load on its core takes fewer. A
 * group's packed b (sized to stay in a core's cache) meets every strip before the next group's turn. */
typedef void (*S(pack_t))(const T *, Py_ssize_t, Py_ssize_t, Py_ssize_t, T *);

typedef struct {
    S(kernel_t) kernel;
    S(pack_t) pack_full; /* the kernel's own packing of a full strip of row-major a, or NULL */
    int mr, nr, ta;
    const T *a;
    Py_ssize_t lda, m, n, k, ldc, lead, strips, panels, group, units;
    const T *bp;
    T *c;
    const T *bias;
    T alpha;
    int relu;
    Py_ssize_t next;
} S(work_t);

typedef struct {
    S(work_t) *work;
    T *ap; /* this thread's packed strip of a */
} S(share_t);

/* panel p's first column: the first panel `lead` columns wide where lead > 0 (so that the others start on a
 * 64-byte line of c), then nr each */
static Py_ssize_t
S(panel_start)(Py_ssize_t p, Py_ssize_t lead, int nr)
{
    return lead == 0 ? p * nr : p == 0 ? 0 : lead + (p - 1) * nr;
}

static void
S(run_share)(S(share_t) *sh)
{
    S(work_t) *w = sh->work;
    for (;;) {
        Py_ssize_t u = NVD_TAKE(&w->next);
        if (u >= w->units)
            return;
        Py_ssize_t g0 = u / w->strips * w->group, s = u % w->strips;
        Py_ssize_t g1 = g0 + w->group < w->panels ? g0 + w->group : w->panels;
        Py_ssize_t r0 = s * w->mr, rows = w->m - r0 < w->mr ? w->m - r0 : w->mr;
        if (w->pack_full != NULL && !w->ta && rows == w->mr)
            w->pack_full(w->a, w->lda, r0, w->k, sh->ap);
        else
            S(pack_a)(w->a, w->ta, w->lda, r0, rows, w->k, w->mr, sh->ap);
        for (Py_ssize_t p = g0; p < g1; p++) {
            Py_ssize_t j0 = S(panel_start)(p, w->lead, w->nr), j1 = S(panel_start)(p + 1, w->lead, w->nr);
            Py_ssize_t cols = (j1 < w->n ? j1 : w->n) - j0;
            w->kernel(w->k, sh->ap, w->bp + p * w->nr * w->k, w->c + r0 * w->ldc + j0, w->ldc,
                      w->bias != NULL ? w->bias + j0 : NULL, w->alpha, w->relu, rows, cols);
        }
    }
}

#if NVD_THREADS
static void *
S(share_thread)(void *arg)
{
    S(run_share)((S(share_t) *)arg);
    return NULL;
}
#endif

/* a share as a BLAS pool runs it (function(args + i * stride), nothing returned) */
static void
S(share_pooled)(void *arg)
{
    S(run_share)((S(share_t) *)arg);
}

/* the shares on threads started here and joined before it returns, the caller running the first */
static void
S(run_own)(S(share_t) *shares, Py_ssize_t t_count)
{
#if NVD_THREADS
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
#if NVD_AFFINITY
    int cpus[MAX_THREADS], n_cpus = t_count > 1 ? nvd_other_cpus(cpus, MAX_THREADS) : 0;
#endif
    for (Py_ssize_t t = 1; t < t_count; t++) {
#if NVD_AFFINITY
        pthread_attr_t attr;
        cpu_set_t on;
        if (n_cpus > 0 && pthread_attr_init(&attr) == 0) {
            CPU_ZERO(&on);
            CPU_SET(cpus[(t - 1) % n_cpus], &on);
            started[t] = pthread_attr_setaffinity_np(&attr, sizeof(on), &on) == 0 &&
                         pthread_create(&tid[t], &attr, S(share_thread), &shares[t]) == 0;
            pthread_attr_destroy(&attr);
        }
#endif
        if (!started[t]) /* (no CPU to hold it to, or that CPU refused: a thread the OS places) */
            started[t] = pthread_create(&tid[t], NULL, S(share_thread), &shares[t]) == 0;
    }
    S(run_share)(&shares[0]);
    for (Py_ssize_t t = 1; t < t_count; t++) /* (a thread that could not start: the others took its units) */
        if (started[t])
            pthread_join(tid[t], NULL);
#else
    S(run_share)(&shares[0]);
#endif
}

/* c = act(alpha op(a) @ op(b) + bias); 0, or -1 where memory ran out (nothing written then) */
static int
S(tiled)(int isa, int ta, int tb, Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, T alpha, const T *a, Py_ssize_t lda,
         const T *b, Py_ssize_t ldb, T *c, Py_ssize_t ldc, const T *bias, int relu, int threads,
         Py_ssize_t block_bytes, const nvd_pool_t *pool)
{
    S(kernel_t) kernel = S(kernel_portable);
    S(pack_t) pack_full = NULL;
    int mr = PMR, nr = PNR;
#if NVD_X86_SIMD
    if (isa == ISA_AVX512) {
        kernel = S(kernel_x), pack_full = X_PACK_A, mr = XMR, nr = 2 * X_LANES;
    }
    else if (isa == ISA_AVX2) {
        kernel = S(kernel_y), pack_full = Y_PACK_A, mr = YMR, nr = 2 * Y_LANES;
    }
#endif
    Py_ssize_t item = (Py_ssize_t)sizeof(T), lead = 0;
    if (isa != ISA_PORTABLE && (uintptr_t)c % (uintptr_t)item == 0 && (ldc * item) % 64 == 0 && n > nr)
        lead = (Py_ssize_t)((64 - (uintptr_t)c % 64) % 64) / item;
    Py_ssize_t panels = lead == 0 ? (n + nr - 1) / nr : 1 + (n - lead + nr - 1) / nr;
    Py_ssize_t strips = (m + mr - 1) / mr;
    /* groups of panels: as few as the cache block allows, of even sizes; more where there are too few strips to
     * keep the threads busy */
    Py_ssize_t most_per_group = block_bytes / (k * nr * item);
    most_per_group = most_per_group < 1 ? 1 : most_per_group;
    Py_ssize_t groups = (panels + most_per_group - 1) / most_per_group;
    Py_ssize_t wanted = (4 * (Py_ssize_t)threads + strips - 1) / strips;
    groups = groups < wanted ? (wanted < panels ? wanted : panels) : groups;
    Py_ssize_t group = (panels + groups - 1) / groups;
    groups = (panels + group - 1) / group;
    /* threads: each with enough work to pay for its start, and at most one per unit */
    double flops = 2.0 * (double)m * (double)n * (double)k;
    double most = flops / MIN_FLOPS_PER_THREAD;
    Py_ssize_t t_count = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    t_count = (double)t_count > most ? (Py_ssize_t)most : t_count;
    t_count = t_count > strips * groups ? strips * groups : t_count;
    t_count = t_count < 1 ? 1 : t_count;

    void *b_raw = NULL, *a_raw[MAX_THREADS] = {NULL};
    T *bp = nvd_aligned((size_t)(panels * nr * k) * sizeof(T), &b_raw);
    int ok = bp != NULL;
    S(work_t) work = {kernel, pack_full, mr, nr, ta, a, lda, m, n, k, ldc, lead, strips, panels, group,
                      strips * groups, bp, c, bias, alpha, relu, 0};
    S(share_t) shares[MAX_THREADS];
    for (Py_ssize_t t = 0; t < t_count && ok; t++) {
        shares[t].work = &work;
        shares[t].ap = nvd_aligned((size_t)(mr * k + 16) * sizeof(T), &a_raw[t]); /* (+16: see pack_full) */
        ok = shares[t].ap != NULL;
    }
    if (!ok) {
        free(b_raw);
        for (Py_ssize_t t = 0; t < t_count; t++)
            free(a_raw[t]);
        return -1;
    }
    for (Py_ssize_t p = 0; p < panels; p++) {
        Py_ssize_t j0 = S(panel_start)(p, lead, nr), j1 = S(panel_start)(p + 1, lead, nr);
        S(pack_b)(b, tb, ldb, j0, (j1 < n ? j1 : n) - j0, k, nr, bp + p * nr * k);
    }
    if (pool != NULL && t_count > 1) {
        /* the BLAS's own workers (see nvd_pool_t): as many as it runs now, the caller among them */
        int size = pool->size();
        size = size > t_count ? (int)t_count : size;
        if (size > 1)
            pool->run(size, (void *)S(share_pooled), shares, (int)sizeof(S(share_t)));
        S(run_share)(&shares[0]); /* (what the pool left, or all of it where the BLAS runs one thread now) */
    }
    else
        S(run_own)(shares, t_count);
    free(b_raw);
    for (Py_ssize_t t = 0; t < t_count; t++)
        free(a_raw[t]);
    return 0;
}

#undef PMR
#undef PNR
#undef XMR
#undef YMR
