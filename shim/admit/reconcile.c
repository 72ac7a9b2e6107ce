/* reconcile.c - permits follow the kernel: holds of sockets that are gone go back. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admit/slot.h"
#include "log.h"
#include "sys.h"

/*
 * The wrappers see every close a program makes through libc, but not all of
 * them: a raw system call instruction, an io_uring close, a library that
 * binds past the preload, a child that execs a program without the shim and
 * closes the socket there. A hold whose socket is gone would keep its
 * compartment full for the life of the holder. So, when a connect finds its
 * compartment, pool or class full (before it is refused or waits, at most
 * every RECONCILE_EVERY_MS per process) and whenever the CLI reads the
 * segment, each hold is checked against the kernel:
 *
 *  - this process's own holds by fstat() of the descriptors it recorded: a
 *    descriptor that is closed or now refers to something else is forgotten
 *    (its entry taken with a compare-and-swap, so a wrapper changing it at
 *    the same moment wins);
 *  - another live process's holds through /proc/PID/fd: a hold is dropped
 *    only if two scans of that directory, one after the other, both lack the
 *    socket's inode, and the kernel's socket tables (sock_diag) do not list
 *    that inode as still having a file. A directory read can miss a
 *    descriptor that the process moves meanwhile (dup2 to a lower number,
 *    then close), twice; sock_diag cannot, for every socket in its tables
 *    (a TCP socket with a file reports its inode, one whose last file is
 *    closed reports 0; a Unix socket is listed while it exists). A socket
 *    open anywhere keeps its hold; a directory that cannot be read (another
 *    user, hidepid) or a sock_diag that fails keeps every hold: doubt never
 *    releases.
 *
 * This process's descriptors are the host's (struct seg_host: the
 * preloaded library's descriptor table), so that admission never reaches
 * into the wrappers' state and the CLI links none of it.
 *
 * Dead processes are proc_reclaim's business and are left alone here. The
 * permits a dropped hold frees (its last holder gone) count in the
 * compartment's `reconciled`.
 *
 * A slot that no process the tables know holds any more but whose socket
 * some process they cannot name may still have (SLOT_KERNEL, slot.c) is
 * given back here too, once sock_diag no longer lists its socket with a
 * file: no descriptor of it is left anywhere. A socket that is not
 * connected (a connect that failed) is not listed either, and holds no
 * connection to keep a permit for.
 */

#define RECONCILE_EVERY_MS	100
#define BATCH			256	/* holds of one process checked per scan */

static _Atomic uint64_t last_run_ms;

/* The slot's socket inode if it holds a permit of compartment comp (any
 * compartment if comp < 0), else 0. */
static uint64_t
counted_inode(const struct seg *s, uint32_t slot, int comp)
{
	struct seg_slot *sl = seg_slot(s, slot);

	if (sl == NULL || !SLOT_HELD(atomic_load(&sl->state)) || !slot_admitted(s, slot))
		return 0;
	if (comp >= 0 && atomic_load(&sl->comp) != (uint32_t)comp)
		return 0;
	return atomic_load(&sl->inode);
}

/* Counts a permit given back because its socket was gone. */
static void
count_reconciled(struct seg_comp *c, bool released)
{
	if (released && c != NULL)
		atomic_fetch_add(&c->reconciled, 1);
}

/* This process's descriptors: those recorded whose socket is no longer
 * behind the number are forgotten. Returns the permits given back. */
static int
reconcile_own(struct seg *s, const struct seg_host *host)
{
	int rec = atomic_load(&s->rec), high, n = 0;

	if (rec < 0 || host == NULL)
		return 0;
	high = host->fd_high();
	for (int fd = 0; fd < high; fd++) {
		uint32_t e = host->fd_slot(fd), slot;
		struct seg_slot *sl;
		struct seg_comp *c;
		struct stat st;
		bool released = false;

		if (e == 0)
			continue;
		slot = e - 1;
		sl = seg_slot(s, slot);
		if (sl == NULL)
			continue;
		if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
		    (uint64_t)st.st_ino == atomic_load(&sl->inode))
			continue;
		if (!host->fd_forget(fd, e))
			continue;	/* a wrapper changed it meanwhile */
		c = seg_slot_comp(s, sl);
		if (seg_dec_floor(&s->lcount[slot]) == 0)
			released = slot_drop_hold(s, rec, slot, false);
		count_reconciled(c, released);
		n += released;
	}
	return n;
}

