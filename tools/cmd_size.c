/* cmd_size.c - Little's law: `bulkshim size` from given figures, `suggest` from a snapshot's. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

/*
 * permits = ceil(rate x latency x headroom x (1 + retries)). The figures are
 * kept as exact decimals (mantissa / 10^scale) and multiplied in 128-bit
 * integers, so 0.1 x 3 is 0.3 and never rounds up to one permit too many.
 */

#define DIGITS_MAX	9	/* significant digits of one figure */
#define DECIMALS_MAX	9	/* digits after the point */

typedef unsigned __int128 u128;

struct dec {
	uint64_t m;	/* value = m / 10^scale */
	int scale;
};

static u128
pow10_u128(int n)
{
	u128 p = 1;

	while (n-- > 0)
		p *= 10;
	return p;
}

/* Parses "250", "0.25"; a latency may end in s, ms or us. Returns 0 or -1. */
static int
parse_dec(const char *s, bool unit, struct dec *out)
{
	int digits = 0, decimals = 0;
	bool point = false, any = false;
	const char *p = s;

	out->m = 0;
	out->scale = 0;
	for (; *p; p++) {
		if (*p == '.' && !point) {
			point = true;
			continue;
		}
		if (*p < '0' || *p > '9')
			break;
		any = true;
		if (out->m == 0 && *p == '0' && !point)
			continue;
		if (out->m != 0 || *p != '0')
			digits++;
		if (point)
			decimals++;
		if (digits > DIGITS_MAX || decimals > DECIMALS_MAX)
			return -1;
		out->m = out->m * 10 + (uint64_t)(*p - '0');
	}
	out->scale = decimals;
	if (!any)
		return -1;
	if (*p == '\0' || (unit && strcmp(p, "s") == 0))
		return 0;
	if (unit && strcmp(p, "ms") == 0)
		out->scale += 3;
	else if (unit && strcmp(p, "us") == 0)
		out->scale += 6;
	else
		return -1;
	return 0;
}

/* A latency written without a unit is in seconds; one longer than this is
 * far more likely milliseconds with the unit forgotten ("--latency 250"). */
#define LATENCY_BARE_MAX_S	60

/* Whether text, parsed into d, is a bare number of seconds above
 * LATENCY_BARE_MAX_S. */
static bool
implausible_seconds(const char *text, const struct dec *d)
{
	size_t n = strlen(text);

	if (n == 0 || text[n - 1] < '0' || text[n - 1] > '9')
		return false;
	return (u128)d->m > (u128)LATENCY_BARE_MAX_S * pow10_u128(d->scale);
}

/* Writes m / 10^scale with at least min_dec decimals and no trailing
 * zeros beyond them. */
static void
dec_text(u128 m, int scale, int min_dec, char *buf, size_t len)
{
	u128 p = pow10_u128(scale), ip = m / p, fp = m % p;
	char frac[40];
	int n;

	snprintf(frac, sizeof(frac), "%0*llu", scale, (unsigned long long)fp);
	frac[scale] = '\0';
	n = scale;
	while (n > min_dec && frac[n - 1] == '0')
		frac[--n] = '\0';
	for (; n < min_dec; n++)
		frac[n] = '0';
	frac[n] = '\0';
	snprintf(buf, len, "%llu%s%s", (unsigned long long)ip, n ? "." : "", frac);
}

static void
dec_show(const struct dec *d, int min_dec, char *buf, size_t len)
{
	dec_text(d->m, d->scale, min_dec, buf, len);
}

