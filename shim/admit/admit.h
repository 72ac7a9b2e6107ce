/* admit.h - admission and the counts in the shared segment: the API of admit/ for the interposer and the CLI. */
#ifndef BULKSHIM_ADMIT_H
#define BULKSHIM_ADMIT_H

#include "bulkshim.h"
#include "config/config.h"
#include "seg_layout.h"

/*
 * The files of admit/, from the bottom up; each calls only those below it:
 *   (admit.h)   the accessors of a mapped segment, inline
 *   adaptive.c  the adaptive limit's controller
 *   limit.c     the limit a take is held to now: static, fleet lease, adaptive
 *   tally.c     counts that a thread killed at any instruction cannot leave wrong
 *   share.c     guaranteed shares, one mechanism for pools and classes
 *   pool.c      pools
 *   stats.c     statistics: histograms, rates, refusals by reason
 *   slot.c      a counted socket's whole life: claim, holds, drop, release
 *   proc.c      process records: reclaim of the dead, fork, exec, exit
 *   reconcile.c holds checked against the kernel
 *   kjoint.c    the count a compartment shares with a kernel engine
 *   permit.c    admission: take, wait, refuse; requests in flight
 *   segment.c   creating, validating and attaching a segment, and its settings
 * tally.h, share.h and pool.h hold the inline steps of admission, private
 * to admit/.
 */

/* What a step of admission found: one result type from a tally's
 * compare-and-swap up to the wrapper's decision. */
enum take {
	TAKE_OK,	/* taken: the permit is the slot's (a connect: counted) */
	TAKE_FULL,	/* refused at a limit (the reason beside it says which) */
	TAKE_BUSY,	/* the slot is not what the caller took it for: it holds the
			 * permit already, was released, or another thread won */
	TAKE_MISS,	/* a fast path's case does not apply: nothing done */
	TAKE_SHARED,	/* another process sharing the socket admits it, or did */
	TAKE_PASS,	/* nothing to count: the call goes through untouched */
};

/* What the process hosting admission lends it (the preloaded library; NULL
 * in the CLI, the tests and the benchmarks, whose permits stand for no
 * descriptor and would look like sockets gone unseen). */
struct seg_host {
	/* Whether a call on descriptor fd (with these send flags) may block:
	 * asked only when a connect finds its compartment full and could
	 * wait (the descriptor admission was given as its `wait`). */
	bool (*blocking)(int fd, int flags);
	/* This process's descriptor table, for reconcile.c: one past the
	 * highest descriptor recorded, the slot + 1 recorded for fd (0: none),
	 * and forgetting fd if it still records e (true if it did). */
	int (*fd_high)(void);
	uint32_t (*fd_slot)(int fd);
	bool (*fd_forget)(int fd, uint32_t e);
};

/* A kernel engine's compartment map as this process sees it (kjoint.c):
 * mapped on first need, the id of the map mapped (0: none), and per
 * compartment of the segment the address of its joint count in that map
 * (0: none). */
struct seg_kern {
	char segment[BS_NAME_MAX];	/* the name attached by, not the header's */
	_Atomic uint32_t id;
	_Atomic uint32_t busy;		/* a thread is mapping it */
	_Atomic uint32_t warned;
	void *map;
	_Atomic uintptr_t joint[BS_MAX_COMPARTMENTS];
};

/* ---- segment.c: mapping, validating and attaching a segment ---- */

/* The process-local handle of a mapped segment. */
struct seg {
	void *base;
	size_t size;
	struct seg_header *h;
	struct seg_comp *comp;
	struct seg_slot *slots;
	struct seg_proc *procs;
	_Atomic uint64_t *bits;
	/* The header's counts, copied when the segment is mapped and checked
	 * against its size: every bounds check uses these, so that a process
	 * writing other counts into the shared header later cannot move a
	 * check past the mapping. */
	uint32_t ncomp, nslots, nprocs, bitmap_words;
	_Atomic uint32_t *lcount;	/* per slot: descriptors in this process */
	int *cmap;			/* config compartment -> segment compartment */
	size_t ncmap;
	_Atomic int rec;		/* this process's record, or -1 */
	/* Threads of this process claiming a record now, and until when a
	 * table found full is not looked at again (proc.c). */
	_Atomic uint32_t claiming;
	_Atomic uint64_t full_until_ms;
	_Atomic uint32_t hint;		/* where the next slot search starts */
	/* The fields of a tally tag, whose slot index takes as few bits as
	 * the segment's slot count needs (tally.c, set by segment.c). */
	uint32_t tag_imask, tag_wmask, tag_smask, tag_one, tag_sshift;
	uint64_t my_start;
	pid_t my_pid;			/* getpid(), updated by proc_fork_child */
	uint64_t ino;			/* the segment object's inode */
	/* The fork gate: threads changing what this process holds are
	 * `busy`; fork raises `forking` and waits for busy to drain, so the
	 * child's record is a snapshot of a still moment (proc.c). */
	_Atomic uint32_t busy;
	_Atomic uint32_t forking;
	/* The holders word of a slot that record `rec` holds alone (slot.c),
	 * kept so that a connect and a close need not build it; 0 when not
	 * known (then it is built). */
	_Atomic uint64_t sole;
	/* The host's callbacks, or NULL (see struct seg_host). With them a
	 * full compartment is reconciled against the kernel before a
	 * refusal (reconcile.c). */
	const struct seg_host *host;
	/* Set once the mapping shrank under this process and was replaced
	 * by zero pages (guard.c): nothing in it is the segment any more. */
	_Atomic int lost;
	struct seg_kern kern;		/* kjoint.c */
};

