/* cmd_check.c - `bulkshim check` (a config and its budget as bars) and `bulkshim list`. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

#define BAR_WIDTH 40
#define COMP_COLUMN 24	/* room for compartment names in `list` */

/* ---- check ---- */

/* The settings of a compartment beyond max_connections, as one line;
 * empty when it sets none. */
static void
settings_line(const struct bs_config *cfg, const struct cfg_compartment *cc, char *buf,
    size_t len)
{
	size_t n = 0;

#define ADD(...) do { \
	if (n < len) \
		n += (size_t)snprintf(buf + n, len - n, "%s", n ? ", " : ""); \
	if (n < len) \
		n += (size_t)snprintf(buf + n, len - n, __VA_ARGS__); \
} while (0)
	buf[0] = '\0';
	if (cc->max_inflight)
		ADD("max_inflight %u", cc->max_inflight);
	if (cc->max_wait_ms)
		ADD("max_wait_ms %u", cc->max_wait_ms);
	if (cc->max_waiting)
		ADD("max_waiting %u", cc->max_waiting);
	if (cc->connect_timeout_ms)
		ADD("connect_timeout_ms %u", cc->connect_timeout_ms);
	if (cc->io_timeout_ms)
		ADD("io_timeout_ms %u", cc->io_timeout_ms);
	if (!cc->enforce)
		ADD("enforce off (observe mode)");
	if (cc->drills)
		ADD("drills allowed");
	for (size_t k = 0; k < cfg->nclass && k < BS_MAX_CLASSES; k++) {
		if (cc->class_limit[k])
			ADD("class %s %u", cfg->classes[k].name, cc->class_limit[k]);
	}
#undef ADD
}

/* What every compartment may have in use at once, as the budget counts it:
 * the compartments outside pools at their max_connections (an adaptive
 * limit or a fleet share moves below it), and each pool once, at the most
 * it can have in use (cfg_pool_most: its members' ceilings overlap by
 * design). */
static uint64_t
total_most(const struct bs_config *cfg)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < cfg->ncomp; i++)
		if (cfg->comp[i].pool == BS_NO_POOL)
			sum += cfg->comp[i].max_connections;
	for (size_t p = 0; p < cfg->npools; p++)
		sum += cfg_pool_most(cfg, p);
	return sum;
}

/* The lines under a compartment's bar that say how its limit is made: the
 * pool it draws from, the adaptive range, the fleet's arithmetic. */
static void
print_arithmetic(const struct bs_config *cfg, const struct cfg_compartment *cc)
{
	const char *pad = "                                    ";	/* under the bar */

	if (cc->pool != BS_NO_POOL) {
		const struct cfg_pool *pool = &cfg->pools[cc->pool];

		printf("%spool %s: guaranteed %u, ceiling %u; with the pool's other members it "
		    "holds at most the pool's %llu\n", pad, pool->name, cc->guaranteed,
		    cc->max_connections, (unsigned long long)cfg_pool_most(cfg, (size_t)cc->pool));
	}
	if (cc->adaptive) {
		const char *what = cc->max_inflight ? "max_inflight" : "max_connections";

		printf("%sadaptive %s: the live limit starts at %u and moves between min %u and "
		    "max %u with the latency (window_ms %u, tolerance_pct %u); never above %u; "
		    "algorithm %s", pad, what,
		    cc->ad_initial, cc->ad_min, cc->ad_max, cc->ad_window_ms, cc->ad_tolerance_pct,
		    cc->ad_max, ad_alg_name(cc->ad_algorithm));
		/* The knobs the chosen controller reads. */
		if (cc->ad_algorithm == AD_ALG_VEGAS || cc->ad_algorithm == AD_ALG_AIMD)
			printf(" (a window past timeout_ms %u is a drop", cc->ad_timeout_ms);
		if (cc->ad_algorithm == AD_ALG_AIMD)
			printf(", backoff_pct %u", cc->ad_backoff_pct);
		if (cc->ad_algorithm == AD_ALG_VEGAS || cc->ad_algorithm == AD_ALG_AIMD)
			printf(")");
		if (cc->ad_algorithm == AD_ALG_ENVOY)
			printf(" (min_concurrency %u for a minRTT window every min_rtt_interval_ms %u "
			    "+ up to 15 %%)", cc->ad_min_concurrency, cc->ad_min_rtt_interval_ms);
		printf("\n");
	}
	if (cc->fleet_limit != 0) {
		const struct cfg_fleet *f = &cfg->fleet;

		printf("%sfleet %s: fleet_limit %u across its hosts; this host's share is leased "
		    "from Redis, at most its max_connections %u, and falls to fleet_floor %u "
		    "without a valid lease\n", pad, f->name, cc->fleet_limit, cc->max_connections,
		    cc->fleet_floor);
		if (f->max_hosts != 0) {
			uint64_t floors = (uint64_t)f->max_hosts * cc->fleet_floor;

			printf("%s  hosts %u x fleet_floor %u = %llu %s fleet_limit %u%s\n", pad,
			    f->max_hosts, cc->fleet_floor, (unsigned long long)floors,
			    floors > cc->fleet_limit ? ">" : "<=", cc->fleet_limit,
			    floors > cc->fleet_limit ? " (the warning above)" : "");
		} else {
			printf("%s  hosts not set: Redis holds back the floors of the hosts it knows\n",
			    pad);
		}
		printf("%s  lease_ms %u, renewed every %u ms\n", pad, f->lease_ms, f->interval_ms);
	}
}

