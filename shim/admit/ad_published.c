/* ad_published.c - the published adaptive controllers: Netflix's Vegas, Gradient2 and AIMD, Envoy's gradient controller. */
#include "admit/ad_alg.h"

#include <string.h>

/*
 * Each controller is written from its published description and applied
 * once per window, as concurrency-limits' WindowedLimit applies its
 * delegate: the window's mean latency is the RTT sample and its mean
 * concurrency (Little's law) stands for the in-flight count, which the
 * app-limited guards (inflight * 2 < limit: no increase) compare with the
 * limit. Limits are kept in 1/16ths where the original keeps a double.
 * Every controller clamps to the compartment's min and max in place of its
 * own minLimit and maxConcurrency. A window whose mean latency passes
 * timeout_ms is a drop (concurrency-limits' didDrop: a timeout).
 *
 * Published defaults used (concurrency-limits' builders, Envoy's
 * adaptive_concurrency v3 API):
 * - Vegas: alpha 3 log10(limit), beta 6 log10(limit), threshold log10(limit),
 *   increase and decrease by log10(limit) (an integer, at least 1),
 *   smoothing 1.0, a new no-load RTT every probeMultiplier 30 x limit
 *   samples x a jitter in [0.5, 1).
 * - Gradient2: rttTolerance 1.5 (the default tolerance_pct of this
 *   algorithm, 150), smoothing 0.2, queueSize 4, longWindow 600 samples
 *   after a warm-up average of 10.
 * - AIMD: backoffRatio 0.9, timeout 5 s, +1 when inflight * 2 >= limit.
 * - Envoy: buffer 25 %, gradient clamped to [0.5, 2], headroom
 *   sqrt(limit x gradient), min_concurrency 3, request_count 50, jitter
 *   15 %; the interval has no default (the documentation's example: 60 s).
 *   Envoy aggregates a window by a percentile (p50 by default); our windows
 *   keep sums, so the sample is the window's mean.
 */

#define VEGAS_PROBE_MULTIPLIER	30
#define G2_WARMUP		10
#define G2_LONG_WINDOW		600
#define G2_QUEUE		4
#define G2_SMOOTHING_PCT	20
#define ENVOY_BUFFER_PCT	25
#define ENVOY_REQUEST_COUNT	50
#define ENVOY_JITTER_PCT	15
#define ENVOY_AT_MIN_WINDOWS	5
#define PHASE_SHIFT		50
#define PHASE_MASK		0x3fffu
#define ENVOY_ACC_SHIFT		40	/* aux[1]: samples << 40 | their sum in us */

uint64_t
ad_pub_pack(const struct ad_pub_state *st)
{
	uint32_t lim = st->limit16 < (1u << AD_LIMIT_BITS) ? st->limit16 : (1u << AD_LIMIT_BITS) - 1;
	uint32_t lat = st->lat_us < AD_BASE_MAX ? st->lat_us : AD_BASE_MAX;

	return (uint64_t)lim | (uint64_t)lat << AD_LIMIT_BITS |
	    (uint64_t)(st->phase & PHASE_MASK) << PHASE_SHIFT;
}

void
ad_pub_unpack(uint64_t ctl, struct ad_pub_state *st)
{
	st->limit16 = AD_CTL_LIMIT(ctl);
	st->lat_us = AD_CTL_BASE(ctl);
	st->phase = (uint32_t)(ctl >> PHASE_SHIFT) & PHASE_MASK;
}

static uint32_t
clamp16(const struct ad_pub_params *p, int64_t v)
{
	int64_t lo = (int64_t)p->min * 16, hi = (int64_t)p->max * 16;

	return (uint32_t)(v < lo ? lo : v > hi ? hi : v);
}

/* A window's mean as an RTT sample: at least 1 us, at most what ctl holds. */
static uint64_t
rtt_of(const struct ad_window *w)
{
	uint64_t m = w->mean_us > 0 ? w->mean_us : 1;

	return m < AD_BASE_MAX ? m : AD_BASE_MAX;
}

static enum ad_reason
moved(uint32_t from, uint32_t to)
{
	return to > from ? AD_R_GROW : to < from ? AD_R_QUEUE : AD_R_NONE;
}

/* concurrency-limits' Log10RootIntFunction: max(1, (int)log10(n)). */
static int64_t
log10_int(uint32_t n)
{
	int64_t d = 0;

	while (n >= 10) {
		n /= 10;
		d++;
	}
	return d > 1 ? d : 1;
}

/* splitmix64: the jitter a window's end time gives, so steps stay pure. */
static uint64_t
mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/*
 * VegasLimit: the queue estimate is limit x (1 - rtt_noload / rtt). At most
 * threshold: grow by beta; under alpha: grow by log10; over beta: shrink by
 * log10; between alpha and beta: hold. rtt_noload (ctl's latency) follows
 * any lower sample, and is taken afresh every probe period. aux[0] holds
 * the samples since the last probe (low 32 bits) and the jitter in
 * thousandths (high 32): lost, the probe comes later.
 */
