/* cmd_clean.c - `bulkshim rm` and `bulkshim prune`: removing stale or damaged segments. */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

#define PREFIX		"bulkshim."
#define DEFAULT_AGE_S	3600

/* What is known of one segment before removing it. */
struct victim {
	char name[BS_NAME_MAX];
	bool damaged;		/* cannot be read as a segment of this version */
	char why[BS_ERRLEN];
	uint32_t live;		/* processes holding permits */
	uint64_t age_ms;	/* since it was created (damaged: since its last change) */
};

/* Looks segment name up into *v. Returns 0, or -errno with the message
 * printed when there is nothing there (or it is not ours to judge). */
static int
inspect(const char *name, struct victim *v, bool quiet)
{
	char path[BS_NAME_MAX + 32], err[BS_ERRLEN];
	struct stat st;
	struct seg *s;
	int r;

	memset(v, 0, sizeof(*v));
	snprintf(v->name, sizeof(v->name), "%s", name);
	snprintf(path, sizeof(path), "/dev/shm/" PREFIX "%s", name);
	if (lstat(path, &st) < 0) {
		r = -errno;
		fprintf(stderr, "bulkshim: no segment %s (%s)\n", path, strerror(-r));
		return r;
	}
	r = seg_open(name, false, &s, err, sizeof(err));
	if (r == -EACCES) {
		if (!quiet)
			fprintf(stderr, "bulkshim: %s\n", err);
		return r;
	}
	if (r < 0) {
		const char *why = strstr(err, ": ");

		v->damaged = true;
		snprintf(v->why, sizeof(v->why), "%s", why ? why + 2 : err);
		v->age_ms = (uint64_t)(time(NULL) - st.st_ctime) * 1000;
		return 0;
	}
	v->live = cli_live_processes(s);
	v->age_ms = now_real_ms() - seg_header(s)->created_ms;
	if (seg_header(s)->created_ms > now_real_ms())
		v->age_ms = 0;
	seg_close(s);
	return 0;
}

static int
unlink_segment(const struct victim *v)
{
	char shm[BS_NAME_MAX + 16];

	seg_shm_name(v->name, shm, sizeof(shm));
	if (shm_unlink(shm) < 0) {
		fprintf(stderr, "bulkshim: cannot remove /dev/shm%s: %s\n", shm, strerror(errno));
		return -1;
	}
	return 0;
}

static bool
valid_name(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n >= BS_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!cfg_name_char(name[i]))
			return false;
	return true;
}

int
cmd_rm(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "force", no_argument, NULL, 'f' },
		{ NULL, 0, NULL, 0 },
	};
	struct victim v;
	bool force = false;
	int c, r = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+fh", longopts, NULL)) != -1) {
		if (c == 'f')
			force = true;
		else if (c == 'h')
			return cli_help("rm", stdout, 0);
		else
			return cli_help("rm", stderr, 2);
	}
	if (optind >= argc)
		return cli_help("rm", stderr, 2);
	for (int i = optind; i < argc; i++) {
		if (!valid_name(argv[i])) {
			fprintf(stderr, "bulkshim: \"%s\" is not a segment name\n", argv[i]);
			r = 1;
			continue;
		}
		if (inspect(argv[i], &v, false) < 0) {
			r = 1;
			continue;
		}
		if (v.live > 0 && !force) {
			fprintf(stderr, "bulkshim: segment %s is in use by %u process%s holding permits; "
			    "not removed (--force removes it: they go on counting in the removed copy, "
			    "and new processes start a fresh one)\n", v.name, v.live,
			    v.live == 1 ? "" : "es");
			r = 1;
			continue;
		}
		if (unlink_segment(&v) < 0) {
			r = 1;
			continue;
		}
		if (v.damaged)
			printf("removed segment %s (damaged: %s)\n", v.name, v.why);
		else
			printf("removed segment %s%s\n", v.name, v.live ? " (in use: --force)" : "");
	}
	return r;
}

/* Parses "90", "90s", "15m", "2h" or "7d" into seconds. */
static bool
parse_age(const char *text, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t unit = 1;

	errno = 0;
	v = strtoull(text, &end, 10);
	if (errno != 0 || end == text || text[0] == '-')
		return false;
	if (strcmp(end, "m") == 0)
		unit = 60;
	else if (strcmp(end, "h") == 0)
		unit = 3600;
	else if (strcmp(end, "d") == 0)
		unit = 86400;
	else if (*end != '\0' && strcmp(end, "s") != 0)
		return false;
	if (v > UINT64_MAX / 1000 / unit)
		return false;
	*out = v * unit;
	return true;
}

static bool
matches(const char *name, char **patterns, int n)
{
	for (int i = 0; i < n; i++)
		if (fnmatch(patterns[i], name, 0) == 0)
			return true;
	return n == 0;
}

int
cmd_prune(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "older-than", required_argument, NULL, 'o' },
		{ "dry-run", no_argument, NULL, 'n' },
		{ NULL, 0, NULL, 0 },
	};
	uint64_t age_s = DEFAULT_AGE_S;
	unsigned removed = 0, kept = 0;
	bool dry = false;
	struct dirent *e;
	struct victim v;
	DIR *d;
	int c, r = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
		if (c == 'o' && parse_age(optarg, &age_s))
			continue;
		if (c == 'o') {
			fprintf(stderr, "bulkshim: --older-than wants a duration like 90s, 15m, 2h "
			    "or 7d, not \"%s\"\n", optarg);
			return 2;
		}
		if (c == 'n')
			dry = true;
		else if (c == 'h')
			return cli_help("prune", stdout, 0);
		else
			return cli_help("prune", stderr, 2);
	}
	d = opendir("/dev/shm");
	if (d == NULL) {
		fprintf(stderr, "bulkshim: cannot read /dev/shm: %s\n", strerror(errno));
		return 1;
	}
	while ((e = readdir(d)) != NULL) {
		const char *name = e->d_name + strlen(PREFIX);

		if (strncmp(e->d_name, PREFIX, strlen(PREFIX)) != 0 || !valid_name(name) ||
		    !matches(name, argv + optind, argc - optind))
			continue;
		/* Another user's segment this user may not read is theirs
		 * to prune: kept, without an error. */
		if (inspect(name, &v, true) < 0) {
			kept++;
			continue;
		}
		if (v.live > 0 || v.age_ms < age_s * 1000) {
			kept++;
			continue;
		}
		if (!dry && unlink_segment(&v) < 0) {
			r = 1;
			continue;
		}
		removed++;
		printf("%s segment %s (%s, %llus old)\n", dry ? "would remove" : "removed", v.name,
		    v.damaged ? v.why : "no live process", (unsigned long long)(v.age_ms / 1000));
	}
	closedir(d);
	printf("%s %u segment%s; kept %u (in use or newer than %llus)\n",
	    dry ? "would remove" : "removed", removed, removed == 1 ? "" : "s", kept,
	    (unsigned long long)age_s);
	return r;
}
