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
 * The rule that moves the limit from one window to the next is the pure
 * function ad_step (ad_step.c); this file keeps its words in the segment.
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
 *
 * A compartment may run a published controller instead (seg_adaptive's
 * `algorithm`: Vegas, Gradient2, AIMD, Envoy; ad_published.c). The windows,
 * the stall check and the one CAS of ctl are the same; only the step
 * differs (ad_pub_window). What such a controller keeps beside ctl, in alg[], is
 * written after ctl by compare-and-swap, and is safe to lose: a process
 * killed between the two leaves a later probe or minRTT window, never a
 * wrong limit.
 */

#define AD_FIRST_SAMPLES	8	/* completions that give the first baseline */
#define AD_FIRST_WINDOWS	8	/* windows the mean of a varying service is taken over */
#define AD_VARIED_SAMPLES	16	/* samples a window of a varying service waits for */
#define SAMPLE_MAX_US	0xffffffffULL	/* a longer sample counts as 71 minutes */

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

/*
 * Once the baseline is in, alg[1] is this controller's again: the open
 * window's replies slower than AD_SLOW_PCT of the baseline in its low
 * SLOW_BITS (one atomic add per such reply; close_window takes them out
 * with one atomic and), and above them the edge, the peak, edge_n and
 * edge_seen and climb (struct ad_state, keep_load). A count above the
 * window's replies (the sum of squares of a first phase that a late sample
 * added to) reads as none.
 */
#define SLOW_BITS	24
#define SLOW_MASK	((1ULL << SLOW_BITS) - 1)
#define EDGE_SHIFT	SLOW_BITS
#define PEAK_SHIFT	(SLOW_BITS + 16)
#define EDGE_N_SHIFT	(SLOW_BITS + 32)
#define EDGE_SEEN	(1ULL << (SLOW_BITS + 36))
#define CLIMB_SHIFT	(SLOW_BITS + 37)

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
keep_load(const struct seg_adaptive *a, struct ad_state *st, uint64_t was[3])
{
	uint64_t e = atomic_load(&a->alg[1]) & ~SLOW_MASK;

	was[2] = e;
	st->edge = (uint32_t)(e >> EDGE_SHIFT) & 0xffff;
	st->climb = (uint32_t)(e >> CLIMB_SHIFT) & 0x7;
	st->peak = (uint32_t)(e >> PEAK_SHIFT) & 0xffff;
	st->edge_n = (uint32_t)(e >> EDGE_N_SHIFT) & 0xf;
	st->edge_seen = (e & EDGE_SEEN) != 0;
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
	st->knee_s = (uint32_t)(was[1] >> 50) & AD_KNEE_S_MASK;
	st->knee_ok = (was[1] >> 63) != 0;
}

static void
keep_store(struct seg_adaptive *a, const struct ad_state *st, uint64_t was[3])
{
	uint64_t e = (uint64_t)(st->edge & 0xffff) << EDGE_SHIFT |
	    (uint64_t)(st->peak & 0xffff) << PEAK_SHIFT |
	    (uint64_t)(st->edge_n < 0xf ? st->edge_n : 0xf) << EDGE_N_SHIFT |
	    (st->edge_seen ? EDGE_SEEN : 0) | (uint64_t)(st->climb & 0x7) << CLIMB_SHIFT,
	    cur = atomic_load(&a->alg[1]);

	/* The count below moves with every slow reply: the edge is written
	 * while the bits above it are still what keep_load read. */
	while (e != was[2] && (cur & ~SLOW_MASK) == was[2] &&
	    !atomic_compare_exchange_weak(&a->alg[1], &cur, (cur & SLOW_MASK) | e))
		;
	uint64_t now[2] = { st->kept_us | (uint64_t)st->kept_s << 32,
			    st->base_s | (uint64_t)(st->knee & 0xf) << 32 |
			    (uint64_t)(st->test_n & 0xf) << 36 | (uint64_t)st->test_seen << 40 |
			    (uint64_t)st->test_up << 41 |
			    (uint64_t)(st->test_r16 < 0xff ? st->test_r16 : 0xff) << 42 |
			    (uint64_t)(st->knee_s & AD_KNEE_S_MASK) << 50 | (uint64_t)st->knee_ok << 63 };

	for (int i = 0; i < 2; i++)
		if (now[i] != was[i])
			atomic_compare_exchange_strong(&a->alg[2 + i], &was[i], now[i]);
}

/* What c's bulkshim controller keeps beside ctl, for the views: false when
 * c has no such controller. */
static bool
kept_of(const struct seg_comp *c, struct ad_state *st)
{
	uint64_t was[3];

	if (atomic_load(&c->ad.mode) == AD_NONE || atomic_load(&c->ad.algorithm) != AD_ALG_BULKSHIM)
		return false;
	keep_load(&c->ad, st, was);
	return true;
}

uint32_t
ad_knee(const struct seg_comp *c, bool *sure)
{
	struct ad_state st;

	*sure = false;
	if (!kept_of(c, &st))
		return 0;
	*sure = st.knee > 0 && st.knee_ok;
	return st.knee;
}

uint32_t
ad_edge(const struct seg_comp *c, bool *again)
{
	struct ad_state st;

	*again = false;
	if (!kept_of(c, &st))
		return 0;
	*again = st.edge > 0 && st.edge == st.peak;
	return st.edge;
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
	uint64_t acc, old, next, sum, el = now_us - start, period, aux[2][2], keep[3], first;
	enum ad_reason why;
	uint32_t alg;

	if (!atomic_compare_exchange_strong(&a->win_start_us, &start, now_us))
		return;		/* another completion closed it */
	/* A periodic probe is due in the window that crosses a multiple of
	 * AD_PROBE_WINDOWS windows on the clock: no word counts windows, and
	 * whichever process closes that window may start it. */
	period = AD_PROBE_WINDOWS * window_len(a);
	w.probe_due = n == 0 && period > 0 && start / period != now_us / period;
	period = AD_EDGE_WINDOWS * window_len(a);
	w.edge_due = n == 0 && period > 0 && start / period != now_us / period;
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
	w.slow = 0;
	if (AD_CTL_BASE(atomic_load(&a->ctl)) != 0) {
		if (first & FIRST_VARIES)
			w.spread16 = FIRST_SPREAD(first);
		if (alg == AD_ALG_BULKSHIM)
			w.slow = atomic_fetch_and(&a->alg[1], ~SLOW_MASK) & SLOW_MASK;
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
	uint64_t start, acc, win, n, f = 0, base;
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
	base = AD_CTL_BASE(atomic_load_explicit(&a->ctl, memory_order_relaxed));
	first = base == 0;
	/* A reply that waited: the slow share of the window (slow_queue16). */
	if (own && !first && us * 100 > base * AD_SLOW_PCT)
		atomic_fetch_add_explicit(&a->alg[1], 1, memory_order_relaxed);
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
		atomic_store(&a->alg[1], 0);	/* no edge, no slow reply */
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

		st.limit16 = ad_clamp16(&p, st.limit16);
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
	cur = ad_clamp16(&p, (uint64_t)(pin < (1u << 20) ? pin : (1u << 20)) * 16) / 16;
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
