/* share.h - private to admit/: guaranteed shares' steps for admission and release. */
#ifndef BULKSHIM_SHARE_H
#define BULKSHIM_SHARE_H

#include "admit/tally.h"

/* The classes of c split it as a pool's compartments split the pool: after
 * slot's class permit (class cls), whose take made the class's count v,
 * one of c's unguaranteed part unless v is within the class's guarantee.
 * On failure the class permit is given back here. TAKE_OK, TAKE_FULL or
 * TAKE_BUSY. */
enum take share_take_class(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen,
    uint32_t cls, uint32_t v);
/* Gives back slot's permits of level l (its shared permit, then its own),
 * passing a guarantee on as a release does; used when admission stops
 * half-way. */
void share_give(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen,
    enum share_level l);
/* True if compartment c is in a pool and would borrow (it holds its
 * guarantee) from a shared part that is all lent: a reconcile may find
 * permits of the pool whose sockets are gone. */
bool share_pool_full(const struct seg *s, const struct seg_comp *c);
/* True if c's classes split it and its unguaranteed part is all lent. */
bool share_classes_full(const struct seg_comp *c);
/* Slot's hand-over of level l, when something is lent (share_released). */
void share_hand_over(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen,
    enum share_level l);

/* Inlined into their callers in other files under LTO (BS_LTO_INLINE). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
/* Slot, whose mark is m (with a MARK_GUARANTEED flag), of compartment c
 * in pool (each NULL: none, as the release read them), is about to give
 * back its permits: see share_hand_over. Two loads when nobody borrows. */
BS_LTO_INLINE void share_released(struct seg *s, uint32_t slot, uint64_t m,
    struct seg_comp *c, struct seg_pool *pool);
#pragma GCC diagnostic pop

#endif
