/* kern_load.c - loads the kernel engine from its skeleton, pins it, attaches it to cgroups. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "engine.h"
/* The generated skeleton casts its embedded object's const away. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcast-qual"
#include "bulkshim.skel.h"
#pragma GCC diagnostic pop

/*
 * Under KERN_PIN_ROOT/<segment>: the maps (sites, comps, socks), the three
 * programs (connect4, connect6, release), and per attached cgroup three
 * links named cg<id>_<program>, <id> being the cgroup's inode number (its
 * cgroup id). Pinned links keep the programs attached after this process
 * exits; removing a link's pin detaches it.
 */

static const struct {
	const char *name;
	enum bpf_attach_type type;
} hooks[] = {
	{ "connect4", BPF_CGROUP_INET4_CONNECT },
	{ "connect6", BPF_CGROUP_INET6_CONNECT },
	{ "release", BPF_CGROUP_INET_SOCK_RELEASE },
};
#define NHOOKS	(sizeof(hooks) / sizeof(hooks[0]))

/* libbpf's own messages (the verifier's log among them) only when
 * BULKSHIM_BPF_DEBUG is set: our errors say what failed in one line. */
static int
silent_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	if (getenv("BULKSHIM_BPF_DEBUG") != NULL)
		return vfprintf(stderr, fmt, ap);
	return 0;
}

static int
unpin_all(const char *segment)
{
	char dir[PATH_MAX], path[PATH_MAX + 256];
	struct dirent *e;
	DIR *d;

	kern_pin_path(dir, sizeof(dir), segment, NULL);
	if ((d = opendir(dir)) == NULL)
		return -errno;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unlink(path);
	}
	closedir(d);
	return rmdir(dir) < 0 ? -errno : 0;
}

/* Loads the programs and maps and pins them for cfg's segment. */
static int
load_new(const struct kern_env *env, const struct bs_config *cfg, char *err, size_t errlen)
{
	struct bulkshim_bpf *skel;
	char dir[PATH_MAX], path[PATH_MAX];
	struct bpf_program *progs[NHOOKS];
	int r;

	libbpf_set_print(silent_print);
	skel = bulkshim_bpf__open();
	if (skel == NULL) {
		bs_format(err, errlen, "cannot open the kernel engine's BPF object: %s",
		    strerror(errno));
		return -errno;
	}
	skel->rodata->have_set_retval = env->set_retval ? 1 : 0;
	if ((r = bulkshim_bpf__load(skel)) < 0) {
		bs_format(err, errlen, "the kernel refused the engine's BPF programs (%s)%s; "
		    "BULKSHIM_BPF_DEBUG=1 shows the verifier's log", strerror(-r),
		    env->btf ? "" : " and the kernel has no BTF (/sys/kernel/btf/vmlinux: "
		    "CONFIG_DEBUG_INFO_BTF)");
		goto done;
	}
	if ((r = kern_apply(bpf_map__fd(skel->maps.comps), bpf_map__fd(skel->maps.sites), cfg,
	    err, errlen)) < 0)
		goto done;
	kern_pin_path(dir, sizeof(dir), cfg->segment, NULL);
	if ((mkdir(KERN_PIN_ROOT, 0700) < 0 && errno != EEXIST) ||
	    (mkdir(dir, 0700) < 0 && errno != EEXIST)) {
		r = -errno;
		bs_format(err, errlen, "cannot make %s: %s", dir, strerror(errno));
		goto done;
	}
	progs[0] = skel->progs.bs_connect4;
	progs[1] = skel->progs.bs_connect6;
	progs[2] = skel->progs.bs_release;
	kern_pin_path(path, sizeof(path), cfg->segment, "sites");
	if ((r = bpf_map__pin(skel->maps.sites, path)) < 0)
		goto pinfail;
	kern_pin_path(path, sizeof(path), cfg->segment, "comps");
	if ((r = bpf_map__pin(skel->maps.comps, path)) < 0)
		goto pinfail;
	kern_pin_path(path, sizeof(path), cfg->segment, "socks");
	if ((r = bpf_map__pin(skel->maps.socks, path)) < 0)
		goto pinfail;
	for (size_t i = 0; i < NHOOKS; i++) {
		kern_pin_path(path, sizeof(path), cfg->segment, hooks[i].name);
		if ((r = bpf_program__pin(progs[i], path)) < 0)
			goto pinfail;
	}
	r = 0;
	goto done;
pinfail:
	bs_format(err, errlen, "cannot pin %s: %s", path, strerror(-r));
	unpin_all(cfg->segment);
done:
	bulkshim_bpf__destroy(skel);
	return r;
}

/* Attaches the pinned programs of segment to the cgroup open as cgfd,
 * pinning each link as cg<id>_<hook>. */
static int
link_cgroup(const char *segment, int cgfd, unsigned long long id, char *err, size_t errlen)
{
	char path[PATH_MAX], name[64];
	int r = 0;

	for (size_t i = 0; i < NHOOKS; i++) {
		int pfd, lfd;

		kern_pin_path(path, sizeof(path), segment, hooks[i].name);
		if ((pfd = bpf_obj_get(path)) < 0) {
			r = -errno;
			bs_format(err, errlen, "cannot open %s: %s", path, strerror(errno));
			break;
		}
		lfd = bpf_link_create(pfd, cgfd, hooks[i].type, NULL);
		close(pfd);
		if (lfd < 0) {
			r = -errno;
			bs_format(err, errlen, "cannot attach %s to the cgroup: %s", hooks[i].name,
			    strerror(errno));
			break;
		}
		snprintf(name, sizeof(name), "cg%llu_%s", id, hooks[i].name);
		kern_pin_path(path, sizeof(path), segment, name);
		r = bpf_obj_pin(lfd, path) < 0 ? -errno : 0;
		close(lfd);
		if (r < 0) {
			bs_format(err, errlen, "cannot pin %s: %s", path, strerror(-r));
			break;
		}
	}
	if (r < 0) {
		for (size_t i = 0; i < NHOOKS; i++) {
			snprintf(name, sizeof(name), "cg%llu_%s", id, hooks[i].name);
			kern_pin_path(path, sizeof(path), segment, name);
			unlink(path);
		}
	}
	return r;
}

