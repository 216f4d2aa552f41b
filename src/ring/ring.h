/*
 * ring.h -- the ring of batch buffers between the workers and the consumer:
 * buffer states (FREE -> FILLING -> HELD [-> RELEASING] -> FREE), the claim
 * of sample slots, publishing a delivered batch's view, the variable
 * batches' arenas, and autotune (how many workers take claims).
 *
 * The ring has depth + 1 buffers (`nbufs`): `depth` batches prepared ahead
 * of the one the consumer holds. Batches are numbered globally,
 * g = epoch * batches_per_epoch + b, so work flows across epoch boundaries
 * without a bubble. Workers claim small runs of sample slots in order: the
 * claim cursor (claim_g, claim_slot) only moves forward, and a batch gets a
 * buffer when the cursor first reaches it, provided a buffer is free and the
 * batch is less than `nbufs` ahead of the consumer. Batches
 * [deliver_g, assigned_end_g) own buffers, indexed by g % nbufs in
 * `inflight`; the consumer takes deliver_g once all its slots are filled. A
 * delivered buffer is HELD until stk_batch_release() frees it.
 *
 * Lock rule: every field of stk__ring and stk__autotune is guarded by the
 * loader's core.lock (lock 1 of internal.h), which the ring shares with the
 * rest of the loader (no lock of its own); the functions below say whether
 * they take it or expect it held. depth, nbufs and run are fixed once the
 * ring is allocated and are read without it. Outside ring.c the loader
 * reads fields (deliver_g for positions, busy for seek, free_count for the
 * consumer's "all buffers held", stats) but writes none: only these
 * functions change the ring.
 */
#ifndef STK_RING_H
#define STK_RING_H

#include "internal.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct core core;
typedef struct buffer buffer;
typedef struct worker worker;

/* Autotune: workers with id >= active wait; the consumer's next() moves
 * active by one after windows of starvation (up) or of plenty (down). */
typedef struct stk__autotune {
    bool on;
    unsigned active;
    uint64_t t0, b0;    /* the window's start (time, delivered batches) */
    uint64_t blocked;   /* ns next() blocked in the window (overhead excluded) */
    unsigned calm;      /* consecutive windows with spare batches */
    uint64_t min_ahead; /* fewest batches ready ahead seen in the window */
} stk__autotune;

typedef struct stk__ring {
    unsigned depth, nbufs; /* nbufs = depth + 1 buffers */
    size_t run;            /* the most slots one claim takes */
    buffer *bufs;
    buffer **inflight; /* batch g's buffer at g % nbufs, for g in [deliver_g, assigned_end_g) */
    unsigned free_count;
    uint64_t claim_g, claim_slot, deliver_g, assigned_end_g;
    unsigned busy; /* workers filling claimed slots (seek and close wait for 0) */
    stk__autotune at;
} stk__ring;

/* Sets the depth (nbufs = depth + 1), before the ring is allocated. */
void stk__ring_set_depth(stk__ring *r, unsigned depth);
/* Autotune's start, with every one of nthreads workers active: starting
 * small would starve the first batches. */
void stk__ring_autotune_init(stk__ring *r, bool on, unsigned nthreads, uint64_t now);
/* Allocates the nbufs buffers (with a device, page-locked memory). */
int stk__ring_alloc(core *c);
/* Frees the buffers (the core is going). */
void stk__ring_free(core *c);
/* Takes the next run of slots to fill and counts the worker busy. Called and
 * returns with c->lock held. Returns false when the loader is closing. */
bool stk__ring_claim(core *c, const worker *w, buffer **bo, uint64_t *g, size_t *slot0,
                     size_t *count);
/* The worker is done with its claimed slots (wakes a waiting seek). Lock held. */
void stk__ring_unclaim(core *c);
/* A variable sample's memory from its batch's arena (a sink's alloc; the
 * sink's ctx is an arena_req naming the batch). */
typedef struct arena_req {
    core *c;
    buffer *b;
} arena_req;
uint8_t *stk__ring_arena_alloc(stk__sink *s, size_t n, int *rc);
/* The next batch in order if all its slots are filled, else NULL. Lock held. */
buffer *stk__ring_ready(const core *c);
/* Hands the ready batch b to the consumer: HELD, a reference to the core,
 * the cursor moves on. Lock held. */
void stk__ring_deliver(core *c, buffer *b);
/* Fills a HELD buffer's public view (without the lock). */
void stk__ring_publish(core *c, buffer *b);
/* Gives a HELD buffer back to the ring; frees the core with its last
 * reference. Takes the lock. */
void stk__ring_release(buffer *b);
/* Frees the buffers being filled, forgets the batches in flight and moves
 * every cursor to batch g (seek, with no worker in a slot). Lock held. */
void stk__ring_seek(core *c, uint64_t g);
/* After a next(): counts blocked_ns as starvation and, when a batch was
 * delivered with autotune on, takes one step of the controller. Lock held. */
void stk__ring_autotune(core *c, uint64_t now, uint64_t blocked_ns, bool delivered);

#endif