int
cmd_size(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "rps", required_argument, NULL, 'r' },
		{ "latency", required_argument, NULL, 'l' },
		{ "headroom", required_argument, NULL, 'H' },
		{ "retries", required_argument, NULL, 'k' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct dec rps, lat, head = { 2, 0 }, retries = { 0, 0 };
	char r[64], l[64], h[64], k[64];
	bool has_rps = false, has_lat = false, json = false;
	u128 num, den;
	uint64_t permits;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
		switch (c) {
		case 'r':
			has_rps = true;
			if (parse_dec(optarg, false, &rps) < 0 || rps.m == 0)
				goto bad;
			break;
		case 'l':
			has_lat = true;
			if (parse_dec(optarg, true, &lat) < 0 || lat.m == 0)
				goto bad;
			if (implausible_seconds(optarg, &lat)) {
				fprintf(stderr, "bulkshim: size: --latency %s has no unit, so it "
				    "reads %s seconds, more than a latency of %d s is likely to be: "
				    "write %sms for milliseconds, or %ss if seconds are meant\n",
				    optarg, optarg, LATENCY_BARE_MAX_S, optarg, optarg);
				return 2;
			}
			break;
		case 'H':
			if (parse_dec(optarg, false, &head) < 0 || head.m == 0)
				goto bad;
			break;
		case 'k':
			if (parse_dec(optarg, false, &retries) < 0)
				goto bad;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			return cli_help("size", stdout, 0);
		default:
			return cli_help("size", stderr, 2);
		}
	}
	if (optind != argc || !has_rps || !has_lat)
		return cli_help("size", stderr, 2);
	/* (1 + K) = (10^scale + m) / 10^scale */
	num = (u128)rps.m * lat.m * head.m * (pow10_u128(retries.scale) + retries.m);
	den = pow10_u128(rps.scale + lat.scale + head.scale + retries.scale);
	permits = (uint64_t)((num + den - 1) / den);
	dec_show(&rps, 0, r, sizeof(r));
	dec_show(&lat, 3, l, sizeof(l));
	dec_show(&head, 1, h, sizeof(h));
	dec_show(&retries, 0, k, sizeof(k));
	if (json) {
		dec_show(&lat, 0, l, sizeof(l));
		dec_show(&head, 0, h, sizeof(h));
		printf("{\"rps\": %s, \"latency_s\": %s, \"headroom\": %s, \"retries\": %s, "
		    "\"permits\": %llu}\n", r, l, h, k, (unsigned long long)permits);
		return 0;
	}
	printf("%s req/s \u00d7 %s s \u00d7 %s headroom \u00d7 (1 + %s %s) = %llu permit%s\n", r, l,
	    h, k, retries.m == 1 && retries.scale == 0 ? "retry" : "retries",
	    (unsigned long long)permits, permits == 1 ? "" : "s");
	if (permits > BS_MAX_LIMIT)
		fprintf(stderr, "bulkshim: %llu is above the largest limit a config accepts (%d)\n",
		    (unsigned long long)permits, BS_MAX_LIMIT);
	return 0;
bad:
	fprintf(stderr, "bulkshim: size: \"%s\" is not a positive number with at most %d digits "
	    "and %d decimals%s\n", optarg, DIGITS_MAX, DECIMALS_MAX,
	    c == 'l' ? " (units: s, ms, us)" : "");
	return 2;
}

/* ---- suggest ---- */

/*
 * Requests in flight are sized from what they are, not from the connect
 * rate: over a short window `suggest` watches the compartment and measures
 * the requests begun per second (admitted, and refused or let past in
 * observe mode), their mean reply time, and the most in flight at once.
 * Little's law gives the concurrency the rate and latency imply; the
 * demand is the larger of that and the peak seen (the lifetime peak of
 * admitted requests included). N threads that each keep one request in
 * flight show a peak of N, and N = rate x latency.
 *
 * Connections are sized from how long they are held, which the time a
 * connect() takes says nothing about: over the same window, the mean
 * number open and the admissions per second give the mean hold time
 * (Little's law read backwards), and the connections open, scaled by what
 * was asked for against what was admitted (refused calls would have held
 * as long), give the concurrency the callers wanted. A window in which
 * nothing was admitted (every connection outlives it) takes that ratio
 * from the compartment's lifetime counts.
 */
struct window {
	uint64_t begun, refused, replies, reply_us;	/* requests: counters at the start */
	uint32_t peak;		/* most in flight at once, overs included */
	uint64_t admitted, conn_refused;	/* connections: counters at the start */
	uint64_t open_sum, samples;	/* connections open, summed over the samples */
	uint32_t conn_peak;	/* most open at once */
};

