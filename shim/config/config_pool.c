/* config_pool.c - pools in a config: their size and reserve, each compartment's guarantee and ceiling. */
#include "config/config_int.h"

#include <errno.h>
#include <libconfig.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const pool_keys[] = { "name", "size", "reserved", NULL };

static int parse_pool(struct cfg_ctx *c, const config_setting_t *g, size_t idx)
{
	struct cfg_pool *p = &c->cfg->pools[idx];
	const config_setting_t *s;
	const char *name = NULL;
	long long v = 0;
	int rc;

	if (!config_setting_is_group(g))
		return cfg_fail(c, g, -EINVAL, "pool %zu must be a group { name = ...; size = N; }, not %s",
				idx + 1, cfg_type_name(config_setting_type(g)));
	p->line = cfg_line_of(c, g);
	for (int i = 0; i < config_setting_length(g); i++) {
		const config_setting_t *e = config_setting_get_elem(g, (unsigned)i);

		if (!cfg_is_known(cfg_key_of(e), pool_keys))
			return cfg_unknown_key(c, e, pool_keys, " in a pool");
	}
	if ((s = config_setting_get_member(g, "name")) == NULL)
		return cfg_fail(c, g, -EINVAL, "pool %zu has no \"name\"", idx + 1);
	if ((rc = cfg_get_string(c, s, &name)) < 0 || (rc = cfg_check_name(c, s, "pool", name)) < 0)
		return rc;
	for (size_t i = 0; i < idx; i++)
		if (strcmp(c->cfg->pools[i].name, name) == 0)
			return cfg_fail(c, s, -EINVAL, "duplicate pool name \"%s\" (also on line %d)",
					name, c->cfg->pools[i].line);
	snprintf(p->name, sizeof(p->name), "%s", name);
	if ((s = config_setting_get_member(g, "size")) == NULL)
		return cfg_fail(c, g, -EINVAL, "pool \"%s\" has no \"size\"", p->name);
	if ((rc = cfg_get_int(c, s, &v)) < 0)
		return rc;
	if (v < 1 || v > BS_MAX_LIMIT)
		return cfg_fail(c, s, -EINVAL, "size of pool \"%s\" must be between 1 and %d, not %lld",
				p->name, BS_MAX_LIMIT, v);
	p->size = (uint32_t)v;
	if ((s = config_setting_get_member(g, "reserved")) != NULL) {
		if ((rc = cfg_get_int(c, s, &v)) < 0)
			return rc;
		if (v < 0 || v >= p->size)
			return cfg_fail(c, s, -EINVAL, "reserved of pool \"%s\" must be between 0 and %u "
					"(below its size), not %lld", p->name, p->size - 1, v);
		p->reserved = (uint32_t)v;
	}
	return 0;
}

/* Reads `pools = ( { name = "pg"; size = 100; reserved = 10; } );`.
 * Returns 0, or -EINVAL with a message. */
int cfg_parse_pools(struct cfg_ctx *c, const config_setting_t *s)
{
	int n = config_setting_length(s), rc;

	if (config_setting_type(s) != CONFIG_TYPE_LIST)
		return cfg_fail(c, s, -EINVAL, "\"pools\" must be a list ( { name = ...; size = N; }, ... ), "
				"not %s", cfg_type_name(config_setting_type(s)));
	if (n > BS_MAX_POOLS)
		return cfg_fail(c, s, -EINVAL, "%d pools; at most %d", n, BS_MAX_POOLS);
	for (int i = 0; i < n; i++) {
		if ((rc = parse_pool(c, config_setting_get_elem(s, (unsigned)i), (size_t)i)) < 0)
			return rc;
		c->cfg->npools = (size_t)i + 1;
	}
	return 0;
}

/* Reads a compartment's `pool` and `guaranteed`. A compartment in a pool
 * without max_connections gets the pool's room as its ceiling. */
int cfg_parse_comp_pool(struct cfg_ctx *c, const config_setting_t *g, struct cfg_compartment *comp)
{
	const config_setting_t *s = config_setting_get_member(g, "pool");
	const config_setting_t *gs = config_setting_get_member(g, "guaranteed");
	const char *name = NULL;
	long long v = 0;
	int rc;

	comp->pool = BS_NO_POOL;
	if (s == NULL) {
		if (gs != NULL)
			return cfg_fail(c, gs, -EINVAL, "\"guaranteed\" of \"%s\" needs a \"pool\" to "
					"guarantee a share of", comp->name);
		return 0;
	}
	if ((rc = cfg_get_string(c, s, &name)) < 0)
		return rc;
	for (size_t p = 0; p < c->cfg->npools; p++)
		if (strcmp(c->cfg->pools[p].name, name) == 0)
			comp->pool = (int)p;
	if (comp->pool == BS_NO_POOL)
		return cfg_fail(c, s, -EINVAL, "compartment \"%s\" names pool \"%s\", which \"pools\" "
				"does not declare", comp->name, name);
	comp->pool_line = cfg_line_of(c, s);
	if (gs != NULL) {
		if ((rc = cfg_get_int(c, gs, &v)) < 0)
			return rc;
		if (v < 0 || v > BS_MAX_LIMIT)
			return cfg_fail(c, gs, -EINVAL, "guaranteed of \"%s\" must be between 0 and %d, "
					"not %lld", comp->name, BS_MAX_LIMIT, v);
		comp->guaranteed = (uint32_t)v;
		comp->pool_line = cfg_line_of(c, gs);
	}
	if (config_setting_get_member(g, "max_connections") == NULL) {
		const struct cfg_pool *p = &c->cfg->pools[comp->pool];

		comp->max_connections = p->size - p->reserved;
	}
	return 0;
}

/* Each guarantee within its ceiling, and each pool's guarantees within its
 * size less its reserve, with every term listed. */
int cfg_check_pools(struct cfg_ctx *c)
{
	const struct bs_config *cfg = c->cfg;

	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *cc = &cfg->comp[i];

		if (cc->pool != BS_NO_POOL && cc->guaranteed > cc->max_connections)
			return cfg_fail_at(c, NULL, cc->pool_line, -EINVAL, "guaranteed %u of \"%s\" is "
					   "above its ceiling, max_connections %u", cc->guaranteed,
					   cc->name, cc->max_connections);
	}
	for (size_t p = 0; p < cfg->npools; p++) {
		const struct cfg_pool *pool = &cfg->pools[p];
		uint64_t sum = 0;
		size_t len = 0, cap = 64 + cfg->ncomp * (BS_NAME_MAX + 16);
		char *list;
		int rc;

		for (size_t i = 0; i < cfg->ncomp; i++)
			if (cfg->comp[i].pool == (int)p)
				sum += cfg->comp[i].guaranteed;
		if (sum <= (uint64_t)pool->size - pool->reserved)
			continue;
		if ((list = malloc(cap)) == NULL)
			return cfg_fail_at(c, NULL, pool->line, -ENOMEM, "out of memory");
		list[0] = '\0';
		for (size_t i = 0; i < cfg->ncomp; i++)
			if (cfg->comp[i].pool == (int)p && cfg->comp[i].guaranteed > 0 && len < cap)
				len += (size_t)snprintf(list + len, cap - len, "%s%u (%s)",
							len ? " + " : "", cfg->comp[i].guaranteed,
							cfg->comp[i].name);
		rc = cfg_fail_at(c, NULL, pool->line, -EINVAL, "pool \"%s\": guarantees exceed its "
				 "room: %s = %llu > %u - %u reserved", pool->name, list,
				 (unsigned long long)sum, pool->size, pool->reserved);
		free(list);
		return rc;
	}
	return 0;
}
