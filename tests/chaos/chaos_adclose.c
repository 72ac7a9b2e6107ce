/* chaos_adclose.c - the chaos run's window closer: closes adaptive windows back to back until SIGKILLed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admit/admit.h"
#include "log.h"
#include "sys.h"
#include "chaos.h"

/*
 * usage: chaos_adclose SEGMENT UNTIL_MS SEED
 *
 * Attaches to the segment (as the CLI does, not preloaded) and, until
 * UNTIL_MS (CLOCK_REALTIME ms), feeds every adaptive compartment samples
 * through ad_sample with a clock that runs ahead by a window per call, so
 * that nearly every call wins a window by compare-and-swap and moves the
 * limit word: nearly all of its time is spent inside a window close. The
 * chaos driver SIGKILLs it every few milliseconds, so kills land between the
 * CAS on win_start, the exchange of the sums and the CAS on ctl. The
 * latencies are random around a base, so the limit moves between its
 * bounds while the workers are admitted against it. Exit 0 at the end, 1 if
 * the segment never appeared.
 */
int
main(int argc, char **argv)
{
	char err[BS_ERRLEN];
	struct seg *s = NULL;
	long long until;
	uint64_t rng, fake = 0;

	if (argc != 4)
		return 2;
	until = atoll(argv[2]);
	rng = strtoull(argv[3], NULL, 0) | 1;
	while (seg_open(argv[1], true, &s, err, sizeof(err)) < 0) {
		struct timespec ts = { 0, 5 * 1000000 };

		if (chaos_now_ms() >= until)
			return 1;
		nanosleep(&ts, NULL);
	}
	while (chaos_now_ms() < until) {
		for (uint32_t i = 0; i < seg_header(s)->ncomp; i++) {
			struct seg_comp *c = seg_comp(s, i);
			uint64_t now = now_mono_us(), lat;

			if (c == NULL || atomic_load(&c->ad.mode) != AD_ON)
				continue;
			rng ^= rng << 13;
			rng ^= rng >> 7;
			rng ^= rng << 17;
			/* 1 to 64 ms: a backend that is sometimes queued. */
			lat = 1000 + rng % 63000;
			if (fake < now)
				fake = now;
			fake += 11000;	/* past a 10 ms window every call */
			ad_sample(c, (int)atomic_load(&c->ad.kind), lat, fake);
		}
	}
	seg_close(s);
	return 0;
}
