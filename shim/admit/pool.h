/* pool.h - private to admit/: a pool's permit in admission, its use statistic, its waiters. */
#ifndef BULKSHIM_POOL_H
#define BULKSHIM_POOL_H

#include "admit/share.h"

/* Sets the use statistic of every pool whose members hold nothing to 0
 * (after a reclaim: what a killed thread left one low is right again). */
void pool_resync_use(struct seg *s);
/* A waiter of c goes to sleep on the pool (delta 1) or wakes (-1). */
void pool_sleepers(struct seg *s, const struct seg_comp *c, int delta);

/* Inlined into their callers in other files under LTO (BS_LTO_INLINE). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
/*
 * After slot's permit of compartment c, in pool, whose take made in_use v:
 * within the guarantee if v is, else a permit lent by the pool
 * (share_take). TAKE_OK, TAKE_FULL with *full the word to wait on,
 * or TAKE_BUSY.
 */
BS_LTO_INLINE int pool_take(struct seg *s, struct seg_comp *c, struct seg_pool *pool,
    uint32_t slot, uint32_t gen, uint32_t took, uint32_t v, uint32_t *seen, _Atomic uint32_t **full);
/* A member of pool took a connection permit: the use statistic goes up
 * and the peak with it. Inline: every take in a pool asks it. */
BS_LTO_INLINE void pool_note_use(struct seg_pool *pool);
/* A slot of a member of pool is being released: the use statistic goes
 * down (before the slot's permits do). */
BS_LTO_INLINE void pool_note_release(struct seg_pool *pool);
#pragma GCC diagnostic pop

#endif
