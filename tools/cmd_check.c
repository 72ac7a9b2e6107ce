/* cmd_check.c - `bulkshim check` (a config and its budget as bars) and `bulkshim list`. */
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
	for (size_t k = 0; k < cfg->nclass && k < BS_MAX_CLASSES; k++) {
		if (cc->class_limit[k])
			ADD("class %s %u", cfg->classes[k].name, cc->class_limit[k]);
	}
#undef ADD
}

static void
print_budget(const struct bs_config *cfg)
{
	char b[BAR_WIDTH + 1], lim[16], more[512];
	uint64_t sum = 0, scale;

	for (size_t i = 0; i < cfg->ncomp; i++)
		sum += cfg->comp[i].max_connections;
	/* Without a budget the bars share the sum of the limits. */
	scale = cfg->has_budget ? cfg->pool : sum;
	printf("%s: ok, segment %s, %zu compartment%s\n", cfg->path, cfg->segment, cfg->ncomp,
	    cfg->ncomp == 1 ? "" : "s");
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
	}
	if (cfg->has_budget) {
		cli_bar(b, BAR_WIDTH, cfg->reserved, cfg->pool, 'r');
		printf("  %-24s %7u  %s\n", "(reserved)", cfg->reserved, b);
		cli_bar(b, BAR_WIDTH, sum + cfg->reserved, cfg->pool, '=');
		printf("  %-24s %7llu  %s  of a pool of %u, %llu free\n", "total",
		    (unsigned long long)(sum + cfg->reserved), b, cfg->pool,
		    (unsigned long long)(cfg->pool - sum - cfg->reserved));
	} else {
		printf("  %-24s %7llu  (no budget set)\n", "total", (unsigned long long)sum);
	}
	cli_check_pools(cfg);
	for (size_t k = 1; k < cfg->nclass; k++) {
		printf("  class %s:", cfg->classes[k].name);
		for (size_t p = 0; p < cfg->classes[k].npatterns; p++)
			printf(" %s", cfg->classes[k].patterns[p]);
		puts(cfg->classes[k].npatterns ? "" : " (no patterns: BULKSHIM_CLASS only)");
	}
}

/* Warns, on stderr, of each fleet compartment whose floors cannot all fit
 * in its fleet_limit: every host may run on its floor without asking Redis,
 * so hosts x fleet_floor above the limit lets the fleet pass it. */
static void
warn_fleet_floors(const struct bs_config *cfg)
{
	uint32_t hosts = cfg->fleet.max_hosts;

	if (!cfg->fleet.on || hosts == 0)
		return;
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *cc = &cfg->comp[i];
		uint64_t floors = (uint64_t)hosts * cc->fleet_floor;

		if (cc->fleet_limit == 0 || floors <= cc->fleet_limit)
			continue;
		fprintf(stderr, "bulkshim: warning: %s:%d: compartment \"%s\": hosts %u x fleet_floor "
		    "%u = %llu, more than fleet_limit %u: hosts on their floors (Redis unreachable, "
		    "agents stopped) may hold that many; lower fleet_floor to at most %u\n",
		    cfg->path, cc->line, cc->name, hosts, cc->fleet_floor, (unsigned long long)floors,
		    cc->fleet_limit, cc->fleet_limit / hosts);
	}
}

/* One host-name destination: what it resolves to, or the error. */
struct host_out {
	const char *path;
	bool quiet;
};

static void
print_host(const struct cli_host *h, void *arg)
{
	const struct host_out *o = arg;
	char ports[16];

	if (h->port_lo == h->port_hi)
		snprintf(ports, sizeof(ports), ":%u", h->port_lo);
	else if (h->port_lo == 0 && h->port_hi == 65535)
		ports[0] = '\0';
	else
		snprintf(ports, sizeof(ports), ":%u-%u", h->port_lo, h->port_hi);
	if (h->error != 0) {
		fprintf(stderr, "bulkshim: %s:%d: host \"%s\" of compartment \"%s\" resolves to "
		    "nothing (%s): nothing is limited for it until the program's own lookup "
		    "succeeds\n", o->path, h->line, h->host, h->comp, cli_host_error(h));
		return;
	}
	if (o->quiet)
		return;
	printf("  host %s%s (%s) ->", h->host, ports, h->comp);
	for (size_t k = 0; k < h->naddr; k++)
		printf("%s %s", k ? "," : "", h->addr[k]);
	putchar('\n');
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
	struct host_out out;
	bool quiet = false;
	size_t bad;
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
	if (!quiet)
		print_budget(&cfg);
	warn_fleet_floors(&cfg);
	/* A name that resolves to nothing limits nothing until the program's
	 * own lookup finds an address: an error, as the library would run. */
	out.path = argv[optind];
	out.quiet = quiet;
	bad = cli_resolve_hosts(&cfg, print_host, &out);
	cfg_free(&cfg);
	return bad ? 1 : 0;
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
