/* interpose.c - the exported libc names: look up the descriptor, decide, call the real one. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

struct shim_state shim;

/*
 * A process that shares our memory but is not the process the table
 * describes: a vfork child, or a child of a raw clone or _Fork that the
 * fork wrapper did not see. Its descriptors are not ours to account, so
 * every wrapper leaves them alone. Only asked on paths that already concern
 * a counted socket, so the system call is not on anyone's hot path.
 */
static bool
foreign_process(void)
{
	return (pid_t)syscall(SYS_getpid) != shim.pid;
}

static bool
active(void)
{
	return atomic_load_explicit(&shim.ready, memory_order_acquire) != 0;
}

/* Gives back the hold that a table entry (slot + 1) stood for. */
static void
drop_entry(uint32_t e)
{
	if (e != 0)
		seg_drop(shim.seg, e - 1);
}

/* A descriptor number just handed out by the kernel: if the table still
 * marks it counted, the socket it stood for vanished unseen (closefrom,
 * a raw close system call), and its hold goes back now. */
static void
fresh_fd(int fd)
{
	if (fd >= 0 && fdt_get(fd) != 0 && active() && !foreign_process())
		drop_entry(fdt_take(fd));
}

/* newfd is now a copy of oldfd: it holds the same socket, if any. */
static void
copy_fd(int oldfd, int newfd)
{
	uint32_t e = fdt_get(oldfd);

	if (!active() || foreign_process()) {
		return;
	}
	if (e != 0)
		seg_hold(shim.seg, e - 1);
	drop_entry(e != 0 ? fdt_set(newfd, e - 1) : fdt_take(newfd));
}

/* The errno a full compartment answers with; only the allowed values are
 * taken from the shared segment, whatever it holds. */
static int
reject_errno(const struct seg_comp *c)
{
	int e = atomic_load(&c->reject_errno);

	return cfg_errno_name(e) != NULL ? e : ECONNREFUSED;
}

enum admit { ADMIT_PASS, ADMIT_COUNTED, ADMIT_REFUSED };

/*
 * Decides a connect (or a TCP Fast Open send) of fd to sa: ADMIT_PASS when
 * the shim has nothing to count, ADMIT_COUNTED when a permit was taken and
 * recorded for fd, ADMIT_REFUSED with errno set when the compartment is full.
 */
static enum admit
admit(int fd, const struct sockaddr *sa, socklen_t len, const char *what)
{
	uint32_t e = fdt_get(fd);
	int comp = match_find(shim.m, sa, len), type = 0, segc, slot;
	socklen_t tlen = sizeof(type);
	struct seg_comp *c;
	struct stat st;
	char dest[128];

	if (comp < 0 && e == 0)
		return ADMIT_PASS;
	if (foreign_process() || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return ADMIT_PASS;
	if (e != 0) {
		struct seg_slot *sl = seg_slot(shim.seg, e - 1);

		/* A connect retried on the same socket (EINPROGRESS,
		 * EALREADY, EISCONN; hiredis polls this way) already has
		 * its permit. Any other socket behind the number is new. */
		if (sl != NULL && atomic_load(&sl->inode) == (uint64_t)st.st_ino)
			return ADMIT_PASS;
		drop_entry(fdt_take(fd));
	}
	if (comp < 0 || !fdt_valid(fd))
		return ADMIT_PASS;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) < 0 || type != SOCK_STREAM)
		return ADMIT_PASS;
	segc = seg_comp_index(shim.seg, (size_t)comp);
	c = segc >= 0 ? seg_comp(shim.seg, (uint32_t)segc) : NULL;
	if (c == NULL)
		return ADMIT_PASS;
	slot = seg_acquire(shim.seg, (uint32_t)segc, (uint64_t)st.st_ino);
	if (slot >= 0) {
		drop_entry(fdt_set(fd, (uint32_t)slot));
		return ADMIT_COUNTED;
	}
	match_format(sa, len, dest, sizeof(dest));
	if (slot == -EBUSY) {
		log_rejection((unsigned)segc, "%s full (%u/%u): %s to %s refused",
		    c->name, atomic_load(&c->in_use), atomic_load(&c->limit), what, dest);
	} else {
		log_rejection((unsigned)segc, "%s: %s table of segment %s is full: %s to %s refused",
		    c->name, slot == -ENOSPC ? "socket or process" : "permit",
		    shim.cfg.segment, what, dest);
	}
	/* connect is a cancellation point: a thread cancelled while it
	 * would have been refused must see the cancellation first. */
	pthread_testcancel();
	errno = reject_errno(c);
	return ADMIT_REFUSED;
}