struct inflight_advice {
	bool counted;		/* the compartment has max_inflight */
	double seconds;		/* the window */
	double rate;		/* requests begun per second, refused ones included */
	double mean_us;		/* mean reply time in the window (else lifetime) */
	uint32_t peak;
	uint64_t little;	/* ceil(rate x mean) */
	uint64_t demand;	/* max(peak, little) */
	uint64_t refused;	/* refused in the window (enforcing) */
};

struct conn_advice {
	bool watched;		/* a window was watched */
	double seconds;
	double rate;		/* connections admitted per second in the window */
	uint64_t refused;	/* refused in the window */
	double mean_open;	/* connections open on average */
	double hold_s;		/* mean hold: mean_open / rate; 0 = none admitted */
	uint32_t peak;		/* most open at once in the window */
	double asked;		/* (admitted + refused) / admitted, of the window or lifetime */
	bool lifetime_ratio;	/* asked is of the lifetime counts */
	uint64_t demand;	/* max(peak, ceil(mean_open x asked)) */
};

struct advice {
	const struct cli_comp *c;
	struct inflight_advice in;
	struct conn_advice co;
	const char *source;	/* "reply", "connect" or NULL without samples */
	uint64_t samples, p50_us, p99_us, suggested;
	uint64_t by_rate;	/* ceil(peak rate x p99 reply x 2); 0 without replies */
	uint32_t limit;		/* the limit compared with, UINT32_MAX = none */
	const char *limit_key;
	uint64_t refused;
	const char *verdict;
	/* In a pool: a guarantee for its usual need (p50) and a ceiling for
	 * its bursts (the larger of Little's law at p99 and its peak). */
	uint64_t guar, ceiling;
};

/* Connections refused by a limit (not by a full table): enforced, or only
 * counted in observe mode when observed is true. */
static uint64_t
conn_refusals(const struct cli_comp *c, bool observed)
{
	static const enum bs_reason limits[] = { REASON_FULL, REASON_WAIT_TIMEOUT,
	    REASON_TOO_MANY_WAITING, REASON_CLASS_FULL, REASON_POOL_FULL,
	    REASON_CLASS_SHARED_FULL };
	uint64_t n = 0;

	for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++)
		n += observed ? c->would_reject[limits[i]] : c->rejected_by[limits[i]];
	return n;
}

/* Requests refused for max_inflight. Those observe mode let past are
 * counted in inflight_admitted already. */
static uint64_t
inflight_refusals(const struct cli_comp *c)
{
	return c->rejected_by[REASON_INFLIGHT_FULL];
}

/* Watches every compartment for `seconds` from the snapshot start,
 * sampling the requests in flight and the connections open every 10 ms. */
static void
watch_window(const struct seg *s, const struct cli_snap *start, struct window *w,
    double seconds)
{
	uint64_t end = now_mono_ms() + (uint64_t)(seconds * 1000);
	uint32_t n = start->ncomp;

	for (uint32_t i = 0; i < n; i++) {
		const struct cli_comp *c = &start->comp[i];

		w[i].begun = c->inflight_admitted;
		w[i].refused = inflight_refusals(c);
		w[i].replies = c->h_reply.count;
		w[i].reply_us = c->h_reply.sum_us;
		w[i].peak = c->inflight;	/* the overs counted in */
		w[i].admitted = c->admitted;
		w[i].conn_refused = conn_refusals(c, false);
		w[i].open_sum = c->in_use;
		w[i].samples = 1;
		w[i].conn_peak = c->in_use;
	}
	while (now_mono_ms() < end) {
		struct timespec ts = { 0, 10 * 1000000L };

		nanosleep(&ts, NULL);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t now = cli_inflight_now(s, i), open = cli_in_use_now(s, i);

			if (now > w[i].peak)
				w[i].peak = now;
			if (open > w[i].conn_peak)
				w[i].conn_peak = open;
			w[i].open_sum += open;
			w[i].samples++;
		}
	}
}

