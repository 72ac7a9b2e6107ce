/* cmd_clean.c - `bulkshim rm` and `bulkshim prune`: removing stale or damaged segments. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "../kernel/engine.h"

#define PREFIX		"bulkshim."
#define DEFAULT_AGE_S	3600
#define NAMED_PIDS	4	/* attached processes named in a message */

/*
 * A segment may be removed only when nothing uses it: a process that has
 * it mapped goes on counting in the removed copy while the next process
 * to start makes a fresh one, and the two counts each admit the limit.
 * Permit holders are in the segment's process table, but a process that
 * holds nothing at the moment may have no record there (it attached at
 * start-up and has not connected yet, or its connections are closed).
 *
 * So the kernel is asked. A write lease (F_SETLEASE) is granted only when
 * no other open file description of the object exists anywhere, and a
 * mapping keeps its file description open after its descriptor is closed:
 * granted means no process, of any user, has the object open or mapped.
 * A dead process's mappings go with it, so the dead never block. The lease
 * is held while the name is unlinked: an open that races the removal waits
 * for it (or fails with EWOULDBLOCK, as the library's does), and then
 * finds the object removed (the library checks st_nlink and opens anew).
 * When no lease can be had (another user's object without CAP_LEASE, a
 * kernel or file system without leases), root reads every /proc/PID/maps
 * instead; anyone else cannot tell, and on doubt the segment is kept.
 *
 * A kernel engine pinned for the segment (KERN_PIN_ROOT/SEGMENT) uses it
 * too: it takes its limits and settings from it.
 */