/* Creates or attaches the segment that cfg names and maps each compartment of
 * cfg to the segment's compartment of the same name. The descriptor is closed
 * before returning. Returns 0 or -errno with a message in err. */
int seg_attach(const struct bs_config *cfg, struct seg **out, char *err, size_t errlen);
/* Maps an existing segment by name, for the CLI; writable asks for O_RDWR.
 * Validates it like seg_attach. Returns 0 or -errno with a message in err. */
int seg_open(const char *name, bool writable, struct seg **out, char *err, size_t errlen);
void seg_close(struct seg *s);
/* For `bulkshim run`: -EPERM with the reason and the fix in err if the
 * object at cfg's segment name belongs to someone seg_attach would not
 * trust and would not replace, so that the program would run without
 * limits; 0 otherwise (none there yet, or one it may use). */
int seg_check_owner(const struct bs_config *cfg, char *err, size_t errlen);

/* ---- mappers.c: who maps a segment's object ---- */

/* How many processes other than this one map inode ino at a path ending in
 * path (every /proc/PID/maps this user may read); the first max of their
 * pids in pids. -errno without /proc. Not async-signal-safe. */
int seg_mappers(uint64_t ino, const char *path, pid_t *pids, int max);

/* ---- guard.c: a mapping that shrinks under the process ---- */

/* Lists s's mapping (shm_name: "/bulkshim.NAME") for guard_fault, from
 * when it is mapped (segment.c) until guard_unwatch before its unmap. */
void guard_watch(struct seg *s, const char *shm_name);
void guard_unwatch(const struct seg *s);
/* Called by a SIGBUS handler with the faulting address: if it lies in a
 * listed mapping, replaces that mapping by private zero pages, marks the
 * segment lost, logs one line and returns the segment (the access can be
 * retried); NULL if the fault is not the segment's. Async-signal-safe. */
struct seg *guard_fault(const void *addr);
/* True once s's mapping was replaced (see guard_fault). */
bool guard_lost(const struct seg *s);

/* The accessors below read the handle and the mapping only: every layer
 * may use them. */

/* The size to suggest for a table of n entries found full (max_sockets,
 * max_processes): twice n, at most max. */
static inline uint32_t
seg_table_grown(uint32_t n, uint32_t max)
{
	return n >= max / 2 ? max : n * 2;
}

static inline struct seg_header *
seg_header(const struct seg *s)
{
	return s->h;
}

/* Compartment i and slot i, or NULL if out of range. Inline: every counted
 * call reads them. */
static inline struct seg_comp *
seg_comp(const struct seg *s, uint32_t i)
{
	return i < s->ncomp ? &s->comp[i] : NULL;
}

static inline struct seg_slot *
seg_slot(const struct seg *s, uint32_t i)
{
	return i < s->nslots ? &s->slots[i] : NULL;
}

/* The compartment a slot names, or NULL (a pending slot, or garbage). */
static inline struct seg_comp *
seg_slot_comp(const struct seg *s, const struct seg_slot *sl)
{
	return seg_comp(s, atomic_load(&sl->comp));
}

/* Process record i, or NULL if out of range. */
static inline struct seg_proc *
seg_proc(const struct seg *s, uint32_t i)
{
	return i < s->nprocs ? &s->procs[i] : NULL;
}
/* Record rec's bitmap row: one bit per socket slot it holds. */
static inline _Atomic uint64_t *
seg_row(const struct seg *s, uint32_t rec)
{
	return s->bits + (size_t)rec * s->bitmap_words;
}

/* The pool of compartment c, or NULL. */
static inline struct seg_pool *
seg_pool_of(const struct seg *s, const struct seg_comp *c)
{
	uint32_t p = atomic_load_explicit(&c->pool, memory_order_relaxed);

	if (p == 0 || p > s->h->npools || p > BS_MAX_POOLS)
		return NULL;
	return &s->h->pools[p - 1];
}

/* seg_pool_of for admission and release: only the bound memory safety
 * needs. A pool word past npools (a damaged segment) names a pool of
 * zeros, which lends nothing. */
static inline struct seg_pool *
seg_pool_at(const struct seg *s, const struct seg_comp *c)
{
	uint32_t p = atomic_load_explicit(&c->pool, memory_order_relaxed) - 1;

	return p < BS_MAX_POOLS ? &s->h->pools[p] : NULL;
}

/* The compartment's max_wait_ms for a wait about to begin: attach checks
 * the word, but it is shared and may be written over later; a value no
 * config gives (above BS_MAX_WAIT_MS) is damage and waits not at all. */
static inline uint32_t
seg_max_wait_ms(const struct seg_comp *c)
{
	uint32_t ms = atomic_load_explicit(&c->max_wait_ms, memory_order_relaxed);

	return ms <= BS_MAX_WAIT_MS ? ms : 0;
}

/* Takes one off *v unless it is 0 (a damaged segment must not wrap a count
 * around to 4 billion); returns the new value. */
static inline uint32_t
seg_dec_floor(_Atomic uint32_t *v)
{
	uint32_t cur = atomic_load(v);

	while (cur > 0 && !atomic_compare_exchange_weak(v, &cur, cur - 1))
		;
	return cur > 0 ? cur - 1 : 0;
}

/* Writes a compartment's configured limits and settings into the segment
 * (at creation, on a fresh start, and for `bulkshim reload`). */
void seg_apply_limits(struct seg_comp *c, const struct cfg_compartment *cc);
/* Says that some compartment's settings changed, after the change (bumps
 * the settings sequence): every process re-reads them at the next I/O of
 * each counted socket. */