/* Marks in found[] the inodes of ino[] that process pid has a descriptor
 * of. Reads the directory with getdents64 into a buffer on the stack: this
 * runs inside connect(), which a signal handler may call, so no malloc.
 * Returns 0, or -errno if /proc/PID/fd cannot be read. */
static int
scan_fds(pid_t pid, const uint64_t *ino, bool *found, size_t n)
{
	char path[64], link[64];
	char buf[4096] __attribute__((aligned(8)));
	ssize_t got;
	int dfd, err = 0;

	bs_format(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	while ((got = getdents64(dfd, buf, sizeof(buf))) > 0) {
		for (ssize_t off = 0; off < got;) {
			struct dirent64 *de = (struct dirent64 *)(void *)(buf + off);
			uint64_t v = 0;
			ssize_t len;

			off += de->d_reclen;
			if (de->d_name[0] < '0' || de->d_name[0] > '9')
				continue;
			len = readlinkat(dfd, de->d_name, link, sizeof(link) - 1);
			if (len <= 8)
				continue;
			link[len] = '\0';
			if (strncmp(link, "socket:[", 8) != 0)
				continue;
			for (const char *p = link + 8; *p >= '0' && *p <= '9'; p++)
				v = v * 10 + (uint64_t)(*p - '0');
			for (size_t i = 0; i < n; i++) {
				if (ino[i] == v)
					found[i] = true;
			}
		}
	}
	if (got < 0)
		err = -errno;
	sys_close(dfd);
	return err;
}

/* Sends one sock_diag dump request and marks in alive[] the inodes of
 * ino[] that its answers list with a file. Returns 0 or -errno. */
static int
diag_dump(int nl, const void *req, size_t len, const uint64_t *ino, bool *alive, size_t n)
{
	char buf[16384] __attribute__((aligned(8)));
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	bool unix_family = ((const struct unix_diag_req *)(const void *)
	    ((const char *)req + sizeof(struct nlmsghdr)))->sdiag_family == AF_UNIX;

	if (sys_sendto(nl, req, len, 0, &sa, sizeof(sa)) < 0)
		return -errno;
	for (;;) {
		ssize_t got = sys_recv(nl, buf, sizeof(buf), 0);
		struct nlmsghdr *h = (struct nlmsghdr *)(void *)buf;
		int left = (int)got;

		if (got < 0)
			return errno == EINTR ? -EAGAIN : -errno;
		/* NLMSG_OK, with the comparison of signs spelled out. */
		for (; left >= (int)sizeof(*h) && h->nlmsg_len >= sizeof(*h) &&
		    h->nlmsg_len <= (unsigned)left; h = NLMSG_NEXT(h, left)) {
			uint64_t v;

			if (h->nlmsg_type == NLMSG_DONE)
				return 0;
			if (h->nlmsg_type == NLMSG_ERROR)
				return -EIO;
			if (unix_family)
				v = ((struct unix_diag_msg *)NLMSG_DATA(h))->udiag_ino;
			else
				v = ((struct inet_diag_msg *)NLMSG_DATA(h))->idiag_inode;
			for (size_t i = 0; v != 0 && i < n; i++) {
				if (ino[i] == v)
					alive[i] = true;
			}
		}
	}
}

/* Marks in alive[] the inodes of ino[] that some file still refers to,
 * by the kernel's TCP (IPv4, IPv6) and Unix socket tables. Returns 0, or
 * -errno if it cannot tell (then nothing may be released). */
static int
diag_alive(const uint64_t *ino, bool *alive, size_t n)
{
	struct {
		struct nlmsghdr h;
		struct inet_diag_req_v2 r;
	} inet = {
		.h = { .nlmsg_len = sizeof(inet), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
		       .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP },
		.r = { .sdiag_protocol = IPPROTO_TCP, .idiag_states = ~0u },
	};
	struct {
		struct nlmsghdr h;
		struct unix_diag_req r;
	} unx = {
		.h = { .nlmsg_len = sizeof(unx), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
		       .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP },
		.r = { .sdiag_family = AF_UNIX, .udiag_states = ~0u },
	};
	int nl = sys_socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG), r;

	if (nl < 0)
		return -errno;
	inet.r.sdiag_family = AF_INET;
	inet.h.nlmsg_seq = 1;
	r = diag_dump(nl, &inet, sizeof(inet), ino, alive, n);
	if (r == 0) {
		inet.r.sdiag_family = AF_INET6;
		inet.h.nlmsg_seq = 2;
		r = diag_dump(nl, &inet, sizeof(inet), ino, alive, n);
	}
	if (r == 0) {
		unx.h.nlmsg_seq = 3;
		r = diag_dump(nl, &unx, sizeof(unx), ino, alive, n);
	}
	sys_close(nl);
	return r;
}

