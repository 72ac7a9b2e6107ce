/* adaptive.c - the adaptive limit: a compartment that sizes itself from the latency it measures. */
#include <errno.h>
#include <stddef.h>

#include "admit/ad_alg.h"
#include "admit/admit.h"
#include "log.h"

/*
 * The controller works in windows of at least window_ms, and at least as
 * long as the last window's mean latency. Every completed request adds its
 * latency to the open window (one atomic add on `acc`,
 * shared by every process). The first completion that finds the window
 * over claims it with one compare-and-swap of `win_start_us`, takes the
 * window's sum out with one exchange, computes the next state with the pure
 * function ad_step and installs it with one compare-and-swap of `ctl`. A
 * process killed anywhere in that sequence leaves every word valid: killed
 * after claiming, its samples stay in `acc` for the next window; killed
 * after the exchange, one window's samples are lost; killed before the last
 * CAS, the limit simply did not move. The words after `ctl` are for the CLI
 * only and are written after it.
 *
 * The rule, for a backend whose latency grows with the queue it is given:
 * - the baseline is the latency without a queue. It starts from the first
 *   completions (below), follows lower samples down (an eighth of the way per
 *   window) and never moves up under load: a sustained overload cannot
 *   ratchet it (Envoy's #11579). It moves up to the sample only when
 *   cutting the limit did not bring latency down: after AD_STUCK_WINDOWS
 *   cuts of one run whose latency stayed where the run began, in windows
 *   the limit held (a cut of a limit above what is in flight took nothing
 *   away, and proves nothing) (a latency
 *   risen past the tolerance over that is a new queue, the capacity
 *   dropped, and begins a new run), or
 *   AD_FLOOR_WINDOWS windows at `min` with latency still high (a stall
 *   window there that had replies counts by its replies, see ad_step).
 *   A queue we feed less would have
 *   shrunk; the backend itself is slower (or the baseline had followed
 *   noise too far down).
 * - two windows in a row whose mean is above tolerance x baseline (or one
 *   above twice that: one such window may be noise) shrink the limit in
 *   proportion, from what is in flight (the smaller of the window's mean
 *   concurrency and the limit, x tolerance x baseline / sample; at least
 *   1/8 and one of the whole permits admission enforces, so the latency
 *   can show the effect, and at most halving per window): the queue it
 *   measures is drained at once, not slowly.
 * - otherwise, if the limit is in use (mean concurrency within 7/8 of it,
 *   or within one permit), it grows: doubling while ramping up from an
 *   `initial` below max (and after the baseline was taken again), until
 *   the first queue; then by 1/16 (at least one) per window. An unused
 *   limit does not grow, so it stays meaningful.
 * - a limit in use may still hold a queue the baseline was taken with: a
 *   backend that got faster is first measured at the limit that suited it
 *   slow. Such a queue shows only when the concurrency goes down, so the
 *   controller probes (probe_start): one window at 3/4 of what is in
 *   flight; if latency falls by 1/8 or more, it probes again (a lower
 *   latency is the baseline), otherwise the window is judged as any
 *   other and the limit grows back. Only a limit in use is probed: after a
 *   faster backend, and once per AD_PROBE_WINDOWS windows where the window
 *   before was above the tolerance (the limit met a queue); and a limit
 *   that is not, when a mild excess is a queue after all: every request of
 *   the window waited past the tolerance (win_min_us, its shortest reply,
 *   is above it; noise would leave some near the baseline). The
 *   period is on the clock (the window that crosses a multiple of it), so
 *   no word counts windows and any process may start a probe; the probe's
 *   bit and the latency before it live in ctl, so a process killed in one
 *   leaves a probe that the next window, closed by anyone, judges.
 *
 * The start refuses nothing: a fresh compartment opens at `initial`, by
 * default `max`, and takes its first baseline from the first
 * AD_FIRST_SAMPLES completions, the requests admitted first, which met no
 * queue of ours (first_sample). When the service time is regular (their
 * FIRST_K shortest within 5/4 of one another, their mean within twice the
 * shortest) the baseline is the shortest of them, without waiting for
 * window_ms: on a healthy backend that is its ordinary latency (a little
 * below the mean: the tolerance and the stuck rule absorb that), and when
 * the load starts above capacity they are the ones a FIFO backend served
 * at once, so the first full window shows the queue against them and the
 * limit is cut down to C. When the service time varies by itself (say
 * exponential), the shortest of eight is about an eighth of the mean and
 * would make every window look like a queue; the first completions are the
 * short ones too. Those and the window after them are dropped, and the
 * baseline is the mean of the next AD_FIRST_WINDOWS windows, with the
 * spread of their samples (the coefficient of variation, kept in alg[0]);
 * if that spread is under 1/4 the service time was regular after all (a
 * backend of capacity under FIRST_K spreads its first completions over
 * whole service times) and the baseline is the shortest of the first.
 * From then on the rules that compare a window's mean with the baseline
 * allow 2 standard errors of that mean (noise_pct) for the tolerance and a
 * probe's fall, and one below it for following it down or a faster
 * backend; none for the stuck rule, which raises it and so would ratchet
 * a draining queue in. A cut below twice that tolerance is the least step
 * (1/8), and such a window waits for AD_VARIED_SAMPLES samples (up to ten
 * windows): otherwise chance alone would cut the limit, the size of an
 * excess that is half chance would cut it too far, and at a low limit the
 * few samples of a window would be mostly chance. A load that is
 * already above capacity when a varying service starts is taken with its
 * queue as the baseline: nothing tells that queue from the service time
 * without cutting, and a cut below capacity is the refusal the start must
 * not make. Each change of alg[0] is one compare-and-swap, and the window
 * is claimed as any other (win_start_us): a process killed in between
 * leaves a dropped window's samples in the next one, or a first-phase
 * window without some of its samples, never a wrong phase.
 * A baseline that started too low (noise) is taken again by the stuck
 * rule below; one that is far above a later window's mean (the backend
 * became faster) follows it down at once.
 *
 * After a slow episode, that window's mean may hold a queue: the slow
 * backend became the baseline, the limit ramped up from it, perhaps past
 * what is in flight, and a limit not in use is not probed. So the
 * baseline that a slowdown replaced is kept (take_slower; beside ctl, in
 * alg[2] and alg[3], keep_load) and judges the first fast window instead,
 * if it is lower: a queue is cut as any other, without a probe.
 *
 * Windows close on completions, so a backend that stalls (its latency
 * going from 5 ms to 2 s) would be seen only when its first slow replies
 * come back. The stall check (ad_stall_due, ad_stall), made on every
 * admission attempt, closes an overdue
 * window without them: when at least half of the requests in flight are
 * older than twice the tolerated latency, their ages (lower bounds of
 * their latencies) are the window's samples, and the limit is cut to what
 * Little's law allows (in flight x tolerance x baseline / age: no halving
 * step, since no cut can show in the latency of what is already stuck),
 * every window_ms while the stall lasts. The cut happens on an admission
 * attempt, before that attempt is decided: no request is admitted against
 * the old limit once the stall is overdue. At most one scan of the
 * slots per process, compartment and quarter of window_ms.
 * In observe mode (enforce = false) nothing is cut, so the limit is what
 * Little's law gives: the window's concurrency scaled by tolerance x
 * baseline / sample; refusals it would make are counted in would_reject.
 * No probe lowers a limit that is not in use or is still growing into the
 * load, and none runs in observe mode: traffic below capacity, which such a
 * limit admits, is not refused by a probe (Envoy's #8337, #18152, whose
 * periodic minimum-latency windows drop every limit to a fixed few).
 *
 * A compartment may run a published controller instead (seg_adaptive's
 * `algorithm`: Vegas, Gradient2, AIMD, Envoy; ad_published.c). The windows,
 * the stall check and the one CAS of ctl are the same; only the step
 * differs (ad_pub_window). What such a controller keeps beside ctl, in alg[], is
 * written after ctl by compare-and-swap, and is safe to lose: a process
 * killed between the two leaves a later probe or minRTT window, never a
 * wrong limit.
 */

