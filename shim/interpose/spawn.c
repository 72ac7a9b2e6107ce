/* spawn.c - processes made: fork with its bookkeeping; vfork, _Fork and clone raise the unseen count (procid.c). */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "interpose/interpose.h"

#if defined(__x86_64__)
/* Called by vfork below on failure, with the error number. */
BS_HIDDEN __attribute__((used)) long shim_vfork_failed(int e);

long
shim_vfork_failed(int e)
{
	errno = e;
	return -1;
}

/*
 * vfork cannot be a C function: the child returns through the caller's
 * stack while the parent is suspended, and the parent then returns through
 * the same stack. As glibc does, the return address is kept in a register
 * across the system call. The count goes up before the child runs and down
 * when the parent resumes, after the child exec'd or exited.
 */
#define STR(x)	#x
#define XSTR(x)	STR(x)

__attribute__((naked)) BS_EXPORT pid_t
vfork(void)
{
	/* Basic asm only, as GCC asks of a naked function. */
	__asm__ volatile(
	    "lock incl shim_unseen(%rip)\n\t"
	    "popq %rdi\n\t"
	    "movl $" XSTR(SYS_vfork) ", %eax\n\t"
	    "syscall\n\t"
	    "pushq %rdi\n\t"
	    "testl %eax, %eax\n\t"
	    "jz 1f\n\t"
	    "lock decl shim_unseen(%rip)\n\t"
	    "cmpl $-4095, %eax\n\t"
	    "jae 2f\n\t"
	    "1:\n\t"
	    "ret\n\t"
	    "2:\n\t"
	    "negl %eax\n\t"
	    "movl %eax, %edi\n\t"
	    "jmp shim_vfork_failed\n\t");
}
#endif

BS_EXPORT pid_t
_Fork(void)
{
	pid_t pid;
	int saved;

	atomic_fetch_add(&shim_unseen, 1);
	pid = real._Fork();
	saved = errno;
	if (pid != 0)
		atomic_fetch_sub(&shim_unseen, 1);
	errno = saved;
	return pid;
}

/* glibc's clone reads the three optional arguments only when the flags ask
 * for them; passing them on as read is what it expects. */
BS_EXPORT int
clone(int (*fn)(void *), void *stack, int flags, void *arg, ...)
{
	va_list ap;
	void *ptid, *tls, *ctid;
	int r, saved;

	va_start(ap, arg);
	ptid = va_arg(ap, void *);
	tls = va_arg(ap, void *);
	ctid = va_arg(ap, void *);
	va_end(ap);
	atomic_fetch_add(&shim_unseen, 1);
	r = real.clone(fn, stack, flags, arg, ptid, tls, ctid);
	saved = errno;
	/* A child sharing our memory for good keeps the count raised. */
	if (!(flags & CLONE_VM) || (flags & CLONE_VFORK) || r < 0)
		atomic_fetch_sub(&shim_unseen, 1);
	errno = saved;
	return r;
}

/*
 * A socket made before a fork and connected after it is one connection in
 * two processes, whichever of them connects. Each such socket (an
 * unconnected, non-listening stream socket from socket()) gets a pending
 * slot before the fork, so both processes hold it from the start and its
 * permit, once admitted, lasts until both are done with it. Pending slots
 * take only the part of the table admissions cannot need; a socket left
 * without one is no longer fresh after the fork either, and its connect
 * takes a watched slot (permit_claim).
 */
static void
share_unconnected(void)
{
	for (int fd = fdt_next_fresh(0); fd >= 0; fd = fdt_next_fresh(fd + 1)) {
		struct sockaddr_storage peer;
		socklen_t plen = sizeof(peer), ilen = sizeof(int);
		int type = 0, listening = 0, slot;
		struct stat st;

		fdt_clear_fresh(fd);
		if (fdt_get(fd) != 0 || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
			continue;
		if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &ilen) < 0 || type != SOCK_STREAM)
			continue;
		ilen = sizeof(int);
		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ilen) < 0 || listening)
			continue;
		if (getpeername(fd, (struct sockaddr *)&peer, &plen) == 0 || errno != ENOTCONN)
			continue;
		slot = slot_claim_shared(shim.seg, proc_record(shim.seg), (uint64_t)st.st_ino);
		if (slot >= 0)
			slot_drop(shim.seg, fdt_set(fd, (uint32_t)slot) - 1);
	}
}

BS_EXPORT pid_t
fork(void)
{
	struct proc_fork f;
	int saved = errno;
	pid_t pid;

	if (!shim_active() || shim_foreign())
		return real.fork();
	/* No thread may be between a change of what this process holds
	 * and its record of it while the child's record is copied. */
	proc_gate_close(shim.seg);
	share_unconnected();
	proc_fork_prepare(shim.seg, &f);
	errno = saved;
	pid = real.fork();
	saved = errno;
	if (pid == 0) {
		shim_forked_seen();
		if (!proc_fork_child(shim.seg, &f)) {
			fds_forget_all();
			proc_adopt(shim.seg, shim_adopt_fd);
		}
	} else {
		proc_fork_parent(shim.seg, &f, pid);
	}
	errno = saved;
	return pid;
}