/* The total line: the sum, as the budget counts it, and how it is made. */
static void
print_total(const struct bs_config *cfg, uint64_t sum)
{
	char b[BAR_WIDTH + 1];

	if (cfg->has_budget) {
		cli_bar(b, BAR_WIDTH, cfg->reserved, cfg->pool, 'r');
		printf("  %-24s %7u  %s\n", "(reserved)", cfg->reserved, b);
		cli_bar(b, BAR_WIDTH, sum + cfg->reserved, cfg->pool, '=');
		printf("  %-24s %7llu  %s  of a pool of %u, %llu free\n", "total",
		    (unsigned long long)(sum + cfg->reserved), b, cfg->pool,
		    (unsigned long long)(cfg->pool - sum - cfg->reserved));
	} else if (cfg->npools > 0) {
		printf("  %-24s %7llu  the most in use at once, each pool counted once at what "
		    "it caps\n", "total", (unsigned long long)sum);
	} else {
		printf("  %-24s %7llu  (no budget set)\n", "total", (unsigned long long)sum);
	}
	for (size_t p = 0; p < cfg->npools; p++) {
		uint64_t ceil = 0;

		for (size_t i = 0; i < cfg->ncomp; i++)
			if (cfg->comp[i].pool == (int)p)
				ceil += cfg->comp[i].max_connections;
		printf("  %-24s %7s  pool %s counts %llu: its members' ceilings sum to %llu, "
		    "capped at its size %u less %u reserved\n", "", "", cfg->pools[p].name,
		    (unsigned long long)cfg_pool_most(cfg, p), (unsigned long long)ceil,
		    cfg->pools[p].size, cfg->pools[p].reserved);
	}
}

/* Prints the addresses host rule r resolved to when the config was loaded,
 * the /128 rules that carry its name; false when it has none. */
static bool
print_addresses(const struct bs_config *cfg, const struct rule *r)
{
	static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };
	char addr[INET6_ADDRSTRLEN];
	size_t n = 0;

	for (size_t i = 0; i < cfg->nrules; i++) {
		const struct rule *a = &cfg->rules[i];

		if (a->kind != RULE_IP || a->comp != r->comp || a->port_lo != r->port_lo ||
		    a->port_hi != r->port_hi || strcmp(a->host, r->host) != 0)
			continue;
		if (memcmp(a->addr, mapped, sizeof(mapped)) == 0)
			inet_ntop(AF_INET, a->addr + 12, addr, sizeof(addr));
		else
			inet_ntop(AF_INET6, a->addr, addr, sizeof(addr));
		printf("%s %s", n++ ? "," : "", addr);
	}
	return n > 0;
}