void seg_settings_changed(struct seg *s);
/* The segment index of config compartment i, or -1. */
int seg_comp_index(const struct seg *s, size_t cfg_index);
/* The segment index of the compartment named name, or -1. */
int seg_comp_find(const struct seg *s, const char *name);
/* Counts the bits set in a process's bitmap row. */
uint32_t seg_proc_held(const struct seg *s, uint32_t i);
/* Records the identity (device, inode) of config file path in h, for the
 * warning about two files on one segment; 0 when it cannot be read. */
void seg_note_config(struct seg_header *h, const char *path);
/* The shared-memory object name of a segment: "/bulkshim.<segment>", cut
 * to fit len (NUL-terminated). */
static inline void
seg_shm_name(const char *segment, char *out, size_t len)
{
	static const char prefix[] = "/bulkshim.";
	size_t n = 0;

	for (; n + 1 < len && n < sizeof(prefix) - 1; n++)
		out[n] = prefix[n];
	for (; n + 1 < len && *segment != '\0'; n++)
		out[n] = *segment++;
	if (len > 0)
		out[n] = '\0';
}

/* ---- adaptive.c: the limit that sizes itself from measured latency ---- */

/* The controller's state, unpacked from seg_adaptive.ctl. */
struct ad_state {
	uint32_t limit16;	/* the limit in 1/16ths */
	uint32_t base_us;	/* latency baseline, 0 = none yet */
	bool ramp;		/* still ramping (doubling) since the start */
	uint32_t floor_windows;	/* windows in a row at the floor with latency high */
	bool high;		/* the last window was above the tolerance */
	uint32_t prev16;	/* latency / baseline in 1/16ths at the first cut of a run,
				 * or of the window before a probe */
	uint32_t stuck;		/* cuts of the run that did not lower the latency */
	bool probe;		/* the limit was lowered to see whether latency falls */
	/* Beside ctl, in seg_adaptive's alg[2] and alg[3] (keep_load): the
	 * baseline the backend had before it was found slower (0 = none) and
	 * when, and when the baseline was last taken anew (the start or a
	 * slower backend); seconds of CLOCK_MONOTONIC. */
	uint32_t kept_us, kept_s, base_s;
	/* Also in alg[3] (its upper half, keep_load): `knee`, a limit of a
	 * few permits whose latency was found to be the backend's own (the
	 * permit below it served less: processor sharing), 0 = none, sure
	 * (knee_ok) once the permit above it was found to serve no more, and
	 * when it was last found or tried (knee_s); a step of one whole
	 * permit under test (knee_test): the limit it was taken from, that
	 * window's latency / baseline in 1/16ths, whether it was a step up
	 * from the knee, and whether the window after it (whose replies were
	 * admitted before it) is over. */
#define AD_KNEE_S_MASK	0x1fffU	/* knee_s is kept modulo this + 1 */
#define AD_KNEE_MAX	8	/* permits: a limit where one is 1/8 or more of it */
#define AD_KNEE_RETRY_S	30	/* the permit above a sure knee is tried this often */
	uint32_t knee, knee_s, test_n, test_r16;
	bool knee_ok, test_up, test_seen;
	/* In alg[1]'s upper bits (keep_load), on a regular service time:
	 * `edge`, one permit above where the last cut of a queue landed (the
	 * least limit known to queue; 0 = none), and `peak`, the highest edge
	 * that a step to it found again (0 = none): the limit below the edge
	 * steps up to it only now and then, seldom at the peak, often below
	 * it (a capacity that came back). edge_n counts the edges found again
	 * below the peak (after AD_PEAK_AGAIN the peak is forgotten),
	 * edge_seen the first window at the edge (its replies were admitted
	 * below it), and climb the steps of an edge that moves up (the step
	 * is 2^(climb - 1) permits; 0: it does not). */
#define AD_EDGE_MAX	0xffffU	/* permits: a higher edge is not kept */
#define AD_PEAK_AGAIN	15	/* edges found again below the peak that forget it */
#define AD_CLIMB_MAX	7	/* a climbing edge steps by at most 2^(this - 1) */
	uint32_t edge, peak, edge_n, climb;
	bool edge_seen;
};
struct ad_params {
	uint32_t min, max, tolerance_pct;
	bool observe;		/* enforce = false: the limit holds nothing back */
};
/* One closed window: samples, their mean latency and the mean concurrency
 * (Little's law: the sum of latencies over the window's length). */
struct ad_window {
	uint64_t n, mean_us, conc16;
	bool stall;		/* a stall window: ages of requests in flight */
	/* Of a stall window: the replies that came in it, and their mean. */
	uint64_t done, done_mean_us;
	bool probe_due;		/* a periodic probe may start at this window's end */
	uint64_t end_us;	/* CLOCK_MONOTONIC when it closed (ad_published.c) */
	uint64_t min_us;	/* its shortest reply, 0 = not known (a stall) */
	/* The service time's own coefficient of variation x 16, as the first
	 * baseline measured it (0: a regular service time): how far a
	 * window's mean of n samples strays by chance. */
	uint32_t spread16;
	/* Replies slower than AD_SLOW_PCT of the baseline among the `done`
	 * (0 = not counted): on a regular service time only a queue makes
	 * them, one in about L/(L - C) at L in flight on C servers. */
	uint64_t slow;
	bool edge_due;		/* the limit below the edge may step to it (the
				 * clock crossed AD_EDGE_WINDOWS windows) */
};
#define AD_SLOW_PCT	125	/* a reply this much of the baseline waited */
#define AD_QUEUE_KEPT	16	/* the slow replies' queue kept: in flight / this */
#define AD_EDGE_WINDOWS	4	/* off the peak, the step to the edge this often */
#define AD_PROBE_WINDOWS	32	/* a probe, or a step to the peak, at most this often */
/* The adaptive controller's rule (ad_step.c). */
uint64_t ad_pack(const struct ad_state *st);
void ad_unpack(uint64_t ctl, struct ad_state *st);
/* The pure controller: the state after window w; returns the reason of a
 * change of the limit (AD_R_NONE: none). */