#define AD_FLOOR_WINDOWS	3
#define AD_STUCK_WINDOWS	3
#define AD_PROBE_WINDOWS	32	/* a probe at most every this many windows */
#define AD_FIRST_SAMPLES	8	/* completions that give the first baseline */
#define AD_FIRST_WINDOWS	8	/* windows the mean of a varying service is taken over */
#define AD_NOISE_MAX	80	/* percent: the most noise_pct widens the tolerance */
#define AD_VARIED_SAMPLES	16	/* samples a window of a varying service waits for */
#define SAMPLE_MAX_US	0xffffffffULL	/* a longer sample counts as 71 minutes */
#define AD_GROW_FREE	4	/* a limit with no queue at all grows by 1/this a window */
#define AD_KNEE_MAX	8	/* permits: a limit where one is 1/8 or more of it */
#define AD_KNEE_RETRY_S	30	/* the permit above a knee is tried this often */
#define KNEE_S_MASK	0x1fffU	/* knee_s is kept modulo this + 1 (keep_load) */
#define AD_SETTLED_S	2	/* a baseline that stood this long was the backend's */
#define AD_KEEP_S	900	/* how long the baseline from before a slowdown is kept */

/*
 * While the controller learns its first baseline, alg[0] (a published
 * controller's word, unused by this one) keeps the FIRST_K shortest of the
 * first completions, FIRST_BITS each in first_code's form (0: none yet),
 * or, once they showed a service time that may vary by itself,
 * FIRST_VARIES, the shortest of them (FIRST_SHORTEST), FIRST_WARM (the
 * warm-up window is over), and then the spread of that service time
 * (FIRST_SPREAD), measured with the baseline; alg[1] sums the squares of
 * the samples meanwhile. See first_sample.
 */
#define FIRST_K		4
#define FIRST_BITS	15
#define FIRST_MASK	((1ULL << FIRST_BITS) - 1)
#define FIRST_VARIES	(1ULL << 63)
#define FIRST_WARM	(1ULL << 62)
#define FIRST_SPREAD(f)	((uint32_t)((f) & 0xff))	/* with FIRST_VARIES, once the baseline is in */
#define FIRST_SHORTEST(f)	((f) >> 8 & FIRST_MASK)	/* with FIRST_VARIES: the shortest, coded */
#define FIRST_REGULAR16	4	/* a spread (x 16) under this is a regular service time */

/* Microseconds (at least 2) as a 15-bit code that sorts as they do: the
 * position of the leading bit, then the next 10 bits. */
static uint64_t
first_code(uint64_t us)
{
	int e;

	if (us < 2)
		us = 2;
	e = 63 - __builtin_clzll(us);
	return (uint64_t)e << 10 | ((e >= 10 ? us >> (e - 10) : us << (10 - e)) & 0x3ff);
}

static uint64_t
first_us(uint64_t code)
{
	uint64_t e = code >> 10, m = (code & 0x3ff) | 0x400;

	return e >= 10 ? m << (e - 10) : m >> (10 - e);
}

uint64_t
ad_pack(const struct ad_state *st)
{
	uint32_t lim = st->limit16 < (1u << AD_LIMIT_BITS) ? st->limit16 : (1u << AD_LIMIT_BITS) - 1;
	uint32_t base = st->base_us < AD_BASE_MAX ? st->base_us : AD_BASE_MAX;
	uint32_t fl = st->floor_windows < 7 ? st->floor_windows : 7;

	return (uint64_t)lim | (uint64_t)base << AD_LIMIT_BITS | (st->ramp ? AD_CTL_RAMP : 0) |
	    (uint64_t)fl << 51 | (st->probe ? AD_CTL_PROBE : 0) | (st->high ? AD_CTL_HIGH : 0) |
	    (uint64_t)(st->prev16 < 63 ? st->prev16 : 63) << 56 |
	    (uint64_t)(st->stuck < 3 ? st->stuck : 3) << 62;
}

void
ad_unpack(uint64_t ctl, struct ad_state *st)
{
	st->limit16 = AD_CTL_LIMIT(ctl);
	st->base_us = AD_CTL_BASE(ctl);
	st->ramp = (ctl & AD_CTL_RAMP) != 0;
	st->floor_windows = AD_CTL_FLOOR(ctl);
	st->high = (ctl & AD_CTL_HIGH) != 0;
	st->prev16 = AD_CTL_PREV(ctl);
	st->stuck = AD_CTL_STUCK(ctl);
	st->probe = (ctl & AD_CTL_PROBE) != 0;
}

static uint32_t
clamp16(const struct ad_params *p, uint64_t v)
{
	uint64_t lo = (uint64_t)p->min * 16, hi = (uint64_t)p->max * 16;

	if (v < lo)
		v = lo;
	if (v > hi)
		v = hi;
	return (uint32_t)v;
}

/*
 * Starts a probe: the limit goes to 3/4 of what is in flight (`from`, in
 * 1/16ths; at least one whole permit below the limit admission enforces)
 * for one window, and prev16
 * keeps this window's latency against the baseline, which the probe's
 * window is judged against. False when there is nothing lower to try
 * (fewer than two in flight, or the floor).
 */
static bool
probe_start(const struct ad_params *p, struct ad_state *st, uint64_t from, uint64_t m)
{
	uint64_t next = from - from / 4, whole = st->limit16 & ~15ULL, r16;

	if (whole < 32 || st->base_us == 0)
		return false;
	if (next >= whole)
		next = whole - 16;
	next = clamp16(p, next);
	if (next >= whole)
		return false;
	r16 = m * 16 / st->base_us;
	st->limit16 = (uint32_t)next;
	st->probe = true;
	st->prev16 = (uint32_t)(r16 < 1 ? 1 : r16 > 63 ? 63 : r16);
	st->stuck = 0;
	st->high = false;
	st->ramp = false;
	return true;
}

/*
 * The backend is slower than the baseline: m is the baseline now. The one
 * it replaces is kept for when the backend is fast again (the lowest of
 * those within AD_KEEP_S), if it had stood AD_SETTLED_S: one replaced
 * sooner had followed noise down, or was an earlier step of this slowdown.
 */
static void
take_slower(struct ad_state *st, uint64_t m, uint32_t now_s)
{
	if (now_s >= st->base_s + AD_SETTLED_S && (st->kept_us == 0 || st->base_us < st->kept_us)) {
		st->kept_us = st->base_us;
		st->kept_s = now_s;
	}
	st->base_us = (uint32_t)m;
	st->base_s = now_s;
}

/* Puts a step of one whole permit under test (knee_test): from n
 * permits, whose window's latency was r16 / 16 x the baseline; `up`, a step
 * up from the knee. */
static void
knee_test_start(struct ad_state *st, uint64_t n, uint64_t r16, bool up)
{
	st->test_n = (uint32_t)n;
	st->test_r16 = (uint32_t)(r16 < 0xff ? r16 : 0xff);
	st->test_up = up;
	st->test_seen = false;
}

