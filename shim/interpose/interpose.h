/* interpose.h - private to interpose/: the real functions, the process's state, the wrappers' helpers. */
#ifndef BULKSHIM_INTERPOSE_H
#define BULKSHIM_INTERPOSE_H

#include "admit/admit.h"
#include "config/config.h"
#include "interpose/fdtable.h"
#include "interpose/names.h"
#include "log.h"
#include "sys.h"

/*
 * Nothing outside interpose/ includes this file: the CLI, the kernel
 * engine and the tests of the layers below never see the interposer's
 * globals. The wrappers call admission (admit/admit.h), never the other
 * way round: admission reaches this process's descriptors through the
 * callbacks of struct seg_host that init.c registers.
 */

/* ---- real.c: the real libc functions ---- */

struct addrinfo;
struct msghdr;
struct mmsghdr;
struct iovec;
struct timespec;
struct sigaction;
/* One member per name of BS_NAMES (names.h), of its own type. */
#define REAL_FIELD(kind, field, sym, ret, params, args, fallback) ret (*field) params;
struct real_fns {
	BS_NAMES(REAL_FIELD)
};
#undef REAL_FIELD

/* glibc declares these only for _FORTIFY_SOURCE builds (io.c defines the
 * wrappers). */
ssize_t __recv_chk(int, void *, size_t, size_t, int);
ssize_t __recvfrom_chk(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);
ssize_t __read_chk(int, void *, size_t, size_t);

/* Entries start at trampolines that bind on first use, so none is ever NULL. */
extern struct real_fns real BS_HIDDEN;

/* Binds every real function once with dlsym(RTLD_NEXT). Safe to call from
 * any wrapper at any time; a recursive call (dlsym calling back into a
 * wrapper) returns at once, and the trampolines then use the raw system
 * calls. Aborts if dlsym returns one of our own wrappers. */
void real_bind(void);
bool real_bound(void);
/* libc's syscall(n, a[0..5]) once bound, the instruction before. */
long real_syscall6(long n, const long a[6]);

/* ---- init.c, connect.c, spawn.c: the process-wide state ---- */

/* The shim's one global: filled by the constructor, read by the wrappers. */
struct shim_state {
	_Atomic int ready;	/* 1 once init finished with a usable segment */
	pid_t pid;		/* getpid() of this process, updated on fork */
	struct bs_config cfg;	/* as loaded at start-up */
	_Atomic(struct matcher *) m;	/* rules -> segment compartment indexes */
	_Atomic(struct matcher *) m_next; /* the rules a reload is putting in place */
	struct seg *seg;
	uint32_t cls;		/* this process's class, as a segment class index */
	_Atomic uint32_t gen;	/* segment generation the matcher was built for */
};
extern struct shim_state shim BS_HIDDEN;

/* True once start-up finished with a usable segment. */
static inline bool
shim_active(void)
{
	return atomic_load_explicit(&shim.ready, memory_order_acquire) != 0;
}
/* procid.c: how many ways to make a process the tables must not follow are
 * under way (the vfork, _Fork and clone wrappers raise it around their
 * call); while it is 0, no such process can exist. */
extern _Atomic int shim_unseen BS_HIDDEN;
/* True in a process that shares our memory but is not the one the tables
 * describe (a vfork child, a clone), or a copy of it the fork wrapper did
 * not prepare: its descriptors are not ours. A system call only while such
 * a process may exist; one load otherwise, inlined under LTO. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE bool shim_foreign(void);
#pragma GCC diagnostic pop
/* spawn.c: a child made without the fork wrapper is about to be made, by
 * this process: what it may inherit is watched (see spawn.c). True if the
 * caller must call spawn_done(true) after the call, in the parent. Both
 * keep errno. */
bool spawn_prepare(void);
void spawn_done(bool prepared);
/* Registers the fork handler that marks children of unseen forks. */
void shim_watch_forks(void);
/* In the child of the fork wrapper: it is seen; shim.pid becomes its pid. */
void shim_forked_seen(void);
/* Records that fd refers to slot (exec adoption). */
void shim_adopt_fd(int fd, uint32_t slot);
/* The errno a refusal of compartment c answers with (an allowed one). */
int shim_reject_errno(const struct seg_comp *c);
/* The program's own SO_RCVTIMEO or SO_SNDTIMEO (opt) of fd in ms, 0 if
 * none (io.c). */
