/* test_order.c -- the epoch order (seeded bijective permutation) and the rank
 * partition, tested directly on src/order.h: bijection for many sizes and
 * seeds, shuffle quality, determinism, and torch DistributedSampler-style
 * partitioning with drop_last and pad-by-wrapping; then the shard-aware
 * order (bijection, window locality, determinism, mixing) and its two-epoch
 * cache from several threads. */
#include "order.h"
#include "testutil.h"

#include <math.h>
#include <pthread.h>
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

/* ---- shard-aware order ------------------------------------------------------ */

/* A shard layout: nshards sizes drawn by `kind`, first[0] = base. */
enum { SIZES_EQUAL, SIZES_RANDOM, SIZES_SOME_EMPTY, SIZES_ALL_EMPTY, SIZES_ONE_BIG };

static uint64_t *make_layout(size_t nshards, int kind, uint64_t base, uint64_t salt)
{
    uint64_t *first = malloc((nshards + 1) * sizeof *first);
    REQUIRE(first);
    stk__rng r = stk__rng_for(salt, (uint64_t)kind, nshards);
    first[0] = base;
    for (size_t k = 0; k < nshards; k++) {
        uint64_t size = 0;
        switch (kind) {
        case SIZES_EQUAL: size = 37; break;
        case SIZES_RANDOM: size = 1 + stk__rng_below(&r, 120); break;
        case SIZES_SOME_EMPTY:
            size = stk__rng_below(&r, 3) == 0 ? 0 : stk__rng_below(&r, 60);
            break;
        case SIZES_ALL_EMPTY: size = 0; break;
        case SIZES_ONE_BIG: size = k == nshards / 2 ? 3000 : 1 + k % 3; break;
        }
        first[k + 1] = first[k] + size;
    }
    return first;
}

/* The shard holding sample v (a non-empty one). */
static size_t shard_of(const uint64_t *first, size_t nshards, uint64_t v)
{
    size_t lo = 0, hi = nshards;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (first[mid] <= v)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Checks one order against the contract: a bijection of the epoch's samples,
 * windows of W consecutive slots of a shard permutation that tile the
 * positions, and each window's positions touching exactly its non-empty
 * shards. Returns 1 when all holds (and reports the first failure). */
static int check_shard_order(const stk__shard_order *o, const uint64_t *first, size_t nshards,
                             unsigned window)
{
    uint64_t base = first[0], n = first[nshards] - first[0];
    int ok = stk__shard_order_len(o) == n;
    uint8_t *seen = calloc(n + 1, 1);
    uint8_t *slot_seen = calloc(nshards + 1, 1);
    uint8_t *in_window = calloc(nshards + 1, 1);
    uint8_t *touched = calloc(nshards + 1, 1);
    REQUIRE(seen && slot_seen && in_window && touched);
    /* The shard order is a permutation of the shards. */
    for (size_t j = 0; j < nshards && ok; j++) {
        size_t k = stk__shard_order_shard(o, j);
        ok = k < nshards && !slot_seen[k];
        if (ok)
            slot_seen[k] = 1;
    }
    size_t nw = stk__shard_order_windows(o);
    ok = ok && nw == (nshards + window - 1) / window;
    size_t prev_slot = 0;
    uint64_t prev_pos = 0;
    for (size_t w = 0; w < nw && ok; w++) {
        size_t sb, se;
        uint64_t pb, pe, sum = 0;
        stk__shard_order_window(o, w, &sb, &se, &pb, &pe);
        /* Windows tile the slots W at a time and the positions in order. */
        ok = sb == prev_slot && se - sb == (w + 1 < nw ? window : nshards - sb) && pb == prev_pos &&
             pe >= pb;
        prev_slot = se;
        prev_pos = pe;
        memset(in_window, 0, nshards + 1);
        memset(touched, 0, nshards + 1);
        for (size_t j = sb; j < se && ok; j++) {
            size_t k = stk__shard_order_shard(o, j);
            in_window[k] = 1;
            sum += first[k + 1] - first[k];
        }
        ok = ok && pe - pb == sum;
        for (uint64_t pos = pb; pos < pe && ok; pos++) {
            uint64_t v = stk__shard_order_at(o, pos);
            ok = v >= base && v - base < n && !seen[v - base] &&
                 stk__shard_order_window_of(o, pos) == w;
            if (!ok)
                break;
            seen[v - base] = 1;
            size_t k = shard_of(first, nshards, v);
            ok = in_window[k];
            touched[k] = 1;
        }
        /* Exactly the window's shards: each of them with a sample is touched. */
        for (size_t k = 0; k < nshards && ok; k++)
            ok = touched[k] == (in_window[k] && first[k + 1] > first[k]);
    }
    ok = ok && prev_slot == nshards && prev_pos == n;
    for (uint64_t i = 0; i < n && ok; i++)
        ok = seen[i];
    free(touched);
    free(in_window);
    free(slot_seen);
    free(seen);
    return ok;
}

static void test_shard_bijection_and_locality(void)
{
    static const size_t counts[] = {0, 1, 2, 3, 5, 8, 17, 64, 200};
    static const unsigned windows[] = {1, 2, 3, 4, 8, 64, 1000};
    static const int kinds[] = {SIZES_EQUAL, SIZES_RANDOM, SIZES_SOME_EMPTY, SIZES_ALL_EMPTY,
                                SIZES_ONE_BIG};
    int cases = 0;
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++) {
            uint64_t base = kd % 2 ? 1000 : 0; /* samples need not start at 0 */
            uint64_t *first = make_layout(counts[c], kinds[kd], base, c);
            for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++)
                for (size_t s = 0; s < NSEEDS; s += 2)
                    for (uint64_t e = 0; e < 2; e++)
                        for (int sh = 0; sh <= 1; sh++) {
                            stk__shard_order *o;
                            int rc = stk__shard_order_create(&o, first, counts[c], windows[wi],
                                                             k_seeds[s], e * 5, sh != 0);
                            REQUIRE(rc == STK_OK);
                            int ok = check_shard_order(o, first, counts[c], windows[wi]);
                            if (!ok)
                                fprintf(stderr,
                                        "shard order wrong: nshards=%zu kind=%d window=%u "
                                        "seed=%llu epoch=%llu shuffle=%d\n",
                                        counts[c], kinds[kd], windows[wi],
                                        (unsigned long long)k_seeds[s], (unsigned long long)e * 5,
                                        sh);
                            CHECK(ok);
                            cases++;
                            stk__shard_order_destroy(o);
                        }
            free(first);
        }
    printf("    %d orders checked\n", cases);
}

