/* drill_seg.c - a drill's words in the segment: started, stopped and read for the views. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "drill.h"

/*
 * The library reads a drill at each call of a matched connection and
 * treats it as running while `faults` is set and the CLOCK_MONOTONIC
 * millisecond is below `deadline_ms`. So a start writes the settings first
 * and `faults` last (a process that sees the faults sees their settings),
 * and a drill whose CLI was killed ends at its deadline with nothing left
 * to end it. Every reader here uses the same test.
 */

static bool
running(const struct seg_drill *d, uint64_t now)
{
	return atomic_load(&d->faults) != 0 && now < atomic_load(&d->deadline_ms);
}

enum drill_refusal
drill_start(struct seg *s, uint32_t i, const struct drill_spec *spec, uint64_t *deadline_ms)
{
	struct seg_drill *d = &seg_comp(s, i)->drill;
	uint64_t now = now_mono_ms();

	if (atomic_load(&d->allowed) != 1)
		return DRILL_NOT_ALLOWED;
	/* A drill past its deadline is over even with its faults still
	 * set (its CLI was killed): it may be replaced. */
	if (running(d, now))
		return DRILL_BUSY;
	atomic_store(&d->faults, 0);
	atomic_store(&d->delay_ms, spec->delay_ms);
	atomic_store(&d->connect_delay_ms, spec->connect_delay_ms);
	atomic_store(&d->fraction_ppm, spec->fraction_ppm);
	atomic_store(&d->by_pid, (int32_t)getpid());
	atomic_store(&d->start_ms, now);
	atomic_store(&d->start_realtime_ms, now_real_ms());
	atomic_store(&d->touched, 0);
	atomic_store(&d->spared, 0);
	*deadline_ms = now + spec->for_ms;
	atomic_store(&d->deadline_ms, *deadline_ms);
	atomic_store(&d->faults, spec->faults);
	atomic_fetch_add(&d->id, 1);
	seg_settings_changed(s);
	return DRILL_OK;
}

void
drill_stop(struct seg *s, uint32_t i)
{
	struct seg_drill *d = &seg_comp(s, i)->drill;

	atomic_store(&d->faults, 0);
	atomic_store(&d->deadline_ms, 0);
	atomic_fetch_add(&d->id, 1);
	seg_settings_changed(s);
}

uint64_t
drill_id(const struct seg *s, uint32_t i)
{
	return atomic_load(&seg_comp(s, i)->drill.id);
}

/* ---- for the views ---- */

void
cli_read_drill(const struct seg_comp *sc, struct cli_drill *out)
{
	const struct seg_drill *d = &sc->drill;
	uint64_t now = now_mono_ms(), deadline;

	memset(out, 0, sizeof(*out));
	out->allowed = atomic_load(&d->allowed) == 1;
	out->faults = atomic_load(&d->faults);
	deadline = atomic_load(&d->deadline_ms);
	/* A deadline further than the longest drill is none a CLI wrote. */
	out->running = out->faults != 0 && now < deadline && deadline - now <= DRILL_MAX_FOR_MS;
	if (!out->running) {
		out->faults = 0;
		return;
	}
	out->remaining_ms = deadline - now;
	out->delay_ms = atomic_load(&d->delay_ms);
	out->connect_delay_ms = atomic_load(&d->connect_delay_ms);
	out->fraction_ppm = atomic_load(&d->fraction_ppm);
	out->by_pid = atomic_load(&d->by_pid);
	out->id = atomic_load(&d->id);
	out->start_realtime_ms = atomic_load(&d->start_realtime_ms);
	out->touched = atomic_load(&d->touched);
	out->spared = atomic_load(&d->spared);
}

const char *
cli_drill_faults(uint32_t faults, char *buf, size_t len)
{
	static const struct { uint32_t bit; const char *name; } names[] = {
		{ DRILL_DELAY, "delay" }, { DRILL_STALL, "stall" }, { DRILL_REFUSE, "refuse" },
		{ DRILL_RESET, "reset" }, { DRILL_CONNECT_DELAY, "connect_delay" },
	};
	size_t pos = 0;

	buf[0] = '\0';
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		int w;

		if (!(faults & names[k].bit))
			continue;
		w = snprintf(buf + pos, len - pos, "%s%s", pos ? "," : "", names[k].name);
		if (w < 0 || (size_t)w >= len - pos)
			break;
		pos += (size_t)w;
	}
	return buf;
}

void
cli_json_drill(FILE *f, const struct cli_drill *d)
{
	static const uint32_t bits[] = { DRILL_DELAY, DRILL_STALL, DRILL_REFUSE, DRILL_RESET,
		DRILL_CONNECT_DELAY };
	char name[32];
	bool first = true;

	if (!d->running) {
		fputs(", \"drill\": null", f);
		return;
	}
	fputs(", \"drill\": {\"faults\": [", f);
	for (size_t k = 0; k < sizeof(bits) / sizeof(bits[0]); k++) {
		if (!(d->faults & bits[k]))
			continue;
		fprintf(f, "%s\"%s\"", first ? "" : ", ", cli_drill_faults(bits[k], name,
		    sizeof(name)));
		first = false;
	}
	fprintf(f, "], \"remaining_seconds\": %.1f, \"delay_ms\": %u, \"connect_delay_ms\": %u, "
	    "\"fraction\": %.6g, \"touched\": %llu, \"spared\": %llu, \"by_pid\": %d, "
	    "\"id\": %llu, \"started_ms\": %llu}", (double)d->remaining_ms / 1000, d->delay_ms,
	    d->connect_delay_ms, d->fraction_ppm == 0 ? 1.0 : (double)d->fraction_ppm / 1e6,
	    (unsigned long long)d->touched, (unsigned long long)d->spared, (int)d->by_pid,
	    (unsigned long long)d->id, (unsigned long long)d->start_realtime_ms);
}

void
cli_drill_metrics(FILE *f, const char *seg, const struct cli_comp *all, uint32_t n,
    void (*labels)(FILE *, const char *, const char *, const char *, const char *))
{
	fputs("# HELP bulkshim_drill_active 1 while a drill (bulkshim drill) puts faults on the "
	    "compartment's connections, 0 otherwise.\n# TYPE bulkshim_drill_active gauge\n", f);
	for (uint32_t i = 0; i < n; i++) {
		fputs("bulkshim_drill_active", f);
		labels(f, seg, all[i].name, NULL, NULL);
		fprintf(f, " %d\n", all[i].drill.running ? 1 : 0);
	}
	fputs("# HELP bulkshim_drill_remaining_seconds Time left before the running drill's "
	    "deadline ends it (0 when none runs).\n# TYPE bulkshim_drill_remaining_seconds "
	    "gauge\n", f);
	for (uint32_t i = 0; i < n; i++) {
		fputs("bulkshim_drill_remaining_seconds", f);
		labels(f, seg, all[i].name, NULL, NULL);
		fprintf(f, " %.3f\n", (double)all[i].drill.remaining_ms / 1000);
	}
	/* The library zeroes the count at each start: a counter of the
	 * running drill, whose resets Prometheus's rate() handles. */
	fputs("# HELP bulkshim_drill_touched_total Calls the running drill delayed, stalled, "
	    "refused or reset (since it started; no series when none runs).\n"
	    "# TYPE bulkshim_drill_touched_total counter\n", f);
	for (uint32_t i = 0; i < n; i++) {
		if (!all[i].drill.running)
			continue;
		fputs("bulkshim_drill_touched_total", f);
		labels(f, seg, all[i].name, NULL, NULL);
		fprintf(f, " %llu\n", (unsigned long long)all[i].drill.touched);
	}
}
