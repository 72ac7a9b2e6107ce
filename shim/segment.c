/* segment.c - the shared-memory segment: layout, validation, permits, reclaim. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

/*
 * Layout: a header, then ncomp compartments, nslots socket slots, nprocs
 * process records, and one bitmap row of nslots bits per process record.
 * Every count in the shared memory is a fixed-width atomic, so 32- and 64-bit
 * processes and processes of different builds agree on it, and nothing in
 * it is a lock: a process killed at any instruction leaves no lock behind.
 *
 * A permit is one unit of a compartment's in_use. The socket holding it has
 * a slot; each process that has a descriptor of the socket has the slot's
 * bit set in its row, and the slot's `holders` counts those rows. The permit
 * goes back when `holders` drops to zero: when the last descriptor in the
 * last process is closed, or when the last holder is found dead.
 */

#define RECLAIM_EVERY_MS 100
#define FORK_GRACE_MS	2000	/* a forked child has this long to claim its record */
#define GATE_WAIT_MS	1000	/* the longest fork waits for the gate to empty */
#define LOCK_WAIT_MS	2000	/* for a segment still being created */
#define LOCK_FAST_MS	100	/* for the upkeep of one already set up */


static size_t
align_up(size_t v, size_t a)
{
	return (v + a - 1) & ~(a - 1);
}

/* Fills the layout fields of h for the given counts. */
static void
layout(struct seg_header *h, uint32_t ncomp, uint32_t nslots, uint32_t nprocs)
{
	h->header_size = sizeof(*h);
	h->ncomp = ncomp;
	h->nslots = nslots;
	h->nprocs = nprocs;
	h->bitmap_words = (nslots + 63) / 64;
	h->off_comp = align_up(sizeof(*h), 64);
	h->off_slots = align_up(h->off_comp + (uint64_t)ncomp * sizeof(struct seg_comp), 64);
	h->off_procs = align_up(h->off_slots + (uint64_t)nslots * sizeof(struct seg_slot), 64);
	h->off_bitmaps = align_up(h->off_procs + (uint64_t)nprocs * sizeof(struct seg_proc), 64);
	h->total_size = align_up(h->off_bitmaps +
	    (uint64_t)nprocs * h->bitmap_words * sizeof(uint64_t), 4096);
}

/* Every name in the segment is printed and compared as a C string: one
 * without its NUL would run into the fields after it. The caller checked
 * that the compartments lie inside the mapping. Returns NULL or what is
 * wrong. */
static const char *
damaged_names(const struct seg_header *h)
{
	const struct seg_comp *c = (const struct seg_comp *)((const char *)h + h->off_comp);

	if (memchr(h->name, '\0', sizeof(h->name)) == NULL ||
	    memchr(h->config_path, '\0', sizeof(h->config_path)) == NULL)
		return "damaged (its name or config path is not terminated)";
	for (int k = 0; k < BS_MAX_CLASSES; k++) {
		if (memchr(h->class_name[k], '\0', sizeof(h->class_name[k])) == NULL)
			return "damaged (a class name is not terminated)";
	}
	for (uint32_t i = 0; i < h->ncomp; i++) {
		if (memchr(c[i].name, '\0', sizeof(c[i].name)) == NULL)
			return "damaged (a compartment name is not terminated)";
	}
	return NULL;
}

/* Checks that a mapped header describes exactly the layout its counts give
 * and fits in `size` bytes, and that its names are terminated. Returns NULL
 * or what is wrong. */
static const char *
validate(const struct seg_header *h, size_t size)
{
	struct seg_header want;

	if (size < sizeof(*h))
		return "truncated (smaller than its header)";
	if (h->magic != SEG_MAGIC)
		return "bad magic (not a bulkshim segment)";
	if (h->version != SEG_VERSION)
		return "unsupported layout version";
	if (h->ncomp == 0 || h->ncomp > BS_MAX_COMPARTMENTS || h->nslots == 0 ||
	    h->nslots > BS_MAX_SOCKETS || h->nprocs == 0 || h->nprocs > BS_MAX_PROCESSES)
		return "counts out of range";
	memset(&want, 0, sizeof(want));
	layout(&want, h->ncomp, h->nslots, h->nprocs);
	if (h->header_size != want.header_size || h->bitmap_words != want.bitmap_words ||
	    h->off_comp != want.off_comp || h->off_slots != want.off_slots ||
	    h->off_procs != want.off_procs || h->off_bitmaps != want.off_bitmaps ||
	    h->total_size != want.total_size)
		return "inconsistent layout";
	if (h->total_size > size)
		return "truncated";
	return damaged_names(h);
}

static void
set_pointers(struct seg *s)
{
	char *b = s->base;

	s->h = s->base;
	s->comp = (struct seg_comp *)(b + s->h->off_comp);
	s->slots = (struct seg_slot *)(b + s->h->off_slots);
	s->procs = (struct seg_proc *)(b + s->h->off_procs);
	s->bits = (_Atomic uint64_t *)(b + s->h->off_bitmaps);
}

static _Atomic uint64_t *
row(const struct seg *s, uint32_t rec)
{
	return s->bits + (size_t)rec * s->h->bitmap_words;
}

/* Reads a small file with raw system calls; returns bytes read or -errno. */
static long
read_small(const char *path, char *buf, size_t len)
{
	long fd, n;

	fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = syscall(SYS_read, fd, buf, len - 1);
	if (n < 0)
		n = -errno;
	syscall(SYS_close, fd);
	if (n >= 0)
		buf[n] = '\0';
	return n;
}

/* Parses /proc/PID/stat: the state letter and field 22 (start time). The
 * command name may hold spaces and parentheses, so parsing starts after the
 * last ')'. Returns 0, -ENOENT if the process is gone, or another -errno. */
