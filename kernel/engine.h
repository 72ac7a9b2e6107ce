/* engine.h - the kernel engine's user-space side, for the CLI: checks, attach, detach, maps. */
#ifndef BULKSHIM_ENGINE_H
#define BULKSHIM_ENGINE_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "log.h"
#include "kern.h"

#define KERN_BPFFS	"/sys/fs/bpf"
#define KERN_PIN_ROOT	KERN_BPFFS "/bulkshim"

/* ---- kern_check.c: what the machine must offer ---- */

/* What kern_check found. */
struct kern_env {
	int major, minor;	/* the running kernel */
	bool set_retval;	/* bpf_set_retval (5.18+): refusals carry the errno */
	bool btf;		/* /sys/kernel/btf/vmlinux */
	char cgroup2[PATH_MAX];	/* where cgroup v2 is mounted */
};

/* Checks privileges (root, or CAP_BPF and CAP_NET_ADMIN), the kernel
 * version (5.9 for sock_release), cgroup v2, BTF, and mounts bpffs on
 * /sys/fs/bpf if nothing is there. Returns 0, or -errno with one message
 * in err that names what is missing and how to get it. */
int kern_check(struct kern_env *env, char *err, size_t errlen);
/* Resolves a cgroup given as a path (absolute, or relative to the cgroup v2
 * mount) into out, and checks it is a cgroup v2 directory. Returns 0 or
 * -errno with a message in err. */
int kern_cgroup_path(const struct kern_env *env, const char *arg, char *out, size_t len,
    char *err, size_t errlen);

/* ---- kern_load.c: programs and links, pinned under KERN_PIN_ROOT/<segment> ---- */

/* Loads the engine for cfg's segment (or reuses the one pinned there),
 * writes cfg's compartments and rules into its maps, and attaches it to
 * the cgroup at path with links pinned beside it. Returns 0, -EEXIST if it
 * is already attached there, or -errno, with a message in err. */
int kern_attach(const struct kern_env *env, const struct bs_config *cfg, const char *cgroup,
    char *err, size_t errlen);
/* Detaches the engine of segment from cgroup (NULL: from every cgroup);
 * when no cgroup is left, unpins the programs and maps. Returns the number
 * of cgroups detached, or -errno with a message in err. */
int kern_detach(const char *segment, const char *cgroup, char *err, size_t errlen);
/* The cgroups the engine of segment is attached to, as cgroup ids, into
 * ids (up to n); returns how many there are (possibly more than n), 0 if
 * the engine is not loaded. */
int kern_links(const char *segment, unsigned long long *ids, int n);
/* Removes the pinned links of segment's engine to the cgroup of id `id`
 * (detaching it there); the programs and maps stay. Cannot fail. */
void kern_unlink(const char *segment, unsigned long long id);
/* The cgroup id the pinned link of segment's engine named by id is attached
 * to now: id itself, or 0 when that cgroup is gone (the kernel detached the
 * link when it was removed) or the link cannot be read. */
unsigned long long kern_link_cgroup(const char *segment, unsigned long long id);
/* Unpins the programs and maps of segment's engine if it is loaded and
 * attached nowhere. Returns 1 if it did, 0 otherwise. */
int kern_unload_idle(const char *segment);

/* ---- kern_sweep.c: what a killed `run --kernel` left ---- */
/* True if no process is in the cgroup at dir, or it cannot be read (then
 * rmdir decides, and refuses a cgroup in use with EBUSY). */
bool kern_cgroup_empty(const char *dir);

/* Removes what runs of segment's engine that ended without cleaning up
 * (SIGKILL) left behind: the cgroups that `run --kernel` made
 * (<cgroup2>/bulkshim.<segment>.<pid>) whose run is gone and which no
 * process is in, with the engine's links to them, and the links to cgroups
 * that no longer exist. A cgroup with a process in it is never removed.
 * Calls say(arg, line) once per thing removed or kept, and unloads the
 * engine when it is attached nowhere after that. Returns how many things
 * were removed. */
int kern_sweep(const struct kern_env *env, const char *segment,
    void (*say)(void *arg, const char *line), void *arg);

/* ---- kern_maps.c: the compartment and destination maps ---- */

/* KERN_PIN_ROOT/<segment>/<name> (name NULL: the directory). bpffs refuses
 * '.' in names, so a segment's dots become '+', which segment names never
 * hold. */
void kern_pin_path(char *out, size_t len, const char *segment, const char *name);

/* The compartment map of a loaded engine, mapped into memory. */
struct kern_view {
	struct kern_comp *comp;	/* KERN_MAX_COMPS entries */
	size_t size;
	unsigned id;		/* the map's id (a segment's `kernel` words name it) */
};

/* Maps the pinned compartment map of segment. Returns 0, -ENOENT when no
 * engine is loaded for it (or this user cannot look), -EACCES (or -EPERM)
 * when one is there that this user may not read, or another -errno. */
int kern_view_open(const char *segment, bool writable, struct kern_view *v);
void kern_view_close(struct kern_view *v);
/* The entry named name, or NULL. */
struct kern_comp *kern_view_find(const struct kern_view *v, const char *name);
/* Writes cfg's compartments (by name, keeping the entries of earlier
 * loads) and its destination rules into the maps: comps_fd and sites_fd.
 * Rules are added before stale ones go, so an unchanged rule never
 * lapses. Returns 0 or -errno with a message in err. */
int kern_apply(int comps_fd, int sites_fd, const struct bs_config *cfg, char *err, size_t errlen);
/* kern_apply on the maps pinned for cfg's segment. */
int kern_apply_pinned(const struct bs_config *cfg, char *err, size_t errlen);
/* Gives the pinned maps of cfg's segment that preloaded processes use
 * (comps, socks) and their directories the owner, group and mode of the
 * segment's object in /dev/shm, so that every process that may use the
 * segment may count with the engine. Returns 0 or -errno with a message. */
int kern_share(const struct bs_config *cfg, char *err, size_t errlen);
/* CLOCK_REALTIME milliseconds of a CLOCK_BOOTTIME nanosecond stamp, 0 for 0. */
unsigned long long kern_boot_to_real_ms(unsigned long long boot_ns);

#endif
