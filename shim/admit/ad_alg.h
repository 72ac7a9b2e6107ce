/* ad_alg.h - the published adaptive controllers (ad_published.c), beside bulkshim's own. */
#ifndef BULKSHIM_AD_ALG_H
#define BULKSHIM_AD_ALG_H

#include <stdbool.h>
#include <stdint.h>

#include "admit/admit.h"

/*
 * A published controller's state. What must move with the limit lives in
 * seg_adaptive.ctl, installed by one compare-and-swap: the limit in 1/16ths
 * (bits 0..23), one latency (bits 24..49: Vegas' no-load RTT, Gradient2's
 * long-term RTT, Envoy's minRTT; AIMD's last window mean, for the views and
 * the stall check) and a phase (bits 50..63). `aux` mirrors alg[0] and
 * alg[1]: words that may be lost or seen stale by a process killed between
 * the two swaps (a probe counter, the next minRTT deadline), never state
 * the limit depends on for its safety.
 */
struct ad_pub_state {
	uint32_t limit16;
	uint32_t lat_us;	/* 0 = none yet */
	uint32_t phase;		/* 14 bits, per controller */
	uint64_t aux[2];
};

/* The knobs of the published controllers (bulkshim.conf(5)). */
struct ad_pub_params {
	uint32_t min, max;		/* whole permits: every controller clamps to them */
	uint32_t tolerance_pct;		/* Gradient2's rttTolerance */
	uint32_t timeout_ms;		/* a window whose mean passes it is a drop */
	uint32_t backoff_pct;		/* AIMD's backoffRatio */
	uint32_t min_rtt_interval_ms;	/* Envoy: between minRTT windows, before jitter */
	uint32_t min_concurrency;	/* Envoy: the limit during a minRTT window */
};

/* Envoy's phase bits: in a minRTT window (the latency field then holds the
 * limit to return to, in 1/16ths), and windows in a row at the floor. */
#define AD_ENVOY_MINRTT		1u
#define AD_ENVOY_AT_MIN(ph)	(((ph) >> 1) & 0x7)

/* The integer square root (floor), for the windows' spread and Envoy's headroom. */
uint64_t ad_isqrt(uint64_t v);
uint64_t ad_pub_pack(const struct ad_pub_state *st);
/* Unpacks ctl; aux is left as the caller set it. */
void ad_pub_unpack(uint64_t ctl, struct ad_pub_state *st);

/*
 * The step functions: the state after window w (w->end_us is when it
 * closed). Pure: the same arguments give the same state; randomness (probe
 * and minRTT jitter) comes from a hash of w->end_us. Each returns the
 * reason of a change of the limit, AD_R_NONE when it did not move.
 */
enum ad_reason ad_vegas_step(const struct ad_pub_params *p, struct ad_pub_state *st,
    const struct ad_window *w);
enum ad_reason ad_gradient2_step(const struct ad_pub_params *p, struct ad_pub_state *st,
    const struct ad_window *w);
enum ad_reason ad_aimd_step(const struct ad_pub_params *p, struct ad_pub_state *st,
    const struct ad_window *w);
enum ad_reason ad_envoy_step(const struct ad_pub_params *p, struct ad_pub_state *st,
    const struct ad_window *w);

/* The state a published controller starts from at `initial` permits. */
void ad_pub_start(unsigned alg, const struct ad_pub_params *p, uint32_t initial,
    struct ad_pub_state *st);
/* The latency in ctl that the stall check may judge by (0: none, as in
 * Envoy's minRTT window, whose latency field is a limit). */
uint32_t ad_alg_latency_us(unsigned alg, uint64_t ctl);

/* ---- ad_dispatch.c: the published controllers on seg_adaptive's words ---- */

/*
 * Runs controller `alg` on window w from ctl word `old`: *next is the ctl
 * to install (by the caller's one CAS), aux[0] the alg[] words it read and
 * aux[1] the ones to write once ctl is in (ad_pub_aux). Returns the reason
 * of a change of the limit.
 */
enum ad_reason ad_pub_window(struct seg_adaptive *a, uint32_t alg, const struct ad_window *w,
    uint64_t old, uint64_t *next, uint64_t aux[2][2]);
/* Writes the alg[] words after ctl, each by compare-and-swap: a window
 * closed meanwhile by another process keeps its own. Losing them is safe. */
void ad_pub_aux(struct seg_adaptive *a, uint64_t aux[2][2]);
/* ad_apply for a published controller, after the knobs are written: `fresh`
 * (newly adaptive, or the algorithm changed) starts it at cc's initial with
 * an empty window; a reload otherwise keeps its state, the limit within the
 * new bounds. */
void ad_pub_apply(struct seg_adaptive *a, const struct cfg_compartment *cc, bool fresh);
/* Writes `limit` (whole permits) into ctl, the latency kept; Envoy's phase
 * starts afresh (out of a minRTT window, whose latency field was a limit,
 * into a new one at the next window). What a pin holds and a resume starts
 * from. */
void ad_pub_put_limit(struct seg_adaptive *a, uint32_t limit);

#endif
