/* procid.c - which process this is: the cached pid, and processes made behind the fork wrapper's back. */
#include <pthread.h>

#include "interpose/interpose.h"

/*
 * The tables describe the process whose pid is shim.pid, cached at start-up
 * and refreshed by the fork wrapper in the child. A process that shares our
 * memory but is not that process (a vfork child, a CLONE_VM child), or a
 * copy of it made without the fork wrapper (_Fork, clone, glibc's internal
 * fork in daemon() or forkpty()), must leave every descriptor alone. Asking
 * the kernel for the pid on every call would cost a system call per
 * connect and per close; instead every way to make such a process raises
 * `unseen` first, and only while it is raised does shim_foreign ask:
 *
 *   - vfork (spawn.c): raised in the parent before the child runs, lowered by
 *     the parent when it resumes (the child has exec'd or exited);
 *   - a fork of any kind runs pthread_atfork's child handler, which raises
 *     it in the child's copy for good; the fork wrapper lowers it again in
 *     a child it prepared properly;
 *   - _Fork and clone (which run no fork handlers): raised around the call,
 *     so that the child's copy keeps it; a clone sharing our memory
 *     without CLONE_VFORK keeps it raised in ours too.
 *
 * syscall() with the fork and clone numbers raises it as clone does
 * (syscall.c); only a system call made with the instruction itself, past
 * every wrapper, is not seen.
 */
_Atomic int shim_unseen __attribute__((used));

/* shim_foreign while `unseen` is raised: ask the kernel. */
static __attribute__((noinline)) bool
foreign_ask(void)
{
	return sys_getpid() != shim.pid;
}

static void
forked_unseen(void)
{
	atomic_fetch_add(&shim_unseen, 1);
}

void
shim_watch_forks(void)
{
	pthread_atfork(NULL, NULL, forked_unseen);
}

void
shim_forked_seen(void)
{
	atomic_fetch_sub(&shim_unseen, 1);
	shim.pid = sys_getpid();
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE bool
shim_foreign(void)
{
#if defined(__x86_64__)
	if (__builtin_expect(atomic_load_explicit(&shim_unseen, memory_order_relaxed) == 0, 1))
		return false;
#endif
	/* Elsewhere vfork is not wrapped (spawn.c): always ask. */
	return foreign_ask();
}
#pragma GCC diagnostic pop
