/* cmd_drill.c - `bulkshim drill`: its options, the three windows (baseline, drill, after), the timeline plot, and `drill stop`. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "drill.h"

/*
 * A drill runs in the foreground: it measures every compartment and every
 * probe for --baseline, starts the faults (drill_seg.c), measures them for
 * --for, stops them and measures --after. The faults' deadline is in the
 * segment, so a CLI that is killed leaves nothing running past it; one
 * that gets SIGINT or SIGTERM stops the drill first and judges what it
 * measured.
 */

#define DRILL_TICK_MS		200	/* how often the compartments are sampled */
#define DEFAULT_FOR_MS		30000
#define DEFAULT_WINDOW_MS	5000
#define DEFAULT_RATE		5

static volatile sig_atomic_t got_signal;

static void
on_signal(int sig)
{
	got_signal = sig;
}

/* ---- parsing ---- */

/* A duration: "8s", "500ms", "2m", "1.5s", "1h"; a bare number is seconds.
 * False on junk, a negative or a value past a day. */
static bool
parse_duration(const char *s, uint64_t *ms)
{
	char *end;
	double v, unit = 1000;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno != 0 || !(v >= 0))
		return false;
	if (strcmp(end, "ms") == 0)
		unit = 1;
	else if (strcmp(end, "s") == 0 || *end == '\0')
		unit = 1000;
	else if (strcmp(end, "m") == 0)
		unit = 60000;
	else if (strcmp(end, "h") == 0)
		unit = 3600000;
	else
		return false;
	v *= unit;
	if (v > 86400000.0)
		return false;
	*ms = (uint64_t)llround(v);
	return true;
}

/* A fraction: "0.25" or "25%", above 0 and at most 1, into parts per million. */
static bool
parse_fraction(const char *s, uint32_t *ppm)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno != 0)
		return false;
	if (strcmp(end, "%") == 0)
		v /= 100;
	else if (*end != '\0')
		return false;
	if (!(v > 0 && v <= 1))
		return false;
	*ppm = (uint32_t)llround(v * 1e6);
	if (*ppm == 0)
		*ppm = 1;
	return true;
}

/* --tolerance success=PP, latency=FACTOR or slack=D, comma-separated. */
static bool
parse_tolerance(const char *arg, struct drill_tol *t)
{
	char buf[256], *save = NULL, *tok;

	if (strlen(arg) >= sizeof(buf))
		return false;
	snprintf(buf, sizeof(buf), "%s", arg);
	for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '='), *end;
		double v;
		uint64_t ms;

		if (eq == NULL)
			return false;
		*eq++ = '\0';
		if (strcmp(tok, "slack") == 0) {
			if (!parse_duration(eq, &ms))
				return false;
			t->slack_ms = ms;
			continue;
		}
		errno = 0;
		v = strtod(eq, &end);
		if (end == eq || errno != 0 || (*end != '\0' && strcmp(end, "%") != 0))
			return false;
		if (strcmp(tok, "success") == 0 && v >= 0 && v <= 100)
			t->success_pp = v;
		else if (strcmp(tok, "latency") == 0 && v >= 1 && v <= 1000)
			t->factor = v;
		else
			return false;
	}
	return true;
}

static void
no_such_comp(const struct seg *s, const char *name)
{
	fprintf(stderr, "bulkshim: no compartment \"%s\" in segment %s; it has:", name,
	    CLI_SEGNAME(seg_header(s)->name));
	for (uint32_t i = 0; i < s->ncomp && i < 16; i++)
		fprintf(stderr, " %s", CLI_SEGNAME(seg_comp(s, i)->name));
	fputc('\n', stderr);
}

/* The config file to name in the refusal of a drill: -c FILE, else the one
 * the segment was last set up from, else the default. */
static const char *
config_named(const struct cli_target *t, const struct seg *s, char *buf, size_t len)
{
	const char *path = seg_header(s)->config_path;

	if (t->config != NULL)
		return t->config;
	if (path[0] != '\0') {
		snprintf(buf, len, "%.*s", (int)strnlen(path, PATH_MAX), path);
		log_scrub(buf, strlen(buf));
		return buf;
	}
	return cli_config_path(t);
}

/* ---- drill stop ---- */