/* What is known of one segment before removing it. */
struct victim {
	char name[BS_NAME_MAX];
	bool damaged;		/* cannot be read as a segment of this version */
	char why[BS_ERRLEN];
	uint32_t live;		/* processes holding permits */
	uint64_t age_ms;	/* since it was created (damaged: since its last change) */
	/* Who else uses it (check_use): */
	int mapped;		/* processes that map it or hold it open, -1: cannot tell */
	pid_t pids[NAMED_PIDS];	/* the first of them this user can see */
	int npids;		/* how many this user can see (may be more than NAMED_PIDS) */
	int engine;		/* cgroups its kernel engine is attached to; -1: cannot tell */
	bool pinned;		/* a kernel engine is pinned for it */
	char doubt[256];	/* why mapped or engine is -1 */
	int fd;			/* the object, with the lease when leased */
	bool leased;
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
	v->fd = -1;
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

/* Which processes (other than this one) map v's object, as this user can
 * see them in /proc. */
static void
find_mappers(struct victim *v, const struct stat *st)
{
	char path[BS_NAME_MAX + 32];
	int n;

	snprintf(path, sizeof(path), "/dev/shm/" PREFIX "%s", v->name);
	n = seg_mappers((uint64_t)st->st_ino, path, v->pids, NAMED_PIDS);
	v->npids = n > 0 ? n : 0;
}

/* Whether a kernel engine is pinned for v, into v->engine and v->pinned. */
static void
check_engine(struct victim *v)
{
	char dir[sizeof(KERN_PIN_ROOT) + BS_NAME_MAX + 1];
	struct stat st;

	kern_pin_path(dir, sizeof(dir), v->name, NULL);
	if (stat(dir, &st) == 0) {
		v->pinned = true;
		v->engine = kern_links(v->name, NULL, 0);
		return;
	}
	/* Nothing pinned at all, or nothing for this segment. */
	if (errno == ENOENT || errno == ENOTDIR)
		return;
	v->engine = -1;
	snprintf(v->doubt, sizeof(v->doubt), "cannot tell whether a kernel engine uses it "
	    "(%s: %s)", dir, strerror(errno));
}

/*
 * Finds out who uses v besides its permit holders (see the top of this
 * file), leaving v->fd open, leased when the lease was granted, for
 * unlink_segment or release_segment. Cannot fail: what it cannot tell is
 * v->mapped or v->engine -1, with the reason in v->doubt.
 */
static void
check_use(struct victim *v)
{
	char path[BS_NAME_MAX + 32];
	struct stat st, now;

	v->fd = -1;
	check_engine(v);
	snprintf(path, sizeof(path), "/dev/shm/" PREFIX "%s", v->name);
	/* O_NONBLOCK: another rm's lease fails the open instead of waiting. */
	v->fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (v->fd < 0 || fstat(v->fd, &st) < 0) {
		v->mapped = -1;
		snprintf(v->doubt, sizeof(v->doubt), "cannot tell whether a process has it attached "
		    "(open %s: %s)", path, strerror(errno));
		return;
	}
	if (fcntl(v->fd, F_SETLEASE, F_WRLCK) == 0) {
		v->leased = true;
		/* Still the object at the name? Another may have replaced it
		 * between inspect and the open: then it is that one's turn. */
		if (lstat(path, &now) < 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev) {
			v->mapped = -1;
			snprintf(v->doubt, sizeof(v->doubt), "it was replaced while it was looked at");
		}
		return;
	}
	if (errno == EAGAIN || errno == EWOULDBLOCK) {
		find_mappers(v, &st);
		v->mapped = v->npids > 0 ? v->npids : 1;
		return;
	}
	/* No lease to be had: root sees every process's maps, others not all. */
	if (geteuid() == 0) {
		find_mappers(v, &st);
		v->mapped = v->npids;
		return;
	}
	v->mapped = -1;
	snprintf(v->doubt, sizeof(v->doubt), "cannot tell whether a process has it attached "
	    "(no lease on %s: %s; root can tell)", path, strerror(errno));
}

/* Gives the lease up and closes v->fd; cannot fail. */
static void
release_segment(struct victim *v)
{
	if (v->fd < 0)
		return;
	if (v->leased)
		fcntl(v->fd, F_SETLEASE, F_UNLCK);
	close(v->fd);
	v->fd = -1;
	v->leased = false;
}

static int
unlink_segment(struct victim *v)
{
	char shm[BS_NAME_MAX + 16];
	int r = 0;

	seg_shm_name(v->name, shm, sizeof(shm));
	if (shm_unlink(shm) < 0) {
		fprintf(stderr, "bulkshim: cannot remove /dev/shm%s: %s\n", shm, strerror(errno));
		r = -1;
	}
	release_segment(v);
	return r;
}

/* Whether anything but permit holders uses v, or may. */
static bool
in_use(const struct victim *v)
{
	return v->mapped != 0 || v->pinned || v->engine != 0;
}

/* "pid 12 (python3), pid 40 (curl) and 3 more" into buf: the attached
 * processes this user can see. */
static void
name_pids(const struct victim *v, char *buf, size_t len)
{
	size_t pos = 0;
	int shown = v->npids < NAMED_PIDS ? v->npids : NAMED_PIDS;

	buf[0] = '\0';
	for (int i = 0; i < shown && pos < len; i++) {
		char file[64], comm[32] = "?";
		FILE *f;

		snprintf(file, sizeof(file), "/proc/%d/comm", (int)v->pids[i]);
		if ((f = fopen(file, "r")) != NULL) {
			if (fgets(comm, sizeof(comm), f) == NULL)
				snprintf(comm, sizeof(comm), "?");
			fclose(f);
		}
		comm[strcspn(comm, "\n")] = '\0';
		/* A process names itself: scrubbed before a terminal sees it. */
		log_scrub(comm, strlen(comm));
		pos += (size_t)snprintf(buf + pos, len - pos, "%spid %d (%s)", i ? ", " : "",
		    (int)v->pids[i], comm);
	}
	if (v->npids > shown && pos < len)
		snprintf(buf + pos, len - pos, " and %d more", v->npids - shown);
}

/* Who uses v besides its permit holders, in words ("attached by 2
 * processes (pid 12 (python3), pid 40 (curl))"; "used by the kernel engine
 * attached to 1 cgroup"), each part after "; ", into buf. */
static void
describe_use(const struct victim *v, char *buf, size_t len)
{
	char pids[256];
	size_t pos = 0;

	buf[0] = '\0';
	if (v->mapped > 0) {
		name_pids(v, pids, sizeof(pids));
		if (v->npids > 0)
			pos += (size_t)snprintf(buf, len, "attached by %d process%s (%s)", v->npids,
			    v->npids == 1 ? "" : "es", pids);
		else if (geteuid() == 0)
			pos += (size_t)snprintf(buf, len, "open in a process that does not map it: "
			    "being set up or read at this moment");
		else
			pos += (size_t)snprintf(buf, len, "attached by processes this user cannot see");
	}
	if (pos < len && v->engine > 0)
		pos += (size_t)snprintf(buf + pos, len - pos, "%sused by the kernel engine attached "
		    "to %d cgroup%s", pos ? "; " : "", v->engine, v->engine == 1 ? "" : "s");
	else if (pos < len && v->pinned)
		pos += (size_t)snprintf(buf + pos, len - pos, "%sused by the kernel engine pinned "
		    "for it under " KERN_PIN_ROOT, pos ? "; " : "");
	if (pos < len && (v->mapped < 0 || v->engine < 0))
		snprintf(buf + pos, len - pos, "%s%s", pos ? "; " : "", v->doubt);
}

/* What removing v anyway breaks, for the line that says it was removed
 * with --force. */
static void
describe_break(const struct victim *v, char *buf, size_t len)
{
	size_t pos = 0;

	buf[0] = '\0';
	if (v->live > 0 || v->mapped != 0)
		pos += (size_t)snprintf(buf, len, "the processes attached to it go on counting in "
		    "the removed copy while new ones count in a fresh segment: each limit can be "
		    "taken once in each until they restart");
	if (pos < len && (v->pinned || v->engine != 0))
		snprintf(buf + pos, len - pos, "%sthe kernel engine stays attached and counts on its "
		    "own, apart from the fresh segment, until `bulkshim detach -s %s`",
		    pos ? "; " : "", v->name);
}

/* A lease that another process's open breaks is announced with SIGIO,
 * which would end this process: the removal waits for nothing, so the
 * signal is ignored (the opener waits until the lease is given up). */
static void
ignore_lease_breaks(void)
{
	signal(SIGIO, SIG_IGN);
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
	char use[BS_ERRLEN], broken[BS_ERRLEN];
	struct victim v;
	bool force = false;
	int c, r = 0;

	ignore_lease_breaks();
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
		check_use(&v);
		describe_use(&v, use, sizeof(use));
		if (in_use(&v) && !force) {
			if (v.mapped == 0 && (v.pinned || v.engine != 0))
				fprintf(stderr, "bulkshim: segment %s holds no permits but is in use (%s); "
				    "not removed (`bulkshim detach -s %s` first; --force removes it, and "
				    "the engine then counts apart from the next segment)\n", v.name, use,
				    v.name);
			else
				fprintf(stderr, "bulkshim: segment %s holds no permits but is in use (%s); "
				    "not removed (--force removes it: those processes would go on counting "
				    "in the removed copy while new ones start a fresh segment)\n", v.name,
				    use);
			release_segment(&v);
			r = 1;
			continue;
		}
		if (unlink_segment(&v) < 0) {
			r = 1;
			continue;
		}
		describe_break(&v, broken, sizeof(broken));
		if (v.damaged)
			printf("removed segment %s (damaged: %s)", v.name, v.why);
		else
			printf("removed segment %s", v.name);
		if (v.live > 0 || in_use(&v))
			printf(" (in use: --force; %s%s%s)", use[0] ? use : "", use[0] ? ": " : "",
			    broken);
		putchar('\n');
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
		{ "force", no_argument, NULL, 'f' },
		{ NULL, 0, NULL, 0 },
	};
	uint64_t age_s = DEFAULT_AGE_S;
	unsigned removed = 0, kept = 0;
	bool dry = false, force = false;
	char use[BS_ERRLEN], broken[BS_ERRLEN];
	struct dirent *e;
	struct victim v;
	DIR *d;
	int c, r = 0;