enum ad_reason ad_step(const struct ad_params *p, struct ad_state *st, const struct ad_window *w);
/* v (1/16ths) within p's min and max. */
uint32_t ad_clamp16(const struct ad_params *p, uint64_t v);
/* The adaptive limit of c now (whole permits), UINT32_MAX if c has none. */
uint32_t ad_current(const struct seg_comp *c);
/* The knee the bulkshim controller holds c's limit at (permits: one more
 * cost latency past the tolerance and served less than a quarter more), 0
 * if none; *sure once the step above it was tried and failed. */
uint32_t ad_knee(const struct seg_comp *c, bool *sure);
/* The edge of c's bulkshim controller (permits: the least limit its slow
 * replies showed a queue at), 0 if none; *again once a step onto it met
 * the queue again (it is stepped onto every AD_PROBE_WINDOWS windows then,
 * every AD_EDGE_WINDOWS before). */
uint32_t ad_edge(const struct seg_comp *c, bool *again);
/* Inlined into admission under LTO (BS_LTO_INLINE). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
/* The limit a take of permit kind p in c is held to now: `lim`, or the
 * adaptive limit when lower. One load when c is not adaptive. */
BS_LTO_INLINE uint32_t ad_limit(const struct seg_comp *c, int p, uint32_t lim);
/* Whether c's adaptive limit is on and limits permit kind p. */
BS_LTO_INLINE bool ad_on(const struct seg_comp *c, int p);
#pragma GCC diagnostic pop
/* A request of c (of permit kind p) completed after us microseconds: adds
 * the sample to the open window; the completion that finds the window over
 * closes it (one CAS decides who) and moves the limit (one CAS on ctl). */
void ad_sample(struct seg_comp *c, int p, uint64_t us, uint64_t now_us);
/*
 * A stalled backend gives no completions to close a window. An admission
 * attempt in c (compartment ci of its segment) while its adaptive limit is
 * on asks ad_stall_due: true when c's open window is overdue, the replies
 * that came in it are not slow ones already on their way, and this process
 * has not scanned c's slots for a quarter of window_ms; then *now is the
 * time, *start the window's start and *old the age past which a request
 * counts as stalled (twice the tolerated latency). The caller counts the
 * requests in flight and the stalled ones (slot_ages) and gives them to
 * ad_stall, which closes the window with their ages as samples when most
 * of what is in flight is stalled. Lock-free and async-signal-safe.
 */
bool ad_stall_due(struct seg_comp *c, uint32_t ci, uint64_t *now, uint64_t *old,
    uint64_t *start);
void ad_stall(struct seg_comp *c, uint64_t start, uint64_t now, uint64_t n, uint64_t sum,
    uint64_t inflight);
/* `bulkshim reset`: zeroes the adaptive statistics (windows, changes, last
 * change, last sample); the limit and its baseline stay. */
void ad_reset_stats(struct seg_comp *c);
/* Writes the configured adaptive settings into c (seg_apply_limits). */
void ad_apply(struct seg_comp *c, const struct cfg_compartment *cc);
/* `set NAME adaptive=off`: pins the current limit into the static word
 * (ad_pin); `on`: resumes from the pinned limit (the static word, within
 * min..max) with the configured static limit back. Returns -EINVAL if c
 * is not adaptive. */
int ad_set_mode(struct seg_comp *c, bool on);
/* `set NAME max_inflight V` (the limit c's adaptive one moves) while it is
 * adaptive, on or pinned already: pins it at V (mode off, the controller's
 * limit V, which it no longer moves), noting the pin as the last change.
 * The caller has written V into the static word. Nothing for a compartment
 * that is not adaptive. */
void ad_pin(struct seg_comp *c, uint32_t v);
const char *ad_reason_name(unsigned r);
const char *ad_mode_name(unsigned mode);

/* drill.c: a drill's words in a compartment (seg_layout.h's seg_drill). */
#define DRILL_PPM	1000000u
/* The longest drill (the CLI's --for at most): the library acts on none
 * whose deadline is further from its start, nor on one that starts in the
 * future, so that no words written into a segment make a wait longer. */
#define DRILL_MAX_MS	(10ULL * 60 * 1000)
struct drill_view {
	uint64_t id;
	uint64_t deadline_ms;
	uint32_t faults, delay_ms, connect_delay_ms, fraction_ppm;
};
/* Reads c's drill whole into v; returns its faults if it runs at now_ms
 * (CLOCK_MONOTONIC), else 0 (also in v->faults). */
uint32_t drill_read(struct seg_comp *c, uint64_t now_ms, struct drill_view *v);
bool drill_running_at(struct seg_comp *c, uint64_t now_ms);
/* Whether the drill v touches the connection of socket inode `inode`
 * (its fraction_ppm, 0 = all). */
bool drill_picks(const struct drill_view *v, uint64_t inode);
/* Starts drill v (faults, settings, deadline_ms) on c: 0, -EPERM when
 * c does not allow drills, -EBUSY when one runs or is being written. The
 * caller bumps the segment's settings_seq after. */