int
kern_attach(const struct kern_env *env, const struct bs_config *cfg, const char *cgroup,
    char *err, size_t errlen)
{
	char path[PATH_MAX], name[64];
	struct stat st;
	bool fresh = false;
	int cgfd, r;

	cgfd = open(cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cgfd < 0 || fstat(cgfd, &st) < 0) {
		bs_format(err, errlen, "cgroup %s: %s", cgroup, strerror(errno));
		r = -errno;
		goto done;
	}
	snprintf(name, sizeof(name), "cg%llu_connect4", (unsigned long long)st.st_ino);
	kern_pin_path(path, sizeof(path), cfg->segment, name);
	if (access(path, F_OK) == 0) {
		bs_format(err, errlen, "the kernel engine of segment %s is already attached to %s",
		    cfg->segment, cgroup);
		r = -EEXIST;
		goto done;
	}
	kern_pin_path(path, sizeof(path), cfg->segment, "connect4");
	if (access(path, F_OK) == 0) {
		/* Loaded for another cgroup: the same counts, this file's rules. */
		if ((r = kern_apply_pinned(cfg, err, errlen)) < 0)
			goto done;
	} else {
		if ((r = load_new(env, cfg, err, errlen)) < 0)
			goto done;
		fresh = true;
	}
	r = link_cgroup(cfg->segment, cgfd, (unsigned long long)st.st_ino, err, errlen);
	if (r < 0 && fresh)
		unpin_all(cfg->segment);
done:
	if (cgfd >= 0)
		close(cgfd);
	return r;
}

int
kern_links(const char *segment, unsigned long long *ids, int n)
{
	char dir[PATH_MAX];
	struct dirent *e;
	int count = 0;
	DIR *d;

	kern_pin_path(dir, sizeof(dir), segment, NULL);
	if ((d = opendir(dir)) == NULL)
		return 0;
	while ((e = readdir(d)) != NULL) {
		unsigned long long id;
		char hook[32];

		if (sscanf(e->d_name, "cg%llu_%31s", &id, hook) != 2 ||
		    strcmp(hook, "connect4") != 0)
			continue;
		if (count < n)
			ids[count] = id;
		count++;
	}
	closedir(d);
	return count;
}

void
kern_unlink(const char *segment, unsigned long long id)
{
	char path[PATH_MAX], name[64];

	for (size_t k = 0; k < NHOOKS; k++) {
		snprintf(name, sizeof(name), "cg%llu_%s", id, hooks[k].name);
		kern_pin_path(path, sizeof(path), segment, name);
		unlink(path);
	}
}

unsigned long long
kern_link_cgroup(const char *segment, unsigned long long id)
{
	struct bpf_link_info info;
	char path[PATH_MAX], name[64];
	__u32 len = sizeof(info);
	int fd;

	snprintf(name, sizeof(name), "cg%llu_%s", id, hooks[0].name);
	kern_pin_path(path, sizeof(path), segment, name);
	if ((fd = bpf_obj_get(path)) < 0)
		return 0;
	memset(&info, 0, sizeof(info));
	if (bpf_obj_get_info_by_fd(fd, &info, &len) < 0 || info.type != BPF_LINK_TYPE_CGROUP)
		info.cgroup.cgroup_id = 0;
	close(fd);
	return info.cgroup.cgroup_id;
}

int
kern_unload_idle(const char *segment)
{
	char path[PATH_MAX];

	kern_pin_path(path, sizeof(path), segment, "connect4");
	if (access(path, F_OK) < 0 || kern_links(segment, NULL, 0) > 0)
		return 0;
	return unpin_all(segment) < 0 ? 0 : 1;
}

int
kern_detach(const char *segment, const char *cgroup, char *err, size_t errlen)
{
	unsigned long long ids[256], want = 0;
	char path[PATH_MAX];
	int n, done = 0;

	if (cgroup != NULL) {
		struct stat st;

		if (stat(cgroup, &st) < 0) {
			bs_format(err, errlen, "cgroup %s: %s", cgroup, strerror(errno));
			return -errno;
		}
		want = (unsigned long long)st.st_ino;
	}
	kern_pin_path(path, sizeof(path), segment, "connect4");
	if (access(path, F_OK) < 0) {
		kern_pin_path(path, sizeof(path), segment, NULL);
		bs_format(err, errlen, "no kernel engine is loaded for segment %s (nothing under "
		    "%s)", segment, path);
		return -ENOENT;
	}
	n = kern_links(segment, ids, 256);
	for (int i = 0; i < n && i < 256; i++) {
		if (cgroup != NULL && ids[i] != want)
			continue;
		kern_unlink(segment, ids[i]);
		done++;
	}
	if (cgroup != NULL && done == 0) {
		bs_format(err, errlen, "the kernel engine of segment %s is not attached to %s",
		    segment, cgroup);
		return -ENOENT;
	}
	if (kern_links(segment, ids, 0) == 0)
		unpin_all(segment);
	return done;
}
