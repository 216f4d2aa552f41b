/*
 * ring.h -- the ring of batch buffers between the workers and the consumer:
 * buffer states (FREE -> FILLING -> HELD [-> RELEASING] -> FREE), the claim
 * of sample slots, publishing a delivered batch's view, the variable
 * batches' arenas, and autotune (how many workers take claims).
 *
 * The ring's fields live in `core` (loader_core.h) and are guarded by
 * core.lock (lock 1 of internal.h) unless a function says otherwise.
 */
#ifndef STK_RING_H
#define STK_RING_H

#include "loader_core.h"

/* Allocates the nbufs buffers (with a device, page-locked memory). */
int stk__ring_alloc(core *c);
/* Frees the buffers (the core is going). */
void stk__ring_free(core *c);
/* Takes the next run of slots to fill. Called and returns with c->lock held.
 * Returns false when the loader is closing. */
bool stk__ring_claim(core *c, const worker *w, buffer **bo, uint64_t *g, size_t *slot0,
                     size_t *count);
/* A variable sample's memory from its batch's arena (a sink's alloc). */
uint8_t *stk__ring_arena_alloc(stk__sink *s, size_t n, int *rc);
/* Fills a HELD buffer's public view (without the lock). */
void stk__ring_publish(core *c, buffer *b);
/* Gives a HELD buffer back to the ring; frees the core with its last
 * reference. Takes the lock. */
void stk__ring_release(buffer *b);
/* Frees the buffers being filled and forgets the batches in flight (seek,
 * with no worker in a slot). Lock held. */
void stk__ring_drop_filling(core *c);
/* One step of the autotune controller, after a delivery. Lock held. */
void stk__ring_autotune(core *c, uint64_t now);

#endif
