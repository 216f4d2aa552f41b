/* test_mix_schedule.c -- the mixture's schedule (src/schedule/mix.h) tested
 * directly: quotas by largest remainder, exact totals per epoch, the source
 * counts of every window of every length within the stated bound (all
 * windows, by prefix counts), ranks consistent with occurrences, every pass
 * of a source exactly once, determinism, epochs differing, and the map from
 * epoch positions to mixture positions (a bijection that makes each rank's
 * stream a window); the inverse walks (a source's k-th position, its
 * count before a position) and the cache's next uses against a scan of the
 * coming positions. */
#include "schedule/mix.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x1234567ULL;
static uint64_t rnd(void)
{
    g_rng += 0x9e3779b97f4a7c15ULL;
    uint64_t z = g_rng;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double rnd_unit(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}

/* A random mixture: 2..5 sources, weights 0.001..0.9 (some of each
 * extreme), sizes small enough that small shares repeat sometimes. */
static void random_mix(stk__mix *m, uint64_t N, uint64_t seed, size_t *nsrc_out)
{
    size_t nsrc = 2 + (size_t)(rnd() % 4);
    double w[5];
    uint64_t samples[5] = {0}, sizes[5], quota[5];
    for (size_t s = 0; s < nsrc; s++) {
        uint64_t r = rnd() % 4;
        w[s] = r == 0 ? 0.001 : r == 1 ? 0.9 : 0.001 + rnd_unit() * 0.899;
        sizes[s] = 1 + rnd() % (N / 2 + 1);
    }
    char err[256];
    uint64_t n = N;
    REQUIRE(stk__mix_quotas(w, samples, sizes, nsrc, &n, quota, err, sizeof err) == STK_OK);
    REQUIRE(n == N);
    REQUIRE(stk__mix_init(m, quota, sizes, nsrc, seed, true) == STK_OK);
    *nsrc_out = nsrc;
}

static void test_quotas(void)
{
    char err[256];
    double w[3] = {0.7, 0.2, 0.1};
    uint64_t samples[3] = {0}, sizes[3] = {1000, 10, 5}, q[3];
    uint64_t N = 256;
    CHECK_EQ(stk__mix_quotas(w, samples, sizes, 3, &N, q, err, sizeof err), STK_OK);
    CHECK_EQ(q[0], 179); /* 179.2, 51.2, 25.6: the 0.6 gets the last one */
    CHECK_EQ(q[1], 51);
    CHECK_EQ(q[2], 26);
    /* Default N: the sizes; no weight: in proportion to the size. */
    double w0[3] = {0, 0, 0};
    N = 0;
    CHECK_EQ(stk__mix_quotas(w0, samples, sizes, 3, &N, q, err, sizeof err), STK_OK);
    CHECK_EQ(N, 1015);
    CHECK_EQ(q[0], 1000);
    CHECK_EQ(q[1], 10);
    CHECK_EQ(q[2], 5);
    /* A fixed count, the rest by weight. */
    uint64_t fixed[3] = {0, 0, 40};
    N = 140;
    CHECK_EQ(stk__mix_quotas(w, fixed, sizes, 3, &N, q, err, sizeof err), STK_OK);
    CHECK_EQ(q[2], 40);
    CHECK_EQ(q[0] + q[1], 100);
    CHECK_EQ(q[0], 78); /* 0.7 / 0.9 of 100 = 77.8 */
    /* Errors: fixed above N, all fixed but short, an empty source. */
    uint64_t big[3] = {0, 0, 500};
    N = 100;
    CHECK_EQ(stk__mix_quotas(w, big, sizes, 3, &N, q, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "samples_per_epoch 100") != NULL);
    uint64_t all[3] = {10, 10, 10};
    N = 100;
    CHECK_EQ(stk__mix_quotas(w, all, sizes, 3, &N, q, err, sizeof err), STK_EINVAL);
    uint64_t empty[3] = {5, 0, 3};
    N = 100;
    CHECK_EQ(stk__mix_quotas(w, samples, empty, 3, &N, q, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "source 1 has no samples") != NULL);
    /* Some weighted, some by size: refused (no common unit). */
    double half[3] = {0.5, 0, 0.5};
    N = 100;
    CHECK_EQ(stk__mix_quotas(half, samples, sizes, 3, &N, q, err, sizeof err), STK_EINVAL);
    CHECK(strstr(err, "2 mixture sources have a weight and 1 have neither") != NULL);
    /* Random weight vectors: sum exact, each within one of its share. */
    for (int it = 0; it < 200; it++) {
        size_t ns = 2 + (size_t)(rnd() % 4);
        double ww[5], sum = 0;
        uint64_t sz[5], z[5] = {0}, q5[5];
        for (size_t s = 0; s < ns; s++)
            ww[s] = 0.001 + rnd_unit() * 0.899, sum += ww[s], sz[s] = 1 + rnd() % 100;
        N = 1 + rnd() % 100000;
        REQUIRE(stk__mix_quotas(ww, z, sz, ns, &N, q5, err, sizeof err) == STK_OK);
        uint64_t tot = 0;
        for (size_t s = 0; s < ns; s++) {
            tot += q5[s];
            CHECK(fabs((double)q5[s] - (double)N * ww[s] / sum) < 1.0 + 1e-9);
        }
        CHECK_EQ(tot, N);
    }
}

/* The largest |count - L q / N| over every window of every source, the
 * totals, and the rank of each occurrence. */
static double check_epoch(const stk__mix *m, uint64_t epoch, size_t nsrc, int *bad_bound)
{
    uint64_t N = m->N;
    uint32_t *pre = calloc((N + 1) * nsrc, sizeof *pre);
    REQUIRE(pre);
    uint64_t seen[5] = {0};
    for (uint64_t t = 0; t < N; t++) {
        size_t s;
        uint64_t k;
        stk__mix_at(m, epoch, t, &s, &k);
        REQUIRE(s < nsrc);
        /* the k-th occurrence of s has rank k */
        if (k != seen[s]) {
            CHECK_EQ(k, seen[s]);
            break;
        }
        seen[s]++;
        for (size_t j = 0; j < nsrc; j++)
            pre[(t + 1) * nsrc + j] = pre[t * nsrc + j] + (j == s);
    }
    for (size_t s = 0; s < nsrc; s++)
        CHECK_EQ(seen[s], m->quota[s]);
    double worst = 0;
    for (size_t s = 0; s < nsrc; s++) {
        double share = (double)m->quota[s] / (double)N;
        for (uint64_t L = 1; L <= N; L++) {
            uint32_t lo = UINT32_MAX, hi = 0;
            for (uint64_t a = 0; a + L <= N; a++) {
                uint32_t c = pre[(a + L) * nsrc + s] - pre[a * nsrc + s];
                lo = c < lo ? c : lo;
                hi = c > hi ? c : hi;
            }
            /* exact integer bounds: floor(Lq/N) - 1 <= c <= ceil(Lq/N) + 1 */
            uint64_t fl = L * m->quota[s] / N, ce = (L * m->quota[s] + N - 1) / N;
            if ((uint64_t)lo + 1 < fl || hi > ce + 1)
                (*bad_bound)++;
            double x = (double)L * share;
            worst = fmax(worst, fmax(x - lo, hi - x));
        }
    }
    free(pre);
    return worst;
}

static void test_windows_random_weights(void)
{
    double worst = 0;
    int bad = 0;
    for (int it = 0; it < 14; it++) {
        stk__mix m;
        size_t nsrc;
        uint64_t N = 500 + rnd() % 1500;
        random_mix(&m, N, rnd(), &nsrc);
        for (uint64_t e = 0; e < 2; e++)
            worst = fmax(worst, check_epoch(&m, e, nsrc, &bad));
    }
    CHECK_EQ(bad, 0);
    /* The stated bound: within 2 of the exact share in every window. */
    CHECK(worst < 2.0);
    printf("  largest window error over random mixtures: %.3f samples\n", worst);
}

/* Two sources: one balanced word, so every window is within 1 (floor or
 * ceil of its share). */
static void test_two_sources_within_one(void)
{
    for (int it = 0; it < 20; it++) {
        uint64_t N = 100 + rnd() % 900;
        uint64_t q[2], sz[2] = {N, N};
        q[0] = 1 + rnd() % (N - 1);
        q[1] = N - q[0];
        stk__mix m;
        REQUIRE(stk__mix_init(&m, q, sz, 2, rnd(), true) == STK_OK);
        int bad = 0;
        CHECK(check_epoch(&m, 3, 2, &bad) < 1.0);
        CHECK_EQ(bad, 0);
    }
}

/* Each pass of a source over its samples is a permutation of them; the last
 * (partial) pass takes distinct samples. */
static void test_passes_exactly_once(void)
{
    for (int it = 0; it < 30; it++) {
        uint64_t size = 1 + rnd() % 300, quota = 1 + rnd() % 1000;
        uint64_t q[2] = {quota, 7}, sz[2] = {size, 7};
        stk__mix m;
        REQUIRE(stk__mix_init(&m, q, sz, 2, rnd(), it % 3 != 0) == STK_OK);
        uint8_t *hit = calloc(size, 1);
        REQUIRE(hit);
        uint64_t cur = 0;
        for (uint64_t k = 0; k < quota; k++) {
            uint64_t pass, i = stk__mix_kth(&m, 5, 0, k, &pass);
            REQUIRE(i < size);
            CHECK_EQ(pass, k / size);
            if (pass != cur)
                memset(hit, 0, size), cur = pass;
            CHECK(!hit[i]);
            hit[i] = 1;
        }
        free(hit);
    }
    /* Passes differ (a fresh permutation each), and so do epochs. */
    uint64_t q[1] = {3000}, sz[1] = {1000};
    stk__mix m;
    REQUIRE(stk__mix_init(&m, q, sz, 1, 9, true) == STK_OK);
    int same_pass = 0, same_epoch = 0;
    for (uint64_t k = 0; k < 1000; k++) {
        uint64_t p, a = stk__mix_kth(&m, 0, 0, k, &p), b = stk__mix_kth(&m, 0, 0, k + 1000, &p),
                    c = stk__mix_kth(&m, 1, 0, k, &p);
        same_pass += a == b;
        same_epoch += a == c;
    }
    CHECK(same_pass < 20);
    CHECK(same_epoch < 20);
}

static void test_deterministic_and_epochs_differ(void)
{
    uint64_t q[3] = {700, 200, 100}, sz[3] = {5000, 50, 3};
    stk__mix a, b, c;
    REQUIRE(stk__mix_init(&a, q, sz, 3, 42, true) == STK_OK);
    REQUIRE(stk__mix_init(&b, q, sz, 3, 42, true) == STK_OK);
    REQUIRE(stk__mix_init(&c, q, sz, 3, 43, true) == STK_OK);
    stk__mix_geom g = {1000, 1000, 1, 1};
    int same = 1, diff_epoch = 0, diff_seed = 0;
    for (uint64_t pos = 0; pos < 1000; pos++) {
        uint64_t d1, d2, d3, d4;
        uint64_t x = stk__mix_sample(&a, &g, 0, pos, &d1);
        same &= x == stk__mix_sample(&b, &g, 0, pos, &d2);
        diff_epoch += x != stk__mix_sample(&a, &g, 1, pos, &d3);
        diff_seed += x != stk__mix_sample(&c, &g, 0, pos, &d4);
        CHECK(x < 5053);
    }
    CHECK(same);
    CHECK(diff_epoch > 500);
    CHECK(diff_seed > 500);
    /* Sources of composite ids. */
    CHECK_EQ(stk__mix_source_of(&a, 0), 0);
    CHECK_EQ(stk__mix_source_of(&a, 4999), 0);
    CHECK_EQ(stk__mix_source_of(&a, 5000), 1);
    CHECK_EQ(stk__mix_source_of(&a, 5050), 2);
    CHECK_EQ(stk__mix_source_of(&a, 5052), 2);
    /* A repeated pass draws afresh; pass 0 keeps the epoch. */
    uint64_t q1[1] = {30}, s1[1] = {10};
    stk__mix r;
    REQUIRE(stk__mix_init(&r, q1, s1, 1, 1, true) == STK_OK);
    stk__mix_geom g1 = {30, 30, 1, 1};
    int fresh = 0, kept = 0;
    for (uint64_t pos = 0; pos < 30; pos++) {
        uint64_t d;
        stk__mix_sample(&r, &g1, 7, pos, &d);
        kept += d == 7;
        fresh += d != 7;
    }
    CHECK_EQ(kept, 10);
    CHECK_EQ(fresh, 20);
}

/* Epoch positions -> mixture positions: a bijection on [0, n) in which each
 * rank's stream (order.h's partition) is a run of consecutive t, for one and
 * several nodes, with padding and with drop_last. */
static void test_rank_streams_are_windows(void)
{
    for (int it = 0; it < 300; it++) {
        uint64_t n = 1 + rnd() % 400;
        unsigned local = 1 + (unsigned)(rnd() % 4), nodes = 1 + (unsigned)(rnd() % 3);
        unsigned world = local * nodes;
        uint64_t B = 1 + rnd() % 9;
        bool drop = rnd() % 2;
        stk__partition p;
        if (stk__partition_init(&p, n, 0, world, B, drop) != STK_OK)
            continue;
        p.local = local;
        stk__mix_geom g = {n, p.per_rank, world, local};
        uint8_t *hit = calloc(n, 1);
        REQUIRE(hit);
        int ok = 1;
        for (uint64_t pos = 0; pos < n; pos++) {
            uint64_t t = stk__mix_t(&g, pos);
            ok &= t < n && !hit[t];
            if (t < n)
                hit[t] = 1;
        }
        CHECK(ok);
        for (unsigned r = 0; r < world && ok; r++) {
            p.rank = r;
            uint64_t prev = 0;
            for (uint64_t k = 0; k < p.per_rank; k++) {
                uint64_t raw = (uint64_t)(r / local) * p.per_rank * local + r % local + k * local;
                if (raw >= n)
                    break; /* padding: a real position read again */
                uint64_t t = stk__mix_t(&g, stk__partition_pos(&p, k));
                if (k && t != prev + 1) {
                    CHECK_EQ(t, prev + 1);
                    ok = 0;
                    break;
                }
                prev = t;
            }
        }
        free(hit);
    }
}

/* Each rank's batches hold their share within the bound: weights
 * 0.5/0.5 over 2 ranks would give each rank one source without the map. */
static void test_rank_batches_proportional(void)
{
    uint64_t q[3] = {700, 200, 100}, sz[3] = {10000, 10000, 10000};
    stk__mix m;
    REQUIRE(stk__mix_init(&m, q, sz, 3, 5, true) == STK_OK);
    for (unsigned world = 1; world <= 4; world++) {
        stk__partition p;
        REQUIRE(stk__partition_init(&p, 1000, 0, world, 20, true) == STK_OK);
        stk__mix_geom g = {1000, p.per_rank, world, world};
        for (unsigned r = 0; r < world; r++) {
            p.rank = r;
            for (uint64_t b = 0; b < p.batches; b++) {
                uint64_t cnt[3] = {0};
                for (uint64_t k = b * 20; k < b * 20 + 20; k++) {
                    size_t s;
                    uint64_t rank;
                    stk__mix_at(&m, 0, stk__mix_t(&g, stk__partition_pos(&p, k)), &s, &rank);
                    cnt[s]++;
                }
                /* shares of 20: 14, 4, 2 */
                CHECK(cnt[0] >= 13 && cnt[0] <= 15);
                CHECK(cnt[1] >= 3 && cnt[1] <= 5);
                CHECK(cnt[2] >= 1 && cnt[2] <= 3);
            }
        }
    }
}

static void test_zero_quota_and_one_source(void)
{
    uint64_t q[3] = {0, 10, 0}, sz[3] = {4, 4, 4};
    stk__mix m;
    REQUIRE(stk__mix_init(&m, q, sz, 3, 1, true) == STK_OK);
    for (uint64_t t = 0; t < 10; t++) {
        size_t s;
        uint64_t k;
        stk__mix_at(&m, 0, t, &s, &k);
        CHECK_EQ(s, 1);
        CHECK_EQ(k, t);
    }
    uint64_t z[2] = {0, 0};
    CHECK_EQ(stk__mix_init(&m, z, sz, 2, 1, true), STK_EINVAL);
}

/* The inverse walks against the forward one, at every position: the k-th
 * position of s is t, and s has k positions before t; per-source batches
 * (block 4) too. */
static void test_inverse_walks(void)
{
    for (int it = 0; it < 40; it++) {
        stk__mix m;
        size_t nsrc;
        uint64_t B = it % 4 == 3 ? 4 : 1, N = 200 + rnd() % 400;
        random_mix(&m, N, rnd(), &nsrc);
        m.block = B;
        m.N *= B;
        uint64_t seen[5] = {0};
        for (uint64_t t = 0; t < m.N; t++) {
            size_t s;
            uint64_t k;
            stk__mix_at(&m, 3, t / B, &s, &k);
            k = k * B + t % B;
            CHECK_EQ(k, seen[s]);
            CHECK_EQ(stk__mix_pos_of(&m, 3, s, k), t);
            for (size_t u = 0; u < nsrc; u++)
                CHECK_EQ(stk__mix_count_before(&m, 3, u, t), seen[u]);
            seen[s]++;
        }
        for (size_t u = 0; u < nsrc; u++)
            CHECK_EQ(stk__mix_count_before(&m, 3, u, m.N), m.quota[u] * B);
    }
}

/* The cache's next uses (stk__mix_next_uses) against a scan of every coming
 * position (the rest of the epoch, then the next one): each shard's next use
 * is the first position whose sample lies in the shard's window of the
 * order that reads it (with windows of one shard: the shard's first read).
 * Sources: one read in prefix (quota under its size), one repeated (2.5
 * passes), one not fetched (UINT64_MAX for its shards, whose table is not
 * the stage's), and one fetched read in order "global" when `global`. */
static void check_next_uses(unsigned window, uint64_t B, uint64_t seed)
{
    /* Source 0: 9 shards of 30 samples, one empty; 1: 5 of 8; 2: 4 of 10. */
    static const uint64_t f0[10] = {0, 30, 60, 60, 90, 120, 150, 180, 210, 240};
    static const uint64_t f1[6] = {0, 8, 16, 24, 32, 40};
    static const uint64_t f2[5] = {0, 10, 20, 30, 40};
    const uint64_t *first[3] = {f0, f1, f2};
    size_t ns[3] = {9, 5, 4}, off[3] = {0, 9, SIZE_MAX}, total = 14;
    uint64_t sz[3] = {240, 40, 40}, q[3] = {150 / B, 100 / B, 30 / B};
    stk__mix m;
    REQUIRE(stk__mix_init(&m, q, sz, 3, seed, true) == STK_OK);
    m.block = B;
    m.N *= B;
    for (size_t s = 0; s < 3; s++) {
        REQUIRE(stk__mix_set_order(&m, s, first[s], ns[s], window) == STK_OK);
        stk__mix_set_shards(&m, s, first[s], ns[s], window, off[s]);
    }
    uint64_t next[14], want[14];
    for (uint64_t e = 0; e < 2; e++) {
        for (uint64_t t = 0; t < m.N; t += 1 + rnd() % 23) {
            REQUIRE(stk__mix_next_uses(&m, e, t, next, total));
            for (size_t x = 0; x < total; x++)
                want[x] = UINT64_MAX;
            for (uint64_t d = 0; d < 2 * m.N - t; d++) {
                uint64_t ep = e + (t + d) / m.N, u = (t + d) % m.N, k, pass;
                size_t s;
                stk__mix_at(&m, ep, u / B, &s, &k);
                k = k * B + u % B;
                if (off[s] == SIZE_MAX)
                    continue;
                uint64_t i = stk__mix_kth(&m, ep, s, k, &pass);
                /* The window of i's shard in the order of (ep, pass). */
                uint64_t key =
                    pass ? stk__mix64(ep ^ pass * 0x9e3779b97f4a7c15ULL) | (1ULL << 63) : ep;
                stk__shard_order *o;
                REQUIRE(stk__shard_order_create(
                            &o, first[s], ns[s], window,
                            stk__mix64(seed ^ ((uint64_t)s + 1) * 0xd1b54a32d192ed03ULL), key,
                            true) == STK_OK);
                CHECK_EQ(stk__shard_order_at(o, k % sz[s]), i);
                size_t w = stk__shard_order_window_of(o, k % sz[s]), sb, se;
                uint64_t pb, pe;
                stk__shard_order_window(o, w, &sb, &se, &pb, &pe);
                if (window == 1)
                    CHECK_EQ(stk__shard_order_shard(o, sb), stk__run_of(first[s], ns[s], i));
                for (size_t j = sb; j < se; j++) {
                    size_t x = off[s] + stk__shard_order_shard(o, j);
                    if (want[x] == UINT64_MAX)
                        want[x] = d;
                }
                stk__shard_order_destroy(o);
            }
            for (size_t x = 0; x < total; x++)
                CHECK_EQ(next[x], want[x]);
        }
    }
    stk__mix_free_orders(&m);
}

static void test_next_uses_match_a_scan(void)
{
    check_next_uses(1, 1, 11);
    check_next_uses(3, 1, 12);
    check_next_uses(1, 10, 13);
    check_next_uses(2, 10, 14);
    /* A source not set (order "global" or "blocks"): unknown, so LRU. */
    uint64_t q[2] = {5, 5}, sz[2] = {5, 5}, next[3];
    stk__mix m;
    REQUIRE(stk__mix_init(&m, q, sz, 2, 1, true) == STK_OK);
    REQUIRE(stk__mix_next_uses(&m, 0, 3, next, 3));
    for (size_t x = 0; x < 3; x++)
        CHECK_EQ(next[x], UINT64_MAX);
}

int main(void)
{
    tu_begin("test_mix_schedule", 300);
    RUN(test_quotas);
    RUN(test_windows_random_weights);
    RUN(test_two_sources_within_one);
    RUN(test_passes_exactly_once);
    RUN(test_deterministic_and_epochs_differ);
    RUN(test_rank_streams_are_windows);
    RUN(test_rank_batches_proportional);
    RUN(test_zero_quota_and_one_source);
    RUN(test_inverse_walks);
    RUN(test_next_uses_match_a_scan);
    return tu_end();
}
