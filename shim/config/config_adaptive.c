/* config_adaptive.c - the `adaptive = { ... }` group of a compartment. */
#include "config/config_int.h"

#include <errno.h>
#include <libconfig.h>
#include <string.h>

#include "seg_layout.h"

static const char *const adaptive_keys[] = {
	"min", "max", "initial", "window_ms", "tolerance_pct", "algorithm", "timeout_ms",
	"backoff_pct", "min_rtt_interval_ms", "min_concurrency", NULL,
};

static const char *const alg_names[AD_ALG_MAX] = {
	[AD_ALG_BULKSHIM] = "bulkshim", [AD_ALG_VEGAS] = "vegas", [AD_ALG_GRADIENT2] = "gradient2",
	[AD_ALG_AIMD] = "aimd", [AD_ALG_ENVOY] = "envoy",
};

const char *
ad_alg_name(unsigned alg)
{
	return alg < AD_ALG_MAX ? alg_names[alg] : "?";
}

int
ad_alg_parse(const char *name)
{
	for (int i = 0; i < AD_ALG_MAX; i++)
		if (strcmp(name, alg_names[i]) == 0)
			return i;
	return -1;
}

/* `algorithm = "..."`, if present: one of alg_names. */
static int
get_algorithm(struct cfg_ctx *c, const config_setting_t *g, uint32_t *out)
{
	const config_setting_t *s = config_setting_get_member(g, "algorithm");
	const char *name;
	int rc, alg;

	if (s == NULL)
		return 0;
	if ((rc = cfg_get_string(c, s, &name)) < 0)
		return rc;
	if ((alg = ad_alg_parse(name)) < 0)
		return cfg_fail(c, s, -EINVAL, "unknown adaptive algorithm \"%.40s\" (known: bulkshim, "
				"vegas, gradient2, aimd, envoy)", name);
	*out = (uint32_t)alg;
	return 0;
}

/* Reads member `key` of group g into *out if present, within lo..hi. */
static int
get_member(struct cfg_ctx *c, const config_setting_t *g, const char *key, long long lo,
    long long hi, uint32_t *out)
{
	const config_setting_t *s = config_setting_get_member(g, key);
	long long v = 0;
	int rc;

	if (s == NULL)
		return 0;
	if ((rc = cfg_get_range(c, s, lo, hi, &v)) < 0)
		return rc;
	*out = (uint32_t)v;
	return 0;
}

/*
 * `adaptive = true;` (every default) or `adaptive = { min; max; initial;
 * window_ms; tolerance_pct; algorithm; timeout_ms; backoff_pct;
 * min_rtt_interval_ms; min_concurrency; }`: the last four are knobs of the
 * published controllers (admit/ad_published.c). The adaptive limit applies to max_inflight,
 * or to max_connections in a compartment without max_inflight, and never
 * exceeds that static limit (in a pool: the ceiling). Defaults: min 1 (in
 * a pool, the guarantee), max the static limit, initial max. Runs after
 * the compartment's pool and limits are read. Returns 0, or -EINVAL with a
 * message.
 */
