/* kjoint.c - one count per compartment with a kernel engine: the library's permits in the engine's map. */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/bpf.h>

#include "admit/repair.h"
#include "admit/tally.h"
#include "log.h"
#include "sys.h"
#include "../../kernel/kern.h"

/*
 * A compartment that a kernel engine (kernel/) counts too has one count
 * for both: the joint count of its entry in the engine's compartment map,
 * a BPF array that user space can map (kern.h). The engine's program takes
 * a permit of it for every connect in its cgroup; the library takes one of
 * it (P_KERN) after the compartment's own permit, for every connection it
 * admits, under the compartment's limit, and gives it back with the
 * others; one that observe mode lets past the limit takes one too, past
 * it (kjoint_take_over), so that the joint count holds every connection
 * of the library's in the compartment and the engine's peak (the most of
 * the joint count and the program's own sockets let past, noted by both
 * sides at each admission) is what both held at once. The joint count is a tally: its tag names the library's last
 * operation, and the program changes only the count beside it, so the
 * library's protocol (tally.c) holds as if the program's sockets were
 * there from the start. Neither side is ever above the limit the other
 * sees.
 *
 * `bulkshim attach` writes the map's id into each covered compartment's
 * `kernel` word in the segment (kjoint_adopt); admission reads that word
 * after its own take and maps the map on first need, in any process, with
 * system calls only (a connect may run in a signal handler). A process
 * that cannot map it refuses the compartment's connects rather than count
 * apart (it says so once): the limit would otherwise be split in two.
 *
 * A preloaded process inside the engine's cgroup would be counted twice,
 * once here and once by the program: before its connect, the library
 * writes KSOCK_LIB into the socket's storage in the engine's socket map
 * (kjoint_mark), and the program lets such a socket through uncounted.
 */

_Static_assert(offsetof(struct kern_comp, joint) % 8 == 0, "joint tally alignment");
_Static_assert(offsetof(struct kern_comp, joint_tag) == offsetof(struct kern_comp, joint) + 4,
    "joint tally tag");

#define KJ_ROOT		"/sys/fs/bpf/bulkshim/"
#define KJ_MAP_BYTES	(sizeof(struct kern_comp) * KERN_MAX_COMPS)
#define KJ_WAIT_SPINS	20000	/* yields while another thread maps the map */

static long
bpf_call(int cmd, union bpf_attr *a)
{
	return sys_call(__NR_bpf, cmd, (long)(uintptr_t)a, (long)sizeof(*a), 0, 0, 0);
}

/* KJ_ROOT<segment>/<file> into out, the segment's dots as '+' (bpffs
 * refuses dots; kern_pin_path). The name is the one this process attached
 * by (never the header's, which any writer of the segment may change);
 * anything outside the characters a config allows fails. */
static bool
pin_path(const struct seg *s, const char *file, char *out, size_t len)
{
	const char *name = s->kern.segment;
	size_t n = 0, i;

	for (i = 0; KJ_ROOT[i] != '\0' && n + 1 < len; i++)
		out[n++] = KJ_ROOT[i];
	for (i = 0; i < BS_NAME_MAX && name[i] != '\0'; i++) {
		char ch = name[i];

		if (!bs_name_char(ch) || n + 1 >= len)
			return false;
		out[n++] = ch == '.' ? '+' : ch;
	}
	if (i == 0 || i == BS_NAME_MAX)
		return false;
	if (n + 1 >= len)
		return false;
	out[n++] = '/';
	for (i = 0; file[i] != '\0'; i++) {
		if (n + 1 >= len)
			return false;
		out[n++] = file[i];
	}
	out[n] = '\0';
	return true;
}

static int
obj_get(const char *path)
{
	union bpf_attr a;

	memset(&a, 0, sizeof(a));
	a.pathname = (uint64_t)(uintptr_t)path;
	return (int)bpf_call(BPF_OBJ_GET, &a);
}

/* The id of the map open as fd, if it is a compartment map of this
 * build's layout; 0 otherwise. */
static uint32_t
map_id(int fd)
{
	struct bpf_map_info info;
	union bpf_attr a;

	memset(&info, 0, sizeof(info));
	memset(&a, 0, sizeof(a));
	a.info.bpf_fd = (uint32_t)fd;
	a.info.info_len = sizeof(info);
	a.info.info = (uint64_t)(uintptr_t)&info;
	if (bpf_call(BPF_OBJ_GET_INFO_BY_FD, &a) < 0)
		return 0;
	if (info.type != BPF_MAP_TYPE_ARRAY || info.value_size != sizeof(struct kern_comp) ||
	    info.max_entries != KERN_MAX_COMPS || !(info.map_flags & BPF_F_MMAPABLE))
		return 0;
	return info.id;
}

