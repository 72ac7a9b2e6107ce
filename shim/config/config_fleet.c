/* config_fleet.c - the `fleet` block and the fleet_limit/fleet_floor keys of a compartment. */
#include "config/config_int.h"

#include <errno.h>
#include <libconfig.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FLEET_LEASE_DEFAULT_MS	3000
#define FLEET_LEASE_MIN_MS	300
#define FLEET_LEASE_MAX_MS	600000
#define FLEET_HOSTS_MAX		100000
/* Linux's default keepalive gives up on a dead peer after 7200 s idle and
 * nine probes 75 s apart: a database server that keeps the default (as
 * PostgreSQL and Redis do) counts a vanished host's connections that long. */
#define FLEET_FORGET_DEFAULT_S	(7200 + 9 * 75)
#define FLEET_FORGET_MAX_S	(7 * 86400)

static const char *const fleet_keys[] = {
	"redis", "password_file", "name", "host", "hosts", "lease_ms", "interval_ms", "timeout_ms",
	"forget_s", NULL,
};

/* "unix:/path", "host:port" or "[v6]:port", port 1..65535. */
static bool
addr_ok(const char *a)
{
	const char *colon;
	char *end;
	long port;

	if (strncmp(a, "unix:", 5) == 0)
		return a[5] == '/' && strlen(a + 5) <= BS_UNIX_PATH_MAX;
	colon = strrchr(a, ':');
	if (colon == NULL || colon == a)
		return false;
	if (a[0] == '[' && colon[-1] != ']')
		return false;
	if (a[0] != '[' && memchr(a, ':', (size_t)(colon - a)) != NULL)
		return false;	/* a bare IPv6 address: its port is ambiguous */
	port = strtol(colon + 1, &end, 10);
	return colon[1] != '\0' && *end == '\0' && port >= 1 && port <= 65535;
}

static int
get_text(struct cfg_ctx *c, const config_setting_t *s, char *out, size_t len)
{
	const char *v = NULL;
	int rc = cfg_get_string(c, s, &v);

	if (rc < 0)
		return rc;
	if (v[0] == '\0')
		return cfg_fail(c, s, -EINVAL, "fleet %s is empty", cfg_key_of(s));
	if (strlen(v) >= len)
		return cfg_fail(c, s, -EINVAL, "fleet %s is %zu characters, more than %zu",
				cfg_key_of(s), strlen(v), len - 1);
	snprintf(out, len, "%s", v);
	return 0;
}

/* Reads `fleet = { redis = "127.0.0.1:6379"; name = "shop-prod"; ... };`.
 * Returns 0, or -EINVAL with a message at the offending line. */
int
cfg_parse_fleet(struct cfg_ctx *c, const config_setting_t *s)
{
	struct cfg_fleet *f = &c->cfg->fleet;
	const config_setting_t *e;
	long long v = 0;
	int rc = 0;

	if (!config_setting_is_group(s))
		return cfg_fail(c, s, -EINVAL, "\"fleet\" must be a group like { redis = "
				"\"127.0.0.1:6379\"; name = \"shop\"; }, not %s",
				cfg_type_name(config_setting_type(s)));
	for (int i = 0; i < config_setting_length(s); i++) {
		e = config_setting_get_elem(s, (unsigned)i);
		if (!cfg_is_known(cfg_key_of(e), fleet_keys))
			return cfg_unknown_key(c, e, fleet_keys, " in fleet");
	}
	f->on = true;
	f->line = cfg_line_of(c, s);
	if ((e = config_setting_get_member(s, "redis")) == NULL)
		return cfg_fail(c, s, -EINVAL, "fleet has no \"redis\" (host:port or unix:/path)");
	if ((rc = get_text(c, e, f->redis, sizeof(f->redis))) < 0)
		return rc;
	if (!addr_ok(f->redis))
		return cfg_fail(c, e, -EINVAL, "fleet redis \"%s\" is neither host:port, [v6]:port "
				"nor unix:/path", f->redis);
	if ((e = config_setting_get_member(s, "name")) == NULL)
		return cfg_fail(c, s, -EINVAL, "fleet has no \"name\": the hosts sharing a budget "
				"must name the same fleet");
	if ((rc = get_text(c, e, f->name, sizeof(f->name))) < 0 ||
	    (rc = cfg_check_name(c, e, "fleet", f->name)) < 0)
		return rc;
	if ((e = config_setting_get_member(s, "password_file")) != NULL &&
	    (rc = get_text(c, e, f->password_file, sizeof(f->password_file))) < 0)
		return rc;
	if ((e = config_setting_get_member(s, "host")) != NULL) {
		if ((rc = get_text(c, e, f->host, sizeof(f->host))) < 0 ||
		    (rc = cfg_check_name(c, e, "fleet host", f->host)) < 0)
			return rc;
	}
	/* The most hosts of the fleet: Redis holds back the floor of each,
	 * also of those it has not heard from (they run on their floors). */
	if ((e = config_setting_get_member(s, "hosts")) != NULL) {
		if ((rc = cfg_get_range(c, e, 1, FLEET_HOSTS_MAX, &v)) < 0)
			return rc;
		f->max_hosts = (uint32_t)v;
	}
	f->lease_ms = FLEET_LEASE_DEFAULT_MS;
	if ((e = config_setting_get_member(s, "lease_ms")) != NULL) {
		if ((rc = cfg_get_range(c, e, FLEET_LEASE_MIN_MS, FLEET_LEASE_MAX_MS, &v)) < 0)
			return rc;
		f->lease_ms = (uint32_t)v;
	}
	/* Six renewals a lease: a round trip or two may fail before the
	 * lease runs out, and a share follows the load within a second. */
	f->interval_ms = f->lease_ms / 6;
	if ((e = config_setting_get_member(s, "interval_ms")) != NULL) {
		if ((rc = cfg_get_range(c, e, 10, f->lease_ms / 3, &v)) < 0)
			return rc;
		f->interval_ms = (uint32_t)v;
	}
	f->timeout_ms = f->interval_ms;
	if ((e = config_setting_get_member(s, "timeout_ms")) != NULL) {
		if ((rc = cfg_get_range(c, e, 10, f->lease_ms / 3, &v)) < 0)
			return rc;
		f->timeout_ms = (uint32_t)v;
	}
	/* A silent host's connections are counted until they must be dead. */
	f->forget_s = FLEET_FORGET_DEFAULT_S;
	if ((e = config_setting_get_member(s, "forget_s")) != NULL) {
		if ((rc = cfg_get_range(c, e, 1, FLEET_FORGET_MAX_S, &v)) < 0)
			return rc;
		if ((uint64_t)v * 1000 < 2 * (uint64_t)f->lease_ms)
			return cfg_fail(c, e, -EINVAL, "fleet forget_s %lld is less than two leases "
					"(lease_ms %u)", v, f->lease_ms);
		f->forget_s = (uint32_t)v;
	}
	return 0;
}