/* True if record rec still belongs to the process (pid, start) found in it. */
static bool
same_process(const struct seg *s, uint32_t rec, pid_t pid, uint64_t start)
{
	struct seg_proc *p = seg_proc(s, rec);

	return atomic_load(&p->state) == PROC_LIVE && atomic_load(&p->pid) == pid &&
	    atomic_load(&p->start) == start;
}

/* One batch of record rec's holds (slot[], ino[]): those whose socket the
 * process no longer has are dropped. Returns the permits given back. */
static int
check_batch(struct seg *s, uint32_t rec, pid_t pid, uint64_t start, const uint32_t *slot,
    const uint64_t *ino, size_t n)
{
	bool found[BATCH], again[BATCH];
	size_t missing = 0;
	int released = 0;

	memset(found, 0, sizeof(found));
	if (scan_fds(pid, ino, found, n) < 0)
		return 0;
	for (size_t i = 0; i < n; i++)
		missing += !found[i];
	if (missing == 0)
		return 0;	/* the usual case: one read of the directory */
	/* A descriptor moved (dup2 then close) while the directory was read
	 * can be missed by one scan; a second must miss it too. */
	memset(again, 0, sizeof(again));
	sched_yield();
	if (scan_fds(pid, ino, again, n) < 0)
		return 0;
	/* What both scans missed is asked of the kernel's socket tables,
	 * which no descriptor juggling can hide a socket from. */
	for (size_t i = 0; i < n; i++)
		found[i] = found[i] || again[i];
	if (diag_alive(ino, found, n) < 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		struct seg_slot *sl = seg_slot(s, slot[i]);
		struct seg_comp *c;
		bool r;

		if (found[i] || sl == NULL)
			continue;
		/* Still the same process, and the slot still this socket. */
		if (!same_process(s, rec, pid, start) || !sys_pid_alive(pid, start) ||
		    atomic_load(&sl->inode) != ino[i] || !SLOT_HELD(atomic_load(&sl->state)))
			continue;
		c = seg_slot_comp(s, sl);
		r = slot_drop_hold(s, (int)rec, slot[i], false);
		bs_log(LOG_INFO, "process %d no longer has socket %llu: its permit%s", (int)pid,
		    (unsigned long long)ino[i], r ? " went back" : " stays with its other holders");
		count_reconciled(c, r);
		released += r;
	}
	return released;
}