int drill_start(struct seg_comp *c, const struct drill_view *v, uint64_t now_ms,
    uint64_t real_ms, pid_t by);
/* Ends c's drill, running or dead; true if one was set. */
bool drill_end(struct seg_comp *c);
/* Windows with fewer completions than this close only after ten windows'
 * time (ad_sample), and a stall check trusts no mean of fewer. */
#define AD_MIN_SAMPLES		4

/* ---- limit.c: the limit a take is held to now ---- */

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
/*
 * The connection limit admission enforces now: max_connections, lowered in
 * a fleet budget to this host's share while its lease lasts, and to
 * fleet_floor once the lease has passed by this host's own clock, so that an
 * agent killed or cut off from Redis cannot keep a share that Redis gives
 * away (the agent's lease ends before Redis's does). One load unless the
 * compartment is in a fleet; lock-free and async-signal-safe. Inlined into
 * admission under LTO.
 */
BS_LTO_INLINE uint32_t limit_conn(const struct seg_comp *c);
/* The limit a take of kind p counted against the limit word `limit` is
 * held to now: the word, or lower, the fleet share (P_CONN, limit_conn)
 * and the adaptive limit (P_CONN and P_INFLIGHT, ad_limit) of the
 * compartment whose word it is. */
BS_LTO_INLINE uint32_t limit_now(_Atomic uint32_t *limit, int p);
#pragma GCC diagnostic pop
/* The level whose limit binds a compartment now, lowest first; a tie goes
 * to the level listed first. limit_why names the first four; the views
 * add a pool's room and a class's (tools/snapshot.c). */
enum limit_by {
	LIMIT_BY_NONE,		/* no limit at all */
	LIMIT_BY_STATIC,	/* max_connections or max_inflight, as set */
	LIMIT_BY_FLEET_SHARE,	/* this host's leased share of a fleet budget */
	LIMIT_BY_FLEET_FLOOR,	/* fleet_floor: no valid lease */
	LIMIT_BY_ADAPTIVE,	/* the adaptive limit */
	LIMIT_BY_POOL,		/* what its pool can still lend it, and what it holds */
	LIMIT_BY_CLASS,		/* a class at its own limit */
	LIMIT_BY_MAX
};
/* The limit limit_now holds a take of kind p (P_CONN or P_INFLIGHT) of c
 * to, with in *by the level it comes from (LIMIT_BY_NONE for UINT32_MAX).
 * The same reads as limit_now, once more: for what a refusal says and
 * what the views show. Lock-free and async-signal-safe; cannot fail. */
uint32_t limit_why(const struct seg_comp *c, int p, enum limit_by *by);
/* The level's name as the views and the refusal line say it ("fleet
 * floor"); "?" for a value out of range. */
const char *limit_by_name(enum limit_by by);

/* ---- tally.c: counts that a killed thread cannot leave wrong ---- */

/* Whether slot (of generation gen) of compartment c holds permit kind p: its
 * tally's tag if that names the slot, else the slot's mark. */
bool tally_held(const struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p);
/* tally_held for the tally count, which the caller knows is p's of slot. */
bool tally_held_at(const struct seg *s, uint32_t slot, uint32_t gen, int p,
    _Atomic uint32_t *count);

/* ---- share.c: guaranteed shares, one mechanism for pools and classes ---- */

/* The two levels: a compartment's share of its pool, a class's share of
 * its compartment. */
enum share_level { SHARE_POOL, SHARE_CLASS, SHARE_LEVELS };
/* The guarantee of level l of compartment c (class cls, for SHARE_CLASS)
 * went from old to now (set, reload). Raised: up to the difference of its
 * permits lent by the shared part move onto it. Lowered: up to the
 * difference of its permits within it become lent ones, past the shared
 * part's limit if need be, so that a lowered guarantee is never exceeded. */
void share_guarantee_changed(struct seg *s, struct seg_comp *c, uint32_t cls, enum share_level l,
    uint32_t old, uint32_t now);
/* The compartment's classes' shared part: its limit less their
 * guarantees (after a change of either). */
void share_update_classes(struct seg_comp *c);

/* ---- pool.c: pools, guarantees, lending ---- */

/* The permits pool p has in use now, and in *lent_derived (if not NULL)
 * how many of them are above their compartments' guarantees. */
uint32_t pool_in_use(const struct seg *s, uint32_t p, uint32_t *lent_derived);
/* Recomputes pool p's shared part after a change of its size, reserve or
 * guarantees, and wakes its waiters. */
void pool_update_shared(struct seg *s, uint32_t p);
/* Writes cfg's pools, guarantees and (if membership, for a segment nobody
 * uses) which compartment is in which pool into the segment; cmap maps
 * config compartments to the segment's. */
void pool_apply(struct seg *s, const struct bs_config *cfg, const int *cmap, bool membership);
/* NULL if the segment has cfg's pools and memberships (cmap: config
 * compartment -> segment compartment), else what differs. */
const char *pool_mismatch(const struct seg *s, const struct bs_config *cfg, const int *cmap);
/* Zeroes pool p's refusals and restarts its peak from what its members
 * have in use now (`bulkshim reset`); never a permit, a count in use or a
 * size. Does nothing for p past the segment's pools. */
void pool_reset_counters(struct seg *s, uint32_t p);

/* ---- stats.c: statistics, never a permit ---- */

/* Records one value in a histogram. Lock-free. */
void stat_hist_add(struct seg_hist *h, uint64_t us);
/* Records one sample standing for n values. */
void stat_hist_add_n(struct seg_hist *h, uint64_t us, uint64_t n);
/* The counter of refusals (would: of observe-mode would-rejects) of c for
 * reason why, or NULL for no such reason. */