static int
cmd_drill_stop(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	struct seg *s;
	int c, stopped = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "c:h", longopts, NULL)) != -1) {
		if (c == 'c')
			t.config = optarg;
		else if (c == 'h')
			return cli_help("drill stop", stdout, 0);
		else
			return cli_help("drill stop", stderr, 2);
	}
	if (argc - optind > 1)
		return cli_help("drill stop", stderr, 2);
	if (cli_open(&t, true, &s) < 0)
		return 1;
	for (uint32_t i = 0; i < s->ncomp; i++) {
		struct cli_drill d;

		if (optind < argc && strncmp(seg_comp(s, i)->name, argv[optind], BS_NAME_MAX) != 0)
			continue;
		cli_read_drill(seg_comp(s, i), &d);
		if (!d.running)
			continue;
		drill_seg_stop(s, i);
		printf("stopped the drill on %s (started by pid %d, %.1fs left)\n",
		    CLI_SEGNAME(seg_comp(s, i)->name), (int)d.by_pid, (double)d.remaining_ms / 1000);
		stopped++;
	}
	if (optind < argc && seg_comp_find(s, argv[optind]) < 0) {
		no_such_comp(s, argv[optind]);
		seg_close(s);
		return 2;
	}
	if (stopped == 0)
		printf("no drill runs%s%s in segment %s\n", optind < argc ? " on " : "",
		    optind < argc ? argv[optind] : "", CLI_SEGNAME(seg_header(s)->name));
	seg_close(s);
	return 0;
}

/* ---- the run ---- */


struct run {
	struct seg *s;
	struct drill_report rep;
	uint64_t phase_start[PH_N];	/* CLOCK_MONOTONIC ms, 0 = not begun */
	uint64_t end_ms;
	uint64_t began_ms;
	uint64_t late_ms;		/* the current window's second half begins */
	struct cli_snap first;		/* at the start of the current window */
	uint32_t *over0, *over_max;
	uint32_t *prev_in_use;		/* at the sample before */
	struct drill_tick *ticks;
	size_t nticks, cap;
};

static void
hist_delta(const struct cli_hist *a, const struct cli_hist *b, struct cli_hist *out)
{
	memset(out, 0, sizeof(*out));
	for (int i = 0; i < BS_HIST_BUCKETS; i++) {
		out->bucket[i] = b->bucket[i] >= a->bucket[i] ? b->bucket[i] - a->bucket[i] : 0;
		out->total += out->bucket[i];
	}
	out->count = out->total;
	out->sum_us = b->sum_us >= a->sum_us ? b->sum_us - a->sum_us : 0;
}

static void
note_tick(struct run *r, int ph, const struct cli_snap *snap)
{
	const struct cli_comp *c = &snap->comp[r->rep.comp];

	if (r->nticks == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 512;
		struct drill_tick *v = realloc(r->ticks, cap * sizeof(*v));

		if (v == NULL)
			return;
		r->ticks = v;
		r->cap = cap;
	}
	r->ticks[r->nticks++] = (struct drill_tick){ now_mono_ms() - r->began_ms, c->in_use,
		c->live_limit, ph };
}

/* One sample of every compartment in window ph. */
static void
sample(struct run *r, int ph, const struct cli_snap *snap)
{
	for (uint32_t i = 0; i < snap->ncomp && i < r->rep.ncomp; i++) {
		const struct cli_comp *c = &snap->comp[i];
		struct drill_cwin *w = &r->rep.win[i][ph];

		w->measured = true;
		if (c->in_use > w->max_in_use)
			w->max_in_use = c->in_use;
		/* Admitted past the limit: above it and more than at the sample
		 * before. A limit lowered under connections already open (`set`,
		 * an adaptive limit cut by the slow dependency) revokes nothing,
		 * and is no leak. */
		if (c->live_limit != UINT32_MAX && c->in_use > c->live_limit &&
		    c->in_use > r->prev_in_use[i])
			w->samples_over++;
		r->prev_in_use[i] = c->in_use;
		if (c->over > r->over_max[i])
			r->over_max[i] = c->over;
		w->end_in_use = c->in_use;
		w->end_limit = c->live_limit;
		if (now_mono_ms() >= r->late_ms && (!w->late || c->in_use < w->late_min_in_use)) {
			w->late = true;
			w->late_min_in_use = c->in_use;
			w->late_limit = c->live_limit;
		}
	}
	note_tick(r, ph, snap);
}