/* Large: 2000 shards of random sizes (about 120k samples), windows of 16. */
static void test_shard_large(void)
{
    uint64_t *first = make_layout(2000, SIZES_RANDOM, 0, 99);
    stk__shard_order *o;
    REQUIRE(stk__shard_order_create(&o, first, 2000, 16, 7, 3, true) == STK_OK);
    CHECK(check_shard_order(o, first, 2000, 16));
    stk__shard_order_destroy(o);
    free(first);
}

static void test_shard_no_shuffle_is_identity(void)
{
    uint64_t *first = make_layout(50, SIZES_SOME_EMPTY, 10, 3);
    stk__shard_order *o;
    REQUIRE(stk__shard_order_create(&o, first, 50, 4, 1, 2, false) == STK_OK);
    int same = 1;
    for (uint64_t pos = 0; pos < stk__shard_order_len(o); pos++)
        same &= stk__shard_order_at(o, pos) == 10 + pos;
    CHECK(same);
    for (size_t j = 0; j < 50; j++)
        CHECK_EQ(stk__shard_order_shard(o, j), j);
    stk__shard_order_destroy(o);
    free(first);
}

/* Equal inputs give equal orders; another epoch or seed gives another shard
 * order and another sample order. */
static void test_shard_deterministic_and_epochs_differ(void)
{
    enum { NS = 64, W = 4 };
    uint64_t *first = make_layout(NS, SIZES_EQUAL, 0, 0);
    uint64_t n = first[NS];
    for (size_t s = 0; s < NSEEDS; s++) {
        stk__shard_order *a, *b;
        REQUIRE(stk__shard_order_create(&a, first, NS, W, k_seeds[s], 1, true) == STK_OK);
        REQUIRE(stk__shard_order_create(&b, first, NS, W, k_seeds[s], 1, true) == STK_OK);
        int same = 1;
        for (uint64_t pos = 0; pos < n; pos++)
            same &= stk__shard_order_at(a, pos) == stk__shard_order_at(b, pos);
        CHECK(same);
        for (int other = 0; other < 3; other++) {
            stk__shard_order_destroy(b);
            uint64_t seed = other == 2 ? k_seeds[s] + 1 : k_seeds[s];
            uint64_t epoch = other == 0 ? 2 : other == 1 ? 1000 : 1;
            REQUIRE(stk__shard_order_create(&b, first, NS, W, seed, epoch, true) == STK_OK);
            int eq_pos = 0, eq_slot = 0;
            for (uint64_t pos = 0; pos < n; pos++)
                eq_pos += stk__shard_order_at(a, pos) == stk__shard_order_at(b, pos);
            for (size_t j = 0; j < NS; j++)
                eq_slot += stk__shard_order_shard(a, j) == stk__shard_order_shard(b, j);
            /* About 1 of 64 slots and 1 of n positions alike by chance. */
            CHECK(eq_slot < 8);
            CHECK(eq_pos < 20);
        }
        stk__shard_order_destroy(a);
        stk__shard_order_destroy(b);
    }
    free(first);
}