_Atomic uint64_t *stat_reason_count(struct seg_comp *c, enum bs_reason why, bool would);
/* A short name for a reason: "full", "inflight_full", "wait_timeout",
 * "too_many_waiting", "class_full", "no_slot", "pool_full",
 * "class_shared_full", "process_table_full"; "unknown" for any other
 * value. */
const char *stat_reason_name(enum bs_reason why);
/* Counts a refusal of compartment c for reason why. */
void stat_refused(struct seg *s, struct seg_comp *c, enum bs_reason why);
/* Zeroes every statistic of compartment c: counts, rejections by reason,
 * would-rejects, rates, histograms, timeouts, class counts; peaks restart
 * from what is held now. Permits, limits and settings are left alone. */
void stat_reset(struct seg_comp *c);
/* The connect of slot's socket, of compartment c, completed (or the socket
 * was first used, which is when an event loop's non-blocking connect is
 * known to have completed): records the time since admission in
 * h_connect, once; nothing if the connect is not timed. */
void stat_connect_time(struct seg *s, uint32_t slot, struct seg_comp *c);
/* The same for slot of compartment c, known to the caller (connect).
 * Inlined into the connect under LTO: a connect that is not timed
 * (CONNECT_EXACT) pays one load. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE void stat_connect_done_in(struct seg *s, uint32_t slot, struct seg_comp *c);
#pragma GCC diagnostic pop

/* ---- slot.c: a counted socket's whole life ---- */

/* Claims a free slot for this process's socket with inode ino, held by
 * record rec (proc_record) through one descriptor, with no permit yet: a
 * pending slot, for a socket about to be admitted, or shared with a child
 * about to be forked before its connect. Returns the slot or -ENOSPC. */
int slot_claim(struct seg *s, int rec, uint64_t ino);
/* slot_claim for the pending slot a fork shares (an unconnected socket of
 * this process): only from the slots that admissions the limits allow can
 * never need, so that entries holding no permit refuse nobody. -ENOSPC when
 * those are taken: the socket is then shared without a slot, and the
 * connect that follows takes a watched one (permit_claim). */
int slot_claim_shared(struct seg *s, int rec, uint64_t ino);
/* True if slot is pending: held, but no compartment admitted it yet. */
bool slot_pending(const struct seg *s, uint32_t slot);
/* True if slot holds a connection permit (or an observe-mode one). */
bool slot_admitted(const struct seg *s, uint32_t slot);
/* Another local descriptor refers to slot. */
void slot_hold(struct seg *s, uint32_t slot);
/* A local descriptor of slot is gone; the permit goes back when the last
 * descriptor in the last process holding the socket is gone. A slot past
 * the table is ignored: the interposer passes its descriptor table's entry
 * (slot + 1, 0 for none) less one, and UINT32_MAX is none. */
void slot_drop(struct seg *s, uint32_t slot);
/* Drops record rec's hold of slot, if it has one; the last hold releases
 * the slot's permits (slot_release). True if this drop released it. */
bool slot_drop_hold(struct seg *s, int rec, uint32_t slot, bool reclaimed);
/* Word w of record rec's holds: its row's word w and the slots w * 64 ..
 * w * 64 + 63 it holds alone through their holders word (HTAG_SOLE). For
 * readers that list a record's holds (reconcile, the CLI). */
uint64_t slot_held_bits(const struct seg *s, uint32_t rec, uint32_t w);
/* Finds the slot of a socket inode, or -1. */
int slot_find_inode(const struct seg *s, uint64_t ino);

/* ---- proc.c: process records, reclaim of the dead, fork, exec, exit ---- */

/* This process's record, claimed on first need. Returns it, or -ENOSPC
 * when the process table is full. */
int proc_record(struct seg *s);
/* Takes back the permits of dead processes. When `throttle` is true it runs
 * at most every 100 ms host-wide. Returns the number of processes reclaimed. */
int proc_reclaim(struct seg *s, bool throttle);
/* The fork gate: a thread about to change what this process holds in a way
 * a concurrent fork must not split enters it; fork waits for it to empty
 * (a bounded wait: a signal handler may fork while its own thread is in). */
void proc_gate_enter(struct seg *s);
void proc_gate_leave(struct seg *s);
/* fork closes the gate; proc_fork_child and proc_fork_parent open it. */
void proc_gate_close(struct seg *s);
/* A fork under way: the child's record (-1: none), its generation, and the
 * descriptor holding the record's fork lock (-1: none). */
struct proc_fork {
	int rec;
	uint32_t gen;
	int lockfd;
};
/* Fork support: before fork, builds the child's process record holding every
 * slot this process holds, into *f. After fork, call proc_fork_child(s, f) in
 * the child and proc_fork_parent(s, f, pid) in the parent (pid < 0 undoes the
 * record); both close the lock descriptor. */
void proc_fork_prepare(struct seg *s, struct proc_fork *f);
/* False if the child's record was lost (reclaimed): the caller forgets its
 * descriptors and adopts what it still can with proc_adopt. */
bool proc_fork_child(struct seg *s, const struct proc_fork *f);
void proc_fork_parent(struct seg *s, const struct proc_fork *f, pid_t pid);
/* A child made without fork() (vfork, posix_spawn, clone, _Fork) gets no
 * record: nothing in the tables will say what it inherited. Before it is
 * made, proc_spawn_prepare closes the gate (as fork does) and watches every
 * slot this process holds (slot_watch), so that no close of ours gives back
 * a permit the child may still hold: the reconcile does, once the kernel
 * has no file of the socket left. proc_spawn_done, in the parent after the
 * call, opens the gate. */
