/* kern_check.c - what the kernel engine needs from the machine, checked with clear messages. */
#include <errno.h>
#include <mntent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "engine.h"

#define CGROUP2_MAGIC	0x63677270
#define BPFFS_MAGIC	0xcafe4a11
#define CAP_NET_ADMIN_BIT 12
#define CAP_SYS_ADMIN_BIT 21
#define CAP_BPF_BIT	39

/* The effective capability set of this process, from /proc/self/status. */
static unsigned long long
cap_effective(void)
{
	unsigned long long caps = 0;
	char line[256];
	FILE *f = fopen("/proc/self/status", "re");

	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "CapEff: %llx", &caps) == 1)
			break;
	}
	fclose(f);
	return caps;
}

static bool
has_cap(unsigned long long caps, int bit)
{
	return (caps >> bit) & 1;
}

/* The first cgroup2 mount point, into out; false if there is none. */
static bool
find_cgroup2(char *out, size_t len)
{
	FILE *f = setmntent("/proc/self/mounts", "re");
	struct mntent *m;
	bool found = false;

	if (f == NULL)
		return false;
	while (!found && (m = getmntent(f)) != NULL) {
		if (strcmp(m->mnt_type, "cgroup2") == 0 && strlen(m->mnt_dir) < len) {
			snprintf(out, len, "%s", m->mnt_dir);
			found = true;
		}
	}
	endmntent(f);
	return found;
}

static bool
fs_is(const char *path, long magic)
{
	struct statfs st;

	return statfs(path, &st) == 0 && st.f_type == magic;
}

/* Mounts bpffs on /sys/fs/bpf when nothing is mounted there yet. */
static int
ensure_bpffs(char *err, size_t errlen)
{
	if (fs_is(KERN_BPFFS, BPFFS_MAGIC))
		return 0;
	if (mkdir(KERN_BPFFS, 0700) < 0 && errno != EEXIST)
		goto fail;
	if (mount("bpf", KERN_BPFFS, "bpf", 0, "mode=0700") == 0)
		return 0;
fail:
	bs_format(err, errlen, "no BPF file system at /sys/fs/bpf and mounting one failed (%s): "
	    "mount -t bpf bpf /sys/fs/bpf", strerror(errno));
	return -errno;
}

int
kern_check(struct kern_env *env, char *err, size_t errlen)
{
	unsigned long long caps = cap_effective();
	struct utsname u;
	struct stat st;

	memset(env, 0, sizeof(*env));
	if (!has_cap(caps, CAP_SYS_ADMIN_BIT) &&
	    !(has_cap(caps, CAP_BPF_BIT) && has_cap(caps, CAP_NET_ADMIN_BIT))) {
		bs_format(err, errlen, "the kernel engine needs root, or CAP_BPF and CAP_NET_ADMIN "
		    "(this process has neither): run it with sudo");
		return -EPERM;
	}
	if (uname(&u) < 0 || sscanf(u.release, "%d.%d", &env->major, &env->minor) != 2) {
		bs_format(err, errlen, "cannot tell the kernel version");
		return -ENOSYS;
	}
	if (env->major < 5 || (env->major == 5 && env->minor < 9)) {
		bs_format(err, errlen, "Linux %d.%d is too old for the kernel engine: it needs 5.9 "
		    "(cgroup/sock_release), and 5.18 to refuse with the config's errno",
		    env->major, env->minor);
		return -ENOSYS;
	}
	env->set_retval = env->major > 5 || env->minor >= 18;
	env->btf = stat("/sys/kernel/btf/vmlinux", &st) == 0;
	if (!find_cgroup2(env->cgroup2, sizeof(env->cgroup2))) {
		bs_format(err, errlen, "no cgroup v2 hierarchy is mounted (see `findmnt -t cgroup2`): "
		    "mount one with `mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 none "
		    "/sys/fs/cgroup/unified`, or boot with systemd.unified_cgroup_hierarchy=1");
		return -ENOENT;
	}
	return ensure_bpffs(err, errlen);
}

int
kern_cgroup_path(const struct kern_env *env, const char *arg, char *out, size_t len, char *err,
    size_t errlen)
{
	char joined[PATH_MAX], resolved[PATH_MAX];

	if ((size_t)snprintf(joined, sizeof(joined), "%s%s%s", arg[0] == '/' ? "" : env->cgroup2,
	    arg[0] == '/' ? "" : "/", arg) >= sizeof(joined)) {
		bs_format(err, errlen, "cgroup path too long");
		return -ENAMETOOLONG;
	}
	if (realpath(joined, resolved) == NULL || strlen(resolved) >= len) {
		bs_format(err, errlen, "cgroup %s: %s", joined, strerror(errno));
		return -ENOENT;
	}
	memcpy(out, resolved, strlen(resolved) + 1);
	if (!fs_is(out, CGROUP2_MAGIC)) {
		bs_format(err, errlen, "%s is not in a cgroup v2 hierarchy (cgroup v2 is mounted "
		    "at %s)", out, env->cgroup2);
		return -EINVAL;
	}
	return 0;
}