/* Window ph begins: its first snapshot. */
static int
window_begin(struct run *r, int ph)
{
	if (cli_snap_read(r->s, &r->first) < 0)
		return -ENOMEM;
	r->phase_start[ph] = now_mono_ms();
	r->late_ms = UINT64_MAX;
	for (uint32_t i = 0; i < r->first.ncomp && i < r->rep.ncomp; i++) {
		r->over0[i] = r->over_max[i] = r->first.comp[i].over;
		if (ph == PH_BASELINE)
			r->prev_in_use[i] = r->first.comp[i].in_use;
	}
	sample(r, ph, &r->first);
	return 0;
}

/* Window ph ends: the deltas between its first and last snapshots. */
static void
window_end(struct run *r, int ph)
{
	struct cli_snap last;

	r->rep.phase_ms[ph] = now_mono_ms() - r->phase_start[ph];
	if (r->rep.phase_ms[ph] == 0)
		r->rep.phase_ms[ph] = 1;
	if (cli_snap_read(r->s, &last) < 0) {
		cli_snap_free(&r->first);
		return;
	}
	sample(r, ph, &last);
	for (uint32_t i = 0; i < last.ncomp && i < r->rep.ncomp; i++) {
		const struct cli_comp *a = &r->first.comp[i], *b = &last.comp[i];
		struct drill_cwin *w = &r->rep.win[i][ph];

		w->admitted = b->admitted >= a->admitted ? b->admitted - a->admitted : 0;
		w->rejected = b->rejected >= a->rejected ? b->rejected - a->rejected : 0;
		hist_delta(&a->h_reply, &b->h_reply, &w->reply);
		hist_delta(&a->h_wait, &b->h_wait, &w->wait);
		w->over_grew = r->over_max[i] > r->over0[i] ? r->over_max[i] - r->over0[i] : 0;
	}
	cli_snap_free(&last);
	cli_snap_free(&r->first);
}

