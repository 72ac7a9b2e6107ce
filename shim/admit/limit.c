/* limit.c - the limit a take is held to now: the static limit, a fleet host's lease, the adaptive limit. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "admit/admit.h"
#include "log.h"

/*
 * A limit is a word of the compartment, written by the config, `bulkshim
 * set` or `reload`; two more may lower it while admission runs: in a
 * fleet budget the host's share of the fleet's limit (written by the fleet
 * agent, good while its lease lasts), and the adaptive limit (adaptive.c).
 * A take compares its count with what these say at that moment.
 */

/* What a fleet grants c now, from one read of the lease: the share while
 * the lease runs (*leased), the floor once it has run out. */
static inline uint32_t
fleet_grant(const struct seg_comp *c, bool *leased)
{
	*leased = now_mono_ms() < atomic_load_explicit(&c->fleet_expiry_ms, memory_order_acquire);
	return atomic_load_explicit(*leased ? &c->fleet_share : &c->fleet_floor,
	    memory_order_relaxed);
}

/* limit_conn's fleet part, out of line: its clock read would
 * otherwise cost every take registers it does not need without a fleet. */
static __attribute__((noinline)) uint32_t
fleet_limit(const struct seg_comp *c, uint32_t lim)
{
	bool leased;
	uint32_t share = fleet_grant(c, &leased);

	return share < lim ? share : lim;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE uint32_t
limit_conn(const struct seg_comp *c)
{
	uint32_t lim = atomic_load_explicit(&c->limit, memory_order_relaxed);

	if (__builtin_expect(atomic_load_explicit(&c->fleet_limit, memory_order_relaxed) == 0, 1))
		return lim;
	return fleet_limit(c, lim);
}

BS_LTO_INLINE uint32_t
limit_now(_Atomic uint32_t *limit, int p)
{
	uint32_t v = atomic_load(limit);

	if (p == P_INFLIGHT)
		return ad_limit((const struct seg_comp *)((uintptr_t)limit -
		    offsetof(struct seg_comp, inflight_limit)), p, v);
	if (p == P_CONN || p == P_KERN) {
		/* A fleet lease may lower the static limit (limit_conn); the
		 * count shared with a kernel engine (P_KERN) is held to the
		 * same limit as the compartment's own. */
		const struct seg_comp *c = (const struct seg_comp *)((uintptr_t)limit -
		    offsetof(struct seg_comp, limit));

		return ad_limit(c, p, limit_conn(c));
	}
	return v;
}
#pragma GCC diagnostic pop

uint32_t
limit_why(const struct seg_comp *c, int p, enum limit_by *by)
{
	uint32_t lim = p == P_INFLIGHT ?
	    atomic_load_explicit(&c->inflight_limit, memory_order_relaxed) :
	    atomic_load_explicit(&c->limit, memory_order_relaxed), v;

	*by = lim == UINT32_MAX ? LIMIT_BY_NONE : LIMIT_BY_STATIC;
	if (p != P_INFLIGHT && atomic_load_explicit(&c->fleet_limit, memory_order_relaxed) != 0) {
		bool leased;

		v = fleet_grant(c, &leased);
		if (v < lim) {
			lim = v;
			*by = leased ? LIMIT_BY_FLEET_SHARE : LIMIT_BY_FLEET_FLOOR;
		}
	}
	v = ad_limit(c, p == P_INFLIGHT ? P_INFLIGHT : P_CONN, lim);
	if (v < lim) {
		lim = v;
		*by = LIMIT_BY_ADAPTIVE;
	}
	return lim;
}

const char *
limit_by_name(enum limit_by by)
{
	static const char *const names[LIMIT_BY_MAX] = {
		[LIMIT_BY_NONE] = "none", [LIMIT_BY_STATIC] = "static",
		[LIMIT_BY_FLEET_SHARE] = "fleet share", [LIMIT_BY_FLEET_FLOOR] = "fleet floor",
		[LIMIT_BY_ADAPTIVE] = "adaptive", [LIMIT_BY_POOL] = "pool",
		[LIMIT_BY_CLASS] = "class",
	};

	return (unsigned)by < LIMIT_BY_MAX ? names[by] : "?";
}