/* Within a window the shards' samples are mixed: with W equal shards, two
 * neighbouring positions share a shard with probability (s - 1) / (Ws - 1),
 * about 1/W. Windows of one shard still shuffle it, each window with its own
 * permutation. And the shard level is uniform: over many seeds every shard
 * comes first about equally often. */
static void test_shard_mixing(void)
{
    enum { NS = 256, W = 4 };
    uint64_t *first = make_layout(NS, SIZES_EQUAL, 0, 0);
    stk__shard_order *o;
    REQUIRE(stk__shard_order_create(&o, first, NS, W, 5, 0, true) == STK_OK);
    uint64_t pairs = 0, same = 0;
    for (size_t w = 0; w < stk__shard_order_windows(o); w++) {
        size_t sb, se;
        uint64_t pb, pe;
        stk__shard_order_window(o, w, &sb, &se, &pb, &pe);
        for (uint64_t pos = pb; pos + 1 < pe; pos++) {
            pairs++;
            same += shard_of(first, NS, stk__shard_order_at(o, pos)) ==
                    shard_of(first, NS, stk__shard_order_at(o, pos + 1));
        }
    }
    double frac = (double)same / (double)pairs;
    printf("    neighbours from one shard: %.3f (expected %.3f)\n", frac, 36.0 / 147.0);
    CHECK(frac > 0.20 && frac < 0.29); /* sd about 0.005 */
    stk__shard_order_destroy(o);

    /* W = 1: each shard shuffled alone, and differently from the others. */
    REQUIRE(stk__shard_order_create(&o, first, NS, 1, 5, 0, true) == STK_OK);
    int fixed = 0, alike = 0;
    for (uint64_t q = 0; q < 37; q++) {
        uint64_t off0 = stk__shard_order_at(o, q) - first[stk__shard_order_shard(o, 0)];
        uint64_t off1 = stk__shard_order_at(o, 37 + q) - first[stk__shard_order_shard(o, 1)];
        fixed += off0 == q;
        alike += off0 == off1;
    }
    CHECK(fixed < 8);
    CHECK(alike < 8);
    stk__shard_order_destroy(o);
    free(first);

    enum { SH = 7, SEEDS = 7000 };
    uint64_t small[SH + 1];
    for (int k = 0; k <= SH; k++)
        small[k] = (uint64_t)k * 3;
    unsigned count[SH] = {0};
    for (uint64_t seed = 0; seed < SEEDS; seed++) {
        REQUIRE(stk__shard_order_create(&o, small, SH, 2, seed, 4, true) == STK_OK);
        count[stk__shard_order_shard(o, 0)]++;
        stk__shard_order_destroy(o);
    }
    double chi = 0, expect = (double)SEEDS / SH;
    for (int k = 0; k < SH; k++)
        chi += ((double)count[k] - expect) * ((double)count[k] - expect) / expect;
    printf("    first shard chi2 %.1f (df %d, limit %.1f)\n", chi, SH - 1, chi2_limit(SH - 1));
    CHECK(chi < chi2_limit(SH - 1));
}