/* After the real call: a connect that failed at once gives its permit back.
 * EINPROGRESS and EINTR leave the connection under way; EALREADY and EISCONN
 * answer a retry. */
static void
settle(int fd, long r)
{
	int err = errno;

	if (r < 0 && err != EINPROGRESS && err != EINTR && err != EALREADY && err != EISCONN)
		drop_entry(fdt_take(fd));
	errno = err;
}

BS_EXPORT int
connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	int saved = errno, r;

	if (!active())
		return real.connect(fd, sa, len);
	switch (admit(fd, sa, len, "connect")) {
	case ADMIT_REFUSED:
		return -1;
	case ADMIT_PASS:
		errno = saved;
		return real.connect(fd, sa, len);
	case ADMIT_COUNTED:
		break;
	}
	errno = saved;
	r = real.connect(fd, sa, len);
	settle(fd, r);
	return r;
}

/* TCP Fast Open: sendto/sendmsg with MSG_FASTOPEN connect implicitly. */
BS_EXPORT ssize_t
sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *sa, socklen_t len)
{
	int saved = errno;
	enum admit a;
	ssize_t r;

	if (!(flags & MSG_FASTOPEN) || sa == NULL || !active())
		return real.sendto(fd, buf, n, flags, sa, len);
	a = admit(fd, sa, len, "sendto");
	if (a == ADMIT_REFUSED)
		return -1;
	errno = saved;
	r = real.sendto(fd, buf, n, flags, sa, len);
	if (a == ADMIT_COUNTED)
		settle(fd, r);
	return r;
}

BS_EXPORT ssize_t
sendmsg(int fd, const struct msghdr *msg, int flags)
{
	int saved = errno;
	enum admit a;
	ssize_t r;

	if (!(flags & MSG_FASTOPEN) || msg == NULL || msg->msg_name == NULL || !active())
		return real.sendmsg(fd, msg, flags);
	a = admit(fd, msg->msg_name, msg->msg_namelen, "sendmsg");
	if (a == ADMIT_REFUSED)
		return -1;
	errno = saved;
	r = real.sendmsg(fd, msg, flags);
	if (a == ADMIT_COUNTED)
		settle(fd, r);
	return r;
}

BS_EXPORT int
close(int fd)
{
	uint32_t e;
	int r, saved;

	if (fdt_get(fd) == 0)
		return real.close(fd);
	if (!active() || foreign_process())
		return real.close(fd);
	/* The entry goes first: once the real close returns, the number may
	 * already belong to a new socket of another thread. Linux frees the
	 * descriptor even when close fails, so the hold always goes. */
	e = fdt_take(fd);
	r = real.close(fd);
	saved = errno;
	drop_entry(e);
	errno = saved;
	return r;
}

BS_EXPORT int
dup(int fd)
{
	int r = real.dup(fd), saved = errno;

	if (r >= 0 && (fdt_get(fd) != 0 || fdt_get(r) != 0)) {
		copy_fd(fd, r);
		errno = saved;
	}
	return r;
}