void proc_spawn_prepare(struct seg *s);
void proc_spawn_done(struct seg *s);
/* Adopts the record this PID had before exec (same start time) and slots of
 * inherited descriptors; `cb` is told each descriptor that refers to a slot.
 * Slots of the old image without a descriptor left are dropped. */
void proc_adopt(struct seg *s, void (*cb)(int fd, uint32_t slot));
/* Releases everything this process holds and frees its record at once. */
void proc_detach_all(struct seg *s);
/* Normal exit: marks this process's record exited, so that its holds go
 * back (and the record is freed) as soon as it is dead, at the next reclaim,
 * which this makes run unthrottled; not while the kernel still has its
 * sockets open or its other threads still run. */
void proc_exit(struct seg *s);

/* ---- reconcile.c: holds checked against the kernel ---- */

/* Gives back the holds whose socket is gone: this process's recorded
 * descriptors (s->host's table) by fstat, other live processes' holds (of
 * compartment c, or all if c is NULL) through /proc/PID/fd. Never drops a
 * hold on doubt. Returns the permits given back (each counted in
 * `reconciled`). */
int reconcile_run(struct seg *s, const struct seg_comp *c);
/* A connection permit of compartment c was found missing, for `why`
 * (REASON_FULL, or REASON_POOL_FULL: then the stale permit may be another
 * compartment's and every one is reconciled): reconciles, at most every
 * 100 ms per process and only in a process whose permits are its
 * descriptors (s->host). Returns the permits given back, after which
 * admission takes once more (before it would wait). A connect that finds
 * room pays nothing for this. */
int reconcile_refused(struct seg *s, const struct seg_comp *c, enum bs_reason why);
/* A class of compartment c is at its cap, or its unguaranteed part has
 * nothing left to lend: reclaims dead holders and reconciles c (each
 * throttled). Returns the permits given back, after which admission tries
 * the class's permits once more. */
int reconcile_class_full(struct seg *s, const struct seg_comp *c);
/* The slots no process the tables know holds any more (SLOT_KERNEL,
 * slot.c), checked against the kernel's socket tables: those whose socket
 * no file refers to go back. Returns the permits given back. Part of
 * reconcile_run; alone at attach, before leftovers are reset. */
int reconcile_kernel_held(struct seg *s);
/* A slot of this process's was just left to the kernel (SLOT_KERNEL): the
 * next reconcile of this process runs unthrottled, so that a connect that
 * finds its compartment full right after the close asks the kernel at
 * once. Async-signal-safe (one store). */
void reconcile_soon(void);
/* The socket table has no free slot: reclaims dead holders and reconciles
 * every hold, and the slots no process the tables know holds any more
 * (each throttled), after which the claim is tried once more. */
void reconcile_table_full(struct seg *s);

/* ---- kjoint.c: the count a compartment shares with a kernel engine ---- */

struct kern_comp;
/* kjoint_of's slow path: maps the engine's map of id `id` in this process
 * (system calls only), or looks again in the one mapped for an entry it
 * gained, and returns c's joint count in it, or NULL when the map cannot
 * be reached (said once, loudly) or has no entry for c. */
_Atomic uint32_t *kjoint_map(const struct seg *s, const struct seg_comp *c, uint32_t id);
/* The joint count of compartment c in its kernel engine's map, or NULL
 * when no engine counts c (its `kernel` word is 0) or this process cannot
 * reach it. Async-signal-safe. */
static inline _Atomic uint32_t *
kjoint_of(const struct seg *s, const struct seg_comp *c)
{
	uint32_t id = atomic_load(&c->kernel), i = (uint32_t)(c - s->comp);
	uintptr_t j;

	if (id == 0 || i >= BS_MAX_COMPARTMENTS)
		return NULL;
	if (atomic_load_explicit(&s->kern.id, memory_order_acquire) == id &&
	    (j = atomic_load_explicit(&s->kern.joint[i], memory_order_relaxed)) != 0)
		return (_Atomic uint32_t *)j;
	return kjoint_map(s, c, id);
}
/* After slot's connection permit of c, whose compartment an engine counts
 * too: one permit of the joint count (P_KERN) under c's limit. TAKE_OK,
 * TAKE_FULL (also when this process cannot reach the map: refused rather
 * than counted apart), or TAKE_BUSY. */
enum take kjoint_take(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen,
    uint32_t *seen);
/* After observe mode let slot's connection of c past a full limit, c
 * being counted with an engine: one permit of the joint count past its
 * limit (the connection is open), and the engine's peak raised to what
 * both engines hold. Cannot fail (a process that cannot reach the map
 * counts nothing there). */
void kjoint_take_over(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen);
/* Tells the engine that socket fd (about to connect, admitted by the
 * library into c) is the library's, so that its program does not count it
 * again when this process is in its cgroup. Best effort: failing, the
 * socket is counted twice (held longer, never over). Leaves errno. */
void kjoint_mark(const struct seg *s, const struct seg_comp *c, int fd);
/* For `bulkshim attach` and `reload`, with map (of id `id`) mapped
 * writable: every compartment of the segment that has an entry in it is
 * counted with it from now on (its `kernel` word), and the connections the
 * library holds in a compartment newly counted go into its joint count.
 * Compartments without an entry are no longer counted with an engine.
 * Returns the connections it counted in. */