/* The entry named like c in map m, or NULL. */
static struct kern_comp *
find_entry(struct kern_comp *m, const struct seg_comp *c)
{
	for (size_t i = 0; i < KERN_MAX_COMPS && m[i].name[0] != '\0'; i++) {
		if (strncmp(m[i].name, c->name, KERN_NAME_MAX < BS_NAME_MAX ? KERN_NAME_MAX :
		    BS_NAME_MAX) == 0)
			return &m[i];
	}
	return NULL;
}

/* Says once per process that the joint count of a compartment cannot be
 * reached, and what that costs. */
static void
warn_once(const struct seg *s, const struct seg_comp *c, const char *why, int e)
{
	char name[BS_NAME_MAX];

	if (atomic_exchange((_Atomic uint32_t *)(uintptr_t)&s->kern.warned, 1) != 0)
		return;
	log_name(name, sizeof(name), c->name, sizeof(c->name));
	bs_log(LOG_ERROR, "compartment %s is counted with a kernel engine, whose map this process "
	    "cannot %s (errno %d%s): its connects are refused, so that the limit is not split "
	    "in two (the map's mode follows the segment's owner, group and mode; Linux before "
	    "6.5 needs CAP_BPF while kernel.unprivileged_bpf_disabled is set)", name, why, e,
	    e > 0 ? "" : ": not the engine the segment names");
}

/* Points every compartment of the segment that map m (of id `id`) counts
 * at its joint count there. */
static void
point(const struct seg *s, struct kern_comp *m, uint32_t id)
{
	struct seg_kern *k = (struct seg_kern *)(uintptr_t)&s->kern;

	for (uint32_t i = 0; i < s->ncomp && i < BS_MAX_COMPARTMENTS; i++) {
		struct kern_comp *ent = atomic_load(&s->comp[i].kernel) == id ?
		    find_entry(m, &s->comp[i]) : NULL;

		atomic_store(&k->joint[i], ent != NULL ? (uintptr_t)&ent->joint : 0);
	}
}

/* Maps the compartment map whose id is `id` and points every compartment
 * it covers at its joint count. Runs with system calls only; when another
 * thread of the process is at it, waits for it (boundedly: a signal
 * handler may have interrupted that thread). */
