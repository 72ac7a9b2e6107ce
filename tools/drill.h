/* drill.h - what the files of `bulkshim drill` share: a drill's spec, its probes, its windows and its verdict. */
#ifndef BULKSHIM_DRILL_H
#define BULKSHIM_DRILL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"

/*
 * cmd_drill.c parses the options and runs the three windows; drill_seg.c
 * starts and stops the faults in the segment (and reads them for the
 * views, through cli.h); drill_probe.c probes the service; drill_verdict.c
 * turns what the windows measured into the table, the JSON object and the
 * exit status. The files call downward in that order.
 */

#define DRILL_MAX_FOR_MS	DRILL_MAX_MS	/* --for at most: the longest drill the library acts on */
#define DRILL_MAX_WINDOW_MS	(10ULL * 60 * 1000)	/* --baseline and --after at most */
#define DRILL_MAX_PROBES	16
#define DRILL_MAX_RATE		50	/* --probe-rate at most, a second per probe */
#define DRILL_PROBE_TIMEOUT_MS	5000	/* a probe's timeout at most */

/* The exit statuses of `bulkshim drill`. */
enum { DRILL_EX_CONTAINED = 0, DRILL_EX_LEAKED = 1, DRILL_EX_REFUSED = 2, DRILL_EX_NOT_RUN = 3 };

enum drill_phase { PH_BASELINE, PH_DRILL, PH_AFTER, PH_N };

/* What a drill puts on its compartment. */
struct drill_spec {
	uint32_t faults;		/* DRILL_* */
	uint32_t delay_ms, connect_delay_ms;
	uint32_t fraction_ppm;		/* 0 or 1000000: every connection */
	uint64_t for_ms;
};

/* The tolerances of the verdict (--tolerance), see the man page's DRILLS. */
struct drill_tol {
	double success_pp;	/* a probe's success may fall this many percentage points */
	double factor;		/* a p99 may grow to factor x its baseline... */
	uint64_t slack_ms;	/* ...or to baseline + slack, whichever is higher */
};

/* ---- drill_seg.c ---- */

/* Why drill_start refused. */
enum drill_refusal { DRILL_OK = 0, DRILL_NOT_ALLOWED, DRILL_BUSY };
/* Starts spec on compartment i (< ncomp) of s, by_pid being this process,
 * with admit/drill.c's drill_start: refused when the compartment does not
 * allow drills or another drill runs or is being written there. Then bumps
 * settings_seq. Returns
 * DRILL_OK with the new deadline (CLOCK_MONOTONIC ms) in *deadline_ms, or
 * the refusal with nothing written. */
enum drill_refusal drill_seg_start(struct seg *s, uint32_t i, const struct drill_spec *spec,
    uint64_t *deadline_ms);
/* Stops the drill on compartment i (drill_end) and bumps settings_seq.
 * Harmless on a compartment with no drill. */
void drill_seg_stop(struct seg *s, uint32_t i);
/* The drill's id now (a start or a stop by anyone moves it). */
uint64_t drill_seg_id(const struct seg *s, uint32_t i);

/* ---- drill_probe.c ---- */

/* One attempt of a probe: when it began (CLOCK_MONOTONIC ms), how long it
 * took, and whether it succeeded. */
struct drill_sample {
	uint64_t start_ms;
	uint32_t ms;
	bool ok;
};

/* A probe: an http:// or https:// URL fetched with libcurl (success: a
 * status below 400), or a shell command (success: exit 0). */
struct drill_probe {
	char *what;		/* the argument (argv's) */
	bool url;
	uint32_t rate;			/* attempts a second */
	uint32_t timeout_ms;
	pthread_mutex_t lock;
	struct drill_sample *samples;	/* under lock */
	size_t n, cap;
	uint32_t running;		/* attempts under way, under lock */
	uint64_t skipped;		/* attempts not begun: too many under way */
	pthread_t thread;
	bool started;
};

/* Starts probing each of probes[0..n) (their locks initialised) at its rate, in threads, until
 * drill_probes_stop. Returns 0, or -errno (nothing left running). */
