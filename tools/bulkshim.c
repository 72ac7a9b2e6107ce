/* bulkshim.c - the operator's CLI: run a program under the shim, show and check compartments. */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#ifndef BS_LIBDIR
#define BS_LIBDIR "/usr/local/lib/bulkshim"
#endif

static const char usage_text[] =
    "usage: bulkshim run [-c FILE] [--] COMMAND [ARG...]\n"
    "       bulkshim status [-c FILE | -s SEGMENT] [--json]\n"
    "       bulkshim check [-q] FILE\n"
    "       bulkshim --help | --version\n";

static int
usage(FILE *f, int status)
{
	fputs(usage_text, f);
	return status;
}

static const char *
default_config(void)
{
	const char *p = getenv("BULKSHIM_CONFIG");

	return p != NULL && *p != '\0' ? p : BS_DEFAULT_CONFIG;
}

/* ---- run ---- */

/* The library beside this binary (a build tree), else the installed one. */
static int
find_library(char *out, size_t len)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n > 0) {
		self[n] = '\0';
		snprintf(out, len, "%s/libbulkshim.so", dirname(self));
		if (access(out, R_OK) == 0)
			return 0;
	}
	snprintf(out, len, "%s/libbulkshim.so", BS_LIBDIR);
	return access(out, R_OK) == 0 ? 0 : -ENOENT;
}

static int
cmd_run(int argc, char **argv)
{
	const char *config = NULL, *old;
	char lib[PATH_MAX], abs[PATH_MAX], *preload;
	int c;

	optind = 1;
	while ((c = getopt(argc, argv, "+c:h")) != -1) {
		switch (c) {
		case 'c':
			config = optarg;
			break;
		case 'h':
			return usage(stdout, 0);
		default:
			return usage(stderr, 2);
		}
	}
	if (optind >= argc)
		return usage(stderr, 2);
	if (find_library(lib, sizeof(lib)) < 0) {
		fprintf(stderr, "bulkshim: cannot find libbulkshim.so beside %s or in %s\n",
		    "the bulkshim binary", BS_LIBDIR);
		return 127;
	}
	if (config != NULL) {
		/* The program may change directory; the shim reads the file
		 * at its start, so pass a path that does not depend on it. */
		if (realpath(config, abs) == NULL) {
			fprintf(stderr, "bulkshim: %s: %s\n", config, strerror(errno));
			return 1;
		}
		setenv("BULKSHIM_CONFIG", abs, 1);
	}
	old = getenv("LD_PRELOAD");
	if (old != NULL && *old != '\0' && strstr(old, lib) == NULL) {
		/* Keep what was there first: a sanitizer runtime must stay
		 * ahead of everything. */
		if (asprintf(&preload, "%s %s", old, lib) < 0)
			return 1;
	} else if (old != NULL && *old != '\0') {
		preload = strdup(old);
	} else {
		preload = strdup(lib);
	}
	if (preload == NULL)
		return 1;
	setenv("LD_PRELOAD", preload, 1);
	execvp(argv[optind], argv + optind);
	fprintf(stderr, "bulkshim: cannot run %s: %s\n", argv[optind], strerror(errno));
	return 127;
}

/* ---- status ---- */

/* The segment a -c FILE names, without resolving its host names. */
static int
segment_of(const char *config, char *out, size_t len)
{
	struct bs_config cfg;
	char err[BS_ERRLEN];
	int r = cfg_load(config, &cfg, false, err, sizeof(err));

	if (r < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return r;
	}
	snprintf(out, len, "%s", cfg.segment);
	cfg_free(&cfg);
	return 0;
}

static uint32_t
live_processes(const struct seg *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < seg_header(s)->nprocs; i++) {
		if (atomic_load(&seg_proc(s, i)->state) == PROC_LIVE)
			n++;
	}
	return n;
}

