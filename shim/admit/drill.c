/* drill.c - a drill's words in a compartment: reading them whole, picking connections, starting and ending one. */
#include <errno.h>
#include <stdatomic.h>

#include "admit/admit.h"

/*
 * `id` is a sequence lock: odd while a start or a stop writes the other
 * words, even when they stand (the writer moves it from even to odd by
 * compare-and-swap, so two CLIs cannot write at once, and to the next even
 * number when done). A reader takes `id` before and after the other
 * words: the same even value both times, and the words read between
 * belong to one drill. A drill runs while faults is not 0 and the clock is
 * below the deadline, so one whose CLI was killed ends on time all the
 * same: nothing has to clear it.
 */

uint32_t
drill_read(struct seg_comp *c, uint64_t now_ms, struct drill_view *v)
{
	struct seg_drill *d = &c->drill;
	uint64_t start;

	for (int tries = 0; tries < 4; tries++) {
		uint64_t id = atomic_load(&d->id);

		if (id & 1)
			continue;
		v->faults = atomic_load(&d->faults);
		v->deadline_ms = atomic_load(&d->deadline_ms);
		v->delay_ms = atomic_load(&d->delay_ms);
		v->connect_delay_ms = atomic_load(&d->connect_delay_ms);
		v->fraction_ppm = atomic_load(&d->fraction_ppm);
		start = atomic_load(&d->start_ms);
		v->id = id;
		if (atomic_load(&d->id) != id)
			continue;
		if (v->faults == 0 || now_ms >= v->deadline_ms || atomic_load(&d->allowed) == 0 ||
		    start > now_ms + 1000 || v->deadline_ms - start > DRILL_MAX_MS)
			v->faults = 0;
		return v->faults;
	}
	/* Changing under us all the while: not a drill to act on now. */
	v->faults = 0;
	return 0;
}

/* A mix of the socket's inode and the drill's id: the same connection is
 * picked or not for the whole drill, and another drill picks anew. */
bool
drill_picks(const struct drill_view *v, uint64_t inode)
{
	uint64_t x = inode * 0x9e3779b97f4a7c15ULL ^ v->id * 0xc2b2ae3d27d4eb4fULL;

	if (v->fraction_ppm == 0 || v->fraction_ppm >= DRILL_PPM)
		return true;
	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 29;
	return x % DRILL_PPM < v->fraction_ppm;
}

bool
drill_running_at(struct seg_comp *c, uint64_t now_ms)
{
	struct drill_view v;

	return drill_read(c, now_ms, &v) != 0;
}

/* Takes the words for writing: the even id they stand at, or -EBUSY when
 * another writer has them. */
static int64_t
drill_lock(struct seg_drill *d)
{
	uint64_t id = atomic_load(&d->id);

	if ((id & 1) || !atomic_compare_exchange_strong(&d->id, &id, id + 1))
		return -EBUSY;
	return (int64_t)(id & INT64_MAX);
}

int
drill_start(struct seg_comp *c, const struct drill_view *v, uint64_t now_ms, uint64_t real_ms,
    pid_t by)
{
	struct seg_drill *d = &c->drill;
	int64_t id;

	if (atomic_load(&d->allowed) == 0)
		return -EPERM;
	if (drill_running_at(c, now_ms) || (id = drill_lock(d)) < 0)
		return -EBUSY;
	atomic_store(&d->faults, 0);
	atomic_store(&d->delay_ms, v->delay_ms);
	atomic_store(&d->connect_delay_ms, v->connect_delay_ms);
	atomic_store(&d->fraction_ppm, v->fraction_ppm);
	atomic_store(&d->by_pid, by);
	atomic_store(&d->start_ms, now_ms);
	atomic_store(&d->start_realtime_ms, real_ms);
	atomic_store(&d->touched, 0);
	atomic_store(&d->spared, 0);
	atomic_store(&d->deadline_ms, v->deadline_ms);
	atomic_store(&d->faults, v->faults);
	atomic_store(&d->id, (uint64_t)id + 2);
	return 0;
}

bool
drill_end(struct seg_comp *c)
{
	struct seg_drill *d = &c->drill;
	int64_t id;
	bool was;

	if (atomic_load(&d->faults) == 0 && atomic_load(&d->deadline_ms) == 0)
		return false;
	/* A writer busy now: it holds the words for a moment only. */
	for (int tries = 0; (id = drill_lock(d)) < 0; tries++) {
		if (tries == 1000)
			return false;
	}
	was = atomic_exchange(&d->faults, 0) != 0;
	atomic_store(&d->deadline_ms, 0);
	atomic_store(&d->id, (uint64_t)id + 2);
	return was;
}
