/* chaos.h - what the chaos driver and its workers share: the counters file and the limits. */
#ifndef BULKSHIM_CHAOS_H
#define BULKSHIM_CHAOS_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define CHAOS_COMPS	3	/* limited compartments, c0..c2 */
#define CHAOS_SERVERS	(CHAOS_COMPS + 1)	/* and one server no rule matches */
#define CHAOS_MAGIC	0x534f414843534255ULL	/* "UBSCHAOS" */

/* Wall-clock milliseconds: the run's deadline is handed to worker images
 * across exec, so it cannot be a monotonic time of one process. */
static inline long long
chaos_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Operation counters, in a small file every worker maps shared. Each is
 * bumped right after the operation returns, so a worker killed at any point
 * loses at most the one it was doing.
 */
enum chaos_counter {
	K_OPS,			/* every operation below */
	K_CONNECT,		/* blocking connects tried */
	K_CONNECT_NB,		/* non-blocking connects tried */
	K_ADMITTED,		/* connects that succeeded to a limited server */
	K_UNMATCHED,		/* connects that succeeded to the unmatched server */
	K_REFUSED,		/* refused by the shim (the compartment was full) */
	K_CONNECT_ERR,		/* any other failure (timeouts, aborted) */
	K_ABANDONED,		/* non-blocking connects closed while in progress */
	K_CLOSE,
	K_WRITE,
	K_DUP,
	K_DUP2,			/* dup2 onto another counted socket of ours */
	K_DUP2_FRESH,		/* dup2 onto a number that held no socket */
	K_DUP3,
	K_DUPFD,
	K_CLOSE_RANGE,
	K_FORK,
	K_CHILD_EXEC,		/* forked children that exec'ed a worker image */
	K_EXEC,			/* whole workers that exec'ed themselves */
	K_ADOPTED,		/* inherited sockets picked up after an exec */
	K_WORKER_START,
	K_EXIT,			/* workers that ended with exit() */
	K_UNDERSCORE_EXIT,	/* workers that ended with _exit() */
	K_PASS,			/* sockets handed to a child with SCM_RIGHTS (-k) */
	K_SPAWN,		/* children made with posix_spawn or vfork (-S) */
	K_MAX
};

struct chaos_stats {
	uint64_t magic;
	_Atomic uint64_t n[K_MAX];
};

#endif