/* The connection half of the advice, from the window w (NULL: none). */
static void
advise_conn(const struct window *w, double seconds, struct advice *a)
{
	const struct cli_comp *c = a->c;
	struct conn_advice *co = &a->co;
	uint64_t adm, ref, life_adm = c->admitted, life_ref = conn_refusals(c, false);
	double offered;

	if (w == NULL || seconds <= 0 || w->samples == 0)
		return;
	co->watched = true;
	co->seconds = seconds;
	adm = c->admitted - w->admitted;
	ref = life_ref - w->conn_refused;
	co->refused = ref;
	co->rate = (double)adm / seconds;
	co->mean_open = (double)w->open_sum / (double)w->samples;
	co->peak = w->conn_peak;
	co->hold_s = adm > 0 ? co->mean_open / co->rate : 0;
	/* Observe mode's would-be refusals are open already (counted in
	 * in use): only real refusals add to what was asked for. */
	if (adm > 0) {
		co->asked = (double)(adm + ref) / (double)adm;
	} else if (life_adm > 0) {
		co->asked = (double)(life_adm + life_ref) / (double)life_adm;
		co->lifetime_ratio = true;
	} else {
		co->asked = 1;
	}
	offered = co->mean_open * co->asked;
	co->demand = (uint64_t)offered;
	if ((double)co->demand < offered - 1e-9)
		co->demand++;
	if (co->peak > co->demand)
		co->demand = co->peak;
}

/* The in-flight half of the advice, from the window w (NULL: none). */
static void
advise_inflight(const struct window *w, double seconds, struct advice *a)
{
	const struct cli_comp *c = a->c;
	struct inflight_advice *in = &a->in;
	uint64_t replies = c->h_reply.count, sum = c->h_reply.sum_us;

	in->counted = c->inflight_limit != UINT32_MAX;
	if (!in->counted || w == NULL || seconds <= 0)
		return;
	in->seconds = seconds;
	in->refused = inflight_refusals(c) - w->refused;
	in->rate = (double)(c->inflight_admitted - w->begun + in->refused) / seconds;
	if (replies > w->replies)
		in->mean_us = (double)(sum - w->reply_us) / (double)(replies - w->replies);
	else if (replies > 0)
		in->mean_us = (double)sum / (double)replies;
	in->peak = w->peak > c->inflight_peak ? w->peak : c->inflight_peak;
	/* Rounded, not ceil: it estimates a mean, and the window's edges
	 * make the rate a little off either way. The peak bounds it below. */
	in->little = (uint64_t)(in->rate * in->mean_us / 1e6 + 0.5);
	in->demand = in->little > in->peak ? in->little : in->peak;
}

static void
advise(const struct cli_comp *c, const struct window *w, double seconds, struct advice *a)
{
	const struct cli_hist *h;
	bool by_requests;
	uint64_t by_hold;

	memset(a, 0, sizeof(*a));
	a->c = c;
	/* Request latency when requests were seen, else connect() time
	 * (shown, never sized from: a connect says nothing of a hold). */
	h = &c->h_reply;
	a->source = "reply";
	if (h->total == 0) {
		h = &c->h_connect;
		a->source = "connect";
	}
	if (h->total == 0)
		a->source = NULL;
	a->samples = h->total;
	a->p50_us = cli_hist_quantile_us(h, 500);
	a->p99_us = cli_hist_quantile_us(h, 990);
	if (h == &c->h_reply)
		a->by_rate = (uint64_t)(((u128)c->peak_rate * a->p99_us * 2 + 999999) / 1000000);
	advise_conn(w, seconds, a);
	by_hold = 2 * a->co.demand;
	a->suggested = a->by_rate > by_hold ? a->by_rate : by_hold;
	a->limit = c->limit != UINT32_MAX ? c->limit : c->inflight_limit;
	a->limit_key = c->limit != UINT32_MAX ? "max_connections" : "max_inflight";
	/* Calls the limits refused, or would have: a full socket or
	 * process table is the segment's size, not the limit's. */
	for (int r = 0; r < REASON_MAX; r++) {
		if (r != REASON_NO_SLOT && r != REASON_PROCESS_TABLE_FULL)
			a->refused += c->rejected_by[r] + c->would_reject[r];
	}
	advise_inflight(w, seconds, a);
	a->guar = (uint64_t)(((u128)c->peak_rate * a->p50_us * 2 + 999999) / 1000000);
	if (h != &c->h_reply)
		a->guar = a->co.demand;
	a->ceiling = a->suggested > c->peak ? a->suggested : c->peak;
	if (a->guar > a->ceiling)
		a->guar = a->ceiling;
	/* A compartment that counts only requests in flight is judged by
	 * them, not by its connect rate. */
	by_requests = c->limit == UINT32_MAX && a->in.counted;
	if (by_requests)
		a->suggested = a->in.demand;
	if (by_requests ? a->in.rate == 0 && a->in.peak == 0 :
	    a->suggested == 0 && a->refused == 0)
		a->verdict = "no data";
	else if (a->limit == UINT32_MAX)
		a->verdict = "no limit";
	else if (a->refused > 0 && a->suggested > a->limit)
		a->verdict = "too small";
	else if (a->refused > 0)
		/* Refused although the demand measured fits under the
		 * limit: a lower live limit (adaptive, fleet, pool, class)
		 * or bursts above the mean. Never "fits". */
		a->verdict = "refused";
	else if (a->suggested * 2 < a->limit)
		a->verdict = "too large";
	else
		a->verdict = "fits";
}

