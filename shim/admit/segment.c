/* segment.c - the shared-memory segment: creation, attach, validation (repair.c puts damaged counts right). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "admit/pool.h"
#include "admit/repair.h"
#include "admit/slot.h"
#include "log.h"
#include "sys.h"

/*
 * The layout is seg_layout.h's. A segment is created by the first process
 * whose config names it, under an exclusive lock on the object, and
 * checked by every process that maps it: its header must describe exactly
 * the layout its counts give and fit the mapping, its names must be
 * terminated, and the counts every later bounds check uses are the ones
 * copied here, never read again from the shared header.
 */

#define LOCK_WAIT_MS	2000	/* for a segment still being created */
#define LOCK_FAST_MS	100	/* for the upkeep of one already set up */


/* Every name in the segment is printed and compared as a C string: one
 * without its NUL would run into the fields after it. The caller checked
 * that the compartments lie inside the mapping. Returns NULL or what is
 * wrong. */
static const char *
damaged_names(const struct seg_header *h, const struct seg_header *want)
{
	const struct seg_comp *c = (const struct seg_comp *)((const char *)h + want->off_comp);

	if (memchr(h->name, '\0', sizeof(h->name)) == NULL ||
	    memchr(h->config_path, '\0', sizeof(h->config_path)) == NULL)
		return "damaged (its name or config path is not terminated)";
	for (int k = 0; k < BS_MAX_CLASSES; k++) {
		if (memchr(h->class_name[k], '\0', sizeof(h->class_name[k])) == NULL)
			return "damaged (a class name is not terminated)";
	}
	for (uint32_t i = 0; i < want->ncomp; i++) {
		if (memchr(c[i].name, '\0', sizeof(c[i].name)) == NULL)
			return "damaged (a compartment name is not terminated)";
	}
	for (uint32_t p = 0; p < h->npools && p < BS_MAX_POOLS; p++) {
		if (memchr(h->pools[p].name, '\0', sizeof(h->pools[p].name)) == NULL)
			return "damaged (a pool name is not terminated)";
	}
	return NULL;
}

/* A 32-bit field of the mapped header, read once (another process may be
 * writing it). */
static uint32_t
read_once(const uint32_t *v)
{
	return *(const volatile uint32_t *)v;
}

/* Checks that the header of s's mapping describes exactly the layout its
 * counts give and fits in the mapping, and that its names are terminated.
 * The counts are read once, and those copies are what s keeps (s->ncomp
 * ...): another process may write the header between two reads, and a
 * count checked here must be the count every later bounds check uses.
 * Returns NULL or what is wrong. */
static const char *
validate(struct seg *s)
{
	const struct seg_header *h = s->base;
	size_t size = s->size;
	struct seg_header want;
	uint32_t ncomp, nslots, nprocs;

	/* Magic and version first, where every layout keeps them: a segment
	 * of another version is named as such even when its header is
	 * smaller than ours. */
	if (size < offsetof(struct seg_header, version) + sizeof(h->version))
		return "truncated (smaller than its header)";
	if (h->magic == 0)
		return "unfinished (magic 0: its creator is setting it up, or died doing so; then the next program to attach sets it up)";
	if (h->magic != SEG_MAGIC)
		return "bad magic (not a bulkshim segment)";
	if (h->version != SEG_VERSION)
		return "unsupported layout version";
	if (size < sizeof(*h))
		return "truncated (smaller than its header)";
	ncomp = read_once(&h->ncomp);
	nslots = read_once(&h->nslots);
	nprocs = read_once(&h->nprocs);
	if (ncomp == 0 || ncomp > BS_MAX_COMPARTMENTS || nslots == 0 ||
	    nslots > BS_MAX_SOCKETS || nprocs == 0 || nprocs > BS_MAX_PROCESSES)
		return "counts out of range";
	memset(&want, 0, sizeof(want));
	seg_layout_fill(&want, ncomp, nslots, nprocs);
	if (h->header_size != want.header_size || h->bitmap_words != want.bitmap_words ||
	    h->off_comp != want.off_comp || h->off_slots != want.off_slots ||
	    h->off_procs != want.off_procs || h->off_bitmaps != want.off_bitmaps ||
	    h->total_size != want.total_size)
		return "inconsistent layout";
	if (want.total_size > size)
		return "truncated";
	if (h->npools > BS_MAX_POOLS)
		return "counts out of range";
	s->ncomp = ncomp;
	s->nslots = nslots;
	s->nprocs = nprocs;
	s->bitmap_words = want.bitmap_words;
	return damaged_names(h, &want);
}