static void test_shard_bad_args(void)
{
    uint64_t first[] = {0, 5, 3, 9};
    stk__shard_order *o = (stk__shard_order *)1;
    CHECK_EQ(stk__shard_order_create(&o, first, 3, 2, 0, 0, true), STK_EINVAL);
    CHECK(o == NULL);
    CHECK_EQ(stk__shard_order_create(&o, first, 1, 0, 0, 0, true), STK_EINVAL);
    CHECK_EQ(stk__shard_order_create(&o, NULL, 1, 2, 0, 0, true), STK_EINVAL);
    stk__shard_orders *c = (stk__shard_orders *)1;
    CHECK_EQ(stk__shard_orders_init(&c, first, 3, 2, 0, true), STK_EINVAL);
    CHECK(c == NULL);
    CHECK_EQ(stk__shard_orders_init(&c, first, 1, 0, 0, true), STK_EINVAL);
    stk__shard_order_destroy(NULL);
    stk__shard_orders_destroy(NULL);
}

/* Every allocation failure is reported as STK_ENOMEM without a leak, and a
 * failed build leaves the cache as it was. */
static void test_shard_out_of_memory(void)
{
    uint64_t *first = make_layout(20, SIZES_RANDOM, 0, 1);
    stk__shard_order *o;
    int failures = 0;
    for (long k = 0;; k++) {
        stk__alloc_fail_after(k);
        int rc = stk__shard_order_create(&o, first, 20, 3, 1, 1, true);
        stk__alloc_fail_after(-1);
        if (rc == STK_OK) {
            stk__shard_order_destroy(o);
            break;
        }
        CHECK_EQ(rc, STK_ENOMEM);
        CHECK(o == NULL);
        failures++;
    }
    CHECK(failures >= 3); /* the handle, the copy of the layout, the table */

    /* The two-epoch cache allocates its tables at init: a lookup of any
     * epoch, with every allocation failing, still answers from the
     * shard-aware order (it used to fail, and the loader then took that
     * one position from the global order: samples repeated and dropped). */
    stk__shard_orders *c;
    REQUIRE(stk__shard_orders_init(&c, first, 20, 3, 1, true) == STK_OK);
    for (uint64_t e = 0; e < 5; e++) {
        stk__shard_order *t;
        REQUIRE(stk__shard_order_create(&t, first, 20, 3, 1, e, true) == STK_OK);
        for (uint64_t pos = 0; pos < first[20] - first[0]; pos += 7) {
            uint64_t v = UINT64_MAX;
            stk__alloc_fail_after(0);
            int rc = stk__shard_orders_at(c, e, pos, &v);
            stk__alloc_fail_after(-1);
            CHECK_EQ(rc, STK_OK);
            CHECK_EQ(v, stk__shard_order_at(t, pos));
        }
        stk__shard_order_destroy(t);
    }
    stk__shard_orders_destroy(c);
    for (long k = 0; k < 4; k++) { /* the handle, the layout, two tables */
        stk__alloc_fail_after(k);
        CHECK_EQ(stk__shard_orders_init(&c, first, 20, 3, 1, true), STK_ENOMEM);
        stk__alloc_fail_after(-1);
        CHECK(c == NULL);
    }
    free(first);
}

/* The cache holds the two most recently used epochs, and lookups allocate
 * nothing: a third epoch refills the least recently used table in place,
 * and every answer matches the epoch's own table. */
static void test_shard_cache_keeps_two_epochs(void)
{
    uint64_t *first = make_layout(30, SIZES_SOME_EMPTY, 0, 2);
    stk__shard_orders *c;
    REQUIRE(stk__shard_orders_init(&c, first, 30, 4, 9, true) == STK_OK);
    stk__shard_order *t[3];
    for (int e = 0; e < 3; e++)
        REQUIRE(stk__shard_order_create(&t[e], first, 30, 4, 9, (uint64_t)e, true) == STK_OK);
    uint64_t v;
    long a0 = stk__alloc_count();
    for (uint64_t pos = 0; pos < first[30] - first[0]; pos++) {
        CHECK_EQ(stk__shard_orders_at(c, pos % 2, pos, &v), STK_OK);
        CHECK_EQ(v, stk__shard_order_at(t[pos % 2], pos));
    }
    CHECK_EQ(stk__shard_orders_at(c, 0, 0, &v), STK_OK);
    CHECK_EQ(stk__shard_orders_at(c, 2, 0, &v), STK_OK); /* replaces 1 */
    CHECK_EQ(v, stk__shard_order_at(t[2], 0));
    CHECK_EQ(stk__shard_orders_at(c, 0, 3, &v), STK_OK); /* still held */
    CHECK_EQ(v, stk__shard_order_at(t[0], 3));
    CHECK_EQ(stk__shard_orders_at(c, 1, 5, &v), STK_OK); /* refilled */
    CHECK_EQ(v, stk__shard_order_at(t[1], 5));
    CHECK_EQ(stk__alloc_count() - a0, 0);
    for (int e = 0; e < 3; e++)
        stk__shard_order_destroy(t[e]);
    stk__shard_orders_destroy(c);
    free(first);
}