int drill_probes_start(struct drill_probe *probes, size_t n);
/* Stops scheduling, waits for the attempts under way (each ends within
 * its timeout) and frees nothing: the samples stay for the verdict. */
void drill_probes_stop(struct drill_probe *probes, size_t n);
/* Frees the samples; cannot fail. */
void drill_probes_free(struct drill_probe *probes, size_t n);

/* ---- drill_plot.c ---- */

struct drill_report;

/* The drilled compartment, sampled every DRILL_TICK_MS: for the plot. */
struct drill_tick {
	uint64_t ms;		/* since the run began */
	uint32_t in_use, limit;	/* limit UINT32_MAX: none */
	int phase;
};

/* Draws the timeline into png with gnuplot, one point a second: each
 * probe's p99 and success among the attempts begun in that second, and the
 * drilled compartment's most connections in use against its live limit;
 * the drill window (phase_start, CLOCK_MONOTONIC ms, 0 = not run) shaded.
 * Says on stderr when it cannot ("gnuplot not installed: no plot"). */
void drill_plot(const char *png, const struct drill_report *rep, const struct drill_tick *ticks,
    size_t nticks, const uint64_t *phase_start, uint64_t began_ms, uint64_t end_ms);

/* ---- drill_verdict.c ---- */

/* A compartment over one window, from the snapshots at its ends and the
 * samples taken every DRILL_TICK_MS in between. */
struct drill_cwin {
	bool measured;
	uint32_t max_in_use, end_in_use, end_limit;	/* limit UINT32_MAX: none */
	/* The fewest in use, and the limit then, among the samples of the
	 * window's second half: whether it came back under its limit. */
	uint32_t late_min_in_use, late_limit;
	bool late;
	uint32_t samples_over;		/* samples with in_use above the live limit and rising */
	uint32_t over_grew;		/* `over` rose during the window */
	uint64_t admitted, rejected;	/* the window's deltas */
	struct cli_hist reply, wait;	/* the window's deltas */
};

/* A probe over one window. */
struct drill_pwin {
	uint64_t n, ok;
	uint64_t p50_ms, p99_ms;
};

/* Everything a drill measured: the verdict's input. */
struct drill_report {
	const char *segment, *compartment;
	uint32_t comp;			/* the drilled compartment's index */
	struct drill_spec spec;
	struct drill_tol tol;
	uint64_t phase_ms[PH_N];	/* how long each window ran, 0 = not run */
	bool interrupted;		/* a signal or `drill stop` ended it early */
	uint32_t ncomp;
	char (*names)[BS_NAME_MAX];	/* ncomp names */
	bool *enforce;			/* ncomp: the compartment enforced its limits */
	uint32_t *max_wait_ms;		/* ncomp */
	struct drill_cwin (*win)[PH_N];	/* ncomp x PH_N */
	size_t nprobe;
	struct drill_probe *probe;
	struct drill_pwin (*pwin)[PH_N];	/* nprobe x PH_N */
};

/* Fills a probe's windows from its samples, each attempt in the window in
 * which it began, one begun in the baseline and still running when the
 * drill began in the drill's (phase_start[p]: CLOCK_MONOTONIC ms, 0 for a
 * window that did not run; phase_end the end of the last). Cannot fail
 * (out of memory, the quantiles are 0). */
void drill_probe_windows(struct drill_probe *p, const uint64_t *phase_start,
    uint64_t phase_end, struct drill_pwin *out);

/* The verdict: DRILL_EX_CONTAINED, DRILL_EX_LEAKED or DRILL_EX_NOT_RUN
 * (the drill window did not run). Prints the containment table and the
 * leaks to f, or with json one JSON object. Write errors are left to f. */
int drill_verdict(FILE *f, const struct drill_report *r, bool json);

/* "250ms", "1.5s", "2m" for a duration in ms, into buf; returns buf. */
const char *drill_duration(uint64_t ms, char *buf, size_t len);
/* "delay 2s, refuse" for a spec, into buf (cut to len); returns buf. */
const char *drill_spec_text(const struct drill_spec *spec, char *buf, size_t len);

#endif
