/* spawn.c - processes made: fork with its bookkeeping; vfork, posix_spawn, popen, system, _Fork and clone watch what the child may inherit. */
#include <errno.h>
#include <sched.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "interpose/interpose.h"

/*
 * A child made without the fork wrapper gets no process record: the tables
 * cannot say that it holds the sockets it inherits (nor can a program it
 * execs without the library). So before it is made, every slot this process
 * holds is watched (proc_spawn_prepare), and its permits stay until the
 * kernel has no file of the socket left, whichever process closes last; a
 * program the child execs with the library finds what it inherited too
 * (proc_adopt). Sockets fresh from socket() lose their mark: one connected
 * after the child was made may be the child's too, and takes a watched
 * slot. Returns true if the caller must call spawn_done once the call that
 * makes the child has returned in the parent. Keeps errno.
 */
bool
spawn_prepare(void)
{
	int saved = errno;

	if (!shim_active() || shim_foreign())
		return false;
	proc_spawn_prepare(shim.seg);
	for (int fd = fdt_next_fresh(0); fd >= 0; fd = fdt_next_fresh(fd + 1))
		fdt_clear_fresh(fd);
	errno = saved;
	return true;
}

void
spawn_done(bool prepared)
{
	int saved = errno;

	if (prepared)
		proc_spawn_done(shim.seg);
	errno = saved;
}

#if defined(__x86_64__)
/* Called by vfork below: before the system call, after it in the parent
 * (with what the first returned), and on failure with the error number. */
BS_HIDDEN __attribute__((used)) int shim_vfork_prepare(void);
BS_HIDDEN __attribute__((used)) void shim_vfork_done(int prepared);
BS_HIDDEN __attribute__((used)) long shim_vfork_failed(int e);

int
shim_vfork_prepare(void)
{
	return spawn_prepare();
}

void
shim_vfork_done(int prepared)
{
	spawn_done(prepared != 0);
}

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
 * across the system call (%rdi), and so is what shim_vfork_prepare
 * returned (%esi): the child may overwrite anything on the stack below
 * the caller's frame. All the bookkeeping is the parent's, before the
 * system call and after it returns there; the child only returns. The
 * count goes up before the child runs and down when the parent resumes,
 * after the child exec'd or exited.
 */
#define STR(x)	#x
#define XSTR(x)	STR(x)

__attribute__((naked)) BS_EXPORT pid_t
vfork(void)
{
	/* Basic asm only, as GCC asks of a naked function. */
	__asm__ volatile(
	    "subq $8, %rsp\n\t"
	    "call shim_vfork_prepare\n\t"
	    "addq $8, %rsp\n\t"
	    "movl %eax, %esi\n\t"
	    "lock incl shim_unseen(%rip)\n\t"
	    "popq %rdi\n\t"
	    "movl $" XSTR(SYS_vfork) ", %eax\n\t"
	    "syscall\n\t"
	    "pushq %rdi\n\t"
	    "testl %eax, %eax\n\t"
	    "jz 1f\n\t"
	    "lock decl shim_unseen(%rip)\n\t"
	    "pushq %rax\n\t"
	    "movl %esi, %edi\n\t"
	    "call shim_vfork_done\n\t"
	    "popq %rax\n\t"
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

/* posix_spawn and posix_spawnp: glibc makes the child with its internal
 * clone, which no wrapper sees, and returns once it has exec'd (or failed
 * to). They return an error number and leave errno alone. */
BS_EXPORT int
posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *actions,
    const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	bool prepared = spawn_prepare();
	int r = real.posix_spawn(pid, path, actions, attr, argv, envp);

	spawn_done(prepared);
	return r;
}

BS_EXPORT int
posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions,
    const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	bool prepared = spawn_prepare();
	int r = real.posix_spawnp(pid, file, actions, attr, argv, envp);

	spawn_done(prepared);
	return r;
}

/* popen and system: glibc makes their child with its internal posix_spawn,
 * which no wrapper sees. popen returns once the child has exec'd, as
 * posix_spawn does. */
BS_EXPORT FILE *
popen(const char *cmd, const char *mode)
{
	bool prepared = spawn_prepare();
	FILE *f = real.popen(cmd, mode);

	spawn_done(prepared);
	return f;
}

/* system() returns only when the command has finished: the gate cannot
 * stay closed that long (every connect of the program's other threads
 * would wait for it), so it opens again before the child is made. What
 * this process holds is watched and its fresh marks cleared all the same;
 * a socket another thread makes and connects in the few microseconds
 * before the child is made is not watched. */
BS_EXPORT int
system(const char *cmd)
{
	spawn_done(spawn_prepare());
	return real.system(cmd);
}

BS_EXPORT pid_t
_Fork(void)
{
	bool prepared = spawn_prepare();
	pid_t pid;
	int saved;

	atomic_fetch_add(&shim_unseen, 1);
	pid = real._Fork();
	saved = errno;
	if (pid != 0) {
		atomic_fetch_sub(&shim_unseen, 1);
		spawn_done(prepared);
	}
	errno = saved;
	return pid;
}

/* glibc's clone reads the three optional arguments only when the flags ask
 * for them; passing them on as read is what it expects. A child sharing
 * our descriptor table (CLONE_FILES) closes what we close: nothing to
 * watch. */
BS_EXPORT int
clone(int (*fn)(void *), void *stack, int flags, void *arg, ...)
{
	va_list ap;
	void *ptid, *tls, *ctid;
	bool prepared;
	int r, saved;

	va_start(ap, arg);
	ptid = va_arg(ap, void *);
	tls = va_arg(ap, void *);
	ctid = va_arg(ap, void *);
	va_end(ap);
	prepared = !(flags & CLONE_FILES) && spawn_prepare();
	atomic_fetch_add(&shim_unseen, 1);
	r = real.clone(fn, stack, flags, arg, ptid, tls, ctid);
	saved = errno;
	/* A child sharing our memory for good keeps the count raised. */
	if (!(flags & CLONE_VM) || (flags & CLONE_VFORK) || r < 0)
		atomic_fetch_sub(&shim_unseen, 1);
	spawn_done(prepared);
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