/* Several threads ask the cache for positions of epochs 0..EPOCHS-1, each
 * thread moving across epoch boundaries at its own pace (so tables are built
 * and replaced while others read), and every answer matches a direct table. */
enum { CT_THREADS = 6, CT_EPOCHS = 6, CT_NS = 40, CT_W = 3 };

typedef struct cache_thread {
    stk__shard_orders *c;
    uint64_t n;
    uint64_t **want; /* want[e][pos] */
    unsigned id;
    int wrong, errors;
} cache_thread;

static void *cache_thread_main(void *arg)
{
    cache_thread *t = arg;
    /* Walk epoch e's positions while also asking for the next epoch's first
     * positions, as workers do when claims cross an epoch boundary. */
    for (uint64_t e = 0; e + 1 < CT_EPOCHS; e++)
        for (uint64_t k = 0; k < t->n; k++) {
            uint64_t pos = (k * (2 * t->id + 1) + t->id) % t->n, v;
            uint64_t epoch = k % 4 == 3 ? e + 1 : e;
            if (stk__shard_orders_at(t->c, epoch, pos, &v) != STK_OK)
                t->errors++;
            else if (v != t->want[epoch][pos])
                t->wrong++;
        }
    return NULL;
}

static void test_shard_cache_threads(void)
{
    uint64_t *first = make_layout(CT_NS, SIZES_SOME_EMPTY, 0, 4);
    uint64_t n = first[CT_NS];
    uint64_t *want[CT_EPOCHS];
    for (uint64_t e = 0; e < CT_EPOCHS; e++) {
        stk__shard_order *o;
        REQUIRE(stk__shard_order_create(&o, first, CT_NS, CT_W, 77, e, true) == STK_OK);
        want[e] = malloc(n * sizeof **want);
        REQUIRE(want[e]);
        for (uint64_t pos = 0; pos < n; pos++)
            want[e][pos] = stk__shard_order_at(o, pos);
        stk__shard_order_destroy(o);
    }
    stk__shard_orders *c;
    REQUIRE(stk__shard_orders_init(&c, first, CT_NS, CT_W, 77, true) == STK_OK);
    pthread_t th[CT_THREADS];
    cache_thread ct[CT_THREADS];
    for (unsigned i = 0; i < CT_THREADS; i++) {
        ct[i] = (cache_thread){.c = c, .n = n, .want = want, .id = i};
        REQUIRE(pthread_create(&th[i], NULL, cache_thread_main, &ct[i]) == 0);
    }
    int wrong = 0, errors = 0;
    for (unsigned i = 0; i < CT_THREADS; i++) {
        pthread_join(th[i], NULL);
        wrong += ct[i].wrong;
        errors += ct[i].errors;
    }
    CHECK_EQ(errors, 0);
    CHECK_EQ(wrong, 0);
    stk__shard_orders_destroy(c);
    for (uint64_t e = 0; e < CT_EPOCHS; e++)
        free(want[e]);
    free(first);
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
    RUN(test_shard_bijection_and_locality);
    RUN(test_shard_large);
    RUN(test_shard_no_shuffle_is_identity);
    RUN(test_shard_deterministic_and_epochs_differ);
    RUN(test_shard_mixing);
    RUN(test_shard_bad_args);
    RUN(test_shard_out_of_memory);
    RUN(test_shard_cache_keeps_two_epochs);
    RUN(test_shard_cache_threads);
    return tu_end();
}