	ignore_lease_breaks();
	optind = 1;
	while ((c = getopt_long(argc, argv, "+fh", longopts, NULL)) != -1) {
		if (c == 'o' && parse_age(optarg, &age_s))
			continue;
		if (c == 'o') {
			fprintf(stderr, "bulkshim: --older-than wants a duration like 90s, 15m, 2h "
			    "or 7d, not \"%s\"\n", optarg);
			return 2;
		}
		if (c == 'n')
			dry = true;
		else if (c == 'f')
			force = true;
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
		/* Old enough and no permits held: kept all the same while
		 * anything has it attached, and said so, since an idle
		 * service is what this finds. */
		check_use(&v);
		describe_use(&v, use, sizeof(use));
		if (in_use(&v) && !force) {
			printf("kept segment %s (%llus old, no permits held, but in use: %s; --force "
			    "removes it)\n", v.name, (unsigned long long)(v.age_ms / 1000), use);
			release_segment(&v);
			kept++;
			continue;
		}
		if (dry)
			release_segment(&v);
		else if (unlink_segment(&v) < 0) {
			r = 1;
			continue;
		}
		removed++;
		printf("%s segment %s (%s, %llus old)", dry ? "would remove" : "removed", v.name,
		    v.damaged ? v.why : in_use(&v) ? "no permits held" : "no live process",
		    (unsigned long long)(v.age_ms / 1000));
		if (in_use(&v)) {
			describe_break(&v, broken, sizeof(broken));
			printf(" (in use: --force; %s: %s)", use, broken);
		}
		putchar('\n');
	}
	closedir(d);
	printf("%s %u segment%s; kept %u (in use or newer than %llus)\n",
	    dry ? "would remove" : "removed", removed, removed == 1 ? "" : "s", kept,
	    (unsigned long long)age_s);
	return r;
}