/* The fields of s that a tally tag's slot index and stamp are read with:
 * the index takes as few bits as the slot count needs (seg_layout.h). */
static void
tag_format(struct seg *s)
{
	uint32_t ib = 32 - (uint32_t)__builtin_clz(s->nslots | 1);

	s->tag_imask = (1u << ib) - 1;
	s->tag_wmask = s->tag_imask | TAG_GEN_MASK << TAG_GEN_SHIFT;
	s->tag_one = 1u << ib;
	s->tag_smask = ((1u << TAG_GEN_SHIFT) - 1) & ~s->tag_imask;
	/* The sequence in the upper half of the stamp, own counts below. */
	s->tag_sshift = ib + (TAG_GEN_SHIFT - ib) / 2;
}

/* The pointers into the mapping, from the counts s keeps (validate, or the
 * creator's), never from the header's offsets. */
static void
set_pointers(struct seg *s)
{
	struct seg_header want;
	char *b = s->base;

	seg_layout_fill(&want, s->ncomp, s->nslots, s->nprocs);
	s->h = s->base;
	s->comp = (struct seg_comp *)(b + want.off_comp);
	s->slots = (struct seg_slot *)(b + want.off_slots);
	s->procs = (struct seg_proc *)(b + want.off_procs);
	s->bits = (_Atomic uint64_t *)(b + want.off_bitmaps);
	tag_format(s);
}

/* ---- attach and open ---- */

/* Takes the segment's flock with a bounded wait so that creation and
 * attachment never interleave, and a crashed creator cannot hang anyone. */
static int
lock_bounded(int fd, int wait_ms)
{
	struct timespec ms = { 0, 1000000 };

	for (int waited = 0; waited < wait_ms; waited++) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return 0;
		if (errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		nanosleep(&ms, NULL);
	}
	return -ETIMEDOUT;
}

/* Maps fd whole and lists the mapping with the guard (guard.c) before
 * anything reads it: the object may shrink at any moment from now on. */
static int
map_fd(struct seg *s, int fd, size_t size, bool writable, const char *name)
{
	void *p = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);

	struct stat st;

	if (p == MAP_FAILED)
		return -errno;
	s->base = p;
	s->size = size;
	guard_watch(s, name);
	s->ino = fstat(fd, &st) == 0 ? (uint64_t)st.st_ino : 0;
	return 0;
}

static void
unmap(struct seg *s)
{
	if (s->base == NULL)
		return;
	guard_unwatch(s);
	munmap(s->base, s->size);
	s->base = NULL;
}

void
seg_settings_changed(struct seg *s)
{
	atomic_fetch_add_explicit(&s->h->settings_seq, 1, memory_order_release);
}