static bool
map_engine(const struct seg *s, const struct seg_comp *c, uint32_t id)
{
	struct seg_kern *k = (struct seg_kern *)(uintptr_t)&s->kern;
	char path[sizeof(KJ_ROOT) + BS_NAME_MAX + 16];
	uint32_t free_ = 0;
	void *p;
	int fd, e = 0;
	bool ok = false;

	for (int i = 0; !atomic_compare_exchange_weak(&k->busy, &free_, 1); i++) {
		free_ = 0;
		if (i >= KJ_WAIT_SPINS)
			return false;
		sched_yield();
	}
	if (atomic_load(&k->id) == id && k->map != NULL) {
		/* Mapped already: an entry the map gained since (a reload). */
		point(s, k->map, id);
		ok = true;
		goto done;
	}
	if (!pin_path(s, "comps", path, sizeof(path))) {
		warn_once(s, c, "find", EINVAL);
		goto done;
	}
	fd = obj_get(path);
	if (fd < 0) {
		warn_once(s, c, "open", errno);
		goto done;
	}
	if (map_id(fd) != id) {
		sys_close(fd);
		warn_once(s, c, "use", 0);
		goto done;
	}
	p = mmap(NULL, KJ_MAP_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	e = errno;
	sys_close(fd);
	if (p == MAP_FAILED) {
		warn_once(s, c, "map", e);
		goto done;
	}
	/* A map replaced by a later engine stays mapped: another thread may
	 * still be reading a count in it. */
	point(s, p, id);
	k->map = p;
	atomic_store(&k->id, id);
	ok = true;
done:
	atomic_store(&k->busy, 0);
	return ok;
}

_Atomic uint32_t *
kjoint_map(const struct seg *s, const struct seg_comp *c, uint32_t id)
{
	uint32_t i = (uint32_t)(c - s->comp);
	uintptr_t j;

	if (i >= BS_MAX_COMPARTMENTS || !map_engine(s, c, id))
		return NULL;
	if ((j = atomic_load(&s->kern.joint[i])) == 0)
		warn_once(s, c, "find it in", ENOENT);
	return (_Atomic uint32_t *)j;
}

/* The engine's entry whose joint count is j. */
static struct kern_comp *
entry_of(_Atomic uint32_t *j)
{
	return (struct kern_comp *)((uintptr_t)j - offsetof(struct kern_comp, joint));
}

/* Raises the engine's peak (the joint count's) to v. */
static void
raise_peak(struct kern_comp *e, uint32_t v)
{
	uint32_t p = __atomic_load_n(&e->peak, __ATOMIC_RELAXED);

	while (v > p && !__atomic_compare_exchange_n(&e->peak, &p, v, true, __ATOMIC_RELAXED,
	    __ATOMIC_RELAXED))
		;
}

/* Raises the engine's peak to what both engines hold now: the joint count
 * (every connection of the library's in the compartment, those observe
 * mode let past included, and the program's permits) and the program's
 * sockets let past a full limit. */
static void
note_both(struct kern_comp *e)
{
	raise_peak(e, __atomic_load_n(&e->joint, __ATOMIC_RELAXED) +
	    __atomic_load_n(&e->over, __ATOMIC_RELAXED));
}

enum take
kjoint_take(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, uint32_t *seen)
{
	_Atomic uint32_t *j = kjoint_of(s, c);
	enum take r;

	if (j == NULL) {
		/* Counted with an engine this process cannot reach: refused
		 * rather than counted apart (warn_once said why). */
		*seen = atomic_load(&c->limit);
		return TAKE_FULL;
	}
	r = tally_take(s, c, slot, gen, P_KERN, 0, seen);
	if (r == TAKE_OK)
		raise_peak(entry_of(j), *seen + 1 + __atomic_load_n(&entry_of(j)->over,
		    __ATOMIC_RELAXED));
	else if (r == TAKE_BUSY && tally_held(s, c, slot, gen, P_KERN))
		r = TAKE_OK;	/* `attach` counted the slot first (kjoint_adopt) */
	return r;
}

void
kjoint_take_over(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen)
{
	_Atomic uint32_t *j = kjoint_of(s, c);

	/* Past the limit: the connection is open already. A slot that holds
	 * the permit still (kern_step took it before a later refusal) keeps
	 * it. */
	if (j == NULL)
		return;
	tally_take_past(s, c, slot, gen, P_KERN);
	note_both(entry_of(j));
}

void
kjoint_mark(const struct seg *s, const struct seg_comp *c, int fd)
{
	char path[sizeof(KJ_ROOT) + BS_NAME_MAX + 16];
	_Atomic uint32_t *j = kjoint_of(s, c);
	struct kern_sock v = { 0, KSOCK_LIB };
	union bpf_attr a;
	int mfd, e = errno;

	if (j == NULL || s->kern.map == NULL || !pin_path(s, "socks", path, sizeof(path)))
		return;
	v.comp = (uint32_t)(entry_of(j) - (struct kern_comp *)s->kern.map);
	if (v.comp >= KERN_MAX_COMPS)
		v.comp = 0;
	mfd = obj_get(path);
	if (mfd >= 0) {
		memset(&a, 0, sizeof(a));
		a.map_fd = (uint32_t)mfd;
		a.key = (uint64_t)(uintptr_t)&fd;
		a.value = (uint64_t)(uintptr_t)&v;
		a.flags = BPF_ANY;
		/* Failing, a process in the engine's cgroup is counted twice:
		 * more permits held than connections, never fewer. */
		bpf_call(BPF_MAP_UPDATE_ELEM, &a);
		sys_close(mfd);
	}
	errno = e;
}

/* Clears MARK_HELD(P_KERN) in slot sl: what a map no longer counted said. */
static void
forget_stale(struct seg_slot *sl)
{
	uint64_t m = atomic_load(&sl->mark);

	while ((m & MARK_HELD(P_KERN)) &&
	    !atomic_compare_exchange_weak(&sl->mark, &m, m & ~MARK_HELD(P_KERN)))
		;
}

uint32_t
kjoint_adopt(struct seg *s, struct kern_comp *map, uint32_t id)
{
	uint32_t counted = 0;

	for (uint32_t i = 0; i < s->ncomp; i++) {
		struct seg_comp *c = &s->comp[i];
		uint32_t was = atomic_load(&c->kernel);

		if (find_entry(map, c) == NULL) {
			atomic_store(&c->kernel, 0);
			continue;
		}
		/* Whoever sets the word counts the compartment's connections
		 * in: `attach` and a process attaching to the segment may
		 * both be at it. */
		if (was == id || !atomic_compare_exchange_strong(&c->kernel, &was, id))
			continue;
		/* Connections the library admitted before the word was set go
		 * into the joint count, past the limit if need be (they are
		 * open): an admission from now on takes its own (kjoint_take),
		 * and one that read the word before it was set took its
		 * connection permit before, so this pass sees it. */
		for (uint32_t j = 0; j < s->nslots; j++) {
			struct seg_slot *sl = &s->slots[j];
			uint32_t gen = MARK_GEN(atomic_load(&sl->mark)), st = atomic_load(&sl->state);

			if (atomic_load(&sl->comp) != i || !(SLOT_HELD(st) || st == SLOT_KERNEL) ||
			    !(tally_held(s, c, j, gen, P_CONN) || tally_held(s, c, j, gen, P_OVER)))
				continue;
			if (tally_take_past(s, c, j, gen, P_KERN) == TAKE_OK)
				counted++;
		}
		note_both(find_entry(map, c));
	}
	return counted;
}

/*
 * Nobody holds a process record and no slot is held for processes the
 * tables cannot name (SLOT_KERNEL: a child made without fork() that has a
 * socket its dead parent counted), so the library holds nothing of e's
 * joint count: it goes down to the program's own part (e->in_use), its tag
 * cleared. The two are read together only while no take or give of the
 * program is under way (begun == done before, begun unchanged after), and
 * a process that claimed a record meanwhile (it may take) leaves it as it
 * is. A program's take that starts after the reading finds the count
 * changed by the swap, or changes it first and fails the swap.
 */
static void
reset_joint(struct seg *s, struct kern_comp *e)
{
	_Atomic uint64_t *t = (_Atomic uint64_t *)(uintptr_t)&e->joint;

	for (int i = 0; i < KJ_WAIT_SPINS; i++) {
		uint32_t b = __atomic_load_n(&e->begun, __ATOMIC_SEQ_CST), own, cur;
		uint64_t w;

		if (__atomic_load_n(&e->done, __ATOMIC_SEQ_CST) != b) {
			sched_yield();
			continue;
		}
		w = atomic_load(t);
		own = __atomic_load_n(&e->in_use, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&e->begun, __ATOMIC_SEQ_CST) != b)
			continue;
		if (repair_in_use(s) || repair_kernel_held(s))
			return;
		cur = (uint32_t)w;
		if (cur <= own && (w >> 32) == 0)
			return;
		if (cur < own)
			own = cur;
		if (atomic_compare_exchange_strong(t, &w, (uint64_t)own)) {
			if (cur != own) {
				char name[BS_NAME_MAX];

				log_name(name, sizeof(name), e->name, sizeof(e->name));
				bs_log(LOG_WARN, "compartment %s: the count shared with the kernel "
				    "engine was %u with no process holding anything here; put back to "
				    "the engine's own %u", name, cur, own);
			}
			return;
		}
	}
}

