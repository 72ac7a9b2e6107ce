/* repair.c - damaged counts of a segment that passed validation, put right (or refused) at attach. */
#include <stdlib.h>
#include <string.h>

#include "admit/repair.h"
#include "admit/slot.h"
#include "log.h"

/*
 * A segment that passed validate() can still hold values no correct shim
 * writes: a damaged or hand-made segment, a bug, a crash at the wrong
 * instruction. Left alone, a count of 4 billion permits in use refuses
 * every connect forever and a wait of 49 days hangs the caller. Attach
 * puts such values right, under the segment's lock, and says what it
 * changed; what it cannot put right safely makes the segment untrusted.
 */

/* No legitimate count comes near this: in_use stays below its limit (at
 * most BS_MAX_LIMIT) or, with no limit, below the socket table. */
#define SANE_COUNT_MAX	((uint32_t)BS_MAX_LIMIT + BS_MAX_SOCKETS)

/* Lowers *v by `by`, never below 0, keeping whatever others added since. */
static void
sub_floor(_Atomic uint32_t *v, uint32_t by)
{
	uint32_t cur = atomic_load(v);

	while (!atomic_compare_exchange_weak(v, &cur, cur > by ? cur - by : 0))
		;
}

/* Frees the process records whose state is none of ours. Nothing else
 * ever writes such a record, so it can be cleared without a race; its row
 * is cleared before the record becomes free. Returns how many. */
uint32_t
repair_records(struct seg *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->nprocs; i++) {
		struct seg_proc *p = &s->procs[i];
		uint32_t st = atomic_load(&p->state);

		if (st <= PROC_EXITED)
			continue;
		for (uint32_t w = 0; w < s->bitmap_words; w++)
			atomic_store(&seg_row(s, i)[w], 0);
		atomic_store(&p->pid, 0);
		atomic_store(&p->owner, 0);
		atomic_store(&p->start, 0);
		if (atomic_compare_exchange_strong(&p->state, &st, PROC_FREE))
			n++;
	}
	return n;
}

/* The counts of compartment c that stand for permits, waiters and
 * requests; all of them are 0 when no process holds a record. */
#define NCOUNTS (6 + BS_MAX_CLASSES)
static void
counts_of(struct seg_comp *c, _Atomic uint32_t *v[NCOUNTS])
{
	v[0] = &c->in_use;
	v[1] = &c->inflight;
	v[2] = &c->over;
	v[3] = &c->inflight_over;
	v[4] = &c->waiting;
	for (int k = 0; k < BS_MAX_CLASSES; k++)
		v[5 + k] = &c->cls[k].in_use;
	v[5 + BS_MAX_CLASSES] = &c->cls_lent;
}

static const char *const count_names[NCOUNTS] = {
	"in_use", "inflight", "over", "inflight_over", "waiting",
	"class 0 in_use", "class 1 in_use", "class 2 in_use", "class 3 in_use",
	"class 4 in_use", "class 5 in_use", "class 6 in_use", "class 7 in_use",
	"class lent",
};

/*
 * No process holds a record, so no permit is held and no slot is in use:
 * whatever the counts say is left over (a process killed between taking a
 * permit and recording it) or garbage. The counts are read first and
 * taken off only if still nobody holds a record afterwards, by subtraction,
 * so a process that starts taking permits meanwhile keeps what it took.
 * Returns false if a process took a record before it was done, if a slot
 * is held for processes the tables cannot name (SLOT_KERNEL), or if memory
 * ran out, and nothing was changed.
 */
