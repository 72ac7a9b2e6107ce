/* cli_guard.c - the CLI's SIGBUS handler: a segment truncated while a command reads it ends nothing. */
#include <signal.h>
#include <string.h>

#include "cli.h"

/*
 * status, watch, serve and the fleet agent map segments (segment.c lists
 * each mapping with guard.c). One that shrinks while it is read faults:
 * guard_fault puts zero pages in its place and says so in one line, and
 * the command goes on with a segment marked lost. Any other SIGBUS is the
 * default one.
 */
static void
on_sigbus(int sig, siginfo_t *info, void *uc)
{
	(void)uc;
	if (info != NULL && info->si_code > 0 && guard_fault(info->si_addr) != NULL)
		return;
	signal(sig, SIG_DFL);
	if (info == NULL || info->si_code <= 0)
		raise(sig);
}

void
cli_guard_start(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigaction(SIGBUS, &sa, NULL);
}