/*
 * Judges a step of one whole permit under test, in the second window after
 * it (the first one's replies were admitted before it: it is skipped). True
 * when this window is spent on the test, with the reason of its step in
 * *why.
 * - A cut from test_n that Little's law asked only part of: did that permit
 *   serve? A queue's requests only wait, and one permit fewer serves as
 *   many per second at a lower latency; a backend that shares its
 *   processors serves fewer (the limit held over this window's latency,
 *   against test_n over that window's, with a quarter of margin for
 *   noise). Then the latency at test_n was the backend's own, not a queue
 *   of ours: it is the baseline, the limit goes back, and test_n is the knee
 *   (processor sharing: PostgreSQL on its cores).
 * - A step up from the knee: the permit above it stays if the latency stays
 *   within the tolerance, or if it served an eighth more per second or
 *   better (its latency is then the baseline): the knee moved, the backend
 *   has more to give. Otherwise the limit is back at the knee, tried again
 *   in AD_KNEE_RETRY_S.
 */
static bool
knee_test(const struct ad_params *p, struct ad_state *st, const struct ad_window *w, uint64_t m,
    uint32_t now_s, enum ad_reason *why)
{
	uint64_t n = st->test_n, before = (uint64_t)st->test_r16 * st->base_us;
	uint64_t lim = st->limit16, whole = lim & ~15ULL;

	if (w->stall) {
		st->test_n = 0;
		return false;
	}
	*why = AD_R_NONE;
	if (!st->test_seen) {
		st->test_seen = true;
		return true;
	}
	st->test_n = 0;
	if (st->test_up) {
		if (m * 100 <= (uint64_t)st->base_us * p->tolerance_pct) {
			st->knee = 0;
			return false;
		}
		if (whole * st->base_us * 8 >= (n - 1) * 16 * m * 9) {
			/* Slower, but it served an eighth more per second or
			 * better: this latency is the backend's own. */
			take_slower(st, m, now_s);
			st->knee = 0;
			st->high = false;
			*why = AD_R_SLOWER;
			return true;
		}
		st->limit16 = clamp16(p, (n - 1) * 16);
		st->knee_s = now_s;
		st->high = false;
		*why = AD_R_QUEUE;
		return true;
	}
	if (w->conc16 > lim * 2 || before == 0 || whole * before * 4 >= n * 256 * m * 3)
		return false;
	take_slower(st, before / 16, now_s);
	st->limit16 = clamp16(p, n * 16);
	if (st->knee != n)
		st->knee_ok = false;
	st->knee = (uint32_t)n;
	st->knee_s = now_s;
	st->high = false;
	st->prev16 = 0;
	st->stuck = 0;
	st->ramp = false;
	*why = AD_R_SLOWER;
	return true;
}

uint64_t
ad_isqrt(uint64_t v)
{
	uint64_t r = 0, b = 1ULL << 62;

	while (b > v)
		b >>= 2;
	for (; b != 0; b >>= 2) {
		if (v >= r + b) {
			v -= r + b;
			r = (r >> 1) + b;
		} else {
			r >>= 1;
		}
	}
	return r;
}

/*
 * How far, in percent, the mean of window w may stray from the latency
 * without a queue by chance alone: 2 standard errors of a mean of n
 * samples of a service time whose coefficient of variation is spread16/16
 * (at most AD_NOISE_MAX). 0 for a regular service time and for a stall,
 * whose ages are no sample of the service time.
 */
static uint64_t
noise_pct(const struct ad_window *w)
{
	uint64_t v;

	if (w->spread16 == 0 || w->stall || w->n == 0)
		return 0;
	v = (uint64_t)w->spread16 * 200 / (16 * ad_isqrt(w->n));
	return v < AD_NOISE_MAX ? v : AD_NOISE_MAX;
}

