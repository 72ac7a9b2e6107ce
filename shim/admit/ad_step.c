/* ad_step.c - the bulkshim adaptive controller's rule: the next limit and baseline from one window. */
#include "admit/ad_alg.h"
#include "admit/admit.h"

/*
 * Pure functions of the state in ctl (and the words kept beside it) and one
 * closed window; adaptive.c measures the windows in the segment and installs
 * what ad_step returns with one compare-and-swap.
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
 *   proportion, to what Little's law says the window's replies per second
 *   would keep in flight at the tolerated latency (its mean concurrency x
 *   tolerance x baseline / sample: from what is in flight, not from the
 *   limit; at least 1/8 and one of the whole permits admission enforces,
 *   so the latency can show the effect, landing on the nearest whole one,
 *   and at most halving per window): the queue it measures is drained at
 *   once, not slowly. A window whose concurrency was above the limit still
 *   measured the queue let in before the last cut; when the limit is at or
 *   below what its replies per second allow, it cuts no further.
 * - otherwise, if the limit is in use (mean concurrency within 7/8 of it,
 *   or within one permit), it grows: doubling while ramping up from an
 *   `initial` below max (and after the baseline was taken again, or a
 *   stall's cut, which says nothing of the capacity), until
 *   the first queue; then by 1/16 (at least one) per window, or by 1/4
 *   when the window met no queue at all (within a quarter of the
 *   tolerance: a capacity that came back). An unused limit does not grow,
 *   so it stays meaningful.
 * - a limit in use may still hold a queue the baseline was taken with: a
 *   backend that got faster is first measured at the limit that suited it
 *   slow. Such a queue shows only when the concurrency goes down, so the
 *   controller probes (probe_start): one window at 3/4 of what is in
 *   flight; if latency falls by 1/8 or more, it probes again (a lower
 *   latency is the baseline), otherwise the window is judged as any
 *   other and the limit grows back. Only a limit in use is probed: after a
 *   faster backend, and once per AD_PROBE_WINDOWS windows where the window
 *   before was above the tolerance (the limit met a queue), except at a
 *   sure knee (below); and a limit
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
 * A backend that shares its processors among what is in flight
 * (PostgreSQL running CPU-bound queries) has no queue to find: the second
 * query slows both, past the tolerance, yet the two serve far more per
 * second than one. At a few permits (AD_KNEE_MAX), where a cut of one
 * whole permit is what the tolerance asked only part of, the cut is judged
 * by what it served (knee_test): a permit whose loss cost a quarter of the
 * replies per second was worth its latency, which is then the baseline, and
 * the limit goes back. That limit is the knee once a step to the permit
 * above it costs latency past the tolerance and serves less than a quarter
 * more: it holds there (the baseline following the latency at it, within
 * the tolerance squared), and the step above is tried every
 * AD_KNEE_RETRY_S. No periodic probe runs there: one permit fewer is
 * faster at a knee by its definition, and a probe would take that latency
 * for the baseline and cut the knee's permit away, to be found again.
 * A FIFO backend never shows a knee below its capacity: one permit fewer
 * above the capacity serves as many per second. The knee and the test in
 * progress live beside ctl in alg[3] (keep_load); lost, the controller
 * judges the next cut as any other.
 *
 * A queue of a permit or two hides in the tolerance: 18 in flight on a
 * FIFO backend of capacity 16 is 1.1 x the baseline, yet requests waited
 * for a server, and the p99 rises to two service times. On a regular
 * service time nothing else makes a reply take AD_SLOW_PCT of the
 * baseline, so the window counts such replies (ad_window.slow), and their
 * share times what was in flight is the queue (slow_queue16), above
 * AD_KNEE_MAX in flight and while at most 3/4 of the replies are slow
 * (more is a backend slower for all, or a queue the mean shows). Of that
 * queue the limit keeps a sixteenth of what is in flight, at least one
 * permit (AD_QUEUE_KEPT): a request holds its permit while it connects and
 * closes, not only while a server works on it, so at exactly the capacity
 * each server idles between its requests (the bench's 16 servers served
 * 370 replies/s at a limit of 16, 389 at 17, with a p99 of 45 and 74 ms).
 * A whole permit past it is cut by half of it (queue_cut: the share
 * overstates a queue, whose waits spread over the requests behind it), at
 * once where the limit let it in; half a permit holds the limit; a window
 * still draining a queue let in before a cut cuts nothing; a cut on the
 * window's mean goes no lower than taking all of the queue away. A cut of
 * a queue that the slow replies showed sets the edge one permit above where
 * it landed (edge_note): the limit grows to one permit under the edge, and
 * steps to it now and then, seldom at the peak (an edge found again: each
 * step there costs a window of a small queue), often below it (a capacity
 * that dropped may have come back) and above it (an edge not yet found
 * again). A step that meets the queue (a whole permit of it in any window,
 * half a permit in its second, or a mean above the tolerance) goes back
 * one permit under the edge, found again, and no further: at 18 on 16 a
 * window of clients in step shows a queue of up to five. One whose second
 * window shows none sends the edge back to the peak, or, at the peak,
 * climbs it by 1, 2, 4... permits every two windows (a capacity above any
 * seen) until a step meets the queue. Below an edge, a window whose replies
 * did not wait past the queue kept is no queue of ours whatever its mean
 * (the clients' waves, a backend slower for every request), and is judged
 * as one within the tolerance. At a few permits (AD_KNEE_MAX) the slow
 * replies measure no queue (one permit is a share of the latency that a
 * backend sharing its processors makes every reply pay): there the edge is the permit whose cut served as many per second
 * (knee_test), and a knee, a permit that served more, forgets it. Edge,
 * peak and climb live in alg[1] above the window's count (keep_load):
 * lost, the controller is what it was without them.
 *
 * In observe mode (enforce = false) nothing is cut, so the limit is what
 * Little's law gives: the window's concurrency scaled by tolerance x
 * baseline / sample; refusals it would make are counted in would_reject.
 * No probe lowers a limit that is not in use or is still growing into the
 * load, and none runs in observe mode: traffic below capacity, which such a
 * limit admits, is not refused by a probe (Envoy's #8337, #18152, whose
 * periodic minimum-latency windows drop every limit to a fixed few).
 */