static void
nap(uint64_t ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* Samples window ph until until_ms (CLOCK_MONOTONIC), a signal or, in the
 * drill window, a stop by someone else (the drill's id moved). True when
 * it ran to the end. */
static bool
measure(struct run *r, int ph, uint64_t until_ms, uint64_t id)
{
	r->late_ms = r->phase_start[ph] + (until_ms - r->phase_start[ph]) / 2;
	for (;;) {
		struct cli_snap snap;
		uint64_t now = now_mono_ms();

		if (got_signal)
			return false;
		if (ph == PH_DRILL && drill_seg_id(r->s, r->rep.comp) != id)
			return false;
		if (now >= until_ms)
			return true;
		nap(until_ms - now < DRILL_TICK_MS ? until_ms - now : DRILL_TICK_MS);
		if (cli_snap_read(r->s, &snap) == 0) {
			sample(r, ph, &snap);
			cli_snap_free(&snap);
		}
	}
}

/* ---- drill ---- */

struct opts {
	struct cli_target t;
	const char *comp, *plot;
	struct drill_spec spec;
	struct drill_tol tol;
	uint64_t baseline_ms, after_ms;
	uint32_t rate;
	bool json, force;
	struct drill_probe probe[DRILL_MAX_PROBES];
	size_t nprobe;
};

static int
usage_error(const char *fmt, const char *arg)
{
	fputs("bulkshim drill: ", stderr);
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	return cli_help("drill", stderr, DRILL_EX_REFUSED);
}

static int
parse(int argc, char **argv, struct opts *o)
{
	enum { O_DELAY = 256, O_STALL, O_REFUSE, O_RESET, O_CDELAY, O_FRACTION, O_FOR, O_BASELINE,
		O_AFTER, O_PROBE, O_RATE, O_TOL, O_JSON, O_PLOT, O_FORCE };
	static const struct option longopts[] = {
		{ "delay", required_argument, NULL, O_DELAY },
		{ "stall", no_argument, NULL, O_STALL },
		{ "refuse", no_argument, NULL, O_REFUSE },
		{ "reset", no_argument, NULL, O_RESET },
		{ "connect-delay", required_argument, NULL, O_CDELAY },
		{ "fraction", required_argument, NULL, O_FRACTION },
		{ "for", required_argument, NULL, O_FOR },
		{ "baseline", required_argument, NULL, O_BASELINE },
		{ "after", required_argument, NULL, O_AFTER },
		{ "probe", required_argument, NULL, O_PROBE },
		{ "probe-rate", required_argument, NULL, O_RATE },
		{ "tolerance", required_argument, NULL, O_TOL },
		{ "json", no_argument, NULL, O_JSON },
		{ "plot", required_argument, NULL, O_PLOT },
		{ "force", no_argument, NULL, O_FORCE },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	uint64_t ms;
	int c;

	o->spec.for_ms = DEFAULT_FOR_MS;
	o->baseline_ms = o->after_ms = DEFAULT_WINDOW_MS;
	o->rate = DEFAULT_RATE;
	o->tol = (struct drill_tol){ 5, 3, 250 };
	optind = 1;
	while ((c = getopt_long(argc, argv, "c:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'c':
			o->t.config = optarg;
			break;
		case O_DELAY:
		case O_CDELAY:
			if (!parse_duration(optarg, &ms) || ms == 0 || ms > DRILL_MAX_FOR_MS)
				return usage_error("not a delay (500ms, 8s, at most 10m): %s", optarg);
			if (c == O_DELAY)
				o->spec.delay_ms = (uint32_t)ms;
			else
				o->spec.connect_delay_ms = (uint32_t)ms;
			o->spec.faults |= c == O_DELAY ? DRILL_DELAY : DRILL_CONNECT_DELAY;
			break;
		case O_STALL:
			o->spec.faults |= DRILL_STALL;
			break;
		case O_REFUSE:
			o->spec.faults |= DRILL_REFUSE;
			break;
		case O_RESET:
			o->spec.faults |= DRILL_RESET;
			break;
		case O_FRACTION:
			if (!parse_fraction(optarg, &o->spec.fraction_ppm))
				return usage_error("not a fraction (0.25 or 25%%, above 0): %s", optarg);
			break;
		case O_FOR:
			if (!parse_duration(optarg, &ms) || ms == 0)
				return usage_error("not a duration: %s", optarg);
			if (ms > DRILL_MAX_FOR_MS)
				return usage_error("--for %s: a drill lasts 10m at most", optarg);
			o->spec.for_ms = ms;
			break;
		case O_BASELINE:
		case O_AFTER:
			if (!parse_duration(optarg, &ms) || ms > DRILL_MAX_WINDOW_MS)
				return usage_error("not a window (0 to 10m): %s", optarg);
			*(c == O_BASELINE ? &o->baseline_ms : &o->after_ms) = ms;
			break;
		case O_PROBE:
			if (o->nprobe == DRILL_MAX_PROBES)
				return usage_error("%s: 16 probes at most", optarg);
			pthread_mutex_init(&o->probe[o->nprobe].lock, NULL);
			o->probe[o->nprobe].what = optarg;
			o->probe[o->nprobe].url = strncmp(optarg, "http://", 7) == 0 ||
			    strncmp(optarg, "https://", 8) == 0;
			o->nprobe++;
			break;
		case O_RATE:
			if (!cli_parse_u64(optarg, &ms) || ms == 0 || ms > DRILL_MAX_RATE)
				return usage_error("--probe-rate %s: 1 to 50 a second", optarg);
			o->rate = (uint32_t)ms;
			break;
		case O_TOL:
			if (!parse_tolerance(optarg, &o->tol))
				return usage_error("--tolerance %s: success=PP, latency=FACTOR, slack=D",
				    optarg);
			break;
		case O_JSON:
			o->json = true;
			break;
		case O_PLOT:
			o->plot = optarg;
			break;
		case O_FORCE:
			o->force = true;
			break;
		case 'h':
			return cli_help("drill", stdout, 0);
		default:
			return cli_help("drill", stderr, DRILL_EX_REFUSED);
		}
	}
	if (argc - optind != 1)
		return cli_help("drill", stderr, DRILL_EX_REFUSED);
	o->comp = argv[optind];
	if (o->spec.faults == 0)
		return usage_error("%sno fault: --delay, --stall, --refuse, --reset or --connect-delay",
		    "");
	for (size_t k = 0; k < o->nprobe; k++) {
		o->probe[k].rate = o->rate;
		o->probe[k].timeout_ms = o->spec.for_ms < DRILL_PROBE_TIMEOUT_MS ?
		    (uint32_t)o->spec.for_ms : DRILL_PROBE_TIMEOUT_MS;
	}
	return -1;
}

/* Whether the drill may start now: 0, or the exit status after saying why. */
static int
may_start(const struct opts *o, const struct seg *s, uint32_t i)
{
	struct cli_drill d;
	char buf[PATH_MAX];

	cli_read_drill(seg_comp(s, i), &d);
	if (!d.allowed) {
		fprintf(stderr, "bulkshim: drills are not allowed in compartment %s: add `drills = "
		    "true;` to %s (globally or in the compartment)\n", o->comp,
		    config_named(&o->t, s, buf, sizeof(buf)));
		return DRILL_EX_REFUSED;
	}
	if (d.running) {
		fprintf(stderr, "bulkshim: a drill runs on %s already (started by pid %d, %.1fs "
		    "left); `bulkshim drill stop %s` ends it\n", o->comp, (int)d.by_pid,
		    (double)d.remaining_ms / 1000, o->comp);
		return DRILL_EX_REFUSED;
	}
	return 0;
}

/* The report's arrays for the segment's compartments and the probes;
 * -ENOMEM leaves what was allocated for free_report. */
static int
alloc_report(struct run *r, struct opts *o, uint32_t i)
{
	uint32_t n = r->s->ncomp;

	r->rep.segment = CLI_SEGNAME(seg_header(r->s)->name);
	r->rep.compartment = o->comp;
	r->rep.comp = i;
	r->rep.spec = o->spec;
	r->rep.tol = o->tol;
	r->rep.ncomp = n;
	r->rep.nprobe = o->nprobe;
	r->rep.probe = o->probe;
	r->rep.names = calloc(n + 1, sizeof(*r->rep.names));
	r->rep.enforce = calloc(n + 1, sizeof(bool));
	r->rep.max_wait_ms = calloc(n + 1, sizeof(uint32_t));
	r->rep.win = calloc(n + 1, sizeof(*r->rep.win));
	r->rep.pwin = calloc(o->nprobe + 1, sizeof(*r->rep.pwin));
	r->over0 = calloc(n + 1, sizeof(uint32_t));
	r->over_max = calloc(n + 1, sizeof(uint32_t));
	r->prev_in_use = calloc(n + 1, sizeof(uint32_t));
	if (r->prev_in_use == NULL || r->rep.names == NULL || r->rep.enforce == NULL || r->rep.max_wait_ms == NULL ||
	    r->rep.win == NULL || r->rep.pwin == NULL || r->over0 == NULL || r->over_max == NULL)
		return -ENOMEM;
	for (uint32_t k = 0; k < n; k++) {
		const struct seg_comp *sc = seg_comp(r->s, k);

		snprintf(r->rep.names[k], sizeof(r->rep.names[k]), "%s",
		    CLI_SEGNAME(sc->name));
		r->rep.enforce[k] = atomic_load(&sc->enforce) != 0;
		r->rep.max_wait_ms[k] = atomic_load(&sc->max_wait_ms);
	}
	return 0;
}

static void
free_report(struct run *r)
{
	free(r->rep.names);
	free(r->rep.enforce);
	free(r->rep.max_wait_ms);
	free(r->rep.win);
	free(r->rep.pwin);
	free(r->over0);
	free(r->over_max);
	free(r->prev_in_use);
	free(r->ticks);
}

static void
progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A line on stderr about where the run is, so that stdout is the verdict. */
static void
progress(const char *fmt, ...)
{
	va_list ap;

	fputs("bulkshim drill: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* The three windows; returns the exit status, after printing the verdict. */
static int
run_drill(struct run *r, struct opts *o)
{
	struct sigaction sa;
	uint64_t deadline = 0, id;
	char spec[256], buf[32];
	bool ended_early = false;
	int v;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	/* A probed server that closes while a request is written must fail
	 * that attempt, not end the drill (TLS writes are not sent with
	 * MSG_NOSIGNAL). */
	signal(SIGPIPE, SIG_IGN);
	r->began_ms = now_mono_ms();
	if (o->nprobe > 0 && drill_probes_start(o->probe, o->nprobe) < 0) {
		fprintf(stderr, "bulkshim: cannot start the probes\n");
		return DRILL_EX_NOT_RUN;
	}
	progress("baseline for %s", drill_duration(o->baseline_ms, buf, sizeof(buf)));
	if (window_begin(r, PH_BASELINE) < 0)
		goto nomem;
	ended_early = !measure(r, PH_BASELINE, r->phase_start[PH_BASELINE] + o->baseline_ms, 0);
	window_end(r, PH_BASELINE);
	if (!ended_early) {
		/* Asked again: the segment may have changed during the baseline. */
		if ((v = may_start(o, r->s, r->rep.comp)) != 0) {
			drill_probes_stop(o->probe, o->nprobe);
			return v;
		}
		if (window_begin(r, PH_DRILL) < 0)
			goto nomem;
		if (drill_seg_start(r->s, r->rep.comp, &o->spec, &deadline) != DRILL_OK) {
			window_end(r, PH_DRILL);
			r->rep.phase_ms[PH_DRILL] = 0;
			drill_probes_stop(o->probe, o->nprobe);
			fprintf(stderr, "bulkshim: the drill could not start: another began first\n");
			return DRILL_EX_REFUSED;
		}
		id = drill_seg_id(r->s, r->rep.comp);
		progress("%s on %s for %s (pid %d stops it at the end, else its deadline does)",
		    drill_spec_text(&o->spec, spec, sizeof(spec)), o->comp,
		    drill_duration(o->spec.for_ms, buf, sizeof(buf)), (int)getpid());
		ended_early = !measure(r, PH_DRILL, deadline, id);
		/* Ours to stop only while it is still ours. */
		if (drill_seg_id(r->s, r->rep.comp) == id)
			drill_seg_stop(r->s, r->rep.comp);
		window_end(r, PH_DRILL);
		progress("drill %s", ended_early ? "ended early" : "over");
	}
	/* A drill stopped by `drill stop` still gets its after window; one
	 * stopped by a signal is judged on what was measured. */
	if (!got_signal && r->phase_start[PH_DRILL] != 0 && o->after_ms > 0) {
		progress("after for %s", drill_duration(o->after_ms, buf, sizeof(buf)));
		if (window_begin(r, PH_AFTER) < 0)
			goto nomem;
		if (!measure(r, PH_AFTER, r->phase_start[PH_AFTER] + o->after_ms, 0))
			ended_early = true;
		window_end(r, PH_AFTER);
	}
	r->end_ms = now_mono_ms();
	r->rep.interrupted = ended_early;
	drill_probes_stop(o->probe, o->nprobe);
	for (size_t k = 0; k < o->nprobe; k++)
		drill_probe_windows(&o->probe[k], r->phase_start, r->end_ms, r->rep.pwin[k]);
	if (got_signal)
		progress("%s: the drill was stopped", strsignal(got_signal));
	v = drill_verdict(stdout, &r->rep, o->json);
	if (o->plot != NULL)
		drill_plot(o->plot, &r->rep, r->ticks, r->nticks, r->phase_start, r->began_ms,
		    r->end_ms);
	return v;
nomem:
	if (deadline != 0)
		drill_seg_stop(r->s, r->rep.comp);
	drill_probes_stop(o->probe, o->nprobe);
	fprintf(stderr, "bulkshim: out of memory\n");
	return DRILL_EX_NOT_RUN;
}

int
cmd_drill(int argc, char **argv)
{
	struct opts o;
	struct run r;
	char name[BS_NAME_MAX];
	int i, v;

	if (argc > 1 && strcmp(argv[1], "stop") == 0) {
		argv[1] = argv[0];
		return cmd_drill_stop(argc - 1, argv + 1);
	}
	memset(&o, 0, sizeof(o));
	memset(&r, 0, sizeof(r));
	if ((v = parse(argc, argv, &o)) >= 0)
		return v;
	if (cli_open(&o.t, true, &r.s) < 0)
		return DRILL_EX_NOT_RUN;
	if ((i = seg_comp_find(r.s, o.comp)) < 0) {
		no_such_comp(r.s, o.comp);
		seg_close(r.s);
		return DRILL_EX_REFUSED;
	}
	snprintf(name, sizeof(name), "%s", CLI_SEGNAME(seg_header(r.s)->name));
	if (cli_live_processes(r.s) == 0) {
		if (!o.force) {
			fprintf(stderr, "bulkshim: no process is attached to segment %s: nothing "
			    "would see the drill (--force runs it anyway)\n", name);
			seg_close(r.s);
			return DRILL_EX_NOT_RUN;
		}
		fprintf(stderr, "bulkshim: no process is attached to segment %s; drilling it "
		    "anyway (--force)\n", name);
	}
	if ((v = may_start(&o, r.s, (uint32_t)i)) != 0) {
		seg_close(r.s);
		return v;
	}
	if (alloc_report(&r, &o, (uint32_t)i) < 0) {
		fprintf(stderr, "bulkshim: out of memory\n");
		v = DRILL_EX_NOT_RUN;
	} else {
		r.rep.segment = name;
		v = run_drill(&r, &o);
	}
	drill_probes_free(o.probe, o.nprobe);
	free_report(&r);
	seg_close(r.s);
	return v;
}