void
kjoint_probe(struct seg *s, bool reset)
{
	char path[sizeof(KJ_ROOT) + BS_NAME_MAX + 16];
	uint32_t id;
	void *p;
	int fd, e;

	if (!pin_path(s, "comps", path, sizeof(path)))
		return;
	fd = obj_get(path);
	if (fd < 0) {
		e = errno;
		if (e == ENOENT) {
			/* No engine: a word that names one is left over or damaged. */
			for (uint32_t i = 0; i < s->ncomp; i++) {
				if (atomic_load(&s->comp[i].kernel) != 0) {
					kjoint_forget(s);
					break;
				}
			}
		} else {
			bs_log(LOG_WARN, "cannot look for a kernel engine of segment %s (%s: errno "
			    "%d): if one counts its compartments, `bulkshim attach` or `reload` must "
			    "run again for them to be counted as one", s->kern.segment, path, e);
		}
		return;
	}
	id = map_id(fd);
	p = id != 0 ? mmap(NULL, KJ_MAP_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) :
	    MAP_FAILED;
	sys_close(fd);
	if (p == MAP_FAILED)
		return;
	for (uint32_t i = 0; reset && i < s->ncomp; i++) {
		struct kern_comp *ent = find_entry(p, &s->comp[i]);

		if (ent != NULL)
			reset_joint(s, ent);
	}
	kjoint_adopt(s, p, id);
	munmap(p, KJ_MAP_BYTES);
}

void
kjoint_forget(struct seg *s)
{
	for (uint32_t i = 0; i < s->ncomp; i++)
		atomic_store(&s->comp[i].kernel, 0);
	/* Nobody moves a joint count of the unloaded map any more: what
	 * the marks say of it is stale, and would keep a later engine's
	 * permit from being counted (kjoint_adopt). */
	for (uint32_t j = 0; j < s->nslots; j++)
		forget_stale(&s->slots[j]);
}

void
kjoint_unmap(struct seg *s)
{
	if (s->kern.map != NULL)
		munmap(s->kern.map, KJ_MAP_BYTES);
	s->kern.map = NULL;
	atomic_store(&s->kern.id, 0);
}