#define AD_FLOOR_WINDOWS	3
#define AD_STUCK_WINDOWS	3
#define AD_NOISE_MAX	80	/* percent: the most noise_pct widens the tolerance */
#define AD_GROW_FREE	4	/* a limit with no queue at all grows by 1/this a window */
#define AD_SETTLED_S	2	/* a baseline that stood this long was the backend's */
#define AD_KEEP_S	900	/* how long the baseline from before a slowdown is kept */

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

uint32_t
ad_clamp16(const struct ad_params *p, uint64_t v)
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
	next = ad_clamp16(p, next);
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

/*
 * Whether the window's slow replies say anything: not on a service time
 * that varies by itself, a stall, observe mode (no cut can show), or when
 * most replies were slow (the backend slower for every request, or a queue
 * the mean shows by itself).
 */
static bool
slow_known(const struct ad_params *p, const struct ad_window *w)
{
	return !p->observe && !w->stall && w->spread16 == 0 && w->done > 0 &&
	    w->slow * 4 <= w->done * 3;
}

/*
 * What was in flight times the share of the window's replies that were slow,
 * in 1/16ths of a permit (done > 0), past the queue the limit keeps: a
 * sixteenth of what is in flight, at least one permit (AD_QUEUE_KEPT). A
 * request holds its permit while it connects and closes, not only while a
 * server works on it, so a limit of exactly the capacity leaves each server
 * idle between its requests (5 % of the bench's 16 servers' replies per
 * second); one permit more keeps them busy, and its wait is short.
 */
static uint64_t
slow_share16(const struct ad_window *w)
{
	uint64_t share = w->conc16 * w->slow / w->done, kept = w->conc16 / AD_QUEUE_KEPT;

	if (kept < 16)
		kept = 16;
	return share > kept ? share - kept : 0;
}