/* dup2 and dup3 close newfd first: a counted socket there loses a holder. */
static int
dup_over(int oldfd, int newfd, int r)
{
	int saved = errno;

	if (r >= 0 && oldfd != newfd && (fdt_get(oldfd) != 0 || fdt_get(newfd) != 0)) {
		copy_fd(oldfd, newfd);
		errno = saved;
	}
	return r;
}

BS_EXPORT int
dup2(int oldfd, int newfd)
{
	return dup_over(oldfd, newfd, real.dup2(oldfd, newfd));
}

BS_EXPORT int
dup3(int oldfd, int newfd, int flags)
{
	return dup_over(oldfd, newfd, real.dup3(oldfd, newfd, flags));
}

/* fcntl's third argument is an int or a pointer; passing it on as a
 * pointer-sized value is what glibc itself does on every ABI we run on. */
static int
fcntl_common(int (*fn)(int, int, ...), int fd, int cmd, void *arg)
{
	int r = fn(fd, cmd, arg), saved = errno;

	if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) &&
	    (fdt_get(fd) != 0 || fdt_get(r) != 0)) {
		copy_fd(fd, r);
		errno = saved;
	}
	return r;
}

BS_EXPORT int
fcntl(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(real.fcntl, fd, cmd, arg);
}

BS_EXPORT int
fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(real.fcntl64, fd, cmd, arg);
}

/* Forgets every counted descriptor in [first, last] after a range close. */
static void
drop_range(unsigned first, unsigned last)
{
	unsigned high = (unsigned)fdt_high();

	if (!active() || foreign_process())
		return;
	if (last >= high)
		last = high == 0 ? 0 : high - 1;
	for (unsigned fd = first; fd <= last && fd < high; fd++) {
		if (fdt_get((int)fd) != 0)
			drop_entry(fdt_take((int)fd));
	}
}

BS_EXPORT int
close_range(unsigned first, unsigned last, int flags)
{
	int r = real.close_range(first, last, flags), saved = errno;

	/* With CLOSE_RANGE_CLOEXEC nothing closes now; the descriptors go
	 * at exec, and the new image drops their holds when it starts. */
	if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC) && first <= last) {
		drop_range(first, last);
		errno = saved;
	}
	return r;
}

BS_EXPORT void
closefrom(int lowfd)
{
	int saved;

	real.closefrom(lowfd);
	saved = errno;
	drop_range(lowfd < 0 ? 0 : (unsigned)lowfd, ~0U);
	errno = saved;
}

BS_EXPORT int
fclose(FILE *fp)
{
	int fd = fp != NULL ? fileno(fp) : -1, r, saved;
	uint32_t e;

	if (fd < 0 || fdt_get(fd) == 0 || !active() || foreign_process())
		return real.fclose(fp);
	/* fclose closes through glibc's internal close, which no wrapper
	 * sees: this is the only place to notice an fdopen'ed socket go. */
	e = fdt_take(fd);
	r = real.fclose(fp);
	saved = errno;
	drop_entry(e);
	errno = saved;
	return r;
}

BS_EXPORT pid_t
fork(void)
{
	int rec, saved;
	pid_t pid;

	if (!active() || foreign_process())
		return real.fork();
	rec = seg_fork_prepare(shim.seg);
	pid = real.fork();
	saved = errno;
	if (pid == 0) {
		shim.pid = (pid_t)syscall(SYS_getpid);
		seg_fork_child(shim.seg, rec);
	} else {
		seg_fork_parent(shim.seg, rec, pid);
	}
	errno = saved;
	return pid;
}

BS_EXPORT int
socket(int domain, int type, int protocol)
{
	int r = real.socket(domain, type, protocol), saved = errno;

	fresh_fd(r);
	errno = saved;
	return r;
}

BS_EXPORT int
accept(int fd, struct sockaddr *sa, socklen_t *len)
{
	int r = real.accept(fd, sa, len), saved = errno;

	fresh_fd(r);
	errno = saved;
	return r;
}