bool
repair_unheld(struct seg *s, const char *name)
{
	uint32_t nslots = 0, lent[BS_MAX_POOLS] = { 0 };
	bool done = false;
	uint32_t *seen = calloc((size_t)s->ncomp * NCOUNTS, sizeof(*seen));
	uint32_t *slot_st = calloc(s->nslots, sizeof(*slot_st));

	if (seen == NULL || slot_st == NULL)
		goto done;
	for (uint32_t i = 0; i < s->ncomp; i++) {
		_Atomic uint32_t *v[NCOUNTS];

		counts_of(&s->comp[i], v);
		for (int k = 0; k < NCOUNTS; k++)
			seen[i * NCOUNTS + k] = atomic_load(v[k]);
	}
	for (uint32_t j = 0; j < s->nslots; j++) {
		slot_st[j] = atomic_load(&s->slots[j].state);
		if (slot_st[j] == SLOT_KERNEL)
			goto done;
	}
	for (uint32_t p = 0; p < s->h->npools && p < BS_MAX_POOLS; p++)
		lent[p] = atomic_load(&s->h->pools[p].lent);
	if (repair_in_use(s))
		goto done;
	for (uint32_t p = 0; p < s->h->npools && p < BS_MAX_POOLS; p++) {
		char pname[BS_NAME_MAX];

		if (lent[p] == 0)
			continue;
		sub_floor(&s->h->pools[p].lent, lent[p]);
		log_name(pname, sizeof(pname), s->h->pools[p].name, sizeof(pname));
		bs_log(LOG_WARN, "segment /dev/shm%s: pool %s: lent was %u with no process holding "
		    "anything; reset to 0", name, pname, lent[p]);
	}
	for (uint32_t i = 0; i < s->ncomp; i++) {
		_Atomic uint32_t *v[NCOUNTS];
		char cname[BS_NAME_MAX];

		counts_of(&s->comp[i], v);
		log_name(cname, sizeof(cname), s->comp[i].name, sizeof(cname));
		for (int k = 0; k < NCOUNTS; k++) {
			uint32_t was = seen[i * NCOUNTS + k];

			if (was == 0)
				continue;
			sub_floor(v[k], was);
			bs_log(LOG_WARN, "segment /dev/shm%s: compartment %s: %s was %u with no "
			    "process holding anything; reset to 0", name, cname, count_names[k], was);
		}
	}
	for (uint32_t j = 0; j < s->nslots; j++) {
		struct seg_slot *sl = &s->slots[j];
		uint32_t st = slot_st[j];

		if (st == SLOT_FREE)
			continue;
		atomic_store(&sl->holders, 0);
		atomic_store(&sl->inode, 0);
		atomic_store(&sl->mark, MARK_OF_GEN(MARK_GEN(atomic_load(&sl->mark))));
		if (atomic_compare_exchange_strong(&sl->state, &st, SLOT_FREE))
			nslots++;
	}
	if (nslots > 0)
		bs_log(LOG_WARN, "segment /dev/shm%s: %u socket slots were in use with no process "
		    "holding them; freed", name, nslots);
	done = true;
done:
	free(seen);
	free(slot_st);
	return done;
}

/* Processes hold records: their counts cannot be recomputed under them,
 * but a count beyond anything possible means the segment is damaged.
 * Returns NULL or what is wrong, in buf. */
const char *
repair_impossible(struct seg *s, char *buf, size_t len)
{
	for (uint32_t i = 0; i < s->ncomp; i++) {
		_Atomic uint32_t *v[NCOUNTS];

		counts_of(&s->comp[i], v);
		for (int k = 0; k < NCOUNTS; k++) {
			uint32_t n = atomic_load(v[k]);

			if (n > SANE_COUNT_MAX) {
				char cname[BS_NAME_MAX];

				log_name(cname, sizeof(cname), s->comp[i].name, sizeof(cname));
				bs_format(buf, len, "damaged (compartment %s: %s is %u while processes "
				    "use the segment)", cname, count_names[k], n);
				return buf;
			}
		}
	}
	return NULL;
}

/* What is wrong with the settings of compartment c, or NULL: values that
 * seg_apply_limits never writes, whatever the config. */
const char *
repair_setting(const struct seg_comp *c)
{
	uint32_t lim = atomic_load(&c->limit), ilim = atomic_load(&c->inflight_limit);
	uint32_t mw = atomic_load(&c->max_waiting);

	if (lim == 0 || (lim > BS_MAX_LIMIT && lim != UINT32_MAX))
		return "limit";
	if (ilim == 0 || (ilim > BS_MAX_LIMIT && ilim != UINT32_MAX))
		return "inflight limit";
	if (mw > BS_MAX_LIMIT)
		return "max_waiting";
	if (atomic_load(&c->max_wait_ms) > BS_MAX_WAIT_MS)
		return "max_wait_ms";
	if (atomic_load(&c->connect_timeout_ms) > BS_MAX_TIMEOUT_MS ||
	    atomic_load(&c->io_timeout_ms) > BS_MAX_TIMEOUT_MS)
		return "timeout";
	for (int k = 0; k < BS_MAX_CLASSES; k++) {
		if (atomic_load(&c->cls[k].limit) > BS_MAX_LIMIT)
			return "class limit";
	}
	return NULL;
}

/* See repair.h. */
bool
repair_kernel_held(const struct seg *s)
{
	for (uint32_t j = 0; j < s->nslots; j++) {
		if (atomic_load(&s->slots[j].state) == SLOT_KERNEL)
			return true;
	}
	return false;
}

/* See repair.h. */
bool
repair_in_use(const struct seg *s)
{
	for (uint32_t i = 0; i < s->nprocs; i++) {
		if (atomic_load(&s->procs[i].state) != PROC_FREE)
			return true;
	}
	return false;
}