enum ad_reason
ad_step(const struct ad_params *p, struct ad_state *st, const struct ad_window *w)
{
	/* The tolerance widened by what chance explains (noise_pct), and
	 * the latency that counts as lower than the baseline by half that:
	 * a baseline that followed chance down would cut on chance. The
	 * stuck rule, which raises the baseline, takes no allowance: a queue
	 * that drains in a few windows would be taken for the service time. */
	uint64_t noise = noise_pct(w), tol = p->tolerance_pct + noise, lo;
	uint64_t m = w->mean_us > 0 ? w->mean_us : 1, lim = st->limit16;
	uint64_t base = st->base_us, next, r16, whole = lim & ~15ULL, from, pre, little;
	bool in_use, held, was_high, lower, faster = false;
	enum ad_reason why;
	uint32_t now_s = (uint32_t)(w->end_us / 1000000);

	if (w->n == 0)
		return AD_R_NONE;
	if (m > AD_BASE_MAX)
		m = AD_BASE_MAX;
	if (base == 0) {
		st->base_us = (uint32_t)m;
		st->base_s = now_s;
		return AD_R_NONE;
	}
	if (st->kept_us > 0 && now_s > st->kept_s + AD_KEEP_S)
		st->kept_us = 0;
	if (whole < 16)
		whole = 16;	/* admission lets one in at any limit */
	/* What is in flight, at most the limit: cuts start from it, since a
	 * cut of a limit above it changes nothing the latency could show. */
	from = w->conc16 < lim ? w->conc16 : lim;
	/* The limit held the concurrency: its mean within 7/8 of it. */
	held = w->conc16 * 8 >= whole * 7;
	/* In use: held, or within one permit of it (the limit of 9 with 8
	 * callers). Only such a limit grows. */
	in_use = held || w->conc16 + 16 >= whole;
	if (st->test_n > 0 && knee_test(p, st, w, m, now_s, &why))
		return why;
	if (st->probe) {
		/* The window after a probe's cut: did latency fall with it? */
		pre = (uint64_t)st->prev16 * base / 16;
		st->probe = false;
		st->prev16 = 0;
		if (!w->stall && m * 800 <= pre * (700 - 8 * noise)) {
			/* It fell: what the cut took away was a queue, and
			 * this window is closer to the latency without one.
			 * Lower again while it keeps falling under the
			 * baseline; or while some reply of a regular service
			 * came in well under it: the baseline was taken with
			 * a queue in it (a fall alone may be the load going
			 * away while the probe ran). */
			lower = m * 16 < base * 15;
			if (lower)
				st->base_us = (uint32_t)m;
			if (lower || (w->spread16 == 0 && w->min_us > 0 && w->min_us * 16 < base * 15))
				probe_start(p, st, from, m);
			return st->limit16 != lim ? AD_R_QUEUE : AD_R_NONE;
		}
		/* It did not: the latency is the backend's. The window is
		 * judged as any other, and the limit, in use, grows back. */
	}
	if (st->kept_us > 0 && m * 2 < base) {
		/* Fast again after a slowdown. This window was measured at the
		 * limit that suited the slow backend (it ramped up after the
		 * slowdown was taken for the baseline), so it may hold a queue,
		 * which the baseline from before shows: it is cut as any other
		 * queue, without a probe. Traffic below capacity meets no queue
		 * and is within the tolerance of it; a backend that stays slower
		 * than it was gets its own baseline again by the stuck rule. */
		if (st->kept_us < m) {
			base = st->base_us = st->kept_us;
			st->base_s = now_s;
		}
		st->kept_us = 0;
	}
	if (m * 100 > base * tol) {
		/* A queue (or a slower backend). One window above the
		 * tolerance may be noise; two in a row, or one far above,
		 * is not. */
		if (!st->high && m * 100 <= 2 * base * tol) {
			st->high = true;
			return AD_R_NONE;
		}
		if (p->observe) {
			/* Observe mode: the limit holds nothing back, so no
			 * cut can show in the latency. What it would be is
			 * the concurrency that Little's law says brings the
			 * latency back within the tolerance. */
			st->ramp = false;
			st->limit16 = clamp16(p, w->conc16 * base * tol / (m * 100));
			return st->limit16 != lim ? AD_R_QUEUE : AD_R_NONE;
		}
		if (w->stall && !(lim <= (uint64_t)p->min * 16 && w->done > 0)) {
			/* Nothing completes, so no cut can show in the latency
			 * and the ages are only lower bounds: neither the floor
			 * nor the stuck rule may take them as the baseline.
			 * Little's law on what is in flight gives the limit
			 * that keeps the latency within the tolerance, at once. */
			st->ramp = false;
			next = w->conc16 * base * tol / (m * 100);
			st->limit16 = clamp16(p, next < lim ? next : lim);
			return st->limit16 != lim ? AD_R_QUEUE : AD_R_NONE;
		}
		/* Little's law on the window: the concurrency its replies per
		 * second would have at the tolerated latency. A window whose
		 * concurrency was above the limit measured requests admitted
		 * before the last cut, a queue still draining; when the limit
		 * is already at or below what that throughput allows there is
		 * nothing left to cut. Cutting again on the drain would take
		 * the limit below the capacity (and at the floor, take the
		 * draining queue for the backend's latency). */
		little = w->conc16 * base * tol / (m * 100);
		if (w->conc16 > lim && little >= whole)
			return AD_R_NONE;
		if (st->knee_ok && whole == (uint64_t)st->knee * 16 && m * 10000 <= base * tol * tol) {
			/* At a sure knee the limit stays put, so a latency
			 * that moves there (up to the tolerance over the
			 * tolerance) is the backend's, not a queue of ours:
			 * the baseline follows it up an eighth of the way, as
			 * it follows lower ones down. Beyond that (a capacity
			 * that halved, say), the window is judged as any other
			 * and the cut is tested again. */
			st->base_us = (uint32_t)(base + (m - base) / 8);
			st->high = false;
			return AD_R_NONE;
		}
		if (st->knee > 0 && !st->knee_ok && in_use && whole == (uint64_t)(st->knee + 1) * 16 &&
		    whole * base * 8 < (uint64_t)st->knee * 16 * m * 9) {
			/* The permit above a knee found by knee_test (whose
			 * latency is the baseline) costs latency past the
			 * tolerance and serves less than an eighth more per
			 * second: a queue. The knee is sure: the limit stays
			 * there, and the permit above it is tried again in
			 * AD_KNEE_RETRY_S. */
			st->knee_ok = true;
			st->knee_s = now_s;
			st->limit16 = clamp16(p, (uint64_t)st->knee * 16);
			st->high = false;
			return AD_R_QUEUE;
		}
		if (lim <= (uint64_t)p->min * 16) {
			/* At the floor nothing is left to cut. A stall window
			 * there that had replies is a backend slower than the
			 * baseline, not a stalled one: its replies (not the
			 * ages) are what the floor rule judges. Otherwise a
			 * backend more than twice as slow at a low floor would
			 * keep the limit there: its few replies per window
			 * never close a window before the stall check finds the one in
			 * flight overdue. */
			if (w->stall) {
				m = w->done_mean_us > 0 ? w->done_mean_us : 1;
				if (m > AD_BASE_MAX)
					m = AD_BASE_MAX;
				if (m * 100 <= base * tol)
					return AD_R_NONE;
			}
			if (++st->floor_windows >= AD_FLOOR_WINDOWS) {
				/* At the floor and still slow: the backend is. */
				take_slower(st, m, now_s);
				st->floor_windows = 0;
				st->ramp = true;	/* back up to what it holds now */
				return AD_R_SLOWER;
			}
			return AD_R_NONE;
		}
		st->floor_windows = 0;
		st->ramp = false;
		/* A run of cuts whose latency stays where the run began:
		 * AD_STUCK_WINDOWS of them mean the baseline is too low (it
		 * followed noise down), not that there is a queue, which
		 * would have shrunk with the limit. Only a window that the
		 * limit held counts: a cut of a limit above what is in flight
		 * took nothing away, and latency that stays put then proves
		 * nothing (taking it as the baseline is how a queue becomes
		 * one). */
		r16 = m * 16 / base;
		if (r16 > 63)
			r16 = 63;
		if (st->prev16 == 0 || r16 * 100 > st->prev16 * tol) {
			/* The run's first cut, or a latency risen past the
			 * tolerance over where the run began: a new queue (the
			 * capacity dropped, the backend slowed) that no cut of
			 * the run can be blamed for. The run begins again. */
			st->prev16 = (uint32_t)r16;
			st->stuck = 0;
		} else if (held && r16 + 1 >= st->prev16 && ++st->stuck >= AD_STUCK_WINDOWS) {
			take_slower(st, m, now_s);
			st->stuck = 0;
			st->prev16 = 0;
			st->high = false;
			st->ramp = false;
			return AD_R_SLOWER;
		}
		/* In proportion: Little's law above, which is from what is
		 * in flight unless a drain is still measured. */
		next = little;
		/* A varying service time's window is above the tolerance
		 * by chance as much as by its queue, and the next windows
		 * still carry that queue: the cut is the least step, unless
		 * the window is far above. */
		if (noise > 0 && m * 100 <= 2 * base * tol)
			next = from - from / 8;
		if (next > from - from / 8)
			next = from - from / 8;	/* a step the latency can show */
		if (next >= whole && whole >= 32)
			next = whole - 16;	/* and one admission enforces */
		if (next < from / 2)
			next = from / 2;
		/* Admission enforces whole permits: the cut lands on the
		 * nearest one (at 1.97 it would admit 1). */
		next = (next + 8) & ~15ULL;
		if (next >= whole && whole >= 32)
			next = whole - 16;
		/* A whole permit cut where Little's law asked for part of
		 * one, from a limit held at AD_KNEE_MAX or less (where one
		 * permit is an eighth of it or more) on a regular service:
		 * the window after the next tells whether it was a queue
		 * (knee_test). */
		if (w->conc16 * 4 >= whole * 3 && noise == 0 && whole <= AD_KNEE_MAX * 16 && whole >= 32 &&
		    little + 16 > whole && next == whole - 16)
			knee_test_start(st, whole / 16, m * 16 / base, false);
		/* A limit well above what is in flight holds nothing back,
		 * and a mild excess may be noise: cutting it below what is
		 * in flight would refuse healthy traffic on a guess. So it
		 * stops at 1.5 x the window's concurrency; a queue that
		 * matters (latency above 1.5 x the tolerance) is cut at once.
		 * "Well above" in the whole permits admission enforces: at
		 * 3.94 only 3 are ever in flight, which is the limit holding
		 * traffic back, not 76 % of it. */
		/* Unless every request of the window waited past the
		 * tolerance (its shortest reply is above it): noise leaves
		 * some near the baseline, a queue none; and a baseline taken
		 * with a queue in it (a start on a machine so busy that the
		 * first replies were slow) shows no more than a mild excess
		 * over it. So that limit is probed: lowered to 3/4 of what is
		 * in flight, lower again while the latency keeps falling, the
		 * lowest latency the baseline. */
		if (!held && m * 200 <= 3 * base * tol) {
			if (w->min_us > 0 && w->min_us * 100 > base * tol &&
			    probe_start(p, st, from, m))
				return AD_R_QUEUE;
			if (next < w->conc16 * 3 / 2 + 16)
				next = w->conc16 * 3 / 2 + 16;
		}
		if (next > lim)
			next = lim;
		st->limit16 = clamp16(p, next);
		return st->limit16 != lim ? AD_R_QUEUE : AD_R_NONE;
	}
	was_high = st->high;
	st->floor_windows = 0;
	st->high = false;
	st->prev16 = 0;
	st->stuck = 0;
	lo = base * (100 - noise / 2) / 100;
	if (m * 2 < lo) {
		st->base_us = (uint32_t)m;	/* a faster backend, not noise */
		faster = true;
	} else if (m < lo) {
		st->base_us = (uint32_t)(base - (base - m) / 8);
	}
	if (!in_use)
		return AD_R_NONE;	/* the limit is not what holds the traffic back */
	/* A limit in use on a latency within the tolerance may still hold
	 * a queue, when the baseline was taken with one in it: a backend
	 * that became faster is measured at the limit that suited it slow.
	 * Such a queue shows only when the concurrency goes down, so the
	 * controller lowers it for a window and keeps the lower latency if
	 * there is one: after a faster backend, and periodically where the
	 * limit sits between growing and being cut (the window before was
	 * above the tolerance: this limit met a queue). A limit not in use,
	 * or one still growing into the load, is never probed: traffic below
	 * capacity, which it admits, is not refused by a probe. */
	if (!p->observe && !st->ramp && (faster || (w->probe_due && was_high)) &&
	    probe_start(p, st, from, m))
		return AD_R_QUEUE;
	if (st->knee > 0 && !p->observe) {
		/* At the knee the permit above it cost more latency than it
		 * served: it is tried again every AD_KNEE_RETRY_S, one
		 * permit, judged by knee_test. Above the knee (the limit
		 * got there otherwise, or the permit above a knee not yet
		 * sure met no queue), growing, there is none. */
		if (st->knee_ok && whole == (uint64_t)st->knee * 16) {
			if (((now_s - st->knee_s) & KNEE_S_MASK) < AD_KNEE_RETRY_S)
				return AD_R_NONE;
			st->limit16 = clamp16(p, whole + 16);
			if (st->limit16 == lim)
				return AD_R_NONE;
			knee_test_start(st, st->knee + 1, m * 16 / base, true);
			return AD_R_GROW;
		}
		if (whole > (uint64_t)(st->knee + !st->knee_ok) * 16)
			st->knee = 0;
	}
	if (st->ramp)
		next = lim * 2;
	else if (noise == 0 && m * 400 <= base * (300 + p->tolerance_pct))
		/* No queue at all (within a quarter of the tolerance): the
		 * capacity is above what is in flight by an unknown amount,
		 * as when it came back after a drop. An overshoot of 1/4 is
		 * within twice the tolerance, cut in proportion after two
		 * windows. A varying service time's window is near the
		 * baseline by chance: it grows as any other. */
		next = lim + (lim / AD_GROW_FREE > 16 ? lim / AD_GROW_FREE : 16);
	else
		next = lim + (lim / 16 > 16 ? lim / 16 : 16);
	st->limit16 = clamp16(p, next);
	if (st->limit16 == lim)
		return AD_R_NONE;
	return st->ramp ? AD_R_RAMP : AD_R_GROW;
}