BS_EXPORT int
accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags)
{
	int r = real.accept4(fd, sa, len, flags), saved = errno;

	fresh_fd(r);
	errno = saved;
	return r;
}

/* A host-name destination follows what the program itself resolves, so a
 * DNS change after start-up is followed too. */
BS_EXPORT int
getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
    struct addrinfo **res)
{
	int r = real.getaddrinfo(node, service, hints, res), saved = errno;

	if (r == 0 && node != NULL && active() && match_has_host(shim.m, node)) {
		for (struct addrinfo *ai = *res; ai != NULL; ai = ai->ai_next) {
			if (ai->ai_addr != NULL &&
			    match_learn(shim.m, node, ai->ai_addr) == -ENOSPC) {
				bs_log(LOG_WARN, "too many addresses learned for %s; "
				    "later ones are not counted", node);
				break;
			}
		}
	}
	errno = saved;
	return r;
}

/* ---- start-up and exit ---- */

static void
adopt_fd(int fd, uint32_t slot)
{
	fdt_set(fd, slot);
}

static bool
env_true(const char *v)
{
	return v != NULL && (strcmp(v, "1") == 0 || strcmp(v, "yes") == 0 ||
	    strcmp(v, "true") == 0 || strcmp(v, "on") == 0);
}

/* The shim cannot work: strict mode ends the process, the default leaves
 * the program running without limits. */
static void
give_up(bool strict, const char *why)
{
	if (strict) {
		bs_log(LOG_ERROR, "%s; exiting (strict mode)", why);
		_exit(BS_EX_CONFIG);
	}
	bs_log(LOG_ERROR, "%s; running without limits", why);
}

__attribute__((constructor)) static void
shim_init(void)
{
	char err[BS_ERRLEN], msg[BS_ERRLEN + 64];
	const char *path, *level;
	bool strict;
	int r;

	real_bind();
	shim.pid = (pid_t)syscall(SYS_getpid);
	/* In secure execution the environment belongs to someone else. */
	if (getauxval(AT_SECURE) != 0)
		return;
	level = getenv("BULKSHIM_LOG");
	if (level != NULL && log_set_level(level) < 0)
		bs_log(LOG_WARN, "BULKSHIM_LOG=%s is not off, error, warn, info or debug; using warn",
		    level);
	strict = env_true(getenv("BULKSHIM_STRICT"));
	path = getenv("BULKSHIM_CONFIG");
	if (path == NULL || *path == '\0')
		path = BS_DEFAULT_CONFIG;
	if (fdt_init() < 0) {
		give_up(strict, "cannot map the descriptor table");
		return;
	}
	r = cfg_load(path, &shim.cfg, true, err, sizeof(err));
	if (r == -ENOENT) {
		if (strict)
			give_up(true, err);
		bs_log(LOG_WARN, "no config file %s (set BULKSHIM_CONFIG); running without limits",
		    path);
		return;
	}
	if (r < 0) {
		give_up(strict || cfg_wants_strict(path), err);
		return;
	}
	strict = strict || shim.cfg.strict;
	shim.m = match_build(shim.cfg.rules, shim.cfg.nrules, err, sizeof(err));
	if (shim.m == NULL) {
		give_up(strict, err);
		return;
	}
	r = seg_attach(&shim.cfg, &shim.seg, err, sizeof(err));
	if (r < 0) {
		bs_format(msg, sizeof(msg), "%s: %s", shim.cfg.path, err);
		give_up(strict, msg);
		return;
	}
	seg_adopt(shim.seg, adopt_fd);
	atomic_store_explicit(&shim.ready, 1, memory_order_release);
	bs_log(LOG_INFO, "%s: %u compartments in segment %s", shim.cfg.path, (unsigned)shim.cfg.ncomp,
	    shim.cfg.segment);
}

/* A normal exit gives every permit of this process back. */
__attribute__((destructor)) static void
shim_fini(void)
{
	if (active() && !foreign_process())
		seg_detach_all(shim.seg);
}
