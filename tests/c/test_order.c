/* test_order.c -- the epoch order (seeded bijective permutation) and the rank
 * partition, tested directly on src/order.h: bijection for many sizes and
 * seeds, shuffle quality, determinism, and torch DistributedSampler-style
 * partitioning with drop_last and pad-by-wrapping. */
#include "order.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const uint64_t k_seeds[] = {0, 1, 2, 42, 0xdeadbeefULL, UINT64_MAX};
#define NSEEDS (sizeof k_seeds / sizeof k_seeds[0])

/* Checks that positions [0, n) map onto [0, n) exactly once. */
static int is_bijection(const stk__order *o, uint64_t n)
{
    size_t words = (size_t)((n + 63) / 64);
    uint64_t *seen = calloc(words ? words : 1, sizeof *seen);
    REQUIRE(seen);
    int ok = 1;
    for (uint64_t k = 0; k < n && ok; k++) {
        uint64_t v = stk__order_at(o, k);
        if (v >= n || (seen[v / 64] >> (v % 64) & 1))
            ok = 0;
        else
            seen[v / 64] |= 1ULL << (v % 64);
    }
    free(seen);
    return ok;
}

static void test_bijection_many_sizes(void)
{
    static const uint64_t sizes[] = {1,    2,    3,    4,    5,     7,     8,     9,    15,   16,
                                     17,   31,   32,   33,   63,    64,    65,    100,  127,  128,
                                     129,  255,  256,  257,  997,   1000,  1021,  1023, 1024, 1025,
                                     4093, 4095, 4096, 4097, 10007, 65535, 65536, 65537};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t s = 0; s < NSEEDS; s++)
            for (uint64_t e = 0; e < 3; e++) {
                stk__order o;
                stk__order_init(&o, sizes[i], k_seeds[s], e * 7, true);
                int ok = is_bijection(&o, sizes[i]);
                if (!ok)
                    fprintf(stderr, "not a bijection: n=%llu seed=%llu epoch=%llu\n",
                            (unsigned long long)sizes[i], (unsigned long long)k_seeds[s],
                            (unsigned long long)e * 7);
                CHECK(ok);
            }
}

