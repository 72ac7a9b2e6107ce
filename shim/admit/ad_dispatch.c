/* ad_dispatch.c - the published controllers on a segment's words: their knobs, a window's step, their start, a pin. */
#include "admit/ad_alg.h"
#include "log.h"

/* The knobs of a published controller, as ad_apply wrote them. */
static void
pub_params(struct seg_adaptive *a, struct ad_pub_params *p)
{
	p->min = atomic_load(&a->min);
	p->max = atomic_load(&a->max);
	p->tolerance_pct = atomic_load(&a->tolerance_pct);
	p->timeout_ms = atomic_load(&a->timeout_ms);
	p->backoff_pct = atomic_load(&a->backoff_pct);
	p->min_rtt_interval_ms = atomic_load(&a->min_rtt_interval_ms);
	p->min_concurrency = atomic_load(&a->min_concurrency);
}

enum ad_reason
ad_pub_window(struct seg_adaptive *a, uint32_t alg, const struct ad_window *w, uint64_t old,
    uint64_t *next, uint64_t aux[2][2])
{
	struct ad_pub_params p;
	struct ad_pub_state st;
	enum ad_reason why = AD_R_NONE;

	pub_params(a, &p);
	ad_pub_unpack(old, &st);
	for (int i = 0; i < 2; i++)
		aux[0][i] = st.aux[i] = atomic_load(&a->alg[i]);
	if (alg == AD_ALG_VEGAS)
		why = ad_vegas_step(&p, &st, w);
	else if (alg == AD_ALG_GRADIENT2)
		why = ad_gradient2_step(&p, &st, w);
	else if (alg == AD_ALG_AIMD)
		why = ad_aimd_step(&p, &st, w);
	else if (alg == AD_ALG_ENVOY)
		why = ad_envoy_step(&p, &st, w);
	*next = ad_pub_pack(&st);
	aux[1][0] = st.aux[0];
	aux[1][1] = st.aux[1];
	return why;
}

void
ad_pub_aux(struct seg_adaptive *a, uint64_t aux[2][2])
{
	for (int i = 0; i < 2; i++)
		if (aux[1][i] != aux[0][i])
			atomic_compare_exchange_strong(&a->alg[i], &aux[0][i], aux[1][i]);
}

/* Starts a window afresh: nothing measured in it yet. */
static void
window_reset(struct seg_adaptive *a)
{
	atomic_store(&a->sample_us, 0);
	atomic_store(&a->acc, 0);
	atomic_store(&a->win_start_us, 0);
}

void
ad_pub_apply(struct seg_adaptive *a, const struct cfg_compartment *cc, bool fresh)
{
	struct ad_pub_params p;
	struct ad_pub_state st;

	pub_params(a, &p);
	ad_pub_unpack(atomic_load(&a->ctl), &st);
	if (fresh || st.limit16 == 0) {
		ad_pub_start(cc->ad_algorithm, &p, cc->ad_initial, &st);
		window_reset(a);
		atomic_store(&a->last_reason, AD_R_START);
		atomic_store(&a->last_from, 0);
		atomic_store(&a->last_to, st.limit16 / 16);
		atomic_store(&a->last_change_ms, now_real_ms());
	} else {
		st.limit16 = st.limit16 < p.min * 16 ? p.min * 16 :
		    st.limit16 > p.max * 16 ? p.max * 16 : st.limit16;
	}
	for (int i = 0; i < 2; i++)
		atomic_store(&a->alg[i], st.aux[i]);
	atomic_store(&a->ctl, ad_pub_pack(&st));
}

void
ad_pub_put_limit(struct seg_adaptive *a, uint32_t limit)
{
	uint64_t old = atomic_load(&a->ctl), next;
	struct ad_pub_state st;

	do {
		ad_pub_unpack(old, &st);
		st.limit16 = limit * 16;
		if (atomic_load(&a->algorithm) == AD_ALG_ENVOY) {
			if (st.phase & AD_ENVOY_MINRTT)
				st.lat_us = 0;
			st.phase = 0;
		}
		next = ad_pub_pack(&st);
	} while (!atomic_compare_exchange_weak(&a->ctl, &old, next));
}
