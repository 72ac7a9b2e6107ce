/* tally.h - private to admit/: the tallies' API. */
#ifndef BULKSHIM_TALLY_H
#define BULKSHIM_TALLY_H

#include "admit/admit.h"

/*
 * Every permit of a slot is taken, given and looked for in the tallies of
 * the compartment c the caller found the slot in (its admission, its
 * release): c is passed down, never looked up again, and a slot reused
 * meanwhile by another socket fails on its generation.
 */
/* The count that permit kind p of slot sl of compartment c is counted in,
 * and in *limit (if not NULL) its limit (NULL: none); NULL if there is no
 * such count (c NULL, no class, no pool). */
_Atomic uint32_t *tally_of(const struct seg *s, struct seg_comp *c, const struct seg_slot *sl,
    int p, _Atomic uint32_t **limit);
/* Changes sl's mark while it is of generation gen, has every flag of need
 * and none of deny: clears clr, sets set. False if it cannot. (Not for
 * MARK_HELD: tally.c alone writes those.) Setting MARK_GUARANTEED on a slot
 * that holds its own permit of the level is all the guaranteed path of a
 * connect costs (share.c). Inlined under LTO. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE bool tally_mark_change(struct seg_slot *sl, uint32_t gen, uint64_t need,
    uint64_t deny, uint64_t clr, uint64_t set);
#pragma GCC diagnostic pop
/* One attempt to take permit kind p for slot (of generation gen): one
 * tagged compare-and-swap of its tally. TAKE_OK, TAKE_FULL (*seen: the
 * count at the limit) or TAKE_BUSY (the slot holds one, or a kind of
 * `deny`, a MARK_HELD mask, or it is released). */
int tally_take(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p,
    uint64_t deny, uint32_t *seen);
/* tally_take past the limit (a guarantee lowered live, share.c). */
int tally_take_past(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p);
/* tally_take and tally_give of P_INFLIGHT for a slot of compartment c,
 * which the caller read after the slot's mark m (so a slot reused meanwhile
 * fails on its generation). */
int tally_take_inflight(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c,
    uint32_t *seen);
bool tally_give_inflight(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c);
/* tally_take of P_CONN for a slot of compartment c (the caller read the
 * slot's compartment: c is the one it names; *took the tag it wrote), and
 * of P_LENT for a slot of a compartment in pool, right after the
 * compartment's take that wrote tag `took` (0: none): inlined into
 * admission (BS_LTO_INLINE; GCC warns that a body it cannot see in this
 * file might not be inlinable, and LTO inlines it). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE int tally_take_conn(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    uint32_t *seen, uint32_t *took);
BS_LTO_INLINE int tally_take_lent(struct seg *s, uint32_t slot, uint32_t gen,
    struct seg_pool *pool, uint32_t took, uint32_t *seen);
/* The in-flight take's fast path, for a caller that found c's adaptive
 * limit off (permit_request_quick): the slot (of mark m0) takes on its own
 * give, below the static limit. TAKE_OK, TAKE_BUSY (released meanwhile:
 * undone), or TAKE_MISS (not that case, nothing done). */
BS_LTO_INLINE int tally_take_inflight_quick(struct seg *s, uint32_t slot, uint64_t m0,
    struct seg_comp *c, uint32_t *seen);
/* The in-flight give's fast path: the tally's tag is the slot's own take,
 * so nobody needs a reflection. True if it gave (and woke a waiter of c),
 * false if not that case (nothing done). */
BS_LTO_INLINE bool tally_give_inflight_quick(struct seg *s, uint32_t slot, uint32_t gen,
    struct seg_comp *c);
#pragma GCC diagnostic pop

/* Gives back permit kind p of slot if it holds it; true if it did. */
bool tally_give(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p);
/* The release of slot (claimed SLOT_RELEASING by the caller), of
 * compartment c in pool (the caller's reads of the slot's and c's; NULL:
 * none): gives back every permit it holds and marks it MARK_RELEASED.
 * Returns what it held (MARK_HELD flags). */
uint64_t tally_release(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    struct seg_pool *pool);
/* The slot (of generation gen, holding nothing) moves to the next
 * generation: a take of the old one still counted is undone as if the
 * slot were released. For a pending slot whose admission was refused. */
void tally_renew(struct seg *s, uint32_t slot, uint32_t gen);
/* Undoes every take of a released slot still counted (its taker died
 * before it could see the release): run when a process is found dead or
 * has exec'd. */
void tally_sweep(struct seg *s);

#endif