/*
 * The queue the window's slow replies show, in 1/16ths of a permit: their
 * share of the replies times what was in flight. On a regular service time
 * (a FIFO backend of capacity C at L in flight: about (L - C) / L of the
 * replies waited) nothing else makes a reply take AD_SLOW_PCT of the
 * baseline, while the window's mean hides a queue of a permit or two in
 * the tolerance. 0 where the share says nothing (slow_known), and at a few
 * permits in flight, where one permit is a share of the latency that a
 * backend sharing its processors makes every reply pay (knee_test).
 */
static uint64_t
slow_queue16(const struct ad_params *p, const struct ad_window *w)
{
	if (!slow_known(p, w) || w->conc16 <= AD_KNEE_MAX * 16)
		return 0;
	return slow_share16(w);
}

/* Where a cut to `next` (1/16ths) from `from` in flight lands: at most
 * halving, on the nearest whole permit (admission enforces whole ones: at
 * 1.97 it would admit 1), at least one below the limit's whole `whole`. */
static uint64_t
land_cut(uint64_t next, uint64_t from, uint64_t whole)
{
	if (next < from / 2)
		next = from / 2;
	next = (next + 8) & ~15ULL;
	if (next >= whole && whole >= 32)
		next = whole - 16;
	return next;
}

/* A cut of the queue q16 (1/16ths) from `from` in flight: half of it, to the
 * nearest whole permit, at least one below the limit's whole `whole`, at
 * most halving. The share overstates the queue: a request that waits makes
 * the ones behind it wait too (at 18 on the bench's 16 servers, a quarter
 * of the replies took 1.25 x the baseline), and a cut below the capacity
 * refuses what it could serve, while one short of the queue is cut again
 * in the next window. */
static uint64_t
queue_cut(uint64_t from, uint64_t q16, uint64_t whole)
{
	uint64_t cut = (q16 / 2 + 8) & ~15ULL;

	return land_cut(from > cut ? from - cut : 0, from, whole);
}

/* The edge and all that goes with it are forgotten: the limit is what it
 * was without one. */
static void
edge_forget(struct ad_state *st)
{
	st->edge = st->peak = st->edge_n = st->climb = 0;
}

/*
 * A cut of a queue on a regular service time landed at `lim16`: one permit
 * above it is the edge. An edge found again (the step to it met the queue
 * again) at or above the peak is the peak; below the peak it counts, and
 * AD_PEAK_AGAIN of them make it the peak (the capacity that dropped stayed
 * down). The step to the edge is then judged from its second window, and a
 * climb (edge_climb) starts again from one permit.
 */
static void
edge_note(struct ad_state *st, uint64_t lim16, bool few)
{
	uint32_t e = (uint32_t)(lim16 / 16) + 1;

	if (e <= AD_KNEE_MAX && !few)
		return;		/* the knee's (knee_test): one permit is a share there */
	if (e > AD_EDGE_MAX) {
		edge_forget(st);
		return;
	}
	if (e == st->edge && e >= st->peak) {
		st->peak = e;
		st->edge_n = 0;
	} else if (e == st->edge && ++st->edge_n >= AD_PEAK_AGAIN) {
		st->peak = e;
		st->edge_n = 0;
	}
	st->edge = e;
	st->edge_seen = false;
	st->climb = 0;
}

/*
 * A step onto the edge (the limit's whole `whole`) met the queue: back one
 * permit under it, which is found again (edge_note, `few` as there).
 */
static enum ad_reason
edge_back(const struct ad_params *p, struct ad_state *st, uint64_t whole, bool few)
{
	uint32_t lim = st->limit16;

	st->limit16 = ad_clamp16(p, whole - 16);
	st->high = false;
	st->ramp = false;
	edge_note(st, st->limit16, few);
	return st->limit16 != lim ? AD_R_QUEUE : AD_R_NONE;
}

/*
 * Two windows at the edge met no queue: the capacity is above it. Below the
 * peak, the edge goes back to the peak (a capacity that dropped came back:
 * the limit grows as any other up to one under it); at or above it, the
 * edge climbs by 1, 2, 4... permits, a step every two windows (the first
 * one's replies were admitted below it), until a step meets the queue and
 * is cut (a capacity above any seen). Returns false when the edge is gone
 * (past max, or AD_EDGE_MAX: nothing above it to find).
 */