static void
json_string(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static void
format_ago(uint64_t when_ms, char *buf, size_t len)
{
	uint64_t now = now_real_ms();

	if (when_ms == 0)
		snprintf(buf, len, "-");
	else if (when_ms > now)
		snprintf(buf, len, "just now");
	else if (now - when_ms < 10000)
		snprintf(buf, len, "%.1fs ago", (double)(now - when_ms) / 1000);
	else
		snprintf(buf, len, "%llus ago", (unsigned long long)((now - when_ms) / 1000));
}

static void
print_status(const struct seg *s, bool json)
{
	const struct seg_header *h = seg_header(s);
	uint32_t procs = live_processes(s);
	char ago[32];

	if (json) {
		printf("{\"segment\": ");
		json_string(h->name);
		printf(", \"processes\": %u, \"compartments\": [", procs);
		for (uint32_t i = 0; i < h->ncomp; i++) {
			const struct seg_comp *c = seg_comp(s, i);
			const char *en = cfg_errno_name(atomic_load(&c->reject_errno));

			printf("%s{\"name\": ", i ? ", " : "");
			json_string(c->name);
			printf(", \"limit\": %u, \"in_use\": %u, \"peak\": %u, \"admitted\": %llu, "
			    "\"rejected\": %llu, \"waiting\": %u, \"last_rejection_ms\": %llu, "
			    "\"reclaimed\": %llu, \"errno\": \"%s\"}",
			    atomic_load(&c->limit), atomic_load(&c->in_use), atomic_load(&c->peak),
			    (unsigned long long)atomic_load(&c->admitted),
			    (unsigned long long)atomic_load(&c->rejected), atomic_load(&c->waiting),
			    (unsigned long long)atomic_load(&c->last_rejection_ms),
			    (unsigned long long)atomic_load(&c->reclaimed),
			    en != NULL ? en : "ECONNREFUSED");
		}
		printf("]}\n");
		return;
	}
	printf("segment %s (/dev/shm/bulkshim.%s), %u process%s holding permits\n", h->name,
	    h->name, procs, procs == 1 ? "" : "es");
	printf("%-24s %7s %7s %7s %10s %10s %10s  %s\n", "COMPARTMENT", "IN USE", "LIMIT",
	    "PEAK", "ADMITTED", "REJECTED", "RECLAIMED", "LAST REJECTION");
	for (uint32_t i = 0; i < h->ncomp; i++) {
		const struct seg_comp *c = seg_comp(s, i);
		uint32_t use = atomic_load(&c->in_use), lim = atomic_load(&c->limit);

		format_ago(atomic_load(&c->last_rejection_ms), ago, sizeof(ago));
		printf("%-24s %7u %7u %7u %10llu %10llu %10llu  %s%s\n", c->name, use, lim,
		    atomic_load(&c->peak), (unsigned long long)atomic_load(&c->admitted),
		    (unsigned long long)atomic_load(&c->rejected),
		    (unsigned long long)atomic_load(&c->reclaimed), ago,
		    lim > 0 && use * 5 >= lim * 4 ? "  HOT" : "");
	}
}

static int
cmd_status(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *config = NULL, *segment = NULL;
	char name[BS_NAME_MAX], err[BS_ERRLEN];
	struct seg *s;
	bool json = false;
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "c:s:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'c':
			config = optarg;
			break;
		case 's':
			segment = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			return usage(stdout, 0);
		default:
			return usage(stderr, 2);
		}
	}
	if (optind != argc || (config != NULL && segment != NULL))
		return usage(stderr, 2);
	if (segment == NULL) {
		if (segment_of(config != NULL ? config : default_config(), name, sizeof(name)) < 0)
			return 1;
		segment = name;
	}
	/* Writable to reclaim the permits of dead processes first; a user
	 * who may only read the segment still gets the figures. */
	r = seg_open(segment, true, &s, err, sizeof(err));
	if (r == -EACCES)
		r = seg_open(segment, false, &s, err, sizeof(err));
	else if (r == 0)
		seg_reclaim(s, false);
	if (r < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return 1;
	}
	print_status(s, json);
	seg_close(s);
	return 0;
}

/* ---- check ---- */

static void
bar(char *buf, size_t width, double frac, char ch)
{
	size_t n = (size_t)(frac * (double)width + 0.5);

	if (n > width)
		n = width;
	memset(buf, ch, n);
	memset(buf + n, '.', width - n);
	buf[width] = '\0';
}

static int
cmd_check(int argc, char **argv)
{
	struct bs_config cfg;
	char err[BS_ERRLEN], b[41];
	bool quiet = false;
	uint64_t sum = 0;
	int c;

	optind = 1;
	while ((c = getopt(argc, argv, "qh")) != -1) {
		switch (c) {
		case 'q':
			quiet = true;
			break;
		case 'h':
			return usage(stdout, 0);
		default:
			return usage(stderr, 2);
		}
	}
	if (optind + 1 != argc)
		return usage(stderr, 2);
	if (cfg_load(argv[optind], &cfg, true, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return 1;
	}
	for (size_t i = 0; i < cfg.ncomp; i++)
		sum += cfg.comp[i].max_connections;
	if (!quiet) {
		uint64_t scale = cfg.has_budget ? cfg.pool : sum;

		printf("%s: ok, segment %s, %zu compartment%s\n", cfg.path, cfg.segment, cfg.ncomp,
		    cfg.ncomp == 1 ? "" : "s");
		for (size_t i = 0; i < cfg.ncomp; i++) {
			size_t ndest = 0;

			for (size_t j = 0; j < cfg.nrules; j++)
				ndest += cfg.rules[j].comp == (int)i && cfg.rules[j].kind != RULE_IP;
			for (size_t j = 0; j < cfg.nrules; j++)
				ndest += cfg.rules[j].comp == (int)i && cfg.rules[j].kind == RULE_IP;
			bar(b, 40, scale ? (double)cfg.comp[i].max_connections / (double)scale : 0, '#');
			printf("  %-24s %7u  %s  %s\n", cfg.comp[i].name, cfg.comp[i].max_connections,
			    b, cfg_errno_name(cfg.comp[i].reject_errno));
		}
		if (cfg.has_budget) {
			bar(b, 40, (double)cfg.reserved / (double)cfg.pool, 'r');
			printf("  %-24s %7u  %s\n", "(reserved)", cfg.reserved, b);
			bar(b, 40, (double)(sum + cfg.reserved) / (double)cfg.pool, '=');
			printf("  %-24s %7llu  %s  of a pool of %u\n", "total",
			    (unsigned long long)(sum + cfg.reserved), b, cfg.pool);
		} else {
			printf("  %-24s %7llu  (no budget set)\n", "total", (unsigned long long)sum);
		}
	}
	cfg_free(&cfg);
	return 0;
}

int
main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr, 2);
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
	    strcmp(argv[1], "help") == 0)
		return usage(stdout, 0);
	if (strcmp(argv[1], "--version") == 0) {
		printf("bulkshim %s\n", BS_VERSION);
		return 0;
	}
	if (strcmp(argv[1], "run") == 0)
		return cmd_run(argc - 1, argv + 1);
	if (strcmp(argv[1], "status") == 0)
		return cmd_status(argc - 1, argv + 1);
	if (strcmp(argv[1], "check") == 0)
		return cmd_check(argc - 1, argv + 1);
	fprintf(stderr, "bulkshim: unknown command \"%s\"\n", argv[1]);
	return usage(stderr, 2);
}
