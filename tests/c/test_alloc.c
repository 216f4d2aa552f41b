/* test_alloc.c -- the library's growable array (stk__grow): contents kept
 * across growth, O(log n) allocations for n appends, no allocation while the
 * capacity suffices, sizes that overflow refused before any allocation, and
 * an allocation failure leaving the array as it was. */
#include "internal.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

/* Appending one element at a time keeps every element and reallocates only
 * when the capacity runs out, geometrically. */
static void test_append_keeps_contents(void)
{
    uint32_t *v = NULL;
    size_t cap = 0;
    long before = stk__alloc_count();
    for (uint32_t k = 0; k < 100000; k++) {
        REQUIRE(stk__grow((void **)&v, &cap, (size_t)k + 1, sizeof *v) == STK_OK);
        CHECK(cap >= (size_t)k + 1);
        v[k] = k * 2654435761u;
    }
    long allocs = stk__alloc_count() - before;
    /* 16, 32, ..., 131072: 14 allocations; a fixed increment would make
     * thousands. */
    CHECK(allocs >= 1 && allocs <= 14);
    int bad = 0;
    for (uint32_t k = 0; k < 100000; k++)
        bad += v[k] != k * 2654435761u;
    CHECK_EQ(bad, 0);
    stk__free(v);
}

/* Asking for no more than the capacity allocates nothing and changes
 * nothing; a jump past twice the capacity gets exactly what it asked for. */
static void test_capacity_rules(void)
{
    char *p = NULL;
    size_t cap = 0;
    REQUIRE(stk__grow((void **)&p, &cap, 1, 1) == STK_OK);
    CHECK_EQ(cap, 16); /* the floor */
    char *was = p;
    long before = stk__alloc_count();
    CHECK_EQ(stk__grow((void **)&p, &cap, 16, 1), STK_OK);
    CHECK_EQ(stk__grow((void **)&p, &cap, 0, 1), STK_OK);
    CHECK_EQ(stk__alloc_count(), before);
    CHECK(p == was);
    CHECK_EQ(cap, 16);
    CHECK_EQ(stk__grow((void **)&p, &cap, 17, 1), STK_OK);
    CHECK_EQ(cap, 32); /* doubled */
    CHECK_EQ(stk__grow((void **)&p, &cap, 1000, 1), STK_OK);
    CHECK_EQ(cap, 1000); /* need > 2 * cap */
    memset(p, 7, 1000);  /* ASan: all of it is there */
    stk__free(p);
    /* elem 0 is a caller's mistake, refused. */
    p = NULL;
    cap = 0;
    CHECK_EQ(stk__grow((void **)&p, &cap, 4, 0), STK_EINVAL);
    CHECK(p == NULL && cap == 0);
}

/* need * elem past PTRDIFF_MAX (or past SIZE_MAX, where it would wrap to a
 * small allocation that later writes overflow) is refused with STK_ENOMEM,
 * before any allocation and with the array untouched. Doubling clamps at the
 * largest array instead of wrapping. */
static void test_overflow(void)
{
    uint64_t *v = NULL;
    size_t cap = 0;
    REQUIRE(stk__grow((void **)&v, &cap, 3, sizeof *v) == STK_OK);
    v[0] = 1;
    v[1] = 2;
    v[2] = 3;
    uint64_t *was = v;
    size_t was_cap = cap;
    long before = stk__alloc_count();
    size_t wrap = SIZE_MAX / sizeof *v + 2; /* * 8 wraps to 8 */
    CHECK_EQ(stk__grow((void **)&v, &cap, wrap, sizeof *v), STK_ENOMEM);
    CHECK_EQ(stk__grow((void **)&v, &cap, (size_t)PTRDIFF_MAX / sizeof *v + 1, sizeof *v),
             STK_ENOMEM);
    CHECK_EQ(stk__grow((void **)&v, &cap, SIZE_MAX, 1), STK_ENOMEM);
    CHECK_EQ(stk__alloc_count(), before);
    CHECK(v == was && cap == was_cap);
    CHECK(v[0] == 1 && v[1] == 2 && v[2] == 3);
    stk__free(v);

    /* The capacity rule alone (no allocation of that size is attempted). */
    size_t max8 = (size_t)PTRDIFF_MAX / 8;
    CHECK_EQ(stk__grow_cap(0, 1, 8), 16);
    CHECK_EQ(stk__grow_cap(20, 10, 8), 20);
    CHECK_EQ(stk__grow_cap(max8 / 2 + 1, max8 / 2 + 2, 8), max8); /* clamped, not wrapped */
    CHECK_EQ(stk__grow_cap(max8, max8, 8), max8);
    CHECK_EQ(stk__grow_cap(max8, max8 + 1, 8), 0);
    CHECK_EQ(stk__grow_cap(0, 1, (size_t)PTRDIFF_MAX / 4), 4); /* floor below 16 */
    CHECK_EQ(stk__grow_cap(0, 1, SIZE_MAX), 0);
    CHECK_EQ(stk__grow_cap(0, 1, 0), 0);
}

/* A failed allocation returns STK_ENOMEM and leaves the array and its
 * capacity as they were: the caller still owns (and frees) the old one. */
static void test_allocation_failure(void)
{
    int *v = NULL;
    size_t cap = 0;
    stk__alloc_fail_after(0);
    CHECK_EQ(stk__grow((void **)&v, &cap, 1, sizeof *v), STK_ENOMEM);
    CHECK(v == NULL && cap == 0);
    stk__alloc_fail_after(-1);
    REQUIRE(stk__grow((void **)&v, &cap, 16, sizeof *v) == STK_OK);
    for (int k = 0; k < 16; k++)
        v[k] = k;
    int *was = v;
    stk__alloc_fail_after(0);
    CHECK_EQ(stk__grow((void **)&v, &cap, 17, sizeof *v), STK_ENOMEM);
    stk__alloc_fail_after(-1);
    CHECK(v == was);
    CHECK_EQ(cap, 16);
    int bad = 0;
    for (int k = 0; k < 16; k++)
        bad += v[k] != k;
    CHECK_EQ(bad, 0);
    /* And the next try, with memory back, grows it. */
    CHECK_EQ(stk__grow((void **)&v, &cap, 17, sizeof *v), STK_OK);
    CHECK_EQ(cap, 32);
    CHECK_EQ(v[15], 15);
    stk__free(v);
}

int main(void)
{
    tu_begin("test_alloc", 60);
    RUN(test_append_keeps_contents);
    RUN(test_capacity_rules);
    RUN(test_overflow);
    RUN(test_allocation_failure);
    return tu_end();
}