/* Lists each host-name destination and what it resolved to at load, the
 * addresses the library would match from its start. */
static void
print_hosts(const struct bs_config *cfg)
{
	for (size_t i = 0; i < cfg->nrules; i++) {
		const struct rule *r = &cfg->rules[i];
		char ports[16], said[BS_HOST_MAX + BS_NAME_MAX + 40];

		if (r->kind != RULE_HOST)
			continue;
		if (r->port_lo == r->port_hi)
			snprintf(ports, sizeof(ports), ":%u", r->port_lo);
		else if (r->port_lo == 0 && r->port_hi == 65535)
			ports[0] = '\0';
		else
			snprintf(ports, sizeof(ports), ":%u-%u", r->port_lo, r->port_hi);
		printf("  host %s%s (%s) ->", r->host, ports, cfg->comp[r->comp].name);
		snprintf(said, sizeof(said), "host \"%s\" of compartment \"%s\" ", r->host,
		    cfg->comp[r->comp].name);
		if (print_addresses(cfg, r))
			;
		else if (cfg->unresolved != NULL && strstr(cfg->unresolved, said) != NULL)
			fputs(" NOTHING: not limited (the error above)", stdout);
		else
			fputs(" only addresses that destinations written earlier have", stdout);
		putchar('\n');
	}
}

static void
print_budget(const struct bs_config *cfg, size_t errors, size_t warnings)
{
	char b[BAR_WIDTH + 1], lim[16], more[512], verdict[64];
	uint64_t sum = total_most(cfg), scale;

	/* Without a budget the bars share what can be in use at once. */
	scale = cfg->has_budget ? cfg->pool : sum;
	if (errors > 0)
		snprintf(verdict, sizeof(verdict), "NOT ok, %zu error%s above", errors,
		    errors == 1 ? "" : "s");
	else if (warnings > 0)
		snprintf(verdict, sizeof(verdict), "ok, with %zu warning%s above", warnings,
		    warnings == 1 ? "" : "s");
	else
		snprintf(verdict, sizeof(verdict), "ok");
	printf("%s: %s, segment %s, %zu compartment%s\n", cfg->path, verdict, cfg->segment,
	    cfg->ncomp, cfg->ncomp == 1 ? "" : "s");
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *cc = &cfg->comp[i];
		const char *en = cfg_errno_name(cc->reject_errno);

		cli_bar(b, BAR_WIDTH, cc->max_connections, scale ? scale : 1, '#');
		printf("  %-24s %7s  %s  %s\n", cc->name, cc->max_connections ?
		    cli_limit_text(cc->max_connections, lim, sizeof(lim)) : "-", b,
		    en != NULL ? en : "ECONNREFUSED");
		settings_line(cfg, cc, more, sizeof(more));
		if (more[0] != '\0')
			printf("  %-24s %7s  %s\n", "", "", more);
		else if (cc->max_connections == 0)
			printf("  %-24s %7s  %s\n", "", "", "no connection limit");
		print_arithmetic(cfg, cc);
	}
	print_total(cfg, sum);
	cli_check_pools(cfg);
	for (size_t k = 1; k < cfg->nclass; k++) {
		printf("  class %s:", cfg->classes[k].name);
		for (size_t p = 0; p < cfg->classes[k].npatterns; p++)
			printf(" %s", cfg->classes[k].patterns[p]);
		puts(cfg->classes[k].npatterns ? "" : " (no patterns: BULKSHIM_CLASS only)");
	}
	print_hosts(cfg);
}

/* Warns, on stderr, of each fleet compartment whose floors cannot all fit
 * in its fleet_limit: every host may run on its floor without asking Redis,
 * so hosts x fleet_floor above the limit lets the fleet pass it. Returns
 * how many warnings it gave. */