/* The default host name in the fleet: this machine's name and the
 * segment's, "web1/shop", as a name can be ("web1" is one already). */
static void
default_host(struct cfg_fleet *f, const char *segment)
{
	char node[BS_HOST_MAX / 2];

	if (gethostname(node, sizeof(node)) < 0 || node[0] == '\0')
		snprintf(node, sizeof(node), "%s", "localhost");
	node[sizeof(node) - 1] = '\0';
	for (char *p = node; *p != '\0'; p++)
		if (!cfg_name_char(*p))
			*p = '_';
	snprintf(f->host, sizeof(f->host), "%s/%s", node, segment);
}

/* Reads fleet_limit and fleet_floor of one compartment, if set. */
int
cfg_parse_comp_fleet(struct cfg_ctx *c, const config_setting_t *g, struct cfg_compartment *comp)
{
	const config_setting_t *lim = config_setting_get_member(g, "fleet_limit");
	const config_setting_t *flo = config_setting_get_member(g, "fleet_floor");
	long long v = 0;
	int rc;

	if (lim == NULL) {
		if (flo != NULL)
			return cfg_fail(c, flo, -EINVAL, "fleet_floor of \"%s\" without fleet_limit",
					comp->name);
		return 0;
	}
	if ((rc = cfg_get_range(c, lim, 1, BS_MAX_LIMIT, &v)) < 0)
		return rc;
	comp->fleet_limit = (uint32_t)v;
	if (comp->max_connections == 0)
		return cfg_fail(c, lim, -EINVAL, "fleet_limit of \"%s\" needs max_connections, this "
				"host's own ceiling", comp->name);
	if (flo != NULL) {
		if ((rc = cfg_get_range(c, flo, 0, comp->fleet_limit, &v)) < 0)
			return rc;
		if (v > comp->max_connections)
			return cfg_fail(c, flo, -EINVAL, "fleet_floor %lld of \"%s\" is above its "
					"max_connections %u", v, comp->name, comp->max_connections);
		comp->fleet_floor = (uint32_t)v;
	}
	return 0;
}

/* After the whole file: fleet keys need the block, and the block needs a
 * compartment to lease for. */
int
cfg_check_fleet(struct cfg_ctx *c)
{
	const struct bs_config *cfg = c->cfg;
	bool any = false;

	for (size_t i = 0; i < cfg->ncomp; i++) {
		if (cfg->comp[i].fleet_limit == 0)
			continue;
		any = true;
		if (!cfg->fleet.on)
			return cfg_fail_at(c, c->path, cfg->comp[i].line, -EINVAL,
					   "compartment \"%s\" sets fleet_limit but there is no "
					   "fleet = { redis = ...; name = ...; } block", cfg->comp[i].name);
	}
	if (cfg->fleet.on && !any)
		return cfg_fail_at(c, c->path, cfg->fleet.line, -EINVAL,
				   "a fleet block, but no compartment sets fleet_limit");
	/* After the whole file: the segment may be named after the block. */
	if (cfg->fleet.on && cfg->fleet.host[0] == '\0')
		default_host(&c->cfg->fleet, cfg->segment);
	return 0;
}