enum ad_reason
ad_vegas_step(const struct ad_pub_params *p, struct ad_pub_state *st, const struct ad_window *w)
{
	uint64_t rtt = rtt_of(w), count = st->aux[0] & 0xffffffffu, jit = st->aux[0] >> 32, queue;
	uint32_t lim = st->limit16;
	int64_t l = log10_int(lim / 16), next;
	bool drop = rtt > (uint64_t)p->timeout_ms * 1000;

	if (w->n == 0)
		return AD_R_NONE;
	if (jit < 500 || jit > 999)
		jit = 500 + mix(w->end_us) % 500;
	if (jit * VEGAS_PROBE_MULTIPLIER * (lim / 16) <= count * 1000) {
		/* A probe: this sample is the new no-load RTT. */
		st->aux[0] = (500 + mix(w->end_us + 1) % 500) << 32;
		st->lat_us = (uint32_t)rtt;
		return AD_R_NONE;
	}
	st->aux[0] = jit << 32 | (count + 1);
	if (st->lat_us == 0 || rtt < st->lat_us) {
		st->lat_us = (uint32_t)rtt;
		return AD_R_NONE;
	}
	/* ceil(limit x (1 - noload / rtt)), the limit in 1/16ths. */
	queue = ((uint64_t)lim * (rtt - st->lat_us) + rtt * 16 - 1) / (rtt * 16);
	if (drop)
		next = (int64_t)lim - l * 16;
	else if ((uint64_t)w->conc16 * 2 < lim)
		return AD_R_NONE;	/* app-limited: no drift upward */
	else if ((int64_t)queue <= l)
		next = (int64_t)lim + 6 * l * 16;
	else if ((int64_t)queue < 3 * l)
		next = (int64_t)lim + l * 16;
	else if ((int64_t)queue > 6 * l)
		next = (int64_t)lim - l * 16;
	else
		return AD_R_NONE;
	st->limit16 = clamp16(p, next);
	return moved(lim, st->limit16);
}

/*
 * Gradient2Limit: the long-term RTT (ctl's latency; its warm-up count in
 * the phase) is an average of the first 10 samples, then an exponential
 * one over 600, cut by 5 % whenever it is over twice the short one. The
 * gradient is tolerance x long / short within [0.5, 1], the new limit
 * limit x gradient + queueSize, smoothed by 0.2. An app-limited window
 * leaves the limit alone.
 */
enum ad_reason
ad_gradient2_step(const struct ad_pub_params *p, struct ad_pub_state *st,
    const struct ad_window *w)
{
	uint64_t shrt = rtt_of(w), lng = st->lat_us, cnt = st->phase & 0xf, g;
	uint32_t lim = st->limit16;
	int64_t next, d;

	if (w->n == 0)
		return AD_R_NONE;
	if (cnt < G2_WARMUP || lng == 0) {
		lng = (lng * cnt + shrt) / (cnt + 1);
		cnt = cnt < G2_WARMUP ? cnt + 1 : cnt;
	} else {
		/* factor 2 / (window + 1), rounded to the nearest us. */
		d = ((int64_t)shrt - (int64_t)lng) * 2;
		d = d >= 0 ? (d + G2_LONG_WINDOW / 2) / (G2_LONG_WINDOW + 1) :
		    -((-d + G2_LONG_WINDOW / 2) / (G2_LONG_WINDOW + 1));
		lng = (uint64_t)((int64_t)lng + d);
	}
	/* Latency back to normal after a long overload: the long RTT comes
	 * down without waiting for the average. */
	if (lng > 2 * shrt)
		lng = lng * 95 / 100;
	st->lat_us = (uint32_t)(lng > 0 ? lng : 1);
	st->phase = (uint32_t)cnt;
	if ((uint64_t)w->conc16 * 2 < lim)
		return AD_R_NONE;	/* app-limited */
	g = (uint64_t)p->tolerance_pct * lng * 10 / shrt;	/* in thousandths */
	g = g < 500 ? 500 : g > 1000 ? 1000 : g;
	next = (int64_t)((uint64_t)lim * g / 1000) + G2_QUEUE * 16;
	next = ((int64_t)lim * (100 - G2_SMOOTHING_PCT) + next * G2_SMOOTHING_PCT) / 100;
	st->limit16 = clamp16(p, next);
	return moved(lim, st->limit16);
}

/*
 * AIMDLimit: a drop (the mean past timeout_ms) multiplies the limit by
 * backoff_pct; otherwise a limit in use (inflight * 2 >= limit) grows by
 * one. Whole permits, as the original's int. The latency field keeps the
 * last mean, for the views and the stall check.
 */