void
seg_apply_limits(struct seg_comp *c, const struct cfg_compartment *cc)
{
	uint32_t lim = cc->max_connections ? cc->max_connections : UINT32_MAX;
	uint32_t ilim = cc->max_inflight ? cc->max_inflight : UINT32_MAX;
	uint32_t waiting = cc->max_waiting;

	if (waiting == 0)
		waiting = cc->max_connections ? cc->max_connections : cc->max_inflight;
	atomic_store(&c->limit, lim);
	atomic_store(&c->inflight_limit, ilim);
	atomic_store(&c->reject_errno, cc->reject_errno);
	atomic_store(&c->enforce, cc->enforce ? 1 : 0);
	atomic_store(&c->drill.allowed, cc->drills ? 1 : 0);
	if (!cc->drills)
		drill_end(c);
	atomic_store(&c->max_wait_ms, cc->max_wait_ms);
	atomic_store(&c->max_waiting, waiting);
	atomic_store(&c->connect_timeout_ms, cc->connect_timeout_ms);
	atomic_store(&c->io_timeout_ms, cc->io_timeout_ms);
	for (int k = 0; k < BS_MAX_CLASSES; k++) {
		atomic_store(&c->cls[k].limit, cc->class_limit[k]);
		atomic_store(&c->cls_guaranteed[k], cc->class_guaranteed[k]);
	}
	atomic_store(&c->cls_shares, cc->class_shares ? 1 : 0);
	share_update_classes(c);
	ad_apply(c, cc);
	/* The share and its lease are the agent's; a reload keeps them. */
	atomic_store(&c->fleet_floor, cc->fleet_floor);
	atomic_store(&c->fleet_limit, cc->fleet_limit);
	/* A limit lowered below what is in use now revokes nothing: the
	 * counts drain through the normal releases. */
}

/* Writes a fresh segment for cfg into the mapped memory. The magic goes in
 * last, so a reader that races the creator sees an invalid header, not a
 * half-written one. */
static void
init_segment(struct seg *s, const struct bs_config *cfg)
{
	struct seg_header *h = s->base;

	memset(s->base, 0, s->size);
	seg_layout_fill(h, (uint32_t)cfg->ncomp, cfg->max_sockets, cfg->max_processes);
	h->version = SEG_VERSION;
	h->creator_uid = (uint32_t)geteuid();
	h->created_ms = now_real_ms();
	bs_format(h->name, sizeof(h->name), "%s", cfg->segment);
	bs_format(h->config_path, sizeof(h->config_path), "%s", cfg->path);
	seg_note_config(h, cfg->path);
	s->ncomp = h->ncomp;
	s->nslots = h->nslots;
	s->nprocs = h->nprocs;
	s->bitmap_words = h->bitmap_words;
	set_pointers(s);
	h->nclass = (uint32_t)cfg->nclass;
	for (size_t k = 0; k < cfg->nclass && k < BS_MAX_CLASSES; k++)
		bs_format(h->class_name[k], sizeof(h->class_name[k]), "%s", cfg->classes[k].name);
	for (size_t i = 0; i < cfg->ncomp; i++) {
		bs_format(s->comp[i].name, sizeof(s->comp[i].name), "%s", cfg->comp[i].name);
		seg_apply_limits(&s->comp[i], &cfg->comp[i]);
		s->cmap[i] = (int)i;
	}
	pool_apply(s, cfg, s->cmap, true);
	atomic_thread_fence(memory_order_release);
	h->magic = SEG_MAGIC;
}

void
seg_note_config(struct seg_header *h, const char *path)
{
	struct stat st;

	h->config_dev = h->config_ino = 0;
	if (path != NULL && stat(path, &st) == 0) {
		h->config_dev = (uint64_t)st.st_dev;
		h->config_ino = (uint64_t)st.st_ino;
	}
}

/* The file's settings just replaced whatever `bulkshim set` had changed
 * (the segment's live_set log): say so, since a `set --all enforce off`
 * undone by a restart is no small thing, and start a new log. */
static void
forget_live_sets(struct seg *s, const struct bs_config *cfg, const char *name)
{
	char list[256];
	size_t n = 0;

	for (size_t i = 0; i < sizeof(s->h->live_set) && s->h->live_set[i] != '\0' &&
	    n + 3 < sizeof(list); i++) {
		if (s->h->live_set[i] != '\n') {
			list[n++] = s->h->live_set[i];
		} else if (i + 1 < sizeof(s->h->live_set) && s->h->live_set[i + 1] != '\0') {
			list[n++] = ',';
			list[n++] = ' ';
		}
	}
	list[n] = '\0';
	if (n == 0)
		return;
	bs_log(LOG_WARN, "segment /dev/shm%s: no process held it, so the settings of %s replace "
	    "what `bulkshim set` had changed live: %s", name, cfg->path, list);
	memset(s->h->live_set, 0, sizeof(s->h->live_set));
}

/* Maps config compartments to segment compartments by name. Returns the
 * number of config compartments the segment lacks. */
