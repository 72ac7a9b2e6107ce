/* guard.c - a segment that shrinks under its mappings: the fault is caught, the mapping replaced, the limits go off. */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "admit/admit.h"
#include "log.h"

/*
 * A mapped segment whose object is truncated (by any writer of it), or
 * whose tmpfs could not give it a page it touches for the first time,
 * raises SIGBUS at the next access to a page beyond the end, in every
 * process that maps it. Validation at attach cannot prevent that. Each
 * mapping is listed here while it exists; the process's SIGBUS handler
 * (the library's in interpose/signal.c, the CLI's in tools/) asks
 * guard_fault whether the address is in one. If it is, the whole mapping
 * is replaced at once by private zero pages, so the faulting access and
 * every later one in this process succeed, and the segment is marked
 * lost: its counts mean nothing from now on, in this process. What was
 * counted in the object stays with the object for the processes that
 * still map it whole.
 *
 * The list is read by a signal handler: entries are published with their
 * base last (release) and withdrawn with it first, and nothing here
 * allocates or locks.
 */

#define GUARD_MAX	16

enum { LOST_NOT, LOST_REPLACED, LOST_FAILED };

struct guarded {
	_Atomic uintptr_t base;		/* 0: a free entry */
	size_t size;
	struct seg *s;
	_Atomic int lost;
	char name[BS_NAME_MAX + 16];
};

static struct guarded guarded[GUARD_MAX];

void
guard_watch(struct seg *s, const char *shm_name)
{
	for (int i = 0; i < GUARD_MAX; i++) {
		struct guarded *g = &guarded[i];
		uintptr_t none = 0;

		if (atomic_load_explicit(&g->base, memory_order_relaxed) != 0)
			continue;
		/* Claimed with a placeholder that no address can fall in
		 * (size 0), then filled, then given its base. */
		if (!atomic_compare_exchange_strong(&g->base, &none, (uintptr_t)1))
			continue;
		g->size = 0;
		g->s = s;
		atomic_store(&g->lost, LOST_NOT);
		strncpy(g->name, shm_name, sizeof(g->name) - 1);
		g->name[sizeof(g->name) - 1] = '\0';
		g->size = s->size;
		atomic_store_explicit(&g->base, (uintptr_t)s->base, memory_order_release);
		return;
	}
	/* More segments mapped at once than entries (a CLI listing many):
	 * this one is read unguarded. */
}

void
guard_unwatch(const struct seg *s)
{
	for (int i = 0; i < GUARD_MAX; i++) {
		struct guarded *g = &guarded[i];

		if (g->s == s && atomic_load(&g->base) == (uintptr_t)s->base) {
			g->s = NULL;
			atomic_store_explicit(&g->base, 0, memory_order_release);
		}
	}
}

bool
guard_lost(const struct seg *s)
{
	return s != NULL && atomic_load_explicit(&s->lost, memory_order_acquire) != 0;
}

struct seg *
guard_fault(const void *addr)
{
	uintptr_t a = (uintptr_t)addr;

	for (int i = 0; i < GUARD_MAX; i++) {
		struct guarded *g = &guarded[i];
		uintptr_t base = atomic_load_explicit(&g->base, memory_order_acquire);
		struct seg *s;

		if (base <= 1 || a < base || a - base >= g->size)
			continue;
		s = g->s;
		/* Another thread that faulted first is replacing it: the
		 * access is retried and finds the new pages (or faults again
		 * until they are there). */
		switch (atomic_exchange(&g->lost, LOST_REPLACED)) {
		case LOST_REPLACED:
			return s;
		case LOST_FAILED:
			atomic_store(&g->lost, LOST_FAILED);
			return NULL;
		}
		if (s != NULL)
			atomic_store_explicit(&s->lost, 1, memory_order_release);
		if (mmap((void *)base, g->size, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
			/* Nothing left to do: the access faults again, and
			 * the default action ends the process as it would
			 * have without the shim. */
			atomic_store(&g->lost, LOST_FAILED);
			return NULL;
		}
		bs_log(LOG_ERROR, "segment /dev/shm%s shrank under this process (it was "
		    "truncated, or /dev/shm had no memory for it) at offset %lu of %lu: this "
		    "process no longer uses it, and runs without its limits", g->name,
		    (unsigned long)(a - base), (unsigned long)g->size);
		return s;
	}
	return NULL;
}