/* Other live processes' holds, checked through /proc/PID/fd. */
static int
reconcile_others(struct seg *s, int comp)
{
	int mine = atomic_load(&s->rec), n = 0;
	uint32_t slot[BATCH];
	uint64_t ino[BATCH];

	for (uint32_t rec = 0; rec < s->nprocs; rec++) {
		struct seg_proc *p = seg_proc(s, rec);
		pid_t pid = atomic_load(&p->pid);
		uint64_t start = atomic_load(&p->start);
		size_t k = 0;

		if ((int)rec == mine || pid == s->my_pid || atomic_load(&p->state) != PROC_LIVE ||
		    pid <= 0)
			continue;
		for (uint32_t w = 0; w < s->bitmap_words; w++) {
			/* Its row and its sole holds (slot.c). */
			uint64_t bits = slot_held_bits(s, rec, w);

			while (bits != 0) {
				uint32_t i = w * 64 + (uint32_t)__builtin_ctzll(bits);
				uint64_t v = counted_inode(s, i, comp);

				bits &= bits - 1;
				if (v == 0)
					continue;
				slot[k] = i;
				ino[k++] = v;
				if (k == BATCH) {
					n += check_batch(s, rec, pid, start, slot, ino, k);
					k = 0;
				}
			}
		}
		if (k > 0 && sys_pid_alive(pid, start))
			n += check_batch(s, rec, pid, start, slot, ino, k);
	}
	return n;
}

/* One batch of SLOT_KERNEL slots (slot[], ino[]): those whose socket no
 * file refers to any more are given back. Returns the permits that went. */
static int
release_unfiled(struct seg *s, const uint32_t *slot, const uint64_t *ino, size_t n)
{
	bool alive[BATCH];
	int released = 0;

	memset(alive, 0, sizeof(alive));
	if (diag_alive(ino, alive, n) < 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		struct seg_comp *c;
		bool r;

		if (alive[i])
			continue;
		c = seg_slot_comp(s, seg_slot(s, slot[i]));
		r = slot_release_kernel(s, slot[i], ino[i]);
		if (r)
			bs_log(LOG_INFO, "socket %llu, shared with processes the tables could not "
			    "name, is closed everywhere: its permit went back", (unsigned long long)ino[i]);
		count_reconciled(c, r);
		released += r;
	}
	return released;
}

int
reconcile_kernel_held(struct seg *s)
{
	uint32_t slot[BATCH];
	uint64_t ino[BATCH];
	size_t k = 0;
	int n = 0;

	for (uint32_t i = 0; i < s->nslots; i++) {
		if (atomic_load_explicit(&s->slots[i].state, memory_order_relaxed) != SLOT_KERNEL)
			continue;
		slot[k] = i;
		ino[k++] = atomic_load(&s->slots[i].inode);
		if (k == BATCH) {
			n += release_unfiled(s, slot, ino, k);
			k = 0;
		}
	}
	if (k > 0)
		n += release_unfiled(s, slot, ino, k);
	return n;
}

int
reconcile_run(struct seg *s, const struct seg_comp *c)
{
	int saved = errno, n;

	n = reconcile_own(s, s->host);
	n += reconcile_others(s, c != NULL ? (int)(c - s->comp) : -1);
	n += reconcile_kernel_held(s);
	errno = saved;
	return n;
}

void
reconcile_soon(void)
{
	atomic_store(&last_run_ms, 0);
}

/* A reconcile of compartment comp (all if comp < 0), at most every
 * RECONCILE_EVERY_MS per process. Returns the permits given back. */
static int
reconcile_throttled(struct seg *s, const struct seg_comp *c)
{
	uint64_t now = now_mono_ms(), last = atomic_load(&last_run_ms);

	if (now - last < RECONCILE_EVERY_MS && now >= last)
		return 0;
	if (s->host == NULL || !atomic_compare_exchange_strong(&last_run_ms, &last, now))
		return 0;
	return reconcile_run(s, c);
}

int
reconcile_refused(struct seg *s, const struct seg_comp *c, enum bs_reason why)
{
	return reconcile_throttled(s, why == REASON_POOL_FULL ? NULL : c);
}

int
reconcile_class_full(struct seg *s, const struct seg_comp *c)
{
	return proc_reclaim(s, true) + reconcile_throttled(s, c);
}

void
reconcile_table_full(struct seg *s)
{
	proc_reclaim(s, true);
	reconcile_throttled(s, NULL);
}