uint64_t shim_own_timeout_ms(int fd, int opt);
/* True if a call with these flags may block on fd. One fcntl. */
bool shim_blocking(int fd, int flags);
/* Logs a refusal (rate-limited) in words that say why. */
void shim_log_refusal(const struct seg_comp *c, enum bs_reason why, const char *what,
    const char *dest);
/* What admission found for a descriptor it counted, handed down the path so
 * that the caller looks nothing up again. */
struct admitted {
	uint32_t slot;
	struct seg_comp *c;
	bool fresh;		/* the descriptor was marked fresh (fdt_mark_fresh) */
};
/* Decides a connect (or TCP Fast Open send) of fd to sa: TAKE_PASS when
 * nothing is to be counted, TAKE_OK when a permit was taken for fd (then
 * *got says which slot of which compartment), TAKE_FULL with errno set when
 * the compartment refused. */
enum take shim_admit(int fd, const struct sockaddr *sa, socklen_t len, const char *what,
    struct admitted *got);
/* After the real connect of an admitted descriptor (got): one that failed
 * at once gives its permit back. */
void shim_settle(int fd, long r, const struct admitted *got);
/* Rebuilds the destination rules if `bulkshim reload` changed them. */
void shim_maybe_reload(void);

/* ---- fds.c: descriptors that come and go ---- */

/* newfd is now a copy of oldfd: it holds the same socket, if any. */
void fds_copy(int oldfd, int newfd);
/* Copying a counted descriptor happens inside the fork gate (see fds.c):
 * true if fd is counted and the gate was entered; fds_gate_done leaves it
 * then. */
bool fds_gate_copy(int fd);
void fds_gate_done(bool in);
/* Forgets every counted descriptor in [first, last] after a range close. */
void fds_drop_range(unsigned first, unsigned last);
/* Forgets every table entry without giving anything back: the record they
 * were held under is gone. */
void fds_forget_all(void);

/* ---- faults.c: a running drill's faults (see faults.c) ---- */

/* True while a drill runs on c (then no socket of c gets a plain verdict);
 * logs this process's first sight of a drill's start and of its end. */
bool drill_running(struct seg_comp *c);
/* Before the real connect of fd, admitted in slot `slot` of c while c has
 * drill faults set: 0 to go on (*timeout_ms, the connect_timeout_ms left,
 * shortened by a delay), or -1 with errno (ECONNREFUSED, ETIMEDOUT, EINTR). */
int drill_connect(int fd, struct seg_comp *c, uint32_t slot, uint32_t *timeout_ms);
/* Before a send or a receive on fd (slot sl, table entry e) of c while c
 * has drill faults set: 0 to go on, or -1 with errno set. */
int drill_send(int fd, struct seg_slot *sl, struct seg_comp *c);
int drill_recv(int fd, struct seg_slot *sl, struct seg_comp *c, uint32_t e, int flags);

/* ---- signal.c: SIGBUS, the library's handler ahead of the program's ---- */

/* Puts the library's SIGBUS handler in place, the program's disposition
 * kept behind it (before the segment is first mapped). */
void signal_guard_start(void);

/* ---- deepbind.c: RTLD_DEEPBIND loads bound back to the wrappers ---- */

/* Loads file with `open` (libc's dlopen or dlmopen, given ctx), and when
 * the load brought objects in, points their GOT entries of the names the
 * shim exports at the shim's wrappers. Returns open's handle (NULL with
 * dlerror() set on failure, as dlopen). */
void *deepbind_load(void *(*open)(void *ctx, const char *file, int mode), void *ctx,
    const char *file, int mode);

/* ---- notice.c: start-up warnings, once per process tree ---- */

/* True the first time key is seen in this process tree (the keys travel in
 * BULKSHIM_NOTICED); constructor only, it calls setenv. */
bool notice_once(const char *key);
/* Counts a process that meant to attach to segment and runs inert, with
 * why, in the segment if this process may write it; else does nothing. */
void notice_unprotected(const char *segment, const char *why);
/* After a segment refused this user: who owns it and the config lines that fix it. */
void notice_denied(const struct bs_config *cfg);
/* After an attach: counts it; warns (once per tree) when the segment's live
 * limits differ from cfg's or it was set up from another config file. */
void notice_attached(const struct bs_config *cfg, struct seg *s);
/* Warns, once per process tree and segment, one line per host-name
 * destination of cfg that gave no address at load: its file and line, and
 * that nothing is limited for it until the program's own lookup finds it. */
void notice_unresolved(const struct bs_config *cfg);

#endif