uint32_t
ad_current(const struct seg_comp *c)
{
	uint32_t l;

	if (atomic_load_explicit(&c->ad.mode, memory_order_relaxed) != AD_ON)
		return UINT32_MAX;
	l = AD_CTL_LIMIT(atomic_load_explicit(&c->ad.ctl, memory_order_relaxed)) / 16;
	return l > 0 ? l : 1;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE uint32_t
ad_limit(const struct seg_comp *c, int p, uint32_t lim)
{
	uint32_t a;

	if (__builtin_expect(atomic_load_explicit(&c->ad.mode, memory_order_relaxed) != AD_ON, 1) ||
	    atomic_load_explicit(&c->ad.kind, memory_order_relaxed) != (uint32_t)p)
		return lim;
	a = ad_current(c);
	return a < lim ? a : lim;
}

BS_LTO_INLINE bool
ad_on(const struct seg_comp *c, int p)
{
	return __builtin_expect(atomic_load_explicit(&c->ad.mode, memory_order_relaxed) == AD_ON, 0) &&
	    atomic_load_explicit(&c->ad.kind, memory_order_relaxed) == (uint32_t)p;
}
#pragma GCC diagnostic pop

static void
note_change(struct seg_adaptive *a, uint32_t from, uint32_t to, enum ad_reason why)
{
	atomic_store(&a->last_from, from);
	atomic_store(&a->last_to, to);
	atomic_store(&a->last_reason, (uint32_t)why);
	atomic_store(&a->last_change_ms, now_real_ms());
	atomic_fetch_add(&a->changes, 1);
}

/*
 * What this controller keeps beside ctl (struct ad_state's kept_us, kept_s
 * and base_s), in alg[2] and alg[3]: read before a window's step, written
 * after its CAS of ctl, each by compare-and-swap. A process killed between
 * the two loses an update: the baseline from before a slowdown is then not
 * restored (the probe after a faster backend remains), or a replaced
 * baseline's age is older than it is.
 */
static void
keep_load(struct seg_adaptive *a, struct ad_state *st, uint64_t was[2])
{
	was[0] = atomic_load(&a->alg[2]);
	was[1] = atomic_load(&a->alg[3]);
	st->kept_us = (uint32_t)was[0];
	st->kept_s = (uint32_t)(was[0] >> 32);
	st->base_s = (uint32_t)was[1];
	st->knee = (uint32_t)(was[1] >> 32) & 0xf;
	st->test_n = (uint32_t)(was[1] >> 36) & 0xf;
	st->test_seen = (was[1] >> 40 & 1) != 0;
	st->test_up = (was[1] >> 41 & 1) != 0;
	st->test_r16 = (uint32_t)(was[1] >> 42) & 0xff;
	st->knee_s = (uint32_t)(was[1] >> 50) & KNEE_S_MASK;
	st->knee_ok = (was[1] >> 63) != 0;
}

static void
keep_store(struct seg_adaptive *a, const struct ad_state *st, uint64_t was[2])
{
	uint64_t now[2] = { st->kept_us | (uint64_t)st->kept_s << 32,
			    st->base_s | (uint64_t)(st->knee & 0xf) << 32 |
			    (uint64_t)(st->test_n & 0xf) << 36 | (uint64_t)st->test_seen << 40 |
			    (uint64_t)st->test_up << 41 |
			    (uint64_t)(st->test_r16 < 0xff ? st->test_r16 : 0xff) << 42 |
			    (uint64_t)(st->knee_s & KNEE_S_MASK) << 50 | (uint64_t)st->knee_ok << 63 };

	for (int i = 0; i < 2; i++)
		if (now[i] != was[i])
			atomic_compare_exchange_strong(&a->alg[2 + i], &was[i], now[i]);
}

/* The open window's length: at least window_ms, and at least the last
 * window's mean latency, so that its completions were mostly admitted
 * under the limit it judges. */
static uint64_t
window_len(struct seg_adaptive *a)
{
	uint64_t win = (uint64_t)atomic_load(&a->window_ms) * 1000;
	uint64_t last = atomic_load_explicit(&a->sample_us, memory_order_relaxed);

	return last > win ? last : win;
}

/*
 * Closes the window that started at `start`, if this caller wins it. The
 * stall check (ad_stall) adds `n` requests still in flight whose ages sum
 * to `age_sum`, `inflight` in flight in all (0 from a completion).
 */
static void
close_window(struct seg_comp *c, uint64_t start, uint64_t now_us, uint64_t n, uint64_t age_sum,
    uint64_t inflight)
{
	struct seg_adaptive *a = &c->ad;
	struct ad_params p = { atomic_load(&a->min), atomic_load(&a->max),
			       atomic_load(&a->tolerance_pct), atomic_load(&c->enforce) == 0 };
	struct ad_window w;
	struct ad_state st;
	uint64_t acc, old, next, sum, el = now_us - start, period, aux[2][2], keep[2], first;
	enum ad_reason why;
	uint32_t alg;

	if (!atomic_compare_exchange_strong(&a->win_start_us, &start, now_us))
		return;		/* another completion closed it */
	/* A periodic probe is due in the window that crosses a multiple of
	 * AD_PROBE_WINDOWS windows on the clock: no word counts windows, and
	 * whichever process closes that window may start it. */
	period = AD_PROBE_WINDOWS * window_len(a);
	w.probe_due = n == 0 && period > 0 && start / period != now_us / period;
	acc = atomic_exchange(&a->acc, 0);
	w.min_us = atomic_exchange(&a->win_min_us, 0);
	if (n > 0)
		w.min_us = 0;	/* a stall's ages are no replies */
	w.n = (acc >> ACC_N_SHIFT) + n;
	w.stall = n > 0;
	w.done = acc >> ACC_N_SHIFT;
	w.done_mean_us = w.done > 0 ? (acc & ACC_SUM_MASK) / w.done : 0;
	sum = (acc & ACC_SUM_MASK) + age_sum;
	if (w.n == 0 || el == 0 || p.min == 0 || p.max < p.min)
		return;
	w.mean_us = sum / w.n;
	alg = atomic_load(&a->algorithm);
	/* alg[0] is this controller's only while it is the one running. */
	first = alg == AD_ALG_BULKSHIM ? atomic_load(&a->alg[0]) : 0;
	w.spread16 = 0;
	if (AD_CTL_BASE(atomic_load(&a->ctl)) != 0) {
		if (first & FIRST_VARIES)
			w.spread16 = FIRST_SPREAD(first);
	} else if (n == 0 && !(first & FIRST_VARIES)) {
		/* The first baseline of a regular service time: the shortest
		 * of the first replies (first_sample). */
		uint64_t lo = atomic_load(&a->sample_us);

		if (lo > 0 && lo < w.mean_us)
			w.mean_us = lo;
	} else if (n == 0 && !(first & FIRST_WARM)) {
		/* This closer found the first completions regular, and a
		 * later one, shorter, made them vary meanwhile: they are
		 * dropped, as first_restart would, and the warm-up window
		 * begins now. */
		return;
	} else if (n == 0) {
		/* The first baseline of a varying one: the window's mean, and
		 * the spread of its samples (their squares in alg[1], in
		 * quarters of microseconds), kept before ctl is written. */
		uint64_t sq = atomic_exchange(&a->alg[1], 0) / w.n, q = w.mean_us / 4;
		uint64_t sd = sq > q * q ? ad_isqrt(sq - q * q) : 0;
		uint64_t cv16 = q > 0 ? sd * 16 / q : 0, lo = first_us(FIRST_SHORTEST(first));

		if (cv16 < FIRST_REGULAR16) {
			/* Steady samples that hardly vary: the service time
			 * is regular after all, and the first completions
			 * were spread by a queue in the backend (one of
			 * capacity under FIRST_K, the load above it from the
			 * start: 2 at S, 2 at 2 S...). The shortest of them
			 * is the baseline, as for any regular one. */
			atomic_store(&a->alg[0], 0);
			if (lo < w.mean_us)
				w.mean_us = lo;
		} else {
			atomic_store(&a->alg[0], FIRST_VARIES | FIRST_WARM |
			    (cv16 > 0xff ? 0xff : cv16));
		}
	}
	/* Little's law over the window; a stall's is what is in flight. */
	w.conc16 = n > 0 ? inflight * 16 : sum * 16 / el;
	if (n == 0) {
		/* A stall's ages must not stretch the next windows (their
		 * length follows the last sample): the replies that end it
		 * should be judged as soon as they come. */
		atomic_store(&a->sample_us, w.mean_us);
		atomic_store(&a->sample_conc16, w.conc16);
	}
	atomic_fetch_add(&a->windows, 1);
	/* Pinned by `set` (AD_OFF): the window is measured, the limit stays. */
	if (atomic_load(&a->mode) != AD_ON)
		return;
	w.end_us = now_us;
	old = atomic_load(&a->ctl);
	if (alg == AD_ALG_BULKSHIM) {
		ad_unpack(old, &st);
		keep_load(a, &st, keep);
		why = ad_step(&p, &st, &w);
		next = ad_pack(&st);
	} else {
		why = ad_pub_window(a, alg, &w, old, &next, aux);
	}
	if (next == old) {
		/* The limit stays; what the controller keeps beside ctl may
		 * still have moved (a cut under test, say). */
		if (alg != AD_ALG_BULKSHIM)
			ad_pub_aux(a, aux);
		else
			keep_store(a, &st, keep);
		return;
	}
	if (!atomic_compare_exchange_strong(&a->ctl, &old, next))
		return;
	/* A pin (ad_pin) sets the mode before it writes its limit: when the
	 * mode changed between the check above and this swap, the pin's limit
	 * was the one replaced (its write, if later, replaced this one). */
	if (atomic_load(&a->mode) != AD_ON) {
		atomic_compare_exchange_strong(&a->ctl, &next, old);
		return;
	}
	if (alg != AD_ALG_BULKSHIM)
		ad_pub_aux(a, aux);
	else
		keep_store(a, &st, keep);
	if (why != AD_R_NONE)
		note_change(a, AD_CTL_LIMIT(old) / 16, AD_CTL_LIMIT(next) / 16, why);
}

/*
 * Notes one of the first completions in alg[0]: among the FIRST_K
 * shortest, unless the service time was already found to vary. Returns
 * the word.
 */
static uint64_t
first_note(struct seg_adaptive *a, uint64_t us)
{
	uint64_t f = atomic_load(&a->alg[0]), v = first_code(us), x[FIRST_K], next;
	int i, k;

	do {
		if (f & FIRST_VARIES)
			return f;
		for (i = 0; i < FIRST_K; i++)
			x[i] = f >> (i * FIRST_BITS) & FIRST_MASK;
		for (k = 0; k < FIRST_K && x[k] != 0 && x[k] <= v; k++)
			;
		if (k == FIRST_K)
			return f;	/* not among the shortest */
		for (i = FIRST_K - 1; i > k; i--)
			x[i] = x[i - 1];
		x[k] = v;
		for (next = 0, i = 0; i < FIRST_K; i++)
			next |= x[i] << (i * FIRST_BITS);
	} while (!atomic_compare_exchange_weak(&a->alg[0], &f, next));
	return next;
}

/*
 * Drops the open window that started at `start` (if this caller wins it)
 * and marks the phase `flag` in alg[0]: the first completions of a varying
 * service time, then the warm-up window after them. Its mean latency is
 * kept in sample_us, so that the next window is at least that long.
 */
static void
first_restart(struct seg_adaptive *a, uint64_t start, uint64_t now_us, uint64_t flag)
{
	uint64_t f, acc;

	if (!atomic_compare_exchange_strong(&a->win_start_us, &start, now_us))
		return;		/* another completion did */
	f = atomic_load(&a->alg[0]);
	while (!(f & flag) && !atomic_compare_exchange_weak(&a->alg[0], &f,
	    flag == FIRST_VARIES ? FIRST_VARIES | (f & FIRST_MASK) << 8 : f | flag))
		;
	acc = atomic_exchange(&a->acc, 0);
	atomic_store(&a->alg[1], 0);
	if ((acc >> ACC_N_SHIFT) > 0)
		atomic_store(&a->sample_us, (acc & ACC_SUM_MASK) / (acc >> ACC_N_SHIFT));
}

/*
 * A completion before there is a baseline (f: alg[0] with it noted; acc:
 * the open window with it). The first AD_FIRST_SAMPLES completions are
 * the requests admitted first, which met no queue of ours. When their
 * FIRST_K shortest are within 5/4 of one another and their mean within
 * twice the shortest, the service time is regular, and the longer ones met
 * a queue in the backend (a FIFO backend under a load that starts above
 * its capacity C serves C at once): the shortest is the baseline, at once
 * (close_window). When they are not,
 * the service time varies by itself, and the shortest is the luck of the
 * draw: with exponential service times the least of 8 is an eighth of the
 * mean, and every later window would look like a queue. The first
 * completions are also the short ones (the long requests of the start are
 * still in flight), and so is the window after them: both are dropped,
 * and the baseline is the mean of the next AD_FIRST_WINDOWS windows. Unless
 * those windows hardly vary (close_window): a FIFO backend of capacity
 * under FIRST_K, under a load above it from the start, spreads its first
 * completions over whole service times (2 at S, 2 at 2 S...), and then
 * serves all at one steady latency, queue included.
 */
static void
first_sample(struct seg_comp *c, uint64_t f, uint64_t start, uint64_t now_us, uint64_t acc)
{
	struct seg_adaptive *a = &c->ad;
	uint64_t x1 = first_us(f & FIRST_MASK), n = acc >> ACC_N_SHIFT, win;
	uint64_t xk = first_us(f >> ((FIRST_K - 1) * FIRST_BITS) & FIRST_MASK);

	if (!(f & FIRST_VARIES)) {
		if (n < AD_FIRST_SAMPLES)
			return;
		if (xk * 4 <= x1 * 5 && (acc & ACC_SUM_MASK) / n <= 2 * x1)
			close_window(c, start, now_us, 0, 0, 0);
		else
			first_restart(a, start, now_us, FIRST_VARIES);
		return;
	}
	win = window_len(a);
	if (now_us - start < ((f & FIRST_WARM) ? AD_FIRST_WINDOWS : 1) * win)
		return;
	if (!(f & FIRST_WARM))
		first_restart(a, start, now_us, FIRST_WARM);
	else if (n >= AD_FIRST_SAMPLES ||
	    now_us - start >= 10 * AD_FIRST_WINDOWS * win)
		close_window(c, start, now_us, 0, 0, 0);
}

void
ad_sample(struct seg_comp *c, int p, uint64_t us, uint64_t now_us)
{
	struct seg_adaptive *a = &c->ad;
	uint64_t start, acc, win, n, f = 0;
	uint32_t lo;
	bool first, own;

	if (atomic_load_explicit(&a->mode, memory_order_relaxed) != AD_ON ||
	    atomic_load_explicit(&a->kind, memory_order_relaxed) != (uint32_t)p)
		return;
	if (us > SAMPLE_MAX_US)
		us = SAMPLE_MAX_US;
	acc = atomic_fetch_add(&a->acc, (1ULL << ACC_N_SHIFT) | us) + ((1ULL << ACC_N_SHIFT) | us);
	own = atomic_load_explicit(&a->algorithm, memory_order_relaxed) == AD_ALG_BULKSHIM;
	/* The window's shortest reply (did every request of it wait?): this
	 * controller's alone. */
	lo = own ? atomic_load_explicit(&a->win_min_us, memory_order_relaxed) : 1;
	while ((lo == 0 || us < lo) && us > 0 &&
	    !atomic_compare_exchange_weak(&a->win_min_us, &lo, (uint32_t)us))
		;
	start = atomic_load(&a->win_start_us);
	first = AD_CTL_BASE(atomic_load_explicit(&a->ctl, memory_order_relaxed)) == 0;
	if (first) {
		/* No baseline yet: the first completions give it
		 * (first_sample; a published controller's, the shortest of
		 * the first AD_FIRST_SAMPLES); while they are regular, the
		 * shortest of them is kept in sample_us, since a burst at the
		 * start queues in the backend's own accept and parse before
		 * any limit could (close_window). */
		f = own ? first_note(a, us) : 0;
		if (f & FIRST_WARM) {
			uint64_t q = us / 4 < (1ULL << 24) ? us / 4 : (1ULL << 24);

			atomic_fetch_add(&a->alg[1], q * q);
		} else if (!(f & FIRST_VARIES)) {
			uint64_t shortest = atomic_load(&a->sample_us);

			while ((shortest == 0 || us < shortest) &&
			    !atomic_compare_exchange_weak(&a->sample_us, &shortest, us))
				;
		}
	}
	if (start == 0 || start > now_us) {
		/* The first sample since the start (or a clock from elsewhere). */
		atomic_compare_exchange_strong(&a->win_start_us, &start, now_us);
		return;
	}
	if (first) {
		if (own)
			first_sample(c, f, start, now_us, acc);
		else if ((acc >> ACC_N_SHIFT) >= AD_FIRST_SAMPLES)
			close_window(c, start, now_us, 0, 0, 0);
		return;
	}
	if (now_us - start < (uint64_t)atomic_load(&a->window_ms) * 1000)
		return;
	win = window_len(a);
	n = acc >> ACC_N_SHIFT;
	/* Before the last window's latency is over, only when its replies
	 * are plainly of requests admitted in it (their mean under half its
	 * age): a backend that got fast again is judged at once. */
	if (now_us - start < win &&
	    (n < AD_MIN_SAMPLES || (acc & ACC_SUM_MASK) / n * 2 >= now_us - start))
		return;
	/* Few samples: wait for more, up to ten windows; a varying service
	 * time for more of them, or its mean would be mostly chance. */
	if (n < (own && (atomic_load_explicit(&a->alg[0], memory_order_relaxed) & FIRST_VARIES) ?
	    AD_VARIED_SAMPLES : AD_MIN_SAMPLES) && now_us - start < 10 * win)
		return;
	close_window(c, start, now_us, 0, 0, 0);
}

/* When this process last scanned each compartment's slots (ad_stall_due). */
static _Atomic uint64_t scanned_us[BS_MAX_COMPARTMENTS];

bool
ad_stall_due(struct seg_comp *c, uint32_t ci, uint64_t *now, uint64_t *old, uint64_t *start)
{
	struct seg_adaptive *a = &c->ad;
	uint64_t win, base, last, acc;

	if (ci >= BS_MAX_COMPARTMENTS)
		return false;
	if (atomic_load_explicit(&a->mode, memory_order_relaxed) != AD_ON)
		return false;	/* pinned: nothing to judge */
	*start = atomic_load(&a->win_start_us);
	base = ad_alg_latency_us(atomic_load_explicit(&a->algorithm, memory_order_relaxed),
	    atomic_load_explicit(&a->ctl, memory_order_relaxed));
	if (*start == 0 || base == 0)
		return false;
	/* window_ms, not the last window's latency: during a stall that
	 * latency is the ages, and waiting for ever longer windows would
	 * slow the cut down just when it matters. */
	*now = now_mono_us();
	win = (uint64_t)atomic_load(&a->window_ms) * 1000;
	if (*now < *start || *now - *start < win)
		return false;	/* not overdue: completions close it */
	*old = 2 * base * atomic_load(&a->tolerance_pct) / 100;
	acc = atomic_load_explicit(&a->acc, memory_order_relaxed);
	if ((acc >> ACC_N_SHIFT) >= AD_MIN_SAMPLES &&
	    (acc & ACC_SUM_MASK) / (acc >> ACC_N_SHIFT) > *old)
		return false;	/* the slow replies are coming: they close it, and judge */
	last = atomic_load_explicit(&scanned_us[ci], memory_order_relaxed);
	return *now - last >= win / 4 &&
	    atomic_compare_exchange_strong(&scanned_us[ci], &last, *now);
}

void
ad_stall(struct seg_comp *c, uint64_t start, uint64_t now, uint64_t n, uint64_t sum,
    uint64_t inflight)
{
	/* A stall: most of what is in flight is overdue. One slow request
	 * among many is not. */
	if (n == 0 || n * 2 < inflight)
		return;
	close_window(c, start, now, n, sum, inflight);
}

void
ad_reset_stats(struct seg_comp *c)
{
	struct seg_adaptive *a = &c->ad;

	atomic_store(&a->windows, 0);
	atomic_store(&a->changes, 0);
	atomic_store(&a->sample_us, 0);
	atomic_store(&a->sample_conc16, 0);
	atomic_store(&a->last_change_ms, 0);
	atomic_store(&a->last_from, 0);
	atomic_store(&a->last_to, 0);
	atomic_store(&a->last_reason, AD_R_NONE);
}

void
ad_apply(struct seg_comp *c, const struct cfg_compartment *cc)
{
	struct seg_adaptive *a = &c->ad;
	struct ad_state st;
	uint32_t was = atomic_load(&a->mode), alg_was;

	if (!cc->adaptive) {
		atomic_store(&a->mode, AD_NONE);
		return;
	}
	atomic_store(&a->kind, cc->max_inflight ? P_INFLIGHT : P_CONN);
	atomic_store(&a->min, cc->ad_min);
	atomic_store(&a->max, cc->ad_max);
	atomic_store(&a->window_ms, cc->ad_window_ms);
	atomic_store(&a->tolerance_pct, cc->ad_tolerance_pct);
	atomic_store(&a->static_limit, cc->max_inflight ? cc->max_inflight : cc->max_connections);
	atomic_store(&a->timeout_ms, cc->ad_timeout_ms);
	atomic_store(&a->backoff_pct, cc->ad_backoff_pct);
	atomic_store(&a->min_rtt_interval_ms, cc->ad_min_rtt_interval_ms);
	atomic_store(&a->min_concurrency, cc->ad_min_concurrency);
	alg_was = atomic_exchange(&a->algorithm, cc->ad_algorithm);
	if (cc->ad_algorithm != AD_ALG_BULKSHIM) {
		ad_pub_apply(a, cc, was == AD_NONE || alg_was != cc->ad_algorithm);
		atomic_store(&a->mode, AD_ON);
		return;
	}
	ad_unpack(atomic_load(&a->ctl), &st);
	if (alg_was != AD_ALG_BULKSHIM)
		st.limit16 = 0;	/* another controller's state: start afresh */
	if (was == AD_NONE || st.limit16 == 0) {
		/* Newly adaptive: start from `initial` (by default max, so
		 * that nothing is refused before there is a reason to), learn
		 * a baseline from the first completions. */
		st.limit16 = cc->ad_initial * 16;
		st.base_us = 0;
		st.ramp = cc->ad_initial < cc->ad_max;
		atomic_store(&a->sample_us, 0);
		atomic_store(&a->alg[0], 0);
		st.floor_windows = 0;
		st.probe = false;
		atomic_store(&a->alg[2], 0);	/* nothing kept (keep_load) */
		atomic_store(&a->alg[3], 0);
		atomic_store(&a->acc, 0);
		atomic_store(&a->win_start_us, 0);
		atomic_store(&a->last_reason, AD_R_START);
		atomic_store(&a->last_from, 0);
		atomic_store(&a->last_to, cc->ad_initial);
		atomic_store(&a->last_change_ms, now_real_ms());
	} else {
		/* A reload keeps what was learned, within the new bounds. */
		struct ad_params p = { cc->ad_min, cc->ad_max, cc->ad_tolerance_pct, false };

		st.limit16 = clamp16(&p, st.limit16);
	}
	atomic_store(&a->ctl, ad_pack(&st));
	atomic_store(&a->mode, AD_ON);
}

/* Writes limit (whole permits) into the controller's word, keeping the
 * baseline it learned and starting its phase afresh (no ramp, no run of
 * cuts): what a pin holds and what a resume starts from. */
static void
put_limit(struct seg_adaptive *a, uint32_t limit)
{
	uint64_t old = atomic_load(&a->ctl), next;
	struct ad_state st;

	if (limit < 1)
		limit = 1;
	if (limit > ((1u << AD_LIMIT_BITS) - 1) / 16)
		limit = ((1u << AD_LIMIT_BITS) - 1) / 16;
	if (atomic_load(&a->algorithm) != AD_ALG_BULKSHIM) {
		ad_pub_put_limit(a, limit);
		return;
	}
	do {
		ad_unpack(old, &st);
		st.limit16 = limit * 16;
		st.ramp = false;
		st.floor_windows = 0;
		st.high = false;
		st.prev16 = 0;
		st.stuck = 0;
		st.probe = false;
		next = ad_pack(&st);
	} while (!atomic_compare_exchange_weak(&a->ctl, &old, next));
}

/* The static limit word that c's adaptive limit stands in for. */
static _Atomic uint32_t *
limit_word(struct seg_comp *c)
{
	return atomic_load(&c->ad.kind) == P_CONN ? &c->limit : &c->inflight_limit;
}

int
ad_set_mode(struct seg_comp *c, bool on)
{
	struct seg_adaptive *a = &c->ad;
	_Atomic uint32_t *word = limit_word(c);
	uint32_t mode = atomic_load(&a->mode), cur, pin;
	struct ad_params p = { atomic_load(&a->min), atomic_load(&a->max), 0, false };

	if (mode == AD_NONE)
		return -EINVAL;
	if (!on) {
		if (mode != AD_ON)
			return 0;
		cur = ad_current(c);
		if (cur < atomic_load(word))
			atomic_store(word, cur);
		pin = atomic_load(word);
		ad_pin(c, pin);
		return 0;
	}
	if (mode == AD_ON)
		return 0;
	/* The pin is the static word (a `set` of the limit or `adaptive off`
	 * wrote it there): the controller starts from it, within its bounds. */
	pin = atomic_load(word);
	cur = clamp16(&p, (uint64_t)(pin < (1u << 20) ? pin : (1u << 20)) * 16) / 16;
	put_limit(a, cur);
	atomic_store(&a->win_start_us, 0);
	atomic_store(&a->acc, 0);
	atomic_store(&a->mode, AD_ON);
	atomic_store(word, atomic_load(&a->static_limit));
	note_change(a, pin, cur, AD_R_RESUMED);
	return 0;
}

void
ad_pin(struct seg_comp *c, uint32_t v)
{
	uint32_t mode = atomic_load(&c->ad.mode);
	uint32_t was = mode == AD_ON ? ad_current(c) : AD_CTL_LIMIT(atomic_load(&c->ad.ctl)) / 16;

	if (mode == AD_NONE)
		return;
	/* The mode first: a window closing meanwhile sees it and leaves the
	 * limit to this pin (close_window). */
	atomic_store(&c->ad.mode, AD_OFF);
	put_limit(&c->ad, v);
	note_change(&c->ad, was, v, AD_R_PINNED);
}

const char *
ad_reason_name(unsigned r)
{
	static const char *const names[AD_R_MAX] = {
		[AD_R_NONE] = "none", [AD_R_START] = "start", [AD_R_RAMP] = "ramp",
		[AD_R_GROW] = "grow", [AD_R_QUEUE] = "queue", [AD_R_SLOWER] = "slower_backend",
		[AD_R_PINNED] = "pinned", [AD_R_RESUMED] = "resumed",
	};

	return r < AD_R_MAX ? names[r] : "?";
}

const char *
ad_mode_name(unsigned mode)
{
	return mode == AD_ON ? "on" : mode == AD_OFF ? "off" : "none";
}