static void
seconds(uint64_t us, char *buf, size_t len)
{
	dec_text(us, 6, 0, buf, len);
}

/* What the window saw of connections: how long they are held and how many
 * the callers asked for. */
static void
print_conn(const struct advice *a)
{
	const struct conn_advice *co = &a->co;

	if (!co->watched)
		return;
	printf("  %-20s %.1f open on average, %u at most, %.1f admitted/s and %llu refused "
	    "over %g s; ", "connections", co->mean_open, co->peak, co->rate,
	    (unsigned long long)co->refused, co->seconds);
	if (co->hold_s > 0)
		printf("held %.3f s on average\n", co->hold_s);
	else if (co->mean_open > 0)
		printf("held longer than the window\n");
	else
		printf("none held\n");
	printf("  %-20s %.1f open \u00d7 %.2f asked per admitted (%s) -> %llu; "
	    "\u00d7 2 = %llu permit%s\n", "demand", co->mean_open, co->asked,
	    co->lifetime_ratio ? "lifetime" : "window", (unsigned long long)co->demand,
	    (unsigned long long)(2 * co->demand), co->demand * 2 == 1 ? "" : "s");
}

static void
print_advice(const struct advice *a)
{
	char p50[64], p99[64];

	seconds(a->p50_us, p50, sizeof(p50));
	seconds(a->p99_us, p99, sizeof(p99));
	printf("\n%s\n", a->c->name);
	printf("  %-20s %llu/s (highest in the last %d s: %llu/s)\n", "peak admission rate",
	    (unsigned long long)a->c->peak_rate, BS_RATE_SECONDS,
	    (unsigned long long)a->c->recent_rate);
	if (a->in.counted && a->in.seconds > 0) {
		printf("  %-20s %.1f/s over %g s (%llu refused), mean reply %.6f s, peak %u in "
		    "flight\n", "requests", a->in.rate, a->in.seconds,
		    (unsigned long long)a->in.refused, a->in.mean_us / 1e6, a->in.peak);
		printf("  %-20s %.1f/s \u00d7 %.6f s = %llu in flight; demand max(peak %u, "
		    "%llu) = %llu\n", "Little's law", a->in.rate, a->in.mean_us / 1e6,
		    (unsigned long long)a->in.little, a->in.peak, (unsigned long long)a->in.little,
		    (unsigned long long)a->in.demand);
	}
	if (a->c->limit == UINT32_MAX && a->in.counted) {
		/* The connect-rate formula says nothing of requests. */
	} else {
		if (a->source == NULL)
			printf("  %-20s no samples yet\n", "latency");
		else
			printf("  %-20s p50 <= %s s, p99 <= %s s (%s, %llu sample%s)\n", "latency",
			    p50, p99, a->source, (unsigned long long)a->samples,
			    a->samples == 1 ? "" : "s");
		if (a->by_rate > 0)
			printf("  %-20s ceil(%llu/s \u00d7 %s s \u00d7 2) = %llu permit%s\n",
			    "Little's law", (unsigned long long)a->c->peak_rate, p99,
			    (unsigned long long)a->by_rate, a->by_rate == 1 ? "" : "s");
		print_conn(a);
	}
	if (a->limit == UINT32_MAX)
		printf("  %-20s none\n", "limit");
	else
		printf("  %-20s %u (%s); %s %llu call%s\n", "limit", a->limit, a->limit_key,
		    a->c->enforce ? "refused" : "would have refused (observe mode)",
		    (unsigned long long)a->refused, a->refused == 1 ? "" : "s");
	if (strcmp(a->verdict, "too small") == 0)
		printf("  %-20s too small: raise %s to %llu\n", "verdict", a->limit_key,
		    (unsigned long long)a->suggested);
	else if (strcmp(a->verdict, "too large") == 0)
		printf("  %-20s too large: %llu would do; lower %s to free capacity\n", "verdict",
		    (unsigned long long)a->suggested, a->limit_key);
	else if (strcmp(a->verdict, "refused") == 0)
		printf("  %-20s refused %llu call%s although %llu would do: %s\n", "verdict",
		    (unsigned long long)a->refused, a->refused == 1 ? "" : "s",
		    (unsigned long long)a->suggested, a->c->live_limit < a->c->limit ?
		    "a lower live limit refused them (see status)" :
		    "bursts above the mean; the peak in use shows how far");
	else if (strcmp(a->verdict, "no limit") == 0)
		printf("  %-20s no limit: Little's law gives %llu\n", "verdict",
		    (unsigned long long)a->suggested);
	else
		printf("  %-20s %s\n", "verdict", a->verdict);
	if (a->c->pool >= 0 && a->source != NULL)
		printf("  %-20s %s: guaranteed %u, propose %llu (rate \u00d7 p50 \u00d7 2); ceiling %u, "
		    "propose %llu (the larger of Little's law and the peak %u)\n", "pool",
		    a->c->pool_name, a->c->guaranteed, (unsigned long long)a->guar,
		    a->c->limit == UINT32_MAX ? 0 : a->c->limit, (unsigned long long)a->ceiling,
		    a->c->peak);
	cli_suggest_classes(stdout, a->c, false);
}