static size_t
warn_fleet_floors(const struct bs_config *cfg)
{
	uint32_t hosts = cfg->fleet.max_hosts;
	size_t n = 0;

	if (!cfg->fleet.on || hosts == 0)
		return 0;
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *cc = &cfg->comp[i];
		uint64_t floors = (uint64_t)hosts * cc->fleet_floor;

		if (cc->fleet_limit == 0 || floors <= cc->fleet_limit)
			continue;
		n++;
		fprintf(stderr, "bulkshim: warning: %s:%d: compartment \"%s\": hosts %u x fleet_floor "
		    "%u = %llu, more than fleet_limit %u: hosts on their floors (Redis unreachable, "
		    "agents stopped) may hold that many; lower fleet_floor to at most %u\n",
		    cfg->path, cc->line, cc->name, hosts, cc->fleet_floor, (unsigned long long)floors,
		    cc->fleet_limit, cc->fleet_limit / hosts);
	}
	return n;
}

int
cmd_check(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct bs_config cfg;
	char err[BS_ERRLEN];
	bool quiet = false;
	size_t errors, warnings;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+qh", longopts, NULL)) != -1) {
		switch (c) {
		case 'q':
			quiet = true;
			break;
		case 'h':
			return cli_help("check", stdout, 0);
		default:
			return cli_help("check", stderr, 2);
		}
	}
	if (optind + 1 != argc)
		return cli_help("check", stderr, 2);
	/* Exactly what the library runs at start-up, host names included,
	 * but every error rather than the first. */
	if (cfg_load_all(argv[optind], &cfg, true, err, sizeof(err)) < 0) {
		cli_print_errors(err);
		return 1;
	}
	/* Every error and warning first, then the verdict and the report: a
	 * reader who stops at "ok" has missed nothing. A name that gave no
	 * address limits nothing until the program's own lookup finds one:
	 * an error, as the library would run. */
	errors = cfg.nunresolved;
	if (cfg.unresolved != NULL)
		cli_print_errors(cfg.unresolved);
	warnings = warn_fleet_floors(&cfg);
	fflush(stderr);
	if (!quiet)
		print_budget(&cfg, errors, warnings);
	cfg_free(&cfg);
	return errors ? 1 : 0;
}

/* ---- list ---- */

struct seg_info {
	char name[256];
	char owner[64];
	uint32_t uid;
	uint64_t size;
	bool valid;
	char reason[BS_ERRLEN];
	uint32_t processes, ncomp;
	char **comps;
};

static int
by_name(const void *a, const void *b)
{
	return strcmp(((const struct seg_info *)a)->name, ((const struct seg_info *)b)->name);
}

static void
inspect(const char *file, struct seg_info *si)
{
	char path[300], err[BS_ERRLEN];
	struct passwd *pw;
	struct stat st;
	struct seg *s;
	int r;

	memset(si, 0, sizeof(*si));
	snprintf(si->name, sizeof(si->name), "%s", file + strlen("bulkshim."));
	snprintf(path, sizeof(path), "/dev/shm/%s", file);
	if (lstat(path, &st) < 0) {
		snprintf(si->reason, sizeof(si->reason), "%s", strerror(errno));
		return;
	}
	si->uid = (uint32_t)st.st_uid;
	si->size = (uint64_t)st.st_size;
	pw = getpwuid(st.st_uid);
	if (pw != NULL)
		snprintf(si->owner, sizeof(si->owner), "%s", pw->pw_name);
	else
		snprintf(si->owner, sizeof(si->owner), "%u", (unsigned)st.st_uid);
	if (!S_ISREG(st.st_mode)) {
		snprintf(si->reason, sizeof(si->reason), "not a regular shared-memory object");
		return;
	}
	if (strlen(si->name) == 0 || strlen(si->name) >= BS_NAME_MAX) {
		snprintf(si->reason, sizeof(si->reason), "name too long for a segment");
		return;
	}
	r = seg_open(si->name, false, &s, err, sizeof(err));
	if (r < 0) {
		/* "segment /dev/shm/bulkshim.x: bad magic" says the name twice. */
		const char *why = strstr(err, ": ");

		snprintf(si->reason, sizeof(si->reason), "%s", r == -EACCES ? "permission denied" :
		    why != NULL ? why + 2 : err);
		return;
	}
	si->valid = true;
	si->processes = cli_live_processes(s);
	si->ncomp = s->ncomp;
	si->comps = calloc(si->ncomp, sizeof(char *));
	for (uint32_t i = 0; si->comps != NULL && i < si->ncomp; i++)
		si->comps[i] = strndup(seg_comp(s, i)->name, BS_NAME_MAX - 1);
	seg_close(s);
}