static size_t
map_compartments(struct seg *s, const struct bs_config *cfg)
{
	size_t missing = 0;

	for (size_t i = 0; i < cfg->ncomp; i++) {
		s->cmap[i] = -1;
		for (uint32_t j = 0; j < s->ncomp; j++) {
			if (strncmp(s->comp[j].name, cfg->comp[i].name, BS_NAME_MAX) == 0) {
				s->cmap[i] = (int)j;
				break;
			}
		}
		if (s->cmap[i] < 0)
			missing++;
	}
	return missing;
}

static struct seg *
seg_new(size_t ncmap)
{
	struct seg *s = calloc(1, sizeof(*s));

	if (s == NULL)
		return NULL;
	s->cmap = calloc(ncmap ? ncmap : 1, sizeof(int));
	if (s->cmap == NULL) {
		free(s);
		return NULL;
	}
	s->ncmap = ncmap;
	s->my_pid = getpid();
	atomic_store(&s->rec, -1);
	return s;
}

static int
alloc_local(struct seg *s)
{
	s->lcount = calloc(s->nslots, sizeof(*s->lcount));
	return s->lcount == NULL ? -ENOMEM : 0;
}

/* Says why the object at the segment's name cannot be opened. glibc's
 * shm_open answers EINVAL for a directory and ELOOP for a symbolic link
 * (it adds O_NOFOLLOW), which say little; lstat says what is there. */
