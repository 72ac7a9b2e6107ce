/* slot.h - private to admit/: the holds of a slot, for process records and reconcile. */
#ifndef BULKSHIM_SLOT_H
#define BULKSHIM_SLOT_H

#include "admit/admit.h"

/* slot_claim without the descriptor: the slot is held by record rec, but
 * no descriptor of this process counts for it yet (lcount 0). */
int slot_alloc(struct seg *s, int rec, uint64_t ino);
/* The holders word of a slot that record rec holds alone, by its first
 * hold (HTAG_SOLE, count 1). */
uint64_t slot_sole_word(const struct seg *s, uint32_t rec);
/* Publishes rec (or -1) as this process's record, with its sole word. */
void slot_set_record(struct seg *s, int rec);
/* True if record rec holds slot, by bit or alone. A change naming rec
 * under way (its sole hold being turned into a bit) is waited for first. */
bool slot_held_by(struct seg *s, uint32_t rec, uint32_t slot);
/* Adds a hold of record rec on slot if somebody still holds the slot (a
 * slot at 0 is being released). True if it did. */
bool slot_hold_add(struct seg *s, uint32_t rec, uint32_t slot);
/* Changes of record rec's holds left half done (its process died between
 * the count and the bit) are finished, so its row is right. */
void slot_settle_holds(struct seg *s, uint32_t rec);
/* Record rec's sole holds (no bit) are dropped, each first resolved for the
 * dead process `dead` if not 0 (slot_resolve). */
void slot_drop_sole_holds(struct seg *s, uint32_t rec, pid_t dead, bool reclaimed);
/* Slots that process pid left unfinished: dropped by it and never
 * released, or set up or released half-way when it died. */
void slot_release_orphans(struct seg *s, pid_t pid);
/* Gives back every permit of a slot nobody holds and frees it; only the
 * caller that moves it from SLOT_USED to SLOT_RELEASING (with its pid)
 * does. A SLOT_WATCHED one becomes SLOT_KERNEL instead, permits and all. */
void slot_release(struct seg *s, uint32_t slot, bool reclaimed);
/* Finishes slot if nobody is left to: a slot no process holds that is
 * still in use (its last holder died before releasing it) is released; one
 * that process `dead` was setting up is freed, one it was releasing is
 * released. Safe against live workers: each step is claimed by CAS. */
void slot_release_orphan(struct seg *s, uint32_t slot, pid_t dead);
/* Marks a slot this process holds as one that processes the tables
 * cannot name may hold too (SLOT_WATCHED): when its last known holder
 * drops it, its permits stay until the kernel has no file of its socket
 * left. True if it is so marked; false if it was given back already. */
bool slot_watch(struct seg *s, uint32_t slot);
/* Gives back the permits of a slot that no process the tables know holds
 * (SLOT_KERNEL), of the socket with inode ino, once the caller has seen
 * the kernel's socket tables list that socket with no file. True if a
 * connection permit went back (reconciled); false if the slot is no longer
 * that (given back by another, or another socket's now). */
bool slot_release_kernel(struct seg *s, uint32_t slot, uint64_t ino);
/* Finishes an operation on slot that process `dead` (0: anyone) left half
 * done: its wait (the slot counted in `waiting`). */
void slot_resolve(struct seg *s, uint32_t slot, pid_t dead);
/* The requests of compartment c (kind p: P_CONN counts connections by
 * their admission time, P_INFLIGHT requests by their first send) that
 * are in flight now: *inflight of them, of which *n are older than `old`
 * microseconds at `now`, their ages summing to *sum. For the adaptive
 * limit's stall check (ad_stall). */
void slot_ages(const struct seg *s, struct seg_comp *c, int p, uint64_t now, uint64_t old,
    uint64_t *inflight, uint64_t *n, uint64_t *sum);

#endif