enum ad_reason
ad_aimd_step(const struct ad_pub_params *p, struct ad_pub_state *st, const struct ad_window *w)
{
	uint64_t rtt = rtt_of(w);
	uint32_t lim = st->limit16, whole = lim / 16;

	if (w->n == 0)
		return AD_R_NONE;
	st->lat_us = (uint32_t)rtt;
	if (rtt > (uint64_t)p->timeout_ms * 1000)
		whole = (uint32_t)((uint64_t)whole * p->backoff_pct / 100);
	else if ((uint64_t)w->conc16 * 2 >= lim)
		whole++;
	st->limit16 = clamp16(p, (int64_t)whole * 16);
	return moved(lim, st->limit16);
}

/* Envoy's next minRTT window: the interval plus up to jitter % of it. */
static uint64_t
envoy_deadline(const struct ad_pub_params *p, uint64_t now_us)
{
	uint64_t iv = (uint64_t)p->min_rtt_interval_ms * 1000, j = iv * ENVOY_JITTER_PCT / 100;

	return now_us + iv + (j > 0 ? mix(now_us) % j : 0) + 1;
}

static uint32_t
envoy_floor16(const struct ad_pub_params *p)
{
	return clamp16(p, (int64_t)p->min_concurrency * 16);
}

/* Enters a minRTT window: the limit goes to min_concurrency, the one to
 * return to waits in the latency field. */
static enum ad_reason
envoy_enter(const struct ad_pub_params *p, struct ad_pub_state *st)
{
	uint32_t lim = st->limit16;

	st->lat_us = lim;
	st->limit16 = envoy_floor16(p);
	st->phase = AD_ENVOY_MINRTT;
	st->aux[0] = 0;
	st->aux[1] = 0;
	return moved(lim, st->limit16);
}

/*
 * Envoy's gradient controller. A minRTT window pins the limit to
 * min_concurrency until request_count samples are in (their count and sum
 * in aux[1]: lost, the window lasts longer); their mean is the minRTT and
 * the limit returns to where it was. Between them, each window sets the
 * limit to L x g + sqrt(L x g), g = (minRTT + buffer) / sample within
 * [0.5, 2]. The next minRTT window starts at a jittered deadline (aux[0]:
 * lost, one is set again) or after 5 windows in a row at min_concurrency.
 */
enum ad_reason
ad_envoy_step(const struct ad_pub_params *p, struct ad_pub_state *st, const struct ad_window *w)
{
	uint64_t rtt = rtt_of(w), n, sum, g, l16, next;
	uint32_t lim = st->limit16, at_min;

	if (w->n == 0)
		return AD_R_NONE;
	if (st->phase & AD_ENVOY_MINRTT) {
		n = (st->aux[1] >> ENVOY_ACC_SHIFT) + w->n;
		sum = (st->aux[1] & ((1ULL << ENVOY_ACC_SHIFT) - 1)) + w->n * rtt;
		if (n < ENVOY_REQUEST_COUNT && sum < (1ULL << ENVOY_ACC_SHIFT) / 2) {
			st->aux[1] = n << ENVOY_ACC_SHIFT | sum;
			return AD_R_NONE;
		}
		st->limit16 = clamp16(p, st->lat_us);
		st->lat_us = (uint32_t)(sum / n > 0 ? sum / n : 1);
		st->phase = 0;
		st->aux[0] = envoy_deadline(p, w->end_us);
		st->aux[1] = 0;
		return moved(lim, st->limit16);
	}
	at_min = AD_ENVOY_AT_MIN(st->phase);
	if (st->lat_us == 0 || at_min >= ENVOY_AT_MIN_WINDOWS ||
	    (st->aux[0] != 0 && w->end_us >= st->aux[0]))
		return envoy_enter(p, st);
	if (st->aux[0] == 0)
		st->aux[0] = envoy_deadline(p, w->end_us);
	g = (uint64_t)st->lat_us * (100 + ENVOY_BUFFER_PCT) * 10 / rtt;	/* thousandths */
	g = g < 500 ? 500 : g > 2000 ? 2000 : g;
	l16 = (uint64_t)(lim / 16) * 16 * g / 1000;
	next = (l16 + ad_isqrt(l16 * 16)) / 16 * 16;	/* truncated to whole, as Envoy's uint32 */
	st->limit16 = clamp16(p, (int64_t)(next < (1ULL << 40) ? next : (1ULL << 40)));
	at_min = st->limit16 <= envoy_floor16(p) ? at_min + 1 : 0;
	st->phase = (at_min > 7 ? 7 : at_min) << 1;
	return moved(lim, st->limit16);
}

void
ad_pub_start(unsigned alg, const struct ad_pub_params *p, uint32_t initial,
    struct ad_pub_state *st)
{
	memset(st, 0, sizeof(*st));
	st->limit16 = initial * 16;
	/* Envoy starts by measuring its minRTT, at min_concurrency. */
	if (alg == AD_ALG_ENVOY)
		envoy_enter(p, st);
}

uint32_t
ad_alg_latency_us(unsigned alg, uint64_t ctl)
{
	if (alg == AD_ALG_ENVOY && ((ctl >> PHASE_SHIFT) & AD_ENVOY_MINRTT))
		return 0;
	return AD_CTL_BASE(ctl);
}
