/* drill_verdict.c - a drill's windows judged: the containment table, the leaks with their figures, the JSON object and the exit status. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "drill.h"

/*
 * The walls a drill checks (bulkshim(1), DRILLS):
 *   a) the drilled compartment: never above its live limit, `over` never
 *      grew (observe mode's leak), and its refusals were fast;
 *   b) every other compartment: its reply p99 within tolerance of its
 *      baseline;
 *   c) every probe: its success rate and p99 within tolerance of baseline;
 *   d) after the drill: every probe back within tolerance, the drilled
 *      compartment back under its limit.
 * A window with no samples on either side of a comparison says nothing
 * about it: that wall is shown as "-" and not held against the drill.
 */

#define MAX_LEAKS	64
#define LEAK_LEN	320

struct leaks {
	size_t n;
	char what[MAX_LEAKS][LEAK_LEN];
	char wall[MAX_LEAKS][BS_NAME_MAX + 256];
};

static const char *const phase_name[PH_N] = { "baseline", "drill", "after" };

static void
leak(struct leaks *l, const char *wall, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void
leak(struct leaks *l, const char *wall, const char *fmt, ...)
{
	va_list ap;

	if (l->n == MAX_LEAKS)
		return;
	snprintf(l->wall[l->n], sizeof(l->wall[l->n]), "%s", wall);
	va_start(ap, fmt);
	vsnprintf(l->what[l->n], sizeof(l->what[l->n]), fmt, ap);
	va_end(ap);
	l->n++;
}

/* ---- a probe's windows ---- */

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* The nearest-rank quantile permille/1000 of sorted v[0..n). */
static uint64_t
quantile(const uint32_t *v, size_t n, unsigned permille)
{
	size_t rank;

	if (n == 0)
		return 0;
	rank = (n * permille + 999) / 1000;
	return v[rank ? rank - 1 : 0];
}

/* The window of an attempt: the one it began in, except that one begun
 * in the baseline and still running when the drill began is the drill's
 * (the fault met it); -1 for none. */
static int
window_of(const struct drill_sample *s, const uint64_t *phase_start, uint64_t phase_end)
{
	int ph = -1;

	for (int k = 0; k < PH_N; k++) {
		if (phase_start[k] != 0 && s->start_ms >= phase_start[k])
			ph = k;
	}
	if (ph < 0 || s->start_ms >= phase_end)
		return -1;
	if (ph == PH_BASELINE && phase_start[PH_DRILL] != 0 &&
	    s->start_ms + s->ms >= phase_start[PH_DRILL])
		ph = PH_DRILL;
	return ph;
}

void
drill_probe_windows(struct drill_probe *p, const uint64_t *phase_start, uint64_t phase_end,
    struct drill_pwin *out)
{
	uint32_t *ms[PH_N];
	size_t k[PH_N] = { 0 };

	memset(out, 0, PH_N * sizeof(*out));
	pthread_mutex_lock(&p->lock);
	for (int ph = 0; ph < PH_N; ph++)
		ms[ph] = malloc((p->n ? p->n : 1) * sizeof(uint32_t));
	for (size_t i = 0; i < p->n; i++) {
		const struct drill_sample *s = &p->samples[i];
		int ph = window_of(s, phase_start, phase_end);

		if (ph < 0)
			continue;
		out[ph].n++;
		out[ph].ok += s->ok;
		if (ms[ph] != NULL)
			ms[ph][k[ph]++] = s->ms;
	}
	pthread_mutex_unlock(&p->lock);
	for (int ph = 0; ph < PH_N; ph++) {
		if (ms[ph] != NULL && k[ph] > 0) {
			qsort(ms[ph], k[ph], sizeof(uint32_t), cmp_u32);
			out[ph].p50_ms = quantile(ms[ph], k[ph], 500);
			out[ph].p99_ms = quantile(ms[ph], k[ph], 990);
		}
		free(ms[ph]);
	}
}

/* ---- text ---- */

const char *
drill_duration(uint64_t ms, char *buf, size_t len)
{
	if (ms < 1000)
		snprintf(buf, len, "%llums", (unsigned long long)ms);
	else if (ms < 60000 || ms % 60000 != 0)
		snprintf(buf, len, "%.3gs", (double)ms / 1000);
	else
		snprintf(buf, len, "%llum", (unsigned long long)(ms / 60000));
	return buf;
}

/* A histogram bound in us as a duration: "<= 1ms". */
static const char *
dur_us(uint64_t us, char *buf, size_t len)
{
	if (us < 1000)
		snprintf(buf, len, "%lluus", (unsigned long long)us);
	else
		drill_duration(us / 1000, buf, len);
	return buf;
}

/* Appends the text to buf (pos bytes of len used), cut at len. */
static void
put(char *buf, size_t len, size_t *pos, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void
put(char *buf, size_t len, size_t *pos, const char *fmt, ...)
{
	va_list ap;
	int w;

	if (*pos + 1 >= len)
		return;
	va_start(ap, fmt);
	w = vsnprintf(buf + *pos, len - *pos, fmt, ap);
	va_end(ap);
	if (w > 0)
		*pos = *pos + (size_t)w < len ? *pos + (size_t)w : len - 1;
}

const char *
drill_spec_text(const struct drill_spec *spec, char *buf, size_t len)
{
	size_t pos = 0;
	char d[32];

	buf[0] = '\0';
	if (spec->faults & DRILL_DELAY)
		put(buf, len, &pos, "delay %s", drill_duration(spec->delay_ms, d, sizeof(d)));
	if (spec->faults & DRILL_STALL)
		put(buf, len, &pos, "%sstall", pos ? ", " : "");
	if (spec->faults & DRILL_REFUSE)
		put(buf, len, &pos, "%srefuse", pos ? ", " : "");
	if (spec->faults & DRILL_RESET)
		put(buf, len, &pos, "%sreset", pos ? ", " : "");
	if (spec->faults & DRILL_CONNECT_DELAY)
		put(buf, len, &pos, "%sconnect delay %s", pos ? ", " : "",
		    drill_duration(spec->connect_delay_ms, d, sizeof(d)));
	if (spec->fraction_ppm != 0 && spec->fraction_ppm != 1000000)
		put(buf, len, &pos, " on %.4g%% of connections", (double)spec->fraction_ppm / 1e4);
	return buf;
}

static double
pct(uint64_t ok, uint64_t n)
{
	return n ? 100.0 * (double)ok / (double)n : 0;
}

/* A latency held to baseline: at most factor x base, or base + slack. */
static uint64_t
allowed(const struct drill_tol *t, uint64_t base)
{
	uint64_t a = (uint64_t)(t->factor * (double)base), b = base + t->slack_ms;

	return a > b ? a : b;
}

/* ---- the walls ---- */

/* a) and the half of d) about the drilled compartment. */
static bool
judge_drilled(const struct drill_report *r, struct leaks *l)
{
	const struct drill_cwin *w = r->win[r->comp];
	const char *name = r->names[r->comp];
	char wall[BS_NAME_MAX + 32], a[32], b[32];
	uint64_t fast_us = 2ULL * r->max_wait_ms[r->comp] * 1000 + 4096;
	size_t before = l->n;

	snprintf(wall, sizeof(wall), "compartment %s", name);
	if (w[PH_DRILL].samples_over > 0)
		leak(l, wall, "compartment %s: admitted past its live limit during the drill: up "
		    "to %u in use against %s", name, w[PH_DRILL].max_in_use,
		    w[PH_DRILL].end_limit == UINT32_MAX ? "(none)" :
		    (snprintf(a, sizeof(a), "%u", w[PH_DRILL].end_limit), a));
	if (w[PH_DRILL].over_grew > 0)
		leak(l, wall, "compartment %s: %u connections let past its full limit during the "
		    "drill (observe mode: enforce = false)", name, w[PH_DRILL].over_grew);
	if (w[PH_DRILL].rejected > 0 && w[PH_DRILL].wait.total > 0 &&
	    cli_hist_quantile_us(&w[PH_DRILL].wait, 990) > fast_us)
		leak(l, wall, "compartment %s: refusals were slow: p99 wait %s during the drill, "
		    "%s allowed", name, dur_us(cli_hist_quantile_us(&w[PH_DRILL].wait, 990), a,
		    sizeof(a)), dur_us(fast_us, b, sizeof(b)));
	/* Back under its limit at least once in the second half of the
	 * after window: a busy compartment may touch its limit now and then. */
	if (r->phase_ms[PH_AFTER] > 0 && w[PH_AFTER].late && w[PH_AFTER].late_limit != UINT32_MAX &&
	    w[PH_AFTER].late_min_in_use >= w[PH_AFTER].late_limit)
		leak(l, wall, "compartment %s: still %u/%u in use at the end of the after window",
		    name, w[PH_AFTER].late_min_in_use, w[PH_AFTER].late_limit);
	return l->n == before;
}

/* b) for compartment i (not the drilled one). */
static bool
judge_other(const struct drill_report *r, uint32_t i, struct leaks *l)
{
	const struct drill_cwin *w = r->win[i];
	uint64_t base, during;
	char wall[BS_NAME_MAX + 32], a[32], b[32];

	if (w[PH_BASELINE].reply.total == 0 || w[PH_DRILL].reply.total == 0)
		return true;
	base = cli_hist_quantile_us(&w[PH_BASELINE].reply, 990);
	during = cli_hist_quantile_us(&w[PH_DRILL].reply, 990);
	if (during / 1000 <= allowed(&r->tol, base / 1000))
		return true;
	snprintf(wall, sizeof(wall), "compartment %s", r->names[i]);
	leak(l, wall, "compartment %s: reply p99 %s during the drill, %s before", r->names[i],
	    dur_us(during, a, sizeof(a)), dur_us(base, b, sizeof(b)));
	return false;
}

/* c) or d) for probe k in window ph. */
static bool
judge_probe(const struct drill_report *r, size_t k, int ph, struct leaks *l)
{
	const struct drill_pwin *w = r->pwin[k];
	const char *what = ph == PH_DRILL ? "during the drill" : "after the drill";
	char wall[512], a[32], b[32];
	bool held = true;

	if (w[PH_BASELINE].n == 0 || w[ph].n == 0)
		return true;
	snprintf(wall, sizeof(wall), "probe %s", r->probe[k].what);
	if (pct(w[ph].ok, w[ph].n) < pct(w[PH_BASELINE].ok, w[PH_BASELINE].n) - r->tol.success_pp) {
		leak(l, wall, "probe %s: success %.0f%% %s, %.0f%% before", r->probe[k].what,
		    pct(w[ph].ok, w[ph].n), what, pct(w[PH_BASELINE].ok, w[PH_BASELINE].n));
		held = false;
	}
	if (w[ph].p99_ms > allowed(&r->tol, w[PH_BASELINE].p99_ms)) {
		leak(l, wall, "probe %s: p99 %s %s, %s before", r->probe[k].what,
		    drill_duration(w[ph].p99_ms, a, sizeof(a)), what, drill_duration(w[PH_BASELINE].p99_ms, b, sizeof(b)));
		held = false;
	}
	return held;
}

/* ---- the table ---- */

static const char *
comp_cell(const struct drill_report *r, uint32_t i, int ph, char *buf, size_t len)
{
	const struct drill_cwin *w = &r->win[i][ph];
	char lim[16], p99[32];

	if (!w->measured || r->phase_ms[ph] == 0)
		return "-";
	if (w->end_limit == UINT32_MAX)
		snprintf(lim, sizeof(lim), "-");
	else
		snprintf(lim, sizeof(lim), "%u", w->end_limit);
	if (w->reply.total > 0)
		dur_us(cli_hist_quantile_us(&w->reply, 990), p99, sizeof(p99));
	else
		snprintf(p99, sizeof(p99), "-");
	snprintf(buf, len, "%u/%s, %llu refused, p99 %s", w->max_in_use, lim,
	    (unsigned long long)w->rejected, p99);
	return buf;
}

static const char *
probe_cell(const struct drill_report *r, size_t k, int ph, char *buf, size_t len)
{
	const struct drill_pwin *w = &r->pwin[k][ph];
	char p99[32];

	if (w->n == 0)
		return "-";
	snprintf(buf, len, "%.0f%% of %llu, p99 %s", pct(w->ok, w->n), (unsigned long long)w->n,
	    drill_duration(w->p99_ms, p99, sizeof(p99)));
	return buf;
}

static void
text(FILE *f, const struct drill_report *r, const bool *comp_held, const bool *probe_held,
    const struct leaks *l, int verdict)
{
	char spec[256], d[3][32], cell[PH_N][128];
	size_t walls = 0;
	int nw = 24;

	for (uint32_t i = 0; i < r->ncomp; i++)
		walls += !comp_held[i];
	for (size_t k = 0; k < r->nprobe; k++)
		walls += !probe_held[k];
	for (uint32_t i = 0; i < r->ncomp; i++) {
		int w = (int)strlen(r->names[i]) + (i == r->comp ? 10 : 0);

		nw = w > nw ? w : nw;
	}
	for (size_t k = 0; k < r->nprobe; k++) {
		int w = (int)strlen(r->probe[k].what) + 6;

		nw = w > nw ? w : nw;
	}
	nw = nw > 60 ? 60 : nw;
	fprintf(f, "drill on %s (segment %s): %s for %s; baseline %s, after %s%s\n",
	    r->compartment, r->segment, drill_spec_text(&r->spec, spec, sizeof(spec)),
	    drill_duration(r->phase_ms[PH_DRILL], d[0], sizeof(d[0])),
	    drill_duration(r->phase_ms[PH_BASELINE], d[1], sizeof(d[1])),
	    drill_duration(r->phase_ms[PH_AFTER], d[2], sizeof(d[2])),
	    r->interrupted ? " (ended early)" : "");
	fprintf(f, "\n%-*s  %-30s %-30s %-30s %s\n", nw, "WALL", "BEFORE", "DURING", "AFTER",
	    "RESULT");
	for (uint32_t i = 0; i < r->ncomp; i++) {
		char name[BS_NAME_MAX + 16];

		snprintf(name, sizeof(name), "%s%s", r->names[i], i == r->comp ? " (drilled)" : "");
		fprintf(f, "%-*.*s  %-30s %-30s %-30s %s%s\n", nw, nw, name,
		    comp_cell(r, i, PH_BASELINE, cell[0], sizeof(cell[0])),
		    comp_cell(r, i, PH_DRILL, cell[1], sizeof(cell[1])),
		    comp_cell(r, i, PH_AFTER, cell[2], sizeof(cell[2])),
		    comp_held[i] ? "held" : "LEAKED", r->enforce[i] ? "" : " (observe)");
	}
	for (size_t k = 0; k < r->nprobe; k++) {
		char name[512];

		snprintf(name, sizeof(name), "probe %s", r->probe[k].what);
		fprintf(f, "%-*.*s  %-30s %-30s %-30s %s\n", nw, nw, name,
		    probe_cell(r, k, PH_BASELINE, cell[0], sizeof(cell[0])),
		    probe_cell(r, k, PH_DRILL, cell[1], sizeof(cell[1])),
		    probe_cell(r, k, PH_AFTER, cell[2], sizeof(cell[2])),
		    probe_held[k] ? "held" : "LEAKED");
	}
	fputc('\n', f);
	for (size_t k = 0; k < l->n; k++)
		fprintf(f, "LEAKED: %s\n", l->what[k]);
	if (verdict == DRILL_EX_NOT_RUN)
		fputs("verdict: not run (no drill window)\n", f);
	else if (verdict == DRILL_EX_CONTAINED)
		fprintf(f, "verdict: contained: every wall held%s\n", r->phase_ms[PH_AFTER] == 0 ?
		    " (no after window: recovery not measured)" : "");
	else
		fprintf(f, "verdict: leaked: %zu wall%s leaked\n", walls, walls == 1 ? "" : "s");
}

/* ---- JSON ---- */

static void
json_hist(FILE *f, const char *key, const struct cli_hist *h)
{
	fprintf(f, ", \"%s_p50_us\": %llu, \"%s_p99_us\": %llu, \"%s_samples\": %llu", key,
	    (unsigned long long)cli_hist_quantile_us(h, 500), key,
	    (unsigned long long)cli_hist_quantile_us(h, 990), key, (unsigned long long)h->total);
}

static void
json(FILE *f, const struct drill_report *r, const bool *comp_held, const bool *probe_held,
    const struct leaks *l, int verdict)
{
	static const uint32_t bits[] = { DRILL_DELAY, DRILL_STALL, DRILL_REFUSE, DRILL_RESET,
		DRILL_CONNECT_DELAY };
	char name[32];
	bool first = true;

	fprintf(f, "{\"verdict\": \"%s\", \"exit\": %d, \"segment\": ", verdict ==
	    DRILL_EX_CONTAINED ? "contained" : verdict == DRILL_EX_LEAKED ? "leaked" : "not run",
	    verdict);
	cli_json_string(f, r->segment);
	fputs(", \"compartment\": ", f);
	cli_json_string(f, r->compartment);
	fputs(", \"faults\": [", f);
	for (size_t k = 0; k < sizeof(bits) / sizeof(bits[0]); k++) {
		if (!(r->spec.faults & bits[k]))
			continue;
		fprintf(f, "%s\"%s\"", first ? "" : ", ", cli_drill_faults(bits[k], name,
		    sizeof(name)));
		first = false;
	}
	fprintf(f, "], \"delay_ms\": %u, \"connect_delay_ms\": %u, \"fraction\": %.6g, "
	    "\"interrupted\": %s", r->spec.delay_ms, r->spec.connect_delay_ms,
	    r->spec.fraction_ppm == 0 ? 1.0 : (double)r->spec.fraction_ppm / 1e6,
	    r->interrupted ? "true" : "false");
	fprintf(f, ", \"tolerance\": {\"success_pp\": %g, \"factor\": %g, \"slack_ms\": %llu}",
	    r->tol.success_pp, r->tol.factor, (unsigned long long)r->tol.slack_ms);
	fputs(", \"phases\": {", f);
	for (int ph = 0; ph < PH_N; ph++)
		fprintf(f, "%s\"%s\": {\"ms\": %llu}", ph ? ", " : "", phase_name[ph],
		    (unsigned long long)r->phase_ms[ph]);
	fputs("}, \"compartments\": [", f);
	for (uint32_t i = 0; i < r->ncomp; i++) {
		fputs(i ? ", {\"name\": " : "{\"name\": ", f);
		cli_json_string(f, r->names[i]);
		fprintf(f, ", \"drilled\": %s, \"enforce\": %s, \"held\": %s, \"windows\": {",
		    i == r->comp ? "true" : "false", r->enforce[i] ? "true" : "false",
		    comp_held[i] ? "true" : "false");
		for (int ph = 0; ph < PH_N; ph++) {
			const struct drill_cwin *w = &r->win[i][ph];

			fprintf(f, "%s\"%s\": ", ph ? ", " : "", phase_name[ph]);
			if (!w->measured || r->phase_ms[ph] == 0) {
				fputs("null", f);
				continue;
			}
			fprintf(f, "{\"max_in_use\": %u, \"in_use\": %u, \"live_limit\": ", w->max_in_use,
			    w->end_in_use);
			if (w->end_limit == UINT32_MAX)
				fputs("null", f);
			else
				fprintf(f, "%u", w->end_limit);
			fprintf(f, ", \"samples_over_limit\": %u, \"over_grew\": %u, \"admitted\": %llu, "
			    "\"rejected\": %llu", w->samples_over, w->over_grew,
			    (unsigned long long)w->admitted, (unsigned long long)w->rejected);
			json_hist(f, "reply", &w->reply);
			json_hist(f, "wait", &w->wait);
			fputc('}', f);
		}
		fputs("}}", f);
	}
	fputs("], \"probes\": [", f);
	for (size_t k = 0; k < r->nprobe; k++) {
		fputs(k ? ", {\"probe\": " : "{\"probe\": ", f);
		cli_json_string(f, r->probe[k].what);
		fprintf(f, ", \"kind\": \"%s\", \"held\": %s, \"windows\": {", r->probe[k].url ?
		    "url" : "command", probe_held[k] ? "true" : "false");
		for (int ph = 0; ph < PH_N; ph++) {
			const struct drill_pwin *w = &r->pwin[k][ph];

			fprintf(f, "%s\"%s\": ", ph ? ", " : "", phase_name[ph]);
			if (r->phase_ms[ph] == 0) {
				fputs("null", f);
				continue;
			}
			fprintf(f, "{\"attempts\": %llu, \"ok\": %llu, \"success\": %.4g, "
			    "\"p50_ms\": %llu, \"p99_ms\": %llu}", (unsigned long long)w->n,
			    (unsigned long long)w->ok, w->n ? (double)w->ok / (double)w->n : 0.0,
			    (unsigned long long)w->p50_ms, (unsigned long long)w->p99_ms);
		}
		fputs("}}", f);
	}
	fputs("], \"leaks\": [", f);
	for (size_t k = 0; k < l->n; k++) {
		fputs(k ? ", {\"wall\": " : "{\"wall\": ", f);
		cli_json_string(f, l->wall[k]);
		fputs(", \"what\": ", f);
		cli_json_string(f, l->what[k]);
		fputc('}', f);
	}
	fputs("]}\n", f);
}

int
drill_verdict(FILE *f, const struct drill_report *r, bool as_json)
{
	struct leaks *l = calloc(1, sizeof(*l));
	bool *comp_held = calloc(r->ncomp + 1, sizeof(bool));
	bool *probe_held = calloc(r->nprobe + 1, sizeof(bool));
	int verdict = DRILL_EX_CONTAINED;

	if (l == NULL || comp_held == NULL || probe_held == NULL) {
		free(l);
		free(comp_held);
		free(probe_held);
		fprintf(stderr, "bulkshim: out of memory\n");
		return DRILL_EX_NOT_RUN;
	}
	for (uint32_t i = 0; i < r->ncomp; i++)
		comp_held[i] = i == r->comp ? judge_drilled(r, l) : judge_other(r, i, l);
	for (size_t k = 0; k < r->nprobe; k++) {
		bool during = judge_probe(r, k, PH_DRILL, l);
		bool after = r->phase_ms[PH_AFTER] == 0 || judge_probe(r, k, PH_AFTER, l);

		probe_held[k] = during && after;
	}
	if (r->phase_ms[PH_DRILL] == 0)
		verdict = DRILL_EX_NOT_RUN;
	else if (l->n > 0)
		verdict = DRILL_EX_LEAKED;
	if (as_json)
		json(f, r, comp_held, probe_held, l, verdict);
	else
		text(f, r, comp_held, probe_held, l, verdict);
	free(l);
	free(comp_held);
	free(probe_held);
	return verdict;
}