static void
json_advice(const struct advice *a)
{
	char p50[64], p99[64];

	seconds(a->p50_us, p50, sizeof(p50));
	seconds(a->p99_us, p99, sizeof(p99));
	fputs("{\"name\": ", stdout);
	cli_json_string(stdout, a->c->name);
	printf(", \"peak_rate\": %llu, \"recent_peak_rate\": %llu, \"latency_source\": ",
	    (unsigned long long)a->c->peak_rate, (unsigned long long)a->c->recent_rate);
	if (a->source != NULL)
		printf("\"%s\"", a->source);
	else
		fputs("null", stdout);
	printf(", \"samples\": %llu, \"p50_s\": %s, \"p99_s\": %s, \"suggested\": %llu, "
	    "\"limit\": %u, \"limit_key\": \"%s\", \"unlimited\": %s, \"enforce\": %s, "
	    "\"refused\": %llu, \"verdict\": \"%s\"", (unsigned long long)a->samples, p50, p99,
	    (unsigned long long)a->suggested, a->limit == UINT32_MAX ? 0 : a->limit, a->limit_key,
	    a->limit == UINT32_MAX ? "true" : "false", a->c->enforce ? "true" : "false",
	    (unsigned long long)a->refused, a->verdict);
	if (a->c->pool >= 0)
		printf(", \"pool\": \"%s\", \"suggested_guaranteed\": %llu, \"suggested_ceiling\": "
		    "%llu", a->c->pool_name, (unsigned long long)a->guar,
		    (unsigned long long)a->ceiling);
	cli_suggest_classes(stdout, a->c, true);
	if (a->co.watched)
		printf(", \"connections\": {\"window_s\": %g, \"rate\": %.3f, \"refused\": %llu, "
		    "\"mean_open\": %.3f, \"peak\": %u, \"mean_hold_s\": %.6f, \"asked_ratio\": %.3f, "
		    "\"asked_ratio_from\": \"%s\", \"demand\": %llu}", a->co.seconds, a->co.rate,
		    (unsigned long long)a->co.refused, a->co.mean_open, a->co.peak, a->co.hold_s,
		    a->co.asked, a->co.lifetime_ratio ? "lifetime" : "window",
		    (unsigned long long)a->co.demand);
	if (a->in.counted && a->in.seconds > 0)
		printf(", \"inflight\": {\"window_s\": %g, \"rate\": %.3f, \"mean_reply_s\": %.6f, "
		    "\"peak\": %u, \"little\": %llu, \"demand\": %llu, \"refused\": %llu}",
		    a->in.seconds, a->in.rate, a->in.mean_us / 1e6, a->in.peak,
		    (unsigned long long)a->in.little, (unsigned long long)a->in.demand,
		    (unsigned long long)a->in.refused);
	putchar('}');
}

