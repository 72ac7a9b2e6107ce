/* kern_sweep.c - finds and removes what a killed `run --kernel` left: its cgroup, the engine's links. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"

/*
 * `run --kernel` without --cgroup makes <cgroup2>/bulkshim.<segment>.<pid>,
 * <pid> being its own, attaches the engine there and, when the command
 * ends, detaches it and removes the cgroup. Killed with SIGKILL it does
 * neither: the engine stays attached (its links are pinned) and the cgroup
 * stays, empty once the command's processes are gone. Such a cgroup is
 * known by its name, by its run being gone, and by having no process in
 * it; anything else (a cgroup given with --cgroup, a live run, a cgroup
 * still in use) is never touched here.
 */

#define RUN_PREFIX	"bulkshim."

/* True if pid is a live `bulkshim` process (the run that made the cgroup). */
static bool
run_alive(long pid)
{
	char path[64], comm[32] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
	if ((f = fopen(path, "re")) == NULL)
		return false;
	if (fgets(comm, sizeof(comm), f) == NULL)
		comm[0] = '\0';
	fclose(f);
	comm[strcspn(comm, "\n")] = '\0';
	return strcmp(comm, "bulkshim") == 0;
}

/* See engine.h. */
bool
kern_cgroup_empty(const char *dir)
{
	char path[PATH_MAX + 16], line[64];
	FILE *f;
	bool empty;

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	if ((f = fopen(path, "re")) == NULL)
		return true;
	empty = fgets(line, sizeof(line), f) == NULL;
	fclose(f);
	return empty;
}

static void
sayf(void (*say)(void *, const char *), void *arg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void
sayf(void (*say)(void *, const char *), void *arg, const char *fmt, ...)
{
	char line[PATH_MAX + 256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	say(arg, line);
}

/* The cgroups of segment's runs that are gone: each empty one is removed
 * with the engine's links to it. */
static int
sweep_cgroups(const struct kern_env *env, const char *segment,
    void (*say)(void *, const char *), void *arg)
{
	char prefix[BS_NAME_MAX + 16], dir[PATH_MAX];
	size_t plen;
	struct dirent *e;
	int removed = 0;
	DIR *d;

	plen = (size_t)snprintf(prefix, sizeof(prefix), RUN_PREFIX "%s.", segment);
	if ((d = opendir(env->cgroup2)) == NULL)
		return 0;
	while ((e = readdir(d)) != NULL) {
		struct stat st;
		char *end;
		long pid;

		if (strncmp(e->d_name, prefix, plen) != 0)
			continue;
		pid = strtol(e->d_name + plen, &end, 10);
		if (pid <= 0 || *end != '\0' || pid == (long)getpid() || run_alive(pid))
			continue;
		if ((size_t)snprintf(dir, sizeof(dir), "%s/%s", env->cgroup2, e->d_name) >=
		    sizeof(dir) || stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
			continue;
		if (!kern_cgroup_empty(dir)) {
			sayf(say, arg, "cgroup %s, left by a run --kernel (pid %ld) that ended "
			    "without cleaning up, still has processes: it is kept, and the kernel "
			    "engine stays attached there", dir, pid);
			continue;
		}
		kern_unlink(segment, (unsigned long long)st.st_ino);
		if (rmdir(dir) < 0) {
			sayf(say, arg, "cannot remove cgroup %s, left by a run --kernel (pid %ld): %s",
			    dir, pid, strerror(errno));
			continue;
		}
		sayf(say, arg, "removed cgroup %s and the kernel engine's links to it, left by a "
		    "run --kernel (pid %ld) that ended without cleaning up", dir, pid);
		removed++;
	}
	closedir(d);
	return removed;
}

int
kern_sweep(const struct kern_env *env, const char *segment,
    void (*say)(void *arg, const char *line), void *arg)
{
	unsigned long long ids[256];
	int removed = sweep_cgroups(env, segment, say, arg), n;

	/* Links whose cgroup is gone: the kernel detached them when it was
	 * removed, but their pins keep the engine loaded. */
	n = kern_links(segment, ids, 256);
	for (int i = 0; i < n && i < 256; i++) {
		if (kern_link_cgroup(segment, ids[i]) != 0)
			continue;
		kern_unlink(segment, ids[i]);
		sayf(say, arg, "removed the kernel engine's links to cgroup %llu, which no longer "
		    "exists", ids[i]);
		removed++;
	}
	if (removed > 0 && kern_unload_idle(segment))
		sayf(say, arg, "unloaded the kernel engine of segment %s: it was attached nowhere "
		    "else", segment);
	return removed;
}