uint32_t kjoint_adopt(struct seg *s, struct kern_comp *map, uint32_t id);
/* At attach (segment.c, under the segment's lock): if an engine is
 * loaded for the segment, kjoint_adopt with its map, so that a segment
 * made again after `attach` is counted with it too; with `reset` (nobody
 * holds a process record) each joint count goes back to the engine's own
 * part first. No engine: no compartment is counted with one (a word left
 * over or damaged is cleared). Says so when this process may not look. */
void kjoint_probe(struct seg *s, bool reset);
/* The engine is unloaded: no compartment is counted with it any more. */
void kjoint_forget(struct seg *s);
/* Unmaps this process's view of the map (seg_close). */
void kjoint_unmap(struct seg *s);

/* ---- permit.c: admission, waiting, requests in flight ---- */

/* An admission attempt in c (permit kind p) while c's adaptive limit is on
 * and limits p: a stalled backend, seen without replies (most of what is in
 * flight older than twice the tolerated latency), cuts the limit before the
 * attempt is decided (ad_stall_due, slot_ages, ad_stall). Lock-free and
 * async-signal-safe; nothing when c is not adaptive. */
void permit_tick(struct seg *s, struct seg_comp *c, int p);
/* Whether admission may wait for a permit of a full compartment: never,
 * always (the tests' permit_acquire), or if the descriptor given (>= 0) is
 * blocking, which is asked (s->host->blocking, a system call) only then. */
#define WAIT_NEVER	(-1)
#define WAIT_ALWAYS	(-2)
/* Admits the pending slot (which this process holds) into compartment c,
 * class cls: the connection permit, and the class's if that class is
 * capped. When c is full and `wait` allows (WAIT_NEVER, WAIT_ALWAYS or the
 * descriptor whose blocking mode decides), waits up to c's max_wait_ms on
 * a futex. In observe mode a call that would be refused is let through and
 * counted in would_reject. TAKE_OK; TAKE_FULL with *why when refused (the
 * slot is pending again); TAKE_SHARED if another process sharing the
 * socket is admitting it. */
enum take permit_admit(struct seg *s, uint32_t slot, struct seg_comp *c, uint32_t cls, int wait,
    enum bs_reason *why);
/* Claims a pending slot for this process's socket of inode ino, about to
 * be admitted into c (which may be NULL), held by this process's record
 * (claimed on first need) through one descriptor. `unseen`: processes the
 * tables cannot name may have the socket too (it was made before a fork
 * that gave it no pending slot, or comes from elsewhere), so the slot is
 * watched (slot_watch). Returns the slot, or -ENOSPC with *why: the
 * process table is full (REASON_PROCESS_TABLE_FULL), or the socket table
 * even after dead holders and sockets closed unseen gave theirs back
 * (REASON_NO_SLOT, or REASON_FULL when c is at its limit anyway). */
int permit_claim(struct seg *s, struct seg_comp *c, uint64_t ino, bool unseen,
    enum bs_reason *why);
/* The pending slot that a fork shared, for this process's connect of its
 * socket (inode ino): this process holds it from now on, if it did not.
 * Returns the slot; -ESTALE if it is no longer that socket's or was given
 * back (then the caller claims one of its own, watched); -ENOSPC with *why
 * REASON_PROCESS_TABLE_FULL when this process can have no record. */
int permit_share(struct seg *s, uint32_t slot, uint64_t ino, enum bs_reason *why);
/* A new slot for a socket of inode ino, admitted into c as permit_admit
 * does (waiting if may_wait), for callers without a descriptor table (the
 * tests, the benchmarks). Returns the slot index, or -EBUSY with *why set
 * when refused, -EINVAL for no compartment. */
int permit_acquire(struct seg *s, struct seg_comp *c, uint32_t cls, uint64_t ino, bool may_wait,
    enum bs_reason *why);
/* A send on slot's socket: the socket becomes in flight unless it is already.
 * Returns 1 if this call made it in flight, 0 if it already was (or the
 * compartment does not count requests), -EBUSY with *why when refused. */
int permit_inflight_begin(struct seg *s, uint32_t slot, bool may_wait, enum bs_reason *why);
/* permit_inflight_begin and the end of a request (recording its reply
 * latency if `record`) for slot, whose mark m the caller read before its
 * compartment c (so that a slot reused meanwhile fails on its generation). */
int permit_request_begin(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c,
    bool may_wait, enum bs_reason *why);
/* permit_request_begin's common case alone: no request let through by
 * observe mode, no adaptive limit, the take on the slot's own give with room
 * and no new peak. 1 if the request is counted, 0 if not (the slot was
 * released meanwhile), -1 if it is not that case (nothing done: the caller
 * goes permit_request_begin's whole way). */
int permit_request_quick(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c);
void permit_request_end(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c,
    bool record);
/* The common end of a request alone: an untimed request of slot (of
 * generation gen) in c, ended by the give on the slot's own take. True if
 * it ended it; false if not that case (nothing done). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE bool permit_reply_quick(struct seg *s, uint32_t slot, uint32_t gen,
    struct seg_comp *c);
#pragma GCC diagnostic pop
/* The reply (a byte, end of file or a hard error) arrived: the request in
 * flight ends and its latency is recorded. */
void permit_inflight_end(struct seg *s, uint32_t slot);
/* The send that began a request failed, or the request was abandoned (an
 * I/O timeout, a hard error): end it without recording a reply latency. */
void permit_inflight_cancel(struct seg *s, uint32_t slot);
/* Whether slot of compartment c has a request counted in flight, let past
 * the limit in observe mode or not. */
bool permit_in_flight(const struct seg *s, uint32_t slot, struct seg_comp *c);

#endif
