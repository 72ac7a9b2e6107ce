/* drill_seg.c - a drill's words in the segment: started, stopped and read for the views. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "drill.h"

/*
 * The library's admit/drill.c owns the words: its drill_start and drill_end
 * write them under the sequence lock that `id` is (two CLIs cannot write at
 * once, and a reader never mixes two drills), and a drill runs while its
 * faults are set and the CLOCK_MONOTONIC millisecond is below its
 * deadline, so one whose CLI was killed ends on time with nothing left to
 * end it. This file adds what the CLI does around them: the deadline from
 * --for, and the bump of settings_seq after each change, which the
 * descriptors that cached a plain verdict wait for.
 */

enum drill_refusal
drill_seg_start(struct seg *s, uint32_t i, const struct drill_spec *spec, uint64_t *deadline_ms)
{
	struct drill_view v = { 0 };
	uint64_t now = now_mono_ms();
	int r;

	v.faults = spec->faults;
	v.delay_ms = spec->delay_ms;
	v.connect_delay_ms = spec->connect_delay_ms;
	v.fraction_ppm = spec->fraction_ppm;
	v.deadline_ms = now + spec->for_ms;
	r = drill_start(seg_comp(s, i), &v, now, now_real_ms(), getpid());
	if (r == -EPERM)
		return DRILL_NOT_ALLOWED;
	if (r < 0)
		return DRILL_BUSY;
	seg_settings_changed(s);
	*deadline_ms = v.deadline_ms;
	return DRILL_OK;
}

void
drill_seg_stop(struct seg *s, uint32_t i)
{
	drill_end(seg_comp(s, i));
	seg_settings_changed(s);
}

uint64_t
drill_seg_id(const struct seg *s, uint32_t i)
{
	return atomic_load(&seg_comp(s, i)->drill.id);
}

/* ---- for the views ---- */

void
cli_read_drill(struct seg_comp *sc, struct cli_drill *out)
{
	const struct seg_drill *d = &sc->drill;
	struct drill_view v;
	uint64_t now = now_mono_ms();

	memset(out, 0, sizeof(*out));
	out->allowed = atomic_load(&d->allowed) != 0;
	/* A deadline further than the longest drill is none a CLI wrote. */
	if (drill_read(sc, now, &v) == 0 || v.deadline_ms - now > DRILL_MAX_FOR_MS)
		return;
	out->running = true;
	out->faults = v.faults;
	out->remaining_ms = v.deadline_ms - now;
	out->delay_ms = v.delay_ms;
	out->connect_delay_ms = v.connect_delay_ms;
	out->fraction_ppm = v.fraction_ppm;
	out->id = v.id;
	out->by_pid = atomic_load(&d->by_pid);
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