static bool
edge_climb(const struct ad_params *p, struct ad_state *st)
{
	if (st->edge < st->peak) {
		st->edge = st->peak;
		st->climb = 0;
		st->edge_seen = false;
		return true;
	}
	if (st->climb < AD_CLIMB_MAX)
		st->climb++;
	st->edge += 1u << (st->climb - 1);
	st->edge_seen = false;	/* judged from its second window, as any step */
	if (st->edge > AD_EDGE_MAX || st->edge > p->max) {
		edge_forget(st);
		return false;
	}
	return true;
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
 * - A step up from a knee: the permit above it stays if the latency stays
 *   within the tolerance, or if it served a quarter more per second or
 *   better (its latency is then the baseline): there was no knee, or it
 *   moved. Otherwise the knee is sure (knee_ok): the limit is back at it,
 *   and the step is tried again in AD_KNEE_RETRY_S.
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
		if (whole * st->base_us * 4 >= (n - 1) * 16 * m * 5) {
			/* Slower, but it served a quarter more per second or
			 * better: this latency is the backend's own. */
			take_slower(st, m, now_s);
			st->knee = 0;
			st->high = false;
			*why = AD_R_SLOWER;
			return true;
		}
		/* It cost latency and served less than a quarter more: the
		 * knee is sure. */
		st->limit16 = ad_clamp16(p, (n - 1) * 16);
		st->knee_ok = true;
		st->knee_s = now_s;
		st->high = false;
		*why = AD_R_QUEUE;
		return true;
	}
	if (w->conc16 > lim * 2 || before == 0)
		return false;
	if (whole * before * 4 >= n * 256 * m * 3) {
		/* One permit fewer served three quarters as many or more:
		 * that permit was a queue, and n is the edge. */
		if (whole == (n - 1) * 16)
			edge_note(st, whole, true);
		return false;
	}
	take_slower(st, before / 16, now_s);
	st->limit16 = ad_clamp16(p, n * 16);
	if (st->knee != n)
		st->knee_ok = false;
	st->knee = (uint32_t)n;
	edge_forget(st);	/* the permit served: no queue begins there */
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
	uint64_t base = st->base_us, next, r16, whole = lim & ~15ULL, from, pre, little, q16;
	bool in_use, held, was_high, lower, at_knee, below_edge, faster = false;
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
	/* At a sure knee (knee_test, which may have just dropped it): one
	 * permit fewer is faster there, and serves less. Observe mode cuts
	 * nothing, so it has no knee. */
	at_knee = !p->observe && st->knee_ok && st->knee > 0 && whole == (uint64_t)st->knee * 16;
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
	/* Below an edge, a window whose replies did not wait (less than half
	 * a permit of them slow past the queue kept: slow_share16) met no
	 * queue of ours, whatever its mean: the edge is where the queue
	 * showed. Such a mean is the clients' waves, or a backend slower for
	 * every request at the same capacity; the window is judged as one
	 * within the tolerance. */
	q16 = slow_queue16(p, w);
	below_edge = st->edge > 0 && whole < (uint64_t)st->edge * 16 && slow_known(p, w) &&
	    slow_share16(w) < 8;
	if (m * 100 > base * tol && !below_edge) {
		if (at_knee && !w->stall && m * 10000 <= base * tol * tol) {
			/* At a sure knee the limit stays put, so a latency
			 * that moves there (up to the tolerance over the
			 * tolerance) is the backend's, not a queue of ours:
			 * the baseline follows it up an eighth of the way, as
			 * it follows lower ones down, from the first such
			 * window (no window there is marked high). Beyond that
			 * (a capacity that halved, say), the window is judged
			 * as any other and the cut is tested again; so is a
			 * stall, whose ages are no latency to follow. */
			st->base_us = (uint32_t)(base + (m - base) / 8);
			st->high = false;
			return AD_R_NONE;
		}
		/* A step onto the edge above the tolerance (not far above:
		 * that is a capacity that dropped, cut as any other) met the
		 * queue found there before: back under the edge at once, and
		 * no further. A second window there would double what each
		 * step costs; at a few permits, a fifth of the replies wait. */
		if (st->edge > 0 && whole == (uint64_t)st->edge * 16 && !w->stall && !p->observe &&
		    m * 100 <= 2 * base * tol)
			return edge_back(p, st, whole, true);
		/* A queue (or a slower backend). One window above the
		 * tolerance may be noise; two in a row, or one far above,
		 * is not. */
		if (!st->high && m * 100 <= 2 * base * tol) {
			st->high = true;
			return AD_R_NONE;
		}
		/* Little's law on the window: the concurrency its replies per
		 * second would have at the tolerated latency. */
		little = w->conc16 * base * tol / (m * 100);
		if (p->observe) {
			/* Observe mode: the limit holds nothing back, so no
			 * cut can show in the latency. What it would be is
			 * the concurrency that Little's law says brings the
			 * latency back within the tolerance. */
			st->ramp = false;
			st->limit16 = ad_clamp16(p, little);
			return st->limit16 != lim ? AD_R_QUEUE : AD_R_NONE;
		}
		if (w->stall && !(lim <= (uint64_t)p->min * 16 && w->done > 0)) {
			/* Nothing completes, so no cut can show in the latency
			 * and the ages are only lower bounds: neither the floor
			 * nor the stuck rule may take them as the baseline.
			 * Little's law on what is in flight gives the limit
			 * that keeps the latency within the tolerance, at once.
			 * That cut says nothing of the capacity: once replies
			 * come back within the tolerance the limit doubles back
			 * (ramp) to the first queue, as from the start, not a
			 * permit a window from the few the stall left. */
			st->ramp = true;
			st->limit16 = ad_clamp16(p, little < lim ? little : lim);
			return st->limit16 != lim ? AD_R_QUEUE : AD_R_NONE;
		}
		/* A window whose concurrency was above the limit measured
		 * requests admitted before the last cut, a queue still
		 * draining; when the limit is already at or below what its
		 * throughput allows (little) there is nothing left to cut.
		 * Cutting again on the drain would take the limit below the
		 * capacity (and at the floor, take the draining queue for the
		 * backend's latency). */
		if (w->conc16 > lim && little >= whole)
			return AD_R_NONE;
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
		next = land_cut(next, from, whole);
		/* Where the slow replies show a queue, the cut goes no lower
		 * than taking all of it away: the mean of a queue of a permit
		 * or two is mostly the waits of the requests behind it, and a
		 * cut of an eighth would take the queue the limit keeps too. */
		if (q16 >= 16 && from > q16) {
			uint64_t all = land_cut(from - q16, from, whole);

			if (next < all)
				next = all;
		}
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
		/* Unless the slow replies show a queue of a whole permit or
		 * more (slow_queue16): that one is cut. */
		if (!held && m * 200 <= 3 * base * tol) {
			if (w->min_us > 0 && w->min_us * 100 > base * tol &&
			    probe_start(p, st, from, m))
				return AD_R_QUEUE;
			if (q16 >= 16)
				next = queue_cut(from, q16, whole);
			else if (next < w->conc16 * 3 / 2 + 16)
				next = w->conc16 * 3 / 2 + 16;
		}
		if (next > lim)
			next = lim;
		st->limit16 = ad_clamp16(p, next);
		if (st->limit16 == lim)
			return AD_R_NONE;
		/* The cut lands one permit under an edge when the slow replies
		 * showed the queue too: a mean above the tolerance may also be
		 * the clients' waves, or a backend that shares its processors,
		 * which slows every reply a little and none by half. */
		if (q16 >= 16)
			edge_note(st, st->limit16, false);
		return AD_R_QUEUE;
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
	/* Within the tolerance, a queue of a permit or two may still be
	 * there: the slow replies show it (slow_queue16). Half a permit of it
	 * or more holds the limit; a whole one is cut, at once where the limit
	 * let it in (held, or the step to the edge), otherwise when the window
	 * before was high too (traffic the limit does not hold back is not
	 * refused on one window). Not at a sure knee, whose latency is the
	 * backend's own. */
	if (at_knee)
		q16 = 0;
	if (q16 >= 16 && w->conc16 > lim)
		return AD_R_NONE;	/* a drain: the queue let in before the last cut */
	if (q16 >= 8 && st->edge > 0 && whole == (uint64_t)st->edge * 16 &&
	    (st->edge_seen || q16 >= 16)) {
		/* The step to the edge met the queue: half a permit of it in
		 * its second window (servers that free one after another keep
		 * the wait of one permit more short, so fewer replies show
		 * it), a whole one in either. Back under the edge, which is
		 * found again, and no further: one permit under it no reply
		 * waited past the queue kept, and a window of the clients in
		 * step at the edge (a queue of up to five at 18 on 16) would
		 * cut two or more. */
		return edge_back(p, st, whole, false);
	}
	if (q16 >= 16 && (held || was_high)) {
		st->limit16 = ad_clamp16(p, queue_cut(from, q16, whole));
		st->ramp = false;
		if (st->limit16 == lim)
			return AD_R_NONE;
		edge_note(st, st->limit16, false);
		return AD_R_QUEUE;
	}
	if (q16 >= 16)
		st->high = true;
	if (q16 >= 8)
		return AD_R_NONE;
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
	if (!p->observe && !st->ramp && (faster || (w->probe_due && was_high && !at_knee)) &&
	    probe_start(p, st, from, m))
		return AD_R_QUEUE;
	if (st->knee > 0 && !p->observe) {
		/* The permit above a knee is tried by knee_test: at once
		 * after the knee was found, then every AD_KNEE_RETRY_S once
		 * it is sure. Above the knee (the limit got there otherwise),
		 * growing, there is none. */
		if (whole == (uint64_t)st->knee * 16) {
			if (st->knee_ok && ((now_s - st->knee_s) & AD_KNEE_S_MASK) < AD_KNEE_RETRY_S)
				return AD_R_NONE;
			st->limit16 = ad_clamp16(p, whole + 16);
			if (st->limit16 == lim)
				return AD_R_NONE;
			knee_test_start(st, st->knee + 1, m * 16 / base, true);
			return AD_R_GROW;
		}
		if (whole > (uint64_t)st->knee * 16)
			st->knee = 0;
	}
	if (st->edge > 0 && noise == 0 && !p->observe) {
		/* Below the edge a limit grows to one permit under it. The step
		 * to it is taken seldom at a peak (probe_due: each step there
		 * costs a window of a small queue) and often elsewhere
		 * (edge_due: below the peak a capacity that dropped may have
		 * come back; above it the edge is not yet found again), at once
		 * while the edge climbs (edge_climb). A step is judged by its
		 * second window: the first one's replies were admitted below. */
		uint64_t e16 = (uint64_t)st->edge * 16;

		if (st->edge > p->max) {
			/* A reload lowered max under it: nothing to find. */
			edge_forget(st);
			e16 = 0;
		}
		if (whole + 16 == e16) {
			if (st->climb == 0 && !(st->edge == st->peak ? w->probe_due : w->edge_due))
				return AD_R_NONE;
			st->limit16 = ad_clamp16(p, e16);
			st->edge_seen = false;
			st->ramp = false;
			return st->limit16 != lim ? AD_R_GROW : AD_R_NONE;
		}
		if (whole == e16 && !st->edge_seen) {
			st->edge_seen = true;
			return AD_R_NONE;
		}
		if (whole == e16 && edge_climb(p, st) && st->climb > 0) {
			st->limit16 = ad_clamp16(p, (uint64_t)st->edge * 16);
			st->ramp = false;
			return st->limit16 != lim ? AD_R_GROW : AD_R_NONE;
		}
		if (whole > e16)
			st->edge = st->climb = 0;	/* the limit got there otherwise */
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
	if (st->edge > 0 && noise == 0 && !p->observe && next > (uint64_t)st->edge * 16 - 16)
		next = (uint64_t)st->edge * 16 - 16;
	if (next < lim)
		next = lim;
	st->limit16 = ad_clamp16(p, next);
	if (st->limit16 == lim)
		return AD_R_NONE;
	return st->ramp ? AD_R_RAMP : AD_R_GROW;
}