static void test_bijection_large(void)
{
    /* About a million, prime (so the cycle walk is exercised) and 2^20 + 1
     * (the worst case: the domain is almost twice n). */
    static const uint64_t sizes[] = {1000003, (1u << 20) + 1};
    for (size_t i = 0; i < 2; i++) {
        stk__order o;
        stk__order_init(&o, sizes[i], 12345, 3, true);
        CHECK(is_bijection(&o, sizes[i]));
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Huge n: a sample of positions must land in range and never collide. */
static void test_huge_sampled(void)
{
    static const uint64_t sizes[] = {(1ULL << 32) + 15, (1ULL << 40) - 1, (1ULL << 62) + 3,
                                     (1ULL << 63) + 12345};
    enum { M = 100000 };
    uint64_t *v = malloc(M * sizeof *v);
    REQUIRE(v);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        stk__order o;
        stk__order_init(&o, sizes[i], 7, 1, true);
        uint64_t stride = sizes[i] / M;
        int in_range = 1;
        for (uint64_t k = 0; k < M; k++) {
            /* A contiguous run and a strided spread of positions. */
            uint64_t pos = k < M / 2 ? k : sizes[i] - 1 - (k - M / 2) * stride;
            v[k] = stk__order_at(&o, pos);
            if (v[k] >= sizes[i])
                in_range = 0;
        }
        CHECK(in_range);
        qsort(v, M, sizeof *v, cmp_u64);
        int dup = 0;
        for (uint64_t k = 1; k < M; k++)
            dup += v[k] == v[k - 1];
        CHECK_EQ(dup, 0);
        /* Values spread over the whole range, not clustered near the start. */
        CHECK(v[M - 1] > sizes[i] / 2);
        CHECK(v[0] < sizes[i] / 2);
    }
    free(v);
}

static void test_no_shuffle_is_identity(void)
{
    static const uint64_t sizes[] = {1, 2, 10, 1000, 1ULL << 40};
    for (size_t i = 0; i < 5; i++) {
        stk__order o;
        stk__order_init(&o, sizes[i], 99, 5, false);
        for (uint64_t k = 0; k < 1000 && k < sizes[i]; k++)
            CHECK_EQ(stk__order_at(&o, k), k);
        CHECK_EQ(stk__order_at(&o, sizes[i] - 1), sizes[i] - 1);
    }
}

/* The same (seed, epoch) gives the same order; another seed or epoch
 * another one. */
static void test_seed_epoch_change_order(void)
{
    enum { N = 1000 };
    stk__order a, b;
    for (size_t s = 0; s < NSEEDS; s++) {
        stk__order_init(&a, N, k_seeds[s], 0, true);
        stk__order_init(&b, N, k_seeds[s], 0, true);
        int same = 1;
        for (uint64_t k = 0; k < N; k++)
            same &= stk__order_at(&a, k) == stk__order_at(&b, k);
        CHECK(same);
        /* Other epochs and seeds: orders differ in most positions. */
        for (uint64_t e = 1; e < 4; e++) {
            stk__order_init(&b, N, k_seeds[s], e, true);
            int equal = 0;
            for (uint64_t k = 0; k < N; k++)
                equal += stk__order_at(&a, k) == stk__order_at(&b, k);
            CHECK(equal < 20); /* about 1 expected by chance */
        }
        stk__order_init(&b, N, k_seeds[s] + 1, 0, true);
        int equal = 0;
        for (uint64_t k = 0; k < N; k++)
            equal += stk__order_at(&a, k) == stk__order_at(&b, k);
        CHECK(equal < 20);
    }
    /* Not the identity, and moves almost everything. */
    stk__order_init(&a, N, 0, 0, true);
    int fixed = 0;
    for (uint64_t k = 0; k < N; k++)
        fixed += stk__order_at(&a, k) == k;
    CHECK(fixed < 20);
}

static double pearson(const double *x, const double *y, size_t n)
{
    double mx = 0, my = 0;
    for (size_t i = 0; i < n; i++)
        mx += x[i], my += y[i];
    mx /= (double)n, my /= (double)n;
    double sxy = 0, sxx = 0, syy = 0;
    for (size_t i = 0; i < n; i++) {
        sxy += (x[i] - mx) * (y[i] - my);
        sxx += (x[i] - mx) * (x[i] - mx);
        syy += (y[i] - my) * (y[i] - my);
    }
    return sxy / sqrt(sxx * syy);
}

/* Neighbours in the order are uncorrelated, and so are position and value.
 * Each correlation of n = 1000 pairs has a standard deviation of about
 * 1/sqrt(1000) = 0.032; the bound of 0.15 is almost five of them, and the
 * mean over 64 seeds (sd 0.004) must be within 0.02 of zero. */
static void test_shuffle_correlation(void)
{
    enum { N = 1000, SEEDS = 64 };
    static double x[N], y[N], pos[N];
    double sum_nb = 0, sum_pv = 0, worst = 0;
    for (uint64_t seed = 0; seed < SEEDS; seed++) {
        stk__order o;
        stk__order_init(&o, N, seed, seed % 3, true);
        for (uint64_t k = 0; k < N; k++)
            pos[k] = (double)stk__order_at(&o, k);
        for (uint64_t k = 0; k + 1 < N; k++) {
            x[k] = pos[k];
            y[k] = pos[k + 1];
        }
        double r = pearson(x, y, N - 1);
        for (uint64_t k = 0; k < N; k++)
            x[k] = (double)k;
        double rv = pearson(x, pos, N);
        sum_nb += r;
        sum_pv += rv;
        if (fabs(r) > worst)
            worst = fabs(r);
        if (fabs(rv) > worst)
            worst = fabs(rv);
    }
    printf("    neighbour corr mean %.4f, position/value corr mean %.4f, worst |r| %.4f\n",
           sum_nb / SEEDS, sum_pv / SEEDS, worst);
    CHECK(worst < 0.15);
    CHECK(fabs(sum_nb / SEEDS) < 0.02);
    CHECK(fabs(sum_pv / SEEDS) < 0.02);
}

/* Upper quantile of chi-square with df degrees of freedom at p ~ 1e-7
 * (Wilson-Hilferty, z = 5.2; conservative for tiny df). The seeds are fixed,
 * so these tests are deterministic; the bound only has to be loose enough
 * that a uniform shuffle passes and a biased one does not. */
static double chi2_limit(double df)
{
    double a = 2.0 / (9.0 * df);
    double t = 1.0 - a + 5.2 * sqrt(a);
    return df * t * t * t;
}

/* Over many seeds, each value lands at each position equally often (chi-square
 * on the n x n table), for small n where it matters most. */
static void test_shuffle_uniform_positions(void)
{
    static const uint64_t sizes[] = {2, 3, 4, 5, 6, 7, 8, 10, 13, 40};
    /* (A 6-round Feistel on a 3-bit domain, used for n = 5..8, is far from
     * uniform; so, less so, are the 4- and 5-bit domains.) */
    enum { SEEDS = 20000 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t n = sizes[i];
        static double count[64][64];
        memset(count, 0, sizeof count);
        for (uint64_t seed = 0; seed < SEEDS; seed++) {
            stk__order o;
            stk__order_init(&o, n, seed * 0x9e3779b97f4a7c15ULL, 0, true);
            for (uint64_t k = 0; k < n; k++)
                count[k][stk__order_at(&o, k)] += 1;
        }
        double expect = (double)SEEDS / (double)n, chi = 0;
        for (uint64_t k = 0; k < n; k++)
            for (uint64_t v = 0; v < n; v++)
                chi += (count[k][v] - expect) * (count[k][v] - expect) / expect;
        /* Rows and columns of the table are constrained (each seed is a
         * permutation): the statistic times (n-1)/n is close to chi-square
         * with (n-1)^2 degrees of freedom (mean n(n-1), checked by
         * simulation against a true Fisher-Yates shuffle). */
        double df = (double)((n - 1) * (n - 1));
        chi *= (double)(n - 1) / (double)n;
        double limit = chi2_limit(df);
        printf("    n=%-3llu chi2 %.1f (df %.0f, limit %.1f)\n", (unsigned long long)n, chi, df,
               limit);
        CHECK(chi < limit);
    }
}

/* Pairs: the first two items of the order form each ordered pair (a, b),
 * a != b, equally often over seeds; a cipher too weak for its domain fails
 * this while it may still pass the one-position test (n = 8 does). */
static void test_shuffle_uniform_pairs(void)
{
    static const uint64_t sizes[] = {2, 3, 5, 8, 10, 12, 40};
    enum { SEEDS = 60000 };
    static double count[40][40];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t n = sizes[i];
        memset(count, 0, sizeof count);
        for (uint64_t seed = 0; seed < SEEDS; seed++) {
            stk__order o;
            stk__order_init(&o, n, seed, 1, true);
            count[stk__order_at(&o, 0)][stk__order_at(&o, 1)] += 1;
        }
        double cells = (double)(n * (n - 1)), expect = SEEDS / cells, chi = 0;
        for (uint64_t a = 0; a < n; a++)
            for (uint64_t b = 0; b < n; b++) {
                if (a == b) {
                    CHECK_EQ(count[a][b], 0);
                    continue;
                }
                chi += (count[a][b] - expect) * (count[a][b] - expect) / expect;
            }
        double df = cells - 1, limit = chi2_limit(df);
        printf("    n=%-3llu pairs chi2 %.1f (df %.0f, limit %.1f)\n", (unsigned long long)n, chi,
               df, limit);
        CHECK(chi < limit);
    }
}