int
cfg_parse_adaptive(struct cfg_ctx *c, const config_setting_t *s, struct cfg_compartment *comp)
{
	uint32_t cap = comp->max_inflight ? comp->max_inflight : comp->max_connections;
	const char *what = comp->max_inflight ? "max_inflight" : "max_connections";
	bool on = true;
	int rc;

	/* In a pool, a connection limit adapts between the guarantee (by
	 * default: adapting never takes back what the pool promised) and the
	 * ceiling, max_connections. */
	comp->ad_min = comp->pool != BS_NO_POOL && !comp->max_inflight && comp->guaranteed > 0 ?
	    comp->guaranteed : 1;
	comp->ad_max = cap;
	comp->ad_initial = 0;
	comp->ad_window_ms = AD_DEF_WINDOW_MS;
	comp->ad_tolerance_pct = AD_DEF_TOLERANCE_PCT;
	comp->ad_algorithm = AD_ALG_BULKSHIM;
	comp->ad_timeout_ms = AD_DEF_TIMEOUT_MS;
	comp->ad_backoff_pct = AD_DEF_BACKOFF_PCT;
	comp->ad_min_rtt_interval_ms = AD_DEF_MIN_RTT_INTERVAL_MS;
	comp->ad_min_concurrency = AD_DEF_MIN_CONCURRENCY;
	if (config_setting_type(s) == CONFIG_TYPE_BOOL) {
		if ((rc = cfg_get_bool(c, s, &on)) < 0)
			return rc;
	} else if (config_setting_is_group(s)) {
		for (int i = 0; i < config_setting_length(s); i++) {
			const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);

			if (!cfg_is_known(cfg_key_of(e), adaptive_keys))
				return cfg_unknown_key(c, e, adaptive_keys, " in adaptive");
		}
		if ((rc = get_algorithm(c, s, &comp->ad_algorithm)) < 0)
			return rc;
		/* Gradient2's published rttTolerance is 1.5, not our 115 %. */
		if (comp->ad_algorithm == AD_ALG_GRADIENT2)
			comp->ad_tolerance_pct = AD_DEF_GRADIENT2_TOLERANCE_PCT;
		if ((rc = get_member(c, s, "min", 1, BS_MAX_LIMIT, &comp->ad_min)) < 0 ||
		    (rc = get_member(c, s, "max", 1, BS_MAX_LIMIT, &comp->ad_max)) < 0 ||
		    (rc = get_member(c, s, "initial", 1, BS_MAX_LIMIT, &comp->ad_initial)) < 0 ||
		    (rc = get_member(c, s, "window_ms", 10, 60000, &comp->ad_window_ms)) < 0 ||
		    (rc = get_member(c, s, "tolerance_pct", 105, 1000, &comp->ad_tolerance_pct)) < 0 ||
		    (rc = get_member(c, s, "timeout_ms", 1, 3600000, &comp->ad_timeout_ms)) < 0 ||
		    /* AIMDLimit's backoffRatio must be in [0.5, 1.0). */
		    (rc = get_member(c, s, "backoff_pct", 50, 99, &comp->ad_backoff_pct)) < 0 ||
		    (rc = get_member(c, s, "min_rtt_interval_ms", 100, 3600000,
				     &comp->ad_min_rtt_interval_ms)) < 0 ||
		    (rc = get_member(c, s, "min_concurrency", 1, BS_MAX_LIMIT,
				     &comp->ad_min_concurrency)) < 0)
			return rc;
	} else {
		return cfg_fail(c, s, -EINVAL, "\"adaptive\" must be a group { min = ...; max = ...; } "
				"or true/false, not %s", cfg_type_name(config_setting_type(s)));
	}
	comp->adaptive = on;
	if (!on)
		return 0;
	if (comp->ad_max > cap)
		return cfg_fail(c, s, -EINVAL, "adaptive max %u of \"%s\" is above its %s %u "
				"(the static limit stays the ceiling)", comp->ad_max, comp->name, what, cap);
	if (comp->ad_min > comp->ad_max)
		return cfg_fail(c, s, -EINVAL, "adaptive min %u of \"%s\" is above its max %u",
				comp->ad_min, comp->name, comp->ad_max);
	/* Open at max by default: nothing is refused before a baseline says
	 * the backend queues (adaptive.c). */
	if (comp->ad_initial == 0)
		comp->ad_initial = comp->ad_max;
	if (comp->ad_initial < comp->ad_min || comp->ad_initial > comp->ad_max)
		return cfg_fail(c, s, -EINVAL, "adaptive initial %u of \"%s\" is outside min %u .. max %u",
				comp->ad_initial, comp->name, comp->ad_min, comp->ad_max);
	return 0;
}