static void
open_failure(const char *name, int e, char *err, size_t errlen)
{
	char path[BS_NAME_MAX + 32];
	struct stat st;

	bs_format(path, sizeof(path), "/dev/shm%s", name);
	if ((e == ELOOP || e == EINVAL) && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
		bs_format(err, errlen, "segment %s is a symbolic link; not followed, not trusted", path);
	else if ((e == ELOOP || e == EINVAL) && lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
		bs_format(err, errlen, "segment %s is a directory, not a shared-memory object; "
		    "not trusted", path);
	else
		bs_format(err, errlen, "cannot open segment %s: %s", path, strerror(e));
}

/*
 * The checks at attach of a segment that existed: records in no known
 * state are freed, dead processes' permits taken back, and then either
 * every leftover count is reset (nobody holds a record) or the counts must
 * at least be possible. Returns NULL, or why the segment is not trusted.
 */
static const char *
scrub(struct seg *s, const char *name, char *buf, size_t len)
{
	uint32_t bad = repair_records(s);

	if (bad > 0)
		bs_log(LOG_WARN, "segment /dev/shm%s: %u process records in no known state; freed",
		    name, bad);
	proc_reclaim(s, false);
	reconcile_kernel_held(s);
	if (!repair_in_use(s) && repair_unheld(s, name))
		return NULL;
	return repair_impossible(s, buf, len);
}

/* Settings of the configured compartments that no config can give are
 * replaced by the configured ones, live processes or not. */
static void
fix_settings(struct seg *s, const struct bs_config *cfg, const char *name)
{
	for (size_t i = 0; i < cfg->ncomp; i++) {
		struct seg_comp *c = &s->comp[s->cmap[i]];
		const char *what = repair_setting(c);

		if (what == NULL)
			continue;
		bs_log(LOG_WARN, "segment /dev/shm%s: compartment %s: %s out of range (limit %u, "
		    "max_wait_ms %u); using the configured values", name, cfg->comp[i].name, what,
		    atomic_load(&c->limit), atomic_load(&c->max_wait_ms));
		seg_apply_limits(c, &cfg->comp[i]);
	}
}

/* Whether the segment behind fd was sized but never finished: the magic,
 * which init_segment writes last, is still 0 (its creator died between
 * ftruncate and the end of init_segment, and the lock it held went with
 * it). Checked by the lock holder only, so a live creator is never
 * overtaken. */
static bool
unfinished(int fd, const struct stat *st)
{
	uint64_t magic = 1;

	if (st->st_size < (off_t)sizeof(struct seg_header))
		return false;
	return pread(fd, &magic, sizeof(magic), offsetof(struct seg_header, magic)) ==
	    (ssize_t)sizeof(magic) && magic == 0;
}

/* Sizes a new segment with memory that is really there: ftruncate
 * reserves nothing on tmpfs, and a page that a full /dev/shm cannot give
 * raises SIGBUS at its first touch. posix_fallocate takes every page now,
 * or fails with nothing taken and the object left at size 0, which the
 * next process to start sets up again (never a half-made segment). */
static int
reserve(int fd, size_t size, const char *name, char *err, size_t errlen)
{
	struct statvfs vfs;
	int e;

	do {
		e = posix_fallocate(fd, 0, (off_t)size);
	} while (e == EINTR);
	if (e == 0)
		return 0;
	if (ftruncate(fd, 0) < 0) {
		/* The object is left as it is: the next creator finds it
		 * unfinished and reserves again. */
	}
	if (e == ENOSPC && fstatvfs(fd, &vfs) == 0)
		bs_format(err, errlen, "cannot reserve %lu KiB for segment /dev/shm%s: /dev/shm has "
		    "%lu KiB free (raise its size, or lower max_sockets/max_processes)",
		    (unsigned long)((size + 1023) / 1024), name,
		    (unsigned long)((uint64_t)vfs.f_bavail * vfs.f_frsize / 1024));
	else
		bs_format(err, errlen, "cannot reserve %lu KiB for segment /dev/shm%s: %s",
		    (unsigned long)((size + 1023) / 1024), name, strerror(e));
	return -e;
}

/* Whether a process of this user may use an object that uid owns under
 * cfg: its own, root's, or the configured owner's. Anyone else's may have
 * been made first by a stranger (/dev/shm is open to every user), and a
 * stranger must not decide what the service's limits are. */
static bool
owner_expected(const struct bs_config *cfg, uid_t uid)
{
	return uid == geteuid() || uid == 0 || (cfg->has_owner && uid == cfg->owner);
}

/* A stranger's object at the segment's name (st), which is never used.
 * Root removes it when no process maps it (a squatter's, or one whose
 * users are gone), if `remove` says so, and returns 1: the caller sets
 * the segment up anew. Else returns -EPERM with who owns it, who maps it,
 * and the fix in err. */
static int
stranger(const struct bs_config *cfg, const char *name, const struct stat *st, bool remove,
    char *err, size_t errlen)
{
	char path[BS_NAME_MAX + 32], who[64] = "";
	pid_t pids[3];
	int n = -1;

	bs_format(path, sizeof(path), "/dev/shm%s", name);
	if (geteuid() == 0) {
		n = seg_mappers((uint64_t)st->st_ino, path, pids, 3);
		if (n == 0 && !remove)
			return 1;
		if (n == 0 && shm_unlink(name) == 0) {
			bs_log(LOG_WARN, "%s belonged to uid %u (not root, not the config's owner) and "
			    "no process mapped it: removed, and set up anew", path,
			    (unsigned)st->st_uid);
			return 1;
		}
		if (n == 0 && errno == ENOENT)
			return 1;	/* another process removed it first */
	}
	if (n > 0)
		bs_format(who, sizeof(who), "; pid %d%s maps it", (int)pids[0],
		    n > 1 ? " and others" : "");
	bs_format(err, errlen, "%s belongs to uid %u, not to this user (uid %u), root or the "
	    "config's owner%s: not used. If uid %u did not make it for this service, remove it as "
	    "root (bulkshim rm --force %s); if it should own it, set owner = \"%u\" in %s", path,
	    (unsigned)st->st_uid, (unsigned)geteuid(), who, (unsigned)st->st_uid, cfg->segment,
	    (unsigned)st->st_uid, cfg->path);
	return -EPERM;
}

/* Opens the existing object at shm name read-write. An open that meets
 * the lease `bulkshim rm` holds while it removes an object nobody maps
 * does not wait for the lease to be given up (the kernel would wait up to
 * lease-break-time, 45 s): it fails with EWOULDBLOCK and is tried again,
 * for LOCK_WAIT_MS at most. Returns the descriptor, or -1 with errno. */
static int
open_existing(const char *name)
{
	struct timespec ms = { 0, 1000000 };
	int fd;

	for (int waited = 0;; waited++) {
		fd = shm_open(name, O_RDWR | O_NONBLOCK, 0);
		if (fd >= 0 || errno != EWOULDBLOCK || waited >= LOCK_WAIT_MS)
			return fd;
		nanosleep(&ms, NULL);
	}
}

/* lstat of the object behind shm name. */
static int
shm_stat(const char *name, struct stat *st)
{
	char path[BS_NAME_MAX + 32];

	bs_format(path, sizeof(path), "/dev/shm%s", name);
	return lstat(path, st);
}

int
seg_check_owner(const struct bs_config *cfg, char *err, size_t errlen)
{
	char name[BS_NAME_MAX + 16];
	struct stat st;

	seg_shm_name(cfg->segment, name, sizeof(name));
	if (shm_stat(name, &st) < 0 || owner_expected(cfg, st.st_uid))
		return 0;
	return stranger(cfg, name, &st, false, err, errlen) > 0 ? 0 : -EPERM;
}

static int
try_attach(const struct bs_config *cfg, struct seg **out, char *err, size_t errlen, int retries)
{
	char name[BS_NAME_MAX + 16], msg[BS_ERRLEN / 2];
	struct seg_header want;
	struct seg *s = NULL;
	struct stat st;
	const char *why;
	bool created = false, locked;
	int fd, r;

	*out = NULL;
	seg_shm_name(cfg->segment, name, sizeof(name));
	/* glibc's shm_open adds O_NOFOLLOW: a symlink planted at the name
	 * fails with ELOOP instead of being followed. */
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, cfg->mode & 07777);
	if (fd >= 0) {
		created = true;
	} else if (errno == EEXIST) {
		fd = open_existing(name);
		/* Removed between the two opens: create it, this time. */
		if (fd < 0 && errno == ENOENT && retries < 3)
			return try_attach(cfg, out, err, errlen, retries + 1);
	}
	if (fd < 0) {
		r = -errno;
		/* Not ours to open may be a stranger's: that is said first. */
		if (r == -EACCES && shm_stat(name, &st) == 0 && !owner_expected(cfg, st.st_uid)) {
			r = stranger(cfg, name, &st, true, err, errlen);
			if (r > 0 && retries < 3)
				return try_attach(cfg, out, err, errlen, retries + 1);
			return -EPERM;
		}
		open_failure(name, -r, err, errlen);
		return r;
	}
	/* The lock serialises creation and the upkeep below. A segment that
	 * is already set up can be attached without it when many processes
	 * start at once and the lock stays busy: then the upkeep is left to
	 * the processes that get the lock. */
	locked = lock_bounded(fd, LOCK_FAST_MS) == 0;
	if (!locked && (fstat(fd, &st) < 0 || st.st_size == 0 || unfinished(fd, &st))) {
		r = lock_bounded(fd, LOCK_WAIT_MS);
		if (r < 0) {
			bs_format(err, errlen, "segment /dev/shm%s stays locked: %s", name,
			    strerror(-r));
			goto fail;
		}
		locked = true;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		bs_format(err, errlen, "cannot stat segment /dev/shm%s", name);
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		r = -EINVAL;
		bs_format(err, errlen, "segment /dev/shm%s is not a regular shared-memory object; not trusted", name);
		goto fail;
	}
	/* Removed between our lookup of the name and now (`bulkshim rm`
	 * without a lease to hold, or an open that waited out its lease):
	 * counting in the removed object would split the count from every
	 * process that starts after us. */
	if (st.st_nlink == 0 && retries < 3) {
		flock(fd, LOCK_UN);
		sys_close(fd);
		return try_attach(cfg, out, err, errlen, retries + 1);
	}
	if (st.st_nlink == 0) {
		r = -ESTALE;
		bs_format(err, errlen, "segment /dev/shm%s is removed each time it is opened", name);
		goto fail;
	}
	if (!owner_expected(cfg, st.st_uid)) {
		r = stranger(cfg, name, &st, true, err, errlen);
		if (r > 0 && retries < 3) {
			flock(fd, LOCK_UN);
			sys_close(fd);
			return try_attach(cfg, out, err, errlen, retries + 1);
		}
		if (r > 0)
			bs_format(err, errlen, "segment /dev/shm%s is made again by uid %u each time "
			    "it is removed: not used", name, (unsigned)st.st_uid);
		r = -EPERM;
		goto fail;
	}
	if (created) {
		/* The mode given to shm_open was filtered by the umask. */
		if (fchmod(fd, cfg->mode & 07777) < 0)
			bs_log(LOG_WARN, "cannot set mode of /dev/shm%s: %s", name, strerror(errno));
		if ((cfg->has_owner || cfg->has_group) &&
		    fchown(fd, cfg->has_owner ? cfg->owner : (uid_t)-1,
		    cfg->has_group ? cfg->group : (gid_t)-1) < 0)
			bs_log(LOG_WARN, "cannot set owner of /dev/shm%s: %s", name, strerror(errno));
	}
	s = seg_new(cfg->ncomp);
	if (s == NULL) {
		r = -ENOMEM;
		bs_format(err, errlen, "out of memory");
		goto fail;
	}
	/* Before any release (the reclaim and repairs below) may need the
	 * engine's map (kjoint.c). */
	bs_format(s->kern.segment, sizeof(s->kern.segment), "%s", cfg->segment);
	if (st.st_size == 0 || unfinished(fd, &st)) {
		/* New, or left empty by a creator that died before sizing it
		 * or before finishing it: whoever holds the lock initialises
		 * it. Nobody can have attached to an unfinished one. */
		if (st.st_size != 0)
			bs_log(LOG_WARN, "segment /dev/shm%s was left unfinished by a creator that "
			    "died; set up anew", name);
		memset(&want, 0, sizeof(want));
		seg_layout_fill(&want, (uint32_t)cfg->ncomp, cfg->max_sockets, cfg->max_processes);
		r = reserve(fd, want.total_size, name, err, errlen);
		if (r < 0)
			goto fail;
		r = map_fd(s, fd, want.total_size, true, name);
		if (r < 0) {
			bs_format(err, errlen, "cannot map segment /dev/shm%s: %s", name, strerror(-r));
			goto fail;
		}
		init_segment(s, cfg);
	} else {
		r = map_fd(s, fd, (size_t)st.st_size, true, name);
		if (r < 0) {
			bs_format(err, errlen, "cannot map segment /dev/shm%s: %s", name, strerror(-r));
			goto fail;
		}
		why = validate(s);
		if (why == NULL) {
			set_pointers(s);
			if (locked)
				why = scrub(s, name, msg, sizeof(msg));
		}
		if (why != NULL) {
			r = -EINVAL;
			bs_format(err, errlen, "segment /dev/shm%s: %s; not trusted (remove it if no "
			    "program uses it)", name, why);
			goto fail;
		}
	}
	if (map_compartments(s, cfg) != 0 || (!created && pool_mismatch(s, cfg, s->cmap) != NULL)) {
		if (locked)
			proc_reclaim(s, false);
		if (!locked || repair_in_use(s)) {
			r = -EEXIST;
			bs_format(err, errlen, "segment /dev/shm%s is in use with other compartments "
			    "(another configuration?)", name);
			goto fail;
		}
		/* Nobody holds anything: start over with this configuration.
		 * The object is unlinked, not rewritten, so that a process
		 * still mapping the old one never sees its layout change. */
		unmap(s);
		shm_unlink(name);
		flock(fd, LOCK_UN);
		sys_close(fd);
		free(s->cmap);
		free(s);
		bs_log(LOG_INFO, "segment /dev/shm%s had other compartments and no holders; recreated", name);
		return try_attach(cfg, out, err, errlen, retries);
	}
	if (!created && locked) {
		fix_settings(s, cfg, name);
		/* Throttled: with many processes starting at once, one scan
		 * of the process table in 100 ms is enough. */
		proc_reclaim(s, true);
		if (!repair_in_use(s)) {
			/* A segment left by an earlier run: this run's
			 * configuration is what the operator means now. */
			for (size_t i = 0; i < cfg->ncomp; i++)
				seg_apply_limits(&s->comp[s->cmap[i]], &cfg->comp[i]);
			pool_apply(s, cfg, s->cmap, true);
			forget_live_sets(s, cfg, name);
		}
	}
	r = alloc_local(s);
	if (r < 0) {
		bs_format(err, errlen, "out of memory");
		goto fail;
	}
	/* The count shared with a kernel engine is put right like the
	 * others when nobody holds a record (its own part is the engine's). */
	if (locked)
		kjoint_probe(s, !repair_in_use(s));
	s->my_start = sys_pid_start(getpid());
	/* Start-up may have rewritten settings (a fresh start, a repair). */
	seg_settings_changed(s);
	/* The mapping keeps the open file description alive, and the flock
	 * with it: closing alone would not unlock. */
	flock(fd, LOCK_UN);
	sys_close(fd);
	*out = s;
	return 0;
fail:
	if (s != NULL) {
		unmap(s);
		free(s->cmap);
		free(s);
	}
	flock(fd, LOCK_UN);
	sys_close(fd);
	return r;
}

int
seg_attach(const struct bs_config *cfg, struct seg **out, char *err, size_t errlen)
{
	return try_attach(cfg, out, err, errlen, 0);
}

int
seg_open(const char *segment, bool writable, struct seg **out, char *err, size_t errlen)
{
	char name[BS_NAME_MAX + 16];
	struct seg *s;
	struct stat st;
	const char *why;
	int fd, r;

	*out = NULL;
	seg_shm_name(segment, name, sizeof(name));
	fd = shm_open(name, writable ? O_RDWR : O_RDONLY, 0);
	if (fd < 0) {
		r = -errno;
		bs_format(err, errlen, "cannot open segment /dev/shm%s: %s", name, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		sys_close(fd);
		bs_format(err, errlen, "/dev/shm%s is not a regular shared-memory object", name);
		return -EINVAL;
	}
	/* Removed while we opened it (see try_attach): as if not there. */
	if (st.st_nlink == 0) {
		sys_close(fd);
		bs_format(err, errlen, "cannot open segment /dev/shm%s: %s", name, strerror(ENOENT));
		return -ENOENT;
	}
	s = seg_new(0);
	if (s == NULL) {
		sys_close(fd);
		return -ENOMEM;
	}
	bs_format(s->kern.segment, sizeof(s->kern.segment), "%s", segment);
	r = st.st_size > 0 ? map_fd(s, fd, (size_t)st.st_size, writable, name) : -EINVAL;
	sys_close(fd);
	if (r < 0) {
		bs_format(err, errlen, "cannot map segment /dev/shm%s", name);
		free(s->cmap);
		free(s);
		return r;
	}
	why = validate(s);
	if (why != NULL) {
		bs_format(err, errlen, "segment /dev/shm%s: %s", name, why);
		seg_close(s);
		return -EINVAL;
	}
	set_pointers(s);
	*out = s;
	return 0;
}

void
seg_close(struct seg *s)
{
	if (s == NULL)
		return;
	unmap(s);
	kjoint_unmap(s);
	free(s->lcount);
	free(s->cmap);
	free(s);
}

int
seg_comp_index(const struct seg *s, size_t cfg_index)
{
	return cfg_index < s->ncmap ? s->cmap[cfg_index] : -1;
}

int
seg_comp_find(const struct seg *s, const char *name)
{
	for (uint32_t i = 0; i < s->ncomp; i++) {
		if (strncmp(seg_comp(s, i)->name, name, BS_NAME_MAX) == 0)
			return (int)i;
	}
	return -1;
}

uint32_t
seg_proc_held(const struct seg *s, uint32_t i)
{
	uint32_t n = 0;

	if (i >= s->nprocs)
		return 0;
	for (uint32_t w = 0; w < s->bitmap_words; w++)
		n += (uint32_t)__builtin_popcountll(slot_held_bits(s, i, w));
	return n;
}