static int
proc_stat(pid_t pid, char *state, uint64_t *start, uint64_t *threads)
{
	char path[64], buf[1024];
	char *p;
	long n;
	int field = 2;

	bs_format(path, sizeof(path), "/proc/%d/stat", (int)pid);
	n = read_small(path, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	p = strrchr(buf, ')');
	if (p == NULL || p[1] != ' ')
		return -EINVAL;
	p += 2;
	*state = *p;
	*threads = 0;
	for (field = 3; field < 22 && *p; p++) {
		if (*p == ' ' && ++field == 20) {
			for (const char *q = p + 1; *q >= '0' && *q <= '9'; q++)
				*threads = *threads * 10 + (uint64_t)(*q - '0');
		}
	}
	*start = 0;
	while (*p >= '0' && *p <= '9')
		*start = *start * 10 + (uint64_t)(*p++ - '0');
	return 0;
}

uint64_t
seg_pid_start(pid_t pid)
{
	char state;
	uint64_t start, threads;

	return proc_stat(pid, &state, &start, &threads) == 0 ? start : 0;
}

bool
seg_pid_alive(pid_t pid, uint64_t start)
{
	char state;
	uint64_t st, threads;
	int r;

	if (pid <= 0)
		return false;
	r = proc_stat(pid, &state, &st, &threads);
	if (r == -ENOENT || r == -ESRCH)
		return false;
	if (r < 0) {
		/* No /proc (or hidepid): fall back to a signal probe, which
		 * cannot tell a zombie or a reused PID, so it errs on "alive". */
		return !(kill(pid, 0) < 0 && errno == ESRCH);
	}
	/* A zombie has closed all its descriptors: its permits are free. But
	 * a thread-group leader that called pthread_exit() shows as a zombie
	 * while its other threads live on, holding the descriptors; the
	 * thread count (field 20) tells the two apart. */
	if ((state == 'Z' || state == 'X' || state == 'x') && threads <= 1)
		return false;
	return start == 0 || st == start;
}

/* ---- attach and open ---- */

static void
seg_name(const char *segment, char *out, size_t len)
{
	bs_format(out, len, "/bulkshim.%s", segment);
}

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

static int
map_fd(struct seg *s, int fd, size_t size, bool writable)
{
	void *p = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		return -errno;
	s->base = p;
	s->size = size;
	return 0;
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
	atomic_store(&c->max_wait_ms, cc->max_wait_ms);
	atomic_store(&c->max_waiting, waiting);
	atomic_store(&c->connect_timeout_ms, cc->connect_timeout_ms);
	atomic_store(&c->io_timeout_ms, cc->io_timeout_ms);
	for (int k = 0; k < BS_MAX_CLASSES; k++)
		atomic_store(&c->cls[k].limit, cc->class_limit[k]);
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
	layout(h, (uint32_t)cfg->ncomp, cfg->max_sockets, cfg->max_processes);
	h->version = SEG_VERSION;
	h->creator_uid = (uint32_t)geteuid();
	h->created_ms = now_real_ms();
	bs_format(h->name, sizeof(h->name), "%s", cfg->segment);
	bs_format(h->config_path, sizeof(h->config_path), "%s", cfg->path);
	set_pointers(s);
	h->nclass = (uint32_t)cfg->nclass;
	for (size_t k = 0; k < cfg->nclass && k < BS_MAX_CLASSES; k++)
		bs_format(h->class_name[k], sizeof(h->class_name[k]), "%s", cfg->classes[k].name);
	for (size_t i = 0; i < cfg->ncomp; i++) {
		bs_format(s->comp[i].name, sizeof(s->comp[i].name), "%s", cfg->comp[i].name);
		seg_apply_limits(&s->comp[i], &cfg->comp[i]);
	}
	atomic_thread_fence(memory_order_release);
	h->magic = SEG_MAGIC;
}

static bool
any_live(struct seg *s)
{
	for (uint32_t i = 0; i < s->h->nprocs; i++) {
		if (atomic_load(&s->procs[i].state) != PROC_FREE)
			return true;
	}
	return false;
}

/* Maps config compartments to segment compartments by name. Returns the
 * number of config compartments the segment lacks. */
static size_t
map_compartments(struct seg *s, const struct bs_config *cfg)
{
	size_t missing = 0;

	for (size_t i = 0; i < cfg->ncomp; i++) {
		s->cmap[i] = -1;
		for (uint32_t j = 0; j < s->h->ncomp; j++) {
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
	s->lcount = calloc(s->h->nslots, sizeof(*s->lcount));
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

/* ---- damaged counters, put right at attach ---- */

/*
 * A segment that passed validate() can still hold values no correct shim
 * writes: a damaged or hand-made segment, a bug, a crash at the wrong
 * instruction. Left alone, a count of 4 billion permits in use refuses
 * every connect forever and a wait of 49 days hangs the caller. Attach
 * puts such values right, under the segment's lock, and says what it
 * changed; what it cannot put right safely makes the segment untrusted.
 */

/* No legitimate count comes near this: in_use stays below its limit (at
 * most BS_MAX_LIMIT) or, with no limit, below the socket table. */
#define SANE_COUNT_MAX	((uint32_t)BS_MAX_LIMIT + BS_MAX_SOCKETS)

/* Lowers *v by `by`, never below 0, keeping whatever others added since. */
static void
sub_floor(_Atomic uint32_t *v, uint32_t by)
{
	uint32_t cur = atomic_load(v);

	while (!atomic_compare_exchange_weak(v, &cur, cur > by ? cur - by : 0))
		;
}

/* Frees the process records whose state is none of ours. Nothing else
 * ever writes such a record, so it can be cleared without a race; its row
 * is cleared before the record becomes free. Returns how many. */
static uint32_t
clear_bad_records(struct seg *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->h->nprocs; i++) {
		struct seg_proc *p = &s->procs[i];
		uint32_t st = atomic_load(&p->state);

		if (st <= PROC_EXITED)
			continue;
		for (uint32_t w = 0; w < s->h->bitmap_words; w++)
			atomic_store(&row(s, i)[w], 0);
		atomic_store(&p->pid, 0);
		atomic_store(&p->owner, 0);
		atomic_store(&p->start, 0);
		if (atomic_compare_exchange_strong(&p->state, &st, PROC_FREE))
			n++;
	}
	return n;
}

/* The counts of compartment c that stand for permits, waiters and
 * requests; all of them are 0 when no process holds a record. */
#define NCOUNTS (5 + BS_MAX_CLASSES)
static void
counts_of(struct seg_comp *c, _Atomic uint32_t *v[NCOUNTS])
{
	v[0] = &c->in_use;
	v[1] = &c->inflight;
	v[2] = &c->over;
	v[3] = &c->inflight_over;
	v[4] = &c->waiting;
	for (int k = 0; k < BS_MAX_CLASSES; k++)
		v[5 + k] = &c->cls[k].in_use;
}

static const char *const count_names[NCOUNTS] = {
	"in_use", "inflight", "over", "inflight_over", "waiting",
	"class 0 in_use", "class 1 in_use", "class 2 in_use", "class 3 in_use",
	"class 4 in_use", "class 5 in_use", "class 6 in_use", "class 7 in_use",
};

/*
 * No process holds a record, so no permit is held and no slot is in use:
 * whatever the counts say is left over (a process killed between taking a
 * permit and recording it) or garbage. The counts are read first and
 * taken off only if still nobody holds a record afterwards, by subtraction,
 * so a process that starts taking permits meanwhile keeps what it took.
 * Returns false if a process took a record before it was done (or memory
 * ran out), and nothing was changed.
 */
static bool
reset_unheld(struct seg *s, const char *name)
{
	uint32_t nslots = 0;
	bool done = false;
	uint32_t *seen = calloc((size_t)s->h->ncomp * NCOUNTS, sizeof(*seen));
	uint32_t *slot_st = calloc(s->h->nslots, sizeof(*slot_st));

	if (seen == NULL || slot_st == NULL)
		goto done;
	for (uint32_t i = 0; i < s->h->ncomp; i++) {
		_Atomic uint32_t *v[NCOUNTS];

		counts_of(&s->comp[i], v);
		for (int k = 0; k < NCOUNTS; k++)
			seen[i * NCOUNTS + k] = atomic_load(v[k]);
	}
	for (uint32_t j = 0; j < s->h->nslots; j++)
		slot_st[j] = atomic_load(&s->slots[j].state);
	if (any_live(s))
		goto done;
	for (uint32_t i = 0; i < s->h->ncomp; i++) {
		_Atomic uint32_t *v[NCOUNTS];

		counts_of(&s->comp[i], v);
		for (int k = 0; k < NCOUNTS; k++) {
			uint32_t was = seen[i * NCOUNTS + k];

			if (was == 0)
				continue;
			sub_floor(v[k], was);
			bs_log(LOG_WARN, "segment /dev/shm%s: compartment %s: %s was %u with no "
			    "process holding anything; reset to 0", name, s->comp[i].name,
			    count_names[k], was);
		}
	}
	for (uint32_t j = 0; j < s->h->nslots; j++) {
		struct seg_slot *sl = &s->slots[j];
		uint32_t st = slot_st[j];

		if (st == SLOT_FREE)
			continue;
		atomic_store(&sl->holders, 0);
		atomic_store(&sl->inode, 0);
		atomic_store(&sl->mark, (uint64_t)MARK_GEN(atomic_load(&sl->mark)) << 32);
		if (atomic_compare_exchange_strong(&sl->state, &st, SLOT_FREE))
			nslots++;
	}
	if (nslots > 0)
		bs_log(LOG_WARN, "segment /dev/shm%s: %u socket slots were in use with no process "
		    "holding them; freed", name, nslots);
	done = true;
done:
	free(seen);
	free(slot_st);
	return done;
}

/* Processes hold records: their counts cannot be recomputed under them,
 * but a count beyond anything possible means the segment is damaged.
 * Returns NULL or what is wrong, in buf. */
static const char *
impossible_counts(struct seg *s, char *buf, size_t len)
{
	for (uint32_t i = 0; i < s->h->ncomp; i++) {
		_Atomic uint32_t *v[NCOUNTS];

		counts_of(&s->comp[i], v);
		for (int k = 0; k < NCOUNTS; k++) {
			uint32_t n = atomic_load(v[k]);

			if (n > SANE_COUNT_MAX) {
				bs_format(buf, len, "damaged (compartment %s: %s is %u while processes "
				    "use the segment)", s->comp[i].name, count_names[k], n);
				return buf;
			}
		}
	}
	return NULL;
}

/* What is wrong with the settings of compartment c, or NULL: values that
 * seg_apply_limits never writes, whatever the config. */
static const char *
bad_setting(const struct seg_comp *c)
{
	uint32_t lim = atomic_load(&c->limit), ilim = atomic_load(&c->inflight_limit);
	uint32_t mw = atomic_load(&c->max_waiting);

	if (lim == 0 || (lim > BS_MAX_LIMIT && lim != UINT32_MAX))
		return "limit";
	if (ilim == 0 || (ilim > BS_MAX_LIMIT && ilim != UINT32_MAX))
		return "inflight limit";
	if (mw > BS_MAX_LIMIT)
		return "max_waiting";
	if (atomic_load(&c->max_wait_ms) > BS_MAX_WAIT_MS)
		return "max_wait_ms";
	if (atomic_load(&c->connect_timeout_ms) > BS_MAX_TIMEOUT_MS ||
	    atomic_load(&c->io_timeout_ms) > BS_MAX_TIMEOUT_MS)
		return "timeout";
	for (int k = 0; k < BS_MAX_CLASSES; k++) {
		if (atomic_load(&c->cls[k].limit) > BS_MAX_LIMIT)
			return "class limit";
	}
	return NULL;
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
	uint32_t bad = clear_bad_records(s);

	if (bad > 0)
		bs_log(LOG_WARN, "segment /dev/shm%s: %u process records in no known state; freed",
		    name, bad);
	seg_reclaim(s, false);
	if (!any_live(s) && reset_unheld(s, name))
		return NULL;
	return impossible_counts(s, buf, len);
}

/* Settings of the configured compartments that no config can give are
 * replaced by the configured ones, live processes or not. */
static void
fix_settings(struct seg *s, const struct bs_config *cfg, const char *name)
{
	for (size_t i = 0; i < cfg->ncomp; i++) {
		struct seg_comp *c = &s->comp[s->cmap[i]];
		const char *what = bad_setting(c);

		if (what == NULL)
			continue;
		bs_log(LOG_WARN, "segment /dev/shm%s: compartment %s: %s out of range (limit %u, "
		    "max_wait_ms %u); using the configured values", name, c->name, what,
		    atomic_load(&c->limit), atomic_load(&c->max_wait_ms));
		seg_apply_limits(c, &cfg->comp[i]);
	}
}

int
seg_attach(const struct bs_config *cfg, struct seg **out, char *err, size_t errlen)
{
	char name[BS_NAME_MAX + 16], msg[BS_ERRLEN / 2];
	struct seg_header want;
	struct seg *s = NULL;
	struct stat st;
	const char *why;
	bool created = false, locked;
	int fd, r;

	*out = NULL;
	seg_name(cfg->segment, name, sizeof(name));
	/* glibc's shm_open adds O_NOFOLLOW: a symlink planted at the name
	 * fails with ELOOP instead of being followed. */
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, cfg->mode & 07777);
	if (fd >= 0) {
		created = true;
	} else if (errno == EEXIST) {
		fd = shm_open(name, O_RDWR, 0);
	}
	if (fd < 0) {
		r = -errno;
		open_failure(name, -r, err, errlen);
		return r;
	}
	/* The lock serialises creation and the upkeep below. A segment that
	 * is already set up can be attached without it when many processes
	 * start at once and the lock stays busy: then the upkeep is left to
	 * the processes that get the lock. */
	locked = lock_bounded(fd, LOCK_FAST_MS) == 0;
	if (!locked && (fstat(fd, &st) < 0 || st.st_size == 0)) {
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
	if (st.st_uid != geteuid() && st.st_uid != 0 &&
	    !(cfg->has_owner && st.st_uid == cfg->owner)) {
		r = -EPERM;
		bs_format(err, errlen, "segment /dev/shm%s belongs to uid %u, not to this user; not trusted",
		    name, (unsigned)st.st_uid);
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
	if (st.st_size == 0) {
		/* New, or left empty by a creator that died before sizing it:
		 * whoever holds the lock initialises it. */
		memset(&want, 0, sizeof(want));
		layout(&want, (uint32_t)cfg->ncomp, cfg->max_sockets, cfg->max_processes);
		if (ftruncate(fd, (off_t)want.total_size) < 0) {
			r = -errno;
			bs_format(err, errlen, "cannot size segment /dev/shm%s: %s", name, strerror(-r));
			goto fail;
		}
		r = map_fd(s, fd, want.total_size, true);
		if (r < 0) {
			bs_format(err, errlen, "cannot map segment /dev/shm%s: %s", name, strerror(-r));
			goto fail;
		}
		init_segment(s, cfg);
	} else {
		r = map_fd(s, fd, (size_t)st.st_size, true);
		if (r < 0) {
			bs_format(err, errlen, "cannot map segment /dev/shm%s: %s", name, strerror(-r));
			goto fail;
		}
		why = validate(s->base, s->size);
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
	if (map_compartments(s, cfg) != 0) {
		if (locked)
			seg_reclaim(s, false);
		if (!locked || any_live(s)) {
			r = -EEXIST;
			bs_format(err, errlen, "segment /dev/shm%s is in use with other compartments "
			    "(another configuration?)", name);
			goto fail;
		}
		/* Nobody holds anything: start over with this configuration.
		 * The object is unlinked, not rewritten, so that a process
		 * still mapping the old one never sees its layout change. */
		munmap(s->base, s->size);
		s->base = NULL;
		shm_unlink(name);
		flock(fd, LOCK_UN);
		close(fd);
		free(s->cmap);
		free(s);
		bs_log(LOG_INFO, "segment /dev/shm%s had other compartments and no holders; recreated", name);
		return seg_attach(cfg, out, err, errlen);
	}
	if (!created && locked) {
		fix_settings(s, cfg, name);
		/* Throttled: with many processes starting at once, one scan
		 * of the process table in 100 ms is enough. */
		seg_reclaim(s, true);
		if (!any_live(s)) {
			/* A segment left by an earlier run: this run's
			 * configuration is what the operator means now. */
			for (size_t i = 0; i < cfg->ncomp; i++)
				seg_apply_limits(&s->comp[s->cmap[i]], &cfg->comp[i]);
		}
	}
	r = alloc_local(s);
	if (r < 0) {
		bs_format(err, errlen, "out of memory");
		goto fail;
	}
	s->my_start = seg_pid_start(getpid());
	/* The mapping keeps the open file description alive, and the flock
	 * with it: closing alone would not unlock. */
	flock(fd, LOCK_UN);
	close(fd);
	*out = s;
	return 0;
fail:
	if (s != NULL) {
		if (s->base != NULL)
			munmap(s->base, s->size);
		free(s->cmap);
		free(s);
	}
	flock(fd, LOCK_UN);
	close(fd);
	return r;
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
	seg_name(segment, name, sizeof(name));
	fd = shm_open(name, writable ? O_RDWR : O_RDONLY, 0);
	if (fd < 0) {
		r = -errno;
		bs_format(err, errlen, "cannot open segment /dev/shm%s: %s", name, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		bs_format(err, errlen, "/dev/shm%s is not a regular shared-memory object", name);
		return -EINVAL;
	}
	s = seg_new(0);
	if (s == NULL) {
		close(fd);
		return -ENOMEM;
	}
	r = st.st_size > 0 ? map_fd(s, fd, (size_t)st.st_size, writable) : -EINVAL;
	close(fd);
	if (r < 0) {
		bs_format(err, errlen, "cannot map segment /dev/shm%s", name);
		free(s->cmap);
		free(s);
		return r;
	}
	why = validate(s->base, s->size);
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
	if (s->base != NULL)
		munmap(s->base, s->size);
	free(s->lcount);
	free(s->cmap);
	free(s);
}

struct seg_header *
seg_header(const struct seg *s)
{
	return s->h;
}

struct seg_comp *
seg_comp(const struct seg *s, uint32_t i)
{
	return i < s->h->ncomp ? &s->comp[i] : NULL;
}

struct seg_slot *
seg_slot(const struct seg *s, uint32_t i)
{
	return i < s->h->nslots ? &s->slots[i] : NULL;
}

struct seg_proc *
seg_proc(const struct seg *s, uint32_t i)
{
	return i < s->h->nprocs ? &s->procs[i] : NULL;
}

int
seg_comp_index(const struct seg *s, size_t cfg_index)
{
	return cfg_index < s->ncmap ? s->cmap[cfg_index] : -1;
}

uint32_t
seg_proc_held(const struct seg *s, uint32_t i)
{
	uint32_t n = 0;

	if (i >= s->h->nprocs)
		return 0;
	for (uint32_t w = 0; w < s->h->bitmap_words; w++)
		n += (uint32_t)__builtin_popcountll(atomic_load(&row(s, i)[w]));
	return n;
}

/* ---- holds: bitmap bits and the holders tally ---- */

/*
 * A hold is two writes: the bit in the holder's row and the slot's holders
 * count. A process killed between them would leave the two disagreeing
 * for good, so holders is a tally like the permit counts (permit.c): one
 * 64-bit compare-and-swap changes the count and a tag naming the record
 * and whether it added or dropped a hold; the bit is written after. Anyone
 * changing the count first makes the bit of the change the tag names right
 * ("helping"), and a dead process's record is made right the same way
 * before its holds are dropped.
 */
#define HTAG_DROP	(1u << 17)
#define HTAG_REC(t)	((t) & 0x1ffffu)
#define HTAG_GEN(t)	((t) >> 18)

_Static_assert(offsetof(struct seg_slot, holders) % 8 == 0, "tally alignment");
_Static_assert(BS_MAX_PROCESSES < HTAG_DROP, "record index fits a tag");

static _Atomic uint64_t *
holders_word(struct seg_slot *sl)
{
	return (_Atomic uint64_t *)(uintptr_t)&sl->holders;
}

static uint64_t
holders_tagged(const struct seg *s, uint32_t rec, bool drop, uint32_t count)
{
	uint32_t tag = (atomic_load(&s->procs[rec].gen) & 0x3fffu) << 18 |
	    (drop ? HTAG_DROP : 0) | (rec + 1);

	return (uint64_t)tag << 32 | count;
}

static bool
has_bit(const struct seg *s, uint32_t rec, uint32_t slot)
{
	return (atomic_load(&row(s, rec)[slot / 64]) >> (slot % 64)) & 1;
}

/* Makes the bit of the change that holders value w names right, if w is
 * still the slot's value and the record is still the one it named. */
static void
hold_help(struct seg *s, uint32_t slot, uint64_t w)
{
	uint32_t tag = (uint32_t)(w >> 32), rec = HTAG_REC(tag);
	uint64_t m = 1ULL << (slot % 64);

	if (rec == 0 || rec > s->h->nprocs)
		return;
	rec--;
	if ((atomic_load(&s->procs[rec].gen) & 0x3fffu) != HTAG_GEN(tag) ||
	    atomic_load(holders_word(&s->slots[slot])) != w)
		return;
	if (tag & HTAG_DROP)
		atomic_fetch_and(&row(s, rec)[slot / 64], ~m);
	else
		atomic_fetch_or(&row(s, rec)[slot / 64], m);
}

void
seg_hold_first(struct seg *s, int rec, uint32_t slot)
{
	atomic_store(holders_word(&s->slots[slot]), holders_tagged(s, (uint32_t)rec, false, 1));
	atomic_fetch_or(&row(s, (uint32_t)rec)[slot / 64], 1ULL << (slot % 64));
}

/* Adds a hold of record rec on slot if somebody still holds the slot (a
 * slot at 0 is being released). True if it did. */
static bool
hold_add(struct seg *s, uint32_t rec, uint32_t slot)
{
	_Atomic uint64_t *t = holders_word(&s->slots[slot]);
	uint64_t w = atomic_load(t);

	for (;;) {
		hold_help(s, slot, w);
		if ((uint32_t)w == 0)
			return false;
		if (atomic_compare_exchange_weak(t, &w, holders_tagged(s, rec, false, (uint32_t)w + 1)))
			break;
	}
	atomic_fetch_or(&row(s, rec)[slot / 64], 1ULL << (slot % 64));
	return true;
}

void
seg_drop_hold(struct seg *s, int rec, uint32_t slot, bool reclaimed)
{
	_Atomic uint64_t *t;
	uint64_t w;
	uint32_t cur;

	if (rec < 0 || (uint32_t)rec >= s->h->nprocs || slot >= s->h->nslots)
		return;
	t = holders_word(&s->slots[slot]);
	w = atomic_load(t);
	for (;;) {
		hold_help(s, slot, w);
		/* No bit: not held, or a drop that died half-way was just
		 * finished by the help above. */
		if (!has_bit(s, (uint32_t)rec, slot))
			return;
		cur = (uint32_t)w;
		if (atomic_compare_exchange_weak(t, &w,
		    holders_tagged(s, (uint32_t)rec, true, cur > 0 ? cur - 1 : 0)))
			break;
	}
	atomic_fetch_and(&row(s, (uint32_t)rec)[slot / 64], ~(1ULL << (slot % 64)));
	/* Only the drop that takes the count from 1 to 0 releases: a stray
	 * bit meeting a count already at 0 must not release twice. */
	if (cur == 1)
		seg_release_slot(s, slot, reclaimed);
}

/* Slots whose holders tally names record rec: their bits are made right
 * (a hold added or dropped by a process that died before its bit). */
static void
settle_holds(struct seg *s, uint32_t rec)
{
	uint32_t gen = atomic_load(&s->procs[rec].gen) & 0x3fffu;

	for (uint32_t i = 0; i < s->h->nslots; i++) {
		uint64_t w = atomic_load(holders_word(&s->slots[i]));
		uint32_t tag = (uint32_t)(w >> 32);

		if (HTAG_REC(tag) == rec + 1 && HTAG_GEN(tag) == gen)
			hold_help(s, i, w);
	}
}

/* Slots nobody holds any more whose last holder (record rec, process pid)
 * died before releasing them, or while claiming or releasing them: no row
 * has their bit, so they are found by their tags. */
static void
release_orphans(struct seg *s, uint32_t rec, pid_t pid)
{
	uint32_t gen = atomic_load(&s->procs[rec].gen) & 0x3fffu;

	for (uint32_t i = 0; i < s->h->nslots; i++) {
		struct seg_slot *sl = &s->slots[i];
		uint32_t tag;

		if (atomic_load_explicit(&sl->state, memory_order_relaxed) == SLOT_FREE ||
		    atomic_load(&sl->holders) != 0)
			continue;
		tag = atomic_load(&sl->holders_tag);
		if ((HTAG_REC(tag) == rec + 1 && HTAG_GEN(tag) == gen) ||
		    (pid > 0 && atomic_load(&sl->op_pid) == pid))
			seg_release_orphan(s, i);
	}
}

/* ---- process records ---- */

/* Drops every hold of record rec and frees the record. The caller owns rec
 * exclusively; `dead` says its process is dead (then whatever it left half
 * done is finished first), `reclaimed` that its permits count as reclaimed
 * (it died without exiting normally). */
static void
empty_record(struct seg *s, uint32_t rec, bool dead_proc, bool reclaimed)
{
	_Atomic uint64_t *r = row(s, rec);
	pid_t dead = dead_proc ? atomic_load(&s->procs[rec].pid) : 0;

	if (dead_proc)
		settle_holds(s, rec);
	for (uint32_t w = 0; w < s->h->bitmap_words; w++) {
		uint64_t bits = atomic_load(&r[w]);

		while (bits != 0) {
			uint32_t slot = w * 64 + (uint32_t)__builtin_ctzll(bits);

			bits &= bits - 1;
			/* What the dead process was doing to the slot when
			 * it died is finished first. */
			if (dead > 0)
				seg_resolve(s, slot, dead);
			seg_drop_hold(s, (int)rec, slot, reclaimed);
		}
	}
	if (dead_proc)
		release_orphans(s, rec, dead);
	atomic_store(&s->procs[rec].pid, 0);
	atomic_store(&s->procs[rec].start, 0);
	atomic_store(&s->procs[rec].owner, 0);
	atomic_store_explicit(&s->procs[rec].state, PROC_FREE, memory_order_release);
}

/* Claims a free process record in state `state` for owner; -ENOSPC if none. */
static int
alloc_record(struct seg *s, uint32_t state, pid_t owner)
{
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t i = 0; i < s->h->nprocs; i++) {
			uint32_t expected = PROC_FREE;

			if (atomic_load(&s->procs[i].state) != PROC_FREE)
				continue;
			/* A freed record has owner 0, so between this CAS
			 * and the owner store a reclaimer sees FORKING with
			 * owner 0 and knows to leave it alone. */
			if (atomic_compare_exchange_strong(&s->procs[i].state, &expected,
			    PROC_FORKING)) {
				atomic_fetch_add(&s->procs[i].gen, 1);
				atomic_store(&s->procs[i].owner, owner);
				atomic_store(&s->procs[i].pid, 0);
				atomic_store(&s->procs[i].since_ms, now_mono_ms());
				s->procs[i].uid = (uint32_t)geteuid();
				for (uint32_t w = 0; w < s->h->bitmap_words; w++)
					atomic_store(&row(s, i)[w], 0);
				if (state != PROC_FORKING)
					atomic_store(&s->procs[i].state, state);
				return (int)i;
			}
		}
		if (pass == 0 && seg_reclaim(s, false) == 0)
			break;
	}
	return -ENOSPC;
}

/* This process's record, claimed on first need. Two threads may race to
 * claim one; the loser gives its record back, so nobody waits. */
int
seg_my_record(struct seg *s)
{
	int r = atomic_load(&s->rec), mine, expected = -1;
	pid_t pid;

	if (r >= 0)
		return r;
	pid = s->my_pid;
	mine = alloc_record(s, PROC_FORKING, pid);
	if (mine < 0)
		return mine;
	atomic_store(&s->procs[mine].start, s->my_start);
	atomic_store(&s->procs[mine].pid, pid);
	atomic_store(&s->procs[mine].state, PROC_LIVE);
	if (!atomic_compare_exchange_strong(&s->rec, &expected, mine)) {
		empty_record(s, (uint32_t)mine, false, false);
		return expected;
	}
	return mine;
}

/*
 * While a fork is under way its child's record is FORKING with no pid yet.
 * If the parent dies then, a reclaimer must know whether a child exists
 * that will still claim the record. The parent takes an OFD read lock on
 * byte `rec` of the segment object before fork; the child inherits the
 * descriptor, so the lock lives until both have closed it: the parent right
 * after fork, the child once it has claimed the record (or at death).
 * Returns the descriptor, or -1 (then the record falls back on a grace
 * period, since_ms).
 */
static int
fork_lock(struct seg *s, uint32_t rec)
{
	char name[BS_NAME_MAX + 16];
	struct flock fl = { .l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = rec, .l_len = 1 };
	int fd;

	seg_name(s->h->name, name, sizeof(name));
	fd = shm_open(name, O_RDONLY, 0);
	if (fd < 0)
		return -1;
	if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* True if some process still has the fork lock of record rec. */
static bool
fork_lock_held(const struct seg *s, uint32_t rec)
{
	char name[BS_NAME_MAX + 16];
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = rec, .l_len = 1 };
	int fd, r;

	seg_name(s->h->name, name, sizeof(name));
	fd = shm_open(name, O_RDONLY, 0);
	if (fd < 0)
		return true;	/* cannot tell: leave it to the grace period */
	r = fcntl(fd, F_OFD_GETLK, &fl);
	close(fd);
	return r < 0 || fl.l_type != F_UNLCK;
}

/* A FORKING record whose parent died before it knew its child: true if a
 * child may still claim it (see fork_lock). */
static bool
forking_child(const struct seg *s, uint32_t rec)
{
	uint64_t since = atomic_load(&s->procs[rec].since_ms);

	if (since == 0)
		return fork_lock_held(s, rec);
	return now_mono_ms() - since < FORK_GRACE_MS;
}

int
seg_reclaim(struct seg *s, bool throttle)
{
	pid_t me = s->my_pid;
	int n = 0;

	if (throttle) {
		uint64_t now = now_mono_ms(), last = atomic_load(&s->h->last_reclaim_ms);

		if (now - last < RECLAIM_EVERY_MS && now >= last)
			return 0;
		if (!atomic_compare_exchange_strong(&s->h->last_reclaim_ms, &last, now))
			return 0;
	}
	for (uint32_t i = 0; i < s->h->nprocs; i++) {
		struct seg_proc *p = &s->procs[i];
		uint32_t st = atomic_load(&p->state), expected = st;
		pid_t pid = atomic_load(&p->pid), owner = atomic_load(&p->owner);
		uint64_t start = atomic_load(&p->start);

		switch (st) {
		case PROC_LIVE:
			if (pid == me || seg_pid_alive(pid, start))
				continue;
			break;
		case PROC_FORKING:
			/* Filled in by a parent around fork(): the child if
			 * it is known, else the parent, speaks for it; a
			 * parent that died right after fork leaves a child
			 * that claims the record within FORK_GRACE_MS. */
			if (owner == 0 || (pid != 0 ? seg_pid_alive(pid, start) :
			    (owner == me || seg_pid_alive(owner, 0) || forking_child(s, i))))
				continue;
			break;
		case PROC_EXITED:
			/* Exited normally: its holds go back once the kernel
			 * has closed its descriptors, never before. */
			if (seg_pid_alive(pid, start))
				continue;
			break;
		case PROC_RECLAIMING:
			if (owner == me || seg_pid_alive(owner, 0))
				continue;
			break;
		default:
			continue;
		}
		if (!atomic_compare_exchange_strong(&p->state, &expected, PROC_RECLAIMING))
			continue;
		/* Between the reads above and the CAS the record may have been
		 * freed and taken by a new process in the same state: then it
		 * is not the one found dead, and goes back untouched. */
		if (atomic_load(&p->pid) != pid || atomic_load(&p->start) != start) {
			atomic_store(&p->state, st);
			continue;
		}
		atomic_store(&p->owner, me);
		empty_record(s, i, true, st != PROC_EXITED);
		n++;
	}
	return n;
}

int
seg_find_inode(const struct seg *s, uint64_t ino)
{
	for (uint32_t i = 0; i < s->h->nslots; i++) {
		if (atomic_load(&s->slots[i].state) == SLOT_USED &&
		    atomic_load(&s->slots[i].inode) == ino)
			return (int)i;
	}
	return -1;
}

/* ---- fork, exec and exit ---- */

void
seg_gate_enter(struct seg *s)
{
	uint64_t deadline = 0;

	for (;;) {
		atomic_fetch_add(&s->busy, 1);
		if (atomic_load(&s->forking) == 0)
			return;
		atomic_fetch_sub(&s->busy, 1);
		/* A fork is taking its snapshot: a moment. Bounded, since a
		 * signal handler can call us while its own thread forks. */
		if (deadline == 0)
			deadline = now_mono_ms() + GATE_WAIT_MS;
		else if (now_mono_ms() >= deadline)
			break;
		sched_yield();
	}
	atomic_fetch_add(&s->busy, 1);
}

void
seg_gate_leave(struct seg *s)
{
	seg_dec_floor(&s->busy);
}

void
seg_gate_close(struct seg *s)
{
	uint64_t deadline = now_mono_ms() + GATE_WAIT_MS;

	atomic_fetch_add(&s->forking, 1);
	while (atomic_load(&s->busy) != 0 && now_mono_ms() < deadline)
		sched_yield();
	if (atomic_load(&s->busy) != 0)
		bs_log(LOG_WARN, "fork: another thread stayed %d ms in the middle of taking a "
		    "permit; the child's holds may miss it", GATE_WAIT_MS);
}

int
seg_fork_prepare(struct seg *s, int *lockfd)
{
	int rec = atomic_load(&s->rec), child;

	*lockfd = -1;
	if (rec < 0)
		return -1;
	child = alloc_record(s, PROC_FORKING, s->my_pid);
	if (child < 0) {
		bs_log(LOG_ERROR, "process table of segment %s is full: a child's "
		    "inherited sockets are not counted as held by it", s->h->name);
		return -1;
	}
	*lockfd = fork_lock(s, (uint32_t)child);
	if (*lockfd >= 0)
		atomic_store(&s->procs[child].since_ms, 0);	/* the lock speaks for it */
	/* The child holds every socket the parent holds now; the holds are
	 * taken before fork so the parent closing first cannot free them.
	 * The gate is closed, so no thread is between taking a slot and
	 * recording it; a slot released meanwhile (holders at 0) is not
	 * held again. */
	for (uint32_t w = 0; w < s->h->bitmap_words; w++) {
		uint64_t b = atomic_load(&row(s, (uint32_t)rec)[w]);

		while (b != 0) {
			uint32_t slot = w * 64 + (uint32_t)__builtin_ctzll(b);

			b &= b - 1;
			hold_add(s, (uint32_t)child, slot);
		}
	}
	return child;
}

static void
fork_unlock(int lockfd)
{
	int saved = errno;

	if (lockfd >= 0)
		close(lockfd);
	errno = saved;
}

bool
seg_fork_child(struct seg *s, int rec, int lockfd)
{
	pid_t me = (pid_t)syscall(SYS_getpid);
	uint32_t expected = PROC_FORKING;
	int32_t zero = 0;
	bool claimed;

	/* The other threads did not come along: nobody is in the gate. */
	atomic_store(&s->busy, 0);
	atomic_store(&s->forking, 0);
	s->my_pid = me;
	s->my_start = seg_pid_start(me);
	if (rec < 0) {
		atomic_store(&s->rec, -1);
		return true;
	}
	atomic_store(&s->procs[rec].start, s->my_start);
	atomic_compare_exchange_strong(&s->procs[rec].pid, &zero, me);
	claimed = atomic_compare_exchange_strong(&s->procs[rec].state, &expected, PROC_LIVE);
	fork_unlock(lockfd);
	if (claimed) {
		atomic_store(&s->rec, rec);
		return true;
	}
	/* Reclaimed: the parent died and the grace ran out. What this
	 * process inherited is adopted again by the caller. */
	atomic_store(&s->rec, -1);
	for (uint32_t i = 0; i < s->h->nslots; i++)
		atomic_store(&s->lcount[i], 0);
	return false;
}

void
seg_fork_parent(struct seg *s, int rec, pid_t pid, int lockfd)
{
	int32_t zero = 0;

	seg_dec_floor(&s->forking);
	fork_unlock(lockfd);
	if (rec < 0)
		return;
	if (pid < 0) {
		empty_record(s, (uint32_t)rec, false, false);
		return;
	}
	atomic_compare_exchange_strong(&s->procs[rec].pid, &zero, pid);
}

static bool
any_slot_used(const struct seg *s)
{
	for (uint32_t i = 0; i < s->h->nslots; i++) {
		if (atomic_load_explicit(&s->slots[i].state, memory_order_relaxed) != SLOT_FREE)
			return true;
	}
	return false;
}

void
seg_adopt(struct seg *s, void (*cb)(int fd, uint32_t slot))
{
	pid_t me = (pid_t)syscall(SYS_getpid);
	int rec = -1;
	DIR *d;
	struct dirent *e;

	/* The record of the image this process was before exec. */
	for (uint32_t i = 0; i < s->h->nprocs; i++) {
		struct seg_proc *p = &s->procs[i];

		if (atomic_load(&p->state) != PROC_LIVE || atomic_load(&p->pid) != me)
			continue;
		if (atomic_load(&p->start) == s->my_start && rec < 0) {
			rec = (int)i;
		} else {
			uint32_t expected = PROC_LIVE;

			/* A dead process whose PID we now have. */
			if (atomic_compare_exchange_strong(&p->state, &expected, PROC_RECLAIMING))
				empty_record(s, i, true, true);
		}
	}
	/* The threads of the old image are gone: what they left half done
	 * on any slot is finished now. */
	for (uint32_t i = 0; i < s->h->nslots; i++) {
		if (atomic_load_explicit(&s->slots[i].state, memory_order_relaxed) == SLOT_FREE ||
		    atomic_load_explicit(&s->slots[i].op_pid, memory_order_relaxed) != me)
			continue;
		seg_resolve(s, i, me);
		seg_release_orphan(s, i);
	}
	if (rec >= 0)
		atomic_store(&s->rec, rec);
	else if (!any_slot_used(s))
		return;		/* nothing anyone holds can have been inherited */
	d = opendir("/proc/self/fd");
	if (d != NULL) {
		while ((e = readdir(d)) != NULL) {
			struct stat st;
			int fd = atoi(e->d_name), slot;

			if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d))
				continue;
			if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
				continue;
			slot = seg_find_inode(s, (uint64_t)st.st_ino);
			if (slot < 0)
				continue;
			if (rec < 0 || !(atomic_load(&row(s, (uint32_t)rec)[slot / 64]) &
			    (1ULL << (slot % 64)))) {
				/* Inherited from another process (posix_spawn,
				 * or a fork the shim did not see): hold it too,
				 * unless its permit was freed meanwhile. */
				struct seg_slot *sl = &s->slots[slot];

				if (rec < 0 && (rec = seg_my_record(s)) < 0)
					break;
				if (!hold_add(s, (uint32_t)rec, (uint32_t)slot))
					continue;
				if (atomic_load(&sl->inode) != (uint64_t)st.st_ino) {
					seg_drop_hold(s, rec, (uint32_t)slot, false);
					continue;
				}
			}
			atomic_fetch_add(&s->lcount[slot], 1);
			cb(fd, (uint32_t)slot);
		}
		closedir(d);
	}
	if (rec < 0)
		return;
	/* Sockets the old image held whose descriptors did not survive exec
	 * (close-on-exec) are no longer held by this process. */
	for (uint32_t slot = 0; slot < s->h->nslots; slot++) {
		if (atomic_load(&s->lcount[slot]) == 0)
			seg_drop_hold(s, rec, slot, false);
	}
}

void
seg_detach_all(struct seg *s)
{
	int rec = atomic_exchange(&s->rec, -1);
	uint32_t expected = PROC_LIVE;

	if (rec < 0)
		return;
	for (uint32_t i = 0; i < s->h->nslots; i++)
		atomic_store(&s->lcount[i], 0);
	if (atomic_compare_exchange_strong(&s->procs[rec].state, &expected, PROC_RECLAIMING))
		empty_record(s, (uint32_t)rec, false, false);
}

void
seg_exit(struct seg *s)
{
	int rec = atomic_load(&s->rec);
	uint32_t expected = PROC_LIVE;

	if (rec < 0)
		return;
	if (seg_proc_held(s, (uint32_t)rec) == 0) {
		seg_detach_all(s);
		return;
	}
	/* The record stays this process's until it is dead, so that a
	 * destructor closing a counted socket after this still gives its
	 * permit back through the usual path. */
	if (atomic_compare_exchange_strong(&s->procs[rec].state, &expected, PROC_EXITED))
		atomic_store(&s->h->last_reclaim_ms, 0);
}
