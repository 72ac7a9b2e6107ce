/* signal.c - SIGBUS: the library's handler first, for a segment that shrinks; the program's own behind it, kept by sigaction and signal. */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "interpose/interpose.h"

/*
 * A segment truncated under the process raises SIGBUS at its next access
 * (guard.c). The library's handler stays the one the kernel calls for
 * SIGBUS from attach on: what the program installs with sigaction or
 * signal is kept here as `program` and reported back to it as its own, and
 * the kernel's disposition takes the program's mask and flags, so its
 * handler runs as it asked. A SIGBUS that is not the segment's (a fault in
 * the program's own mapped file, a kill) goes to the program's handler, or
 * gets the default action.
 *
 * Not seen: a program that installs its handler with the raw system call,
 * or with sysv_signal, sigset or bsd_signal, replaces the library's; then a
 * truncated segment ends it as before, and its own handling works.
 */

static struct sigaction program;	/* what the program asked for SIGBUS */
static _Atomic int guarding;		/* the library's handler is installed */

static void on_sigbus(int sig, siginfo_t *info, void *uc);

/* Installs the library's handler with the mask and flags of the program's
 * disposition p. Async-signal-safe. */
static int
install(const struct sigaction *p)
{
	struct sigaction mine;

	memset(&mine, 0, sizeof(mine));
	mine.sa_sigaction = on_sigbus;
	mine.sa_mask = p->sa_mask;
	/* SA_RESETHAND is the program's to have: done in on_sigbus. */
	mine.sa_flags = SA_SIGINFO | SA_ONSTACK | (p->sa_flags & (SA_RESTART | SA_NODEFER));
	return real.sigaction(SIGBUS, &mine, NULL);
}

/* The default action of SIGBUS, as the kernel would have taken it: a fault
 * is retried after the return and ends the process with a core; a signal
 * that was sent is sent again, to be taken when the handler returns. */
static void
default_action(const siginfo_t *info)
{
	struct sigaction dfl;

	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	real.sigaction(SIGBUS, &dfl, NULL);
	atomic_store(&guarding, 0);
	if (info == NULL || info->si_code <= 0)
		sys_call(SYS_tgkill, sys_getpid(), sys_call(SYS_gettid, 0, 0, 0, 0, 0, 0), SIGBUS,
		    0, 0, 0);
}

static void
on_sigbus(int sig, siginfo_t *info, void *uc)
{
	int saved = errno;
	struct sigaction p;
	struct seg *lost;

	lost = info != NULL && info->si_code > 0 ? guard_fault(info->si_addr) : NULL;
	if (lost != NULL) {
		/* The segment's limits are off: every later call passes. */
		if (lost == shim.seg)
			atomic_store_explicit(&shim.ready, 0, memory_order_release);
		errno = saved;
		return;
	}
	p = program;
	if (p.sa_flags & SA_RESETHAND) {
		memset(&program, 0, sizeof(program));
		program.sa_handler = SIG_DFL;
		install(&program);
	}
	if (p.sa_flags & SA_SIGINFO) {
		p.sa_sigaction(sig, info, uc);
	} else if (p.sa_handler == SIG_IGN && info != NULL && info->si_code <= 0) {
		/* A sent SIGBUS the program ignores. A fault cannot be
		 * ignored: the kernel would have taken the default. */
	} else if (p.sa_handler == SIG_DFL || p.sa_handler == SIG_IGN) {
		default_action(info);
	} else {
		p.sa_handler(sig);
	}
	errno = saved;
}

void
signal_guard_start(void)
{
	struct sigaction cur;

	if (atomic_load(&guarding) || real.sigaction(SIGBUS, NULL, &cur) != 0)
		return;
	program = cur;
	if (install(&program) == 0)
		atomic_store(&guarding, 1);
}

BS_EXPORT int
sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	struct sigaction before;
	sigset_t all, was;
	int r = 0;

	if (sig != SIGBUS || !atomic_load(&guarding))
		return real.sigaction(sig, act, old);
	/* The program's disposition changes while no SIGBUS of this thread
	 * can read it half written. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &was);
	before = program;
	/* act is read before old is written: they may be one struct. */
	if (act != NULL) {
		program = *act;
		r = install(&program);
		if (r != 0)
			program = before;
	}
	if (old != NULL && r == 0)
		*old = before;
	pthread_sigmask(SIG_SETMASK, &was, NULL);
	return r;
}

/* glibc's signal(): BSD semantics, the signal blocked in its handler and
 * system calls restarted. */
BS_EXPORT bs_sighandler
signal(int sig, bs_sighandler h)
{
	struct sigaction act, old;

	if (sig != SIGBUS || !atomic_load(&guarding))
		return real.signal(sig, h);
	memset(&act, 0, sizeof(act));
	act.sa_handler = h;
	sigemptyset(&act.sa_mask);
	sigaddset(&act.sa_mask, sig);
	act.sa_flags = SA_RESTART;
	if (sigaction(sig, &act, &old) != 0)
		return SIG_ERR;
	return old.sa_handler;
}