int
cmd_suggest(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "json", no_argument, NULL, 'j' },
		{ "window", required_argument, NULL, 'w' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	struct window *w = NULL;
	double seconds = 1.0;
	struct cli_snap snap;
	struct advice a;
	uint64_t t0, t1;
	struct seg *s;
	bool json = false;
	char *end;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (cli_target_opt(&t, c, optarg))
			continue;
		if (c == 'j') {
			json = true;
		} else if (c == 'w') {
			seconds = strtod(optarg, &end);
			if (*end != '\0' || end == optarg || !(seconds >= 0 && seconds <= 600)) {
				fprintf(stderr, "bulkshim: --window wants seconds from 0 to 600, not "
				    "\"%s\"\n", optarg);
				return 2;
			}
		} else if (c == 'h') {
			return cli_help("suggest", stdout, 0);
		} else {
			return cli_help("suggest", stderr, 2);
		}
	}
	if (optind != argc || (t.config != NULL && t.segment != NULL))
		return cli_help("suggest", stderr, 2);
	if (cli_open(&t, false, &s) < 0)
		return 1;
	t0 = now_mono_us();
	if (cli_snap_read(s, &snap) < 0)
		goto nomem;
	t0 = (t0 + now_mono_us()) / 2;
	/* The advice is of a window: from this snapshot to one taken at its
	 * end, watching what is held meanwhile. Its rates are over the time
	 * between the two snapshots (the middle of each read), not the
	 * seconds asked for: the last sleep and a busy machine make it
	 * longer, and counts over the longer time divided by the shorter
	 * would overstate every rate. */
	if (snap.ncomp > 0 && seconds > 0 && (w = calloc(snap.ncomp, sizeof(*w))) != NULL) {
		watch_window(s, &snap, w, seconds);
		cli_snap_free(&snap);
		t1 = now_mono_us();
		if (cli_snap_read(s, &snap) < 0)
			goto nomem;
		t1 = (t1 + now_mono_us()) / 2;
		if (t1 > t0 && (double)(t1 - t0) / 1e6 > seconds)
			seconds = (double)(t1 - t0) / 1e6;
	}
	seg_close(s);
	if (json) {
		fputs("{\"segment\": ", stdout);
		cli_json_string(stdout, snap.name);
		fputs(", \"headroom\": 2, \"compartments\": [", stdout);
	} else {
		printf("segment %s: permits by Little's law from the recorded peak admission rate "
		    "and p99 latency, headroom 2\n(latencies are upper bounds of log2 histogram "
		    "buckets)\n", snap.name);
	}
	for (uint32_t i = 0; i < snap.ncomp; i++) {
		advise(&snap.comp[i], w != NULL ? &w[i] : NULL, seconds, &a);
		if (json) {
			if (i)
				fputs(", ", stdout);
			json_advice(&a);
		} else {
			print_advice(&a);
		}
	}
	if (json)
		fputs("]}\n", stdout);
	free(w);
	cli_snap_free(&snap);
	return 0;
nomem:
	fprintf(stderr, "bulkshim: out of memory\n");
	free(w);
	seg_close(s);
	return 1;
}