/* ---- partition ----------------------------------------------------------- */

/* Reference: torch.utils.data.DistributedSampler's positions for `rank`,
 * followed by DataLoader batching (drop_last drops the partial batch). */
static uint64_t ref_positions(uint64_t n, unsigned rank, unsigned world, uint64_t bs, int drop_last,
                              uint64_t *out)
{
    uint64_t total = drop_last ? n / world * world : (n + world - 1) / world * world;
    uint64_t k = 0;
    for (uint64_t j = rank; j < total; j += world)
        out[k++] = j % n; /* padding repeats the order from its start */
    if (drop_last)
        k = k / bs * bs;
    return k;
}

static void test_partition_matches_reference(void)
{
    uint64_t ref[200];
    for (uint64_t n = 1; n <= 40; n++)
        for (unsigned world = 1; world <= 6; world++)
            for (uint64_t bs = 1; bs <= 7; bs++)
                for (int dl = 0; dl <= 1; dl++) {
                    uint64_t batches0 = 0;
                    int empty0 = -1;
                    unsigned *cover = calloc(n, sizeof *cover);
                    for (unsigned rank = 0; rank < world; rank++) {
                        stk__partition p;
                        int rc = stk__partition_init(&p, n, rank, world, bs, dl != 0);
                        uint64_t k = ref_positions(n, rank, world, bs, dl, ref);
                        if (k == 0) {
                            CHECK_EQ(rc, STK_EEMPTY);
                            if (empty0 < 0)
                                empty0 = 1;
                            continue;
                        }
                        CHECK_EQ(rc, STK_OK);
                        CHECK(empty0 != 1);
                        empty0 = 0;
                        CHECK_EQ(p.per_rank, k);
                        /* Every rank has the same number of batches. */
                        if (rank == 0)
                            batches0 = p.batches;
                        CHECK_EQ(p.batches, batches0);
                        CHECK_EQ(p.batches, dl ? k / bs : (k + bs - 1) / bs);
                        uint64_t sum = 0;
                        for (uint64_t b = 0; b < p.batches; b++) {
                            uint64_t len = stk__partition_batch_len(&p, b);
                            CHECK(len >= 1 && len <= bs);
                            if (dl || b + 1 < p.batches)
                                CHECK_EQ(len, bs);
                            sum += len;
                        }
                        CHECK_EQ(sum, k);
                        int same = 1;
                        for (uint64_t j = 0; j < k; j++) {
                            uint64_t pos = stk__partition_pos(&p, j);
                            same &= pos == ref[j];
                            if (pos < n)
                                cover[pos]++;
                        }
                        if (!same)
                            fprintf(stderr,
                                    "partition differs: n=%llu world=%u rank=%u bs=%llu dl=%d\n",
                                    (unsigned long long)n, world, rank, (unsigned long long)bs, dl);
                        CHECK(same);
                    }
                    if (empty0 == 0) {
                        /* Coverage: drop_last -> each at most once; otherwise each at
                         * least once, and exactly once when world divides n. */
                        for (uint64_t i = 0; i < n; i++) {
                            if (dl)
                                CHECK(cover[i] <= 1);
                            else if (n % world == 0)
                                CHECK_EQ(cover[i], 1);
                            else
                                CHECK(cover[i] >= 1);
                        }
                    }
                    free(cover);
                }
}

