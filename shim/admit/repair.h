/* repair.h - private to admit/: the checks and repairs of repair.c, which segment.c makes at attach under the segment's lock. */
#ifndef BULKSHIM_REPAIR_H
#define BULKSHIM_REPAIR_H

#include "admit/admit.h"

/* Whether any process record is taken: then no count can be recomputed. */
bool repair_in_use(const struct seg *s);
/* Whether any slot is held for processes the tables cannot name
 * (SLOT_KERNEL): its permits are held with no record. */
bool repair_kernel_held(const struct seg *s);
/* Frees the process records whose state is none of ours; returns how many. */
uint32_t repair_records(struct seg *s);
/* With no record held: recomputes every count from the slots, keeping
 * what processes that started meanwhile took, and logs what it changed.
 * False if a process took a record before it was done (nothing changed). */
bool repair_unheld(struct seg *s, const char *name);
/* With records held: NULL, or (in buf) the first count beyond anything
 * possible, which makes the segment untrusted. */
const char *repair_impossible(struct seg *s, char *buf, size_t len);
/* A setting of compartment c that no config gives, or NULL. */
const char *repair_setting(const struct seg_comp *c);

#endif