static void
print_list(const struct seg_info *all, size_t n, bool json)
{
	if (json) {
		fputs("{\"segments\": [", stdout);
		for (size_t i = 0; i < n; i++) {
			const struct seg_info *si = &all[i];

			fputs(i ? ", {\"name\": " : "{\"name\": ", stdout);
			cli_json_string(stdout, si->name);
			fputs(", \"owner\": ", stdout);
			cli_json_string(stdout, si->owner);
			printf(", \"uid\": %u, \"size\": %llu, \"valid\": %s", si->uid,
			    (unsigned long long)si->size, si->valid ? "true" : "false");
			if (!si->valid) {
				fputs(", \"reason\": ", stdout);
				cli_json_string(stdout, si->reason);
				fputs("}", stdout);
				continue;
			}
			printf(", \"processes\": %u, \"compartments\": [", si->processes);
			for (uint32_t k = 0; k < si->ncomp; k++) {
				if (k)
					fputs(", ", stdout);
				cli_json_string(stdout, si->comps && si->comps[k] ? si->comps[k] : "");
			}
			fputs("]}", stdout);
		}
		fputs("]}\n", stdout);
		return;
	}
	printf("%-24s %-12s %12s %9s  %s\n", "SEGMENT", "OWNER", "SIZE", "PROCESSES",
	    "COMPARTMENTS");
	for (size_t i = 0; i < n; i++) {
		const struct seg_info *si = &all[i];

		printf("%-24s %-12s %12llu ", si->name, si->owner, (unsigned long long)si->size);
		if (!si->valid) {
			printf("%9s  invalid: %s\n", "-", si->reason);
			continue;
		}
		/* The row stays one line: the names that fit, then how many
		 * there are in all (--json lists every one). */
		printf("%9u  ", si->processes);
		for (uint32_t k = 0, used = 0; k < si->ncomp; k++) {
			const char *name = si->comps && si->comps[k] ? si->comps[k] : "?";

			if (used + strlen(name) + 1 > COMP_COLUMN && si->ncomp > 1) {
				printf(",... (%u)", si->ncomp);
				break;
			}
			used += (uint32_t)printf("%s%s", k ? "," : "", name);
		}
		putchar('\n');
	}
}

int
cmd_list(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct seg_info *all = NULL, *more;
	size_t n = 0, cap = 0;
	struct dirent *e;
	bool json = false;
	DIR *d;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
		if (c == 'j')
			json = true;
		else if (c == 'h')
			return cli_help("list", stdout, 0);
		else
			return cli_help("list", stderr, 2);
	}
	if (optind != argc)
		return cli_help("list", stderr, 2);
	d = opendir("/dev/shm");
	if (d == NULL) {
		fprintf(stderr, "bulkshim: cannot read /dev/shm: %s\n", strerror(errno));
		return 1;
	}
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, "bulkshim.", 9) != 0)
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			more = realloc(all, cap * sizeof(*all));
			if (more == NULL) {
				fprintf(stderr, "bulkshim: out of memory\n");
				break;
			}
			all = more;
		}
		inspect(e->d_name, &all[n++]);
	}
	closedir(d);
	if (n > 0)
		qsort(all, n, sizeof(*all), by_name);
	print_list(all, n, json);
	for (size_t i = 0; i < n; i++) {
		for (uint32_t k = 0; all[i].comps != NULL && k < all[i].ncomp; k++)
			free(all[i].comps[k]);
		free(all[i].comps);
	}
	free(all);
	return 0;
}