/* Padding by wrapping: the extra samples are the first ones of the order. */
static void test_partition_padding(void)
{
    stk__partition p;
    /* n = 10, world 4: ceil = 3 each, 12 positions, positions 0 and 1 twice. */
    unsigned cover[10] = {0};
    for (unsigned r = 0; r < 4; r++) {
        CHECK_EQ(stk__partition_init(&p, 10, r, 4, 2, false), STK_OK);
        CHECK_EQ(p.per_rank, 3);
        CHECK_EQ(p.batches, 2);
        CHECK_EQ(stk__partition_batch_len(&p, 1), 1);
        for (uint64_t k = 0; k < p.per_rank; k++)
            cover[stk__partition_pos(&p, k)]++;
    }
    for (int i = 0; i < 10; i++)
        CHECK_EQ(cover[i], i < 2 ? 2 : 1);
    /* drop_last: floor = 2 each, whole batches of 2, positions 8, 9 unused. */
    memset(cover, 0, sizeof cover);
    for (unsigned r = 0; r < 4; r++) {
        CHECK_EQ(stk__partition_init(&p, 10, r, 4, 2, true), STK_OK);
        CHECK_EQ(p.per_rank, 2);
        CHECK_EQ(p.batches, 1);
        for (uint64_t k = 0; k < p.per_rank; k++)
            cover[stk__partition_pos(&p, k)]++;
    }
    for (int i = 0; i < 10; i++)
        CHECK_EQ(cover[i], i < 8 ? 1 : 0);
    /* More ranks than samples: every rank still gets one. */
    CHECK_EQ(stk__partition_init(&p, 2, 4, 5, 3, false), STK_OK);
    CHECK_EQ(p.per_rank, 1);
    CHECK_EQ(stk__partition_pos(&p, 0), 0);
    CHECK_EQ(stk__partition_init(&p, 2, 4, 5, 3, true), STK_EEMPTY);
    /* drop_last with a batch larger than the share. */
    CHECK_EQ(stk__partition_init(&p, 5, 0, 1, 8, true), STK_EEMPTY);
    CHECK_EQ(stk__partition_init(&p, 5, 0, 1, 8, false), STK_OK);
    CHECK_EQ(p.batches, 1);
    CHECK_EQ(stk__partition_batch_len(&p, 0), 5);
}

int main(void)
{
    tu_begin("test_order", 120);
    RUN(test_bijection_many_sizes);
    RUN(test_bijection_large);
    RUN(test_huge_sampled);
    RUN(test_no_shuffle_is_identity);
    RUN(test_seed_epoch_change_order);
    RUN(test_shuffle_correlation);
    RUN(test_shuffle_uniform_positions);
    RUN(test_shuffle_uniform_pairs);
    RUN(test_partition_matches_reference);
    RUN(test_partition_padding);
    return tu_end();
}
