/* seg_layout.h - the shared segment's layout: the versioned ABI every reader of a segment shares. */
#ifndef BULKSHIM_SEG_LAYOUT_H
#define BULKSHIM_SEG_LAYOUT_H

#include "bulkshim.h"

/*
 * A segment is the POSIX shared-memory object /dev/shm/bulkshim.<name>:
 * a header (struct seg_header), then ncomp compartments (struct
 * seg_comp), nslots socket slots (struct seg_slot), nprocs process
 * records (struct seg_proc), and one bitmap row of nslots bits per
 * process record, each part starting on a 64-byte boundary and the whole
 * rounded up to a page (seg_layout_fill gives every offset). Every word a
 * process changes is a fixed-width atomic, so 32- and 64-bit processes and
 * processes of different builds agree on it, and nothing in it is a lock:
 * a process killed at any instruction leaves none behind.
 *
 * This is the whole of what the library, the CLI, the kernel engine and
 * the tests share about a segment. A change to any of it bumps
 * SEG_VERSION; a reader refuses a segment of another version (it checks
 * magic and version first, where every layout keeps them) and runs without
 * it rather than misread it. Nothing read from a segment is trusted: any
 * process that may write it may write anything (segment.c checks the
 * header against its mapping, and every index is bounds-checked against
 * the counts copied at attach).
 */

#define SEG_MAGIC	0x314d48534b4c5542ULL	/* "BULKSHM1" */
#define SEG_VERSION	10	/* bumped by every change to this file's structures */

/* SLOT_WATCHED: in use like SLOT_USED, but processes the tables cannot
 * name may hold the socket too (it was shared by a fork before it had a
 * slot, or by a fork whose child got no process record), so its holders
 * going to zero gives nothing back: the slot becomes SLOT_KERNEL, held by
 * nobody the tables know, and its permits go back once the kernel's socket
 * tables no longer list the socket with a file (reconcile.c). */
enum { SLOT_FREE = 0, SLOT_USED = 1, SLOT_INIT = 2, SLOT_RELEASING = 3, SLOT_WATCHED = 4,
	SLOT_KERNEL = 5 };
/* A slot that processes hold and drop (SLOT_USED or SLOT_WATCHED). */
#define SLOT_HELD(st)		((st) == SLOT_USED || (st) == SLOT_WATCHED)
/* A slot being set up (SLOT_INIT) or given back (SLOT_RELEASING) carries the
 * pid of the process doing it in the same word, claimed with one CAS, so a
 * reclaimer can tell a dead worker's slot from a live one's. */
#define SLOT_KIND(st)		((st) & 0xfu)
#define SLOT_BY(st)		((pid_t)((st) >> 4))
#define SLOT_BUSY(kind, pid)	((uint32_t)(kind) | (uint32_t)(pid) << 4)
/* PROC_EXITED: the process exited normally; its holds go back when it is
 * seen dead, after the kernel closed its sockets, so that the dependency
 * never sees more connections than permits. */
enum { PROC_FREE = 0, PROC_FORKING = 1, PROC_LIVE = 2, PROC_RECLAIMING = 3, PROC_EXITED = 4 };

/* Capacity shared by the compartments naming it. A compartment's permits
 * up to its guarantee count in its guar_in_use; those above it are
 * borrowed from the shared part, size - reserved - the sum of guarantees,
 * and count in `lent` (a tally, by slot). */
struct seg_pool {
	char name[BS_NAME_MAX];
	_Atomic uint32_t size;
	_Atomic uint32_t reserved;
	_Atomic uint32_t shared;	/* the limit of `lent` */
	_Atomic uint32_t sleepers;	/* waiters asleep on `lent`, roughly */
	_Atomic uint32_t lent;		/* a tally: permits lent above guarantees */
	_Atomic uint32_t lent_tag;
	_Atomic uint32_t peak;		/* most permits its members had in use at once */
	/* Its members' permits in use, a statistic the peak is raised from at
	 * every take (pool_note_use): counted after a permit's take and before
	 * its give, so it never reads more than the pool has in use. Not a
	 * tally: a thread killed between the two leaves it one low, until a
	 * reclaim finds the pool empty and sets it to 0 (pool_resync_use). */
	_Atomic uint32_t in_use_stat;
	_Atomic uint64_t rejected;	/* refusals for pool_full */
};

struct seg_header {
	uint64_t magic;
	uint32_t version;
	uint32_t header_size;
	uint64_t total_size;
	uint32_t ncomp, nslots, nprocs, bitmap_words;
	uint64_t off_comp, off_slots, off_procs, off_bitmaps;
	_Atomic uint32_t generation;
	uint32_t creator_uid;
	uint64_t created_ms;		/* CLOCK_REALTIME */
	_Atomic uint64_t last_reclaim_ms;	/* CLOCK_MONOTONIC */
	char name[BS_NAME_MAX];
	char config_path[PATH_MAX];	/* what `bulkshim reload` last applied */
	char class_name[BS_MAX_CLASSES][BS_CLASS_NAME_MAX];
	uint32_t nclass;
	/* Bumped after every change of a compartment's settings (start-up,
	 * `bulkshim set`, `bulkshim reload`): descriptors cache what their
	 * I/O needs against it (FDT_PLAIN). Only its low 31 bits count. */
	_Atomic uint32_t settings_seq;
	/* The pools (pool.c). */
	uint32_t npools;
	struct seg_pool pools[BS_MAX_POOLS];
	/* Who attached, and who meant to and ran without limits. */
	_Atomic uint64_t attaches;	/* processes that attached since creation */
	_Atomic uint64_t unprotected;	/* processes that meant to attach and ran inert */
	_Atomic uint64_t unprotected_ms;	/* CLOCK_REALTIME of the last one */
	char unprotected_why[256];	/* its reason, NUL-terminated */
	/* The config file that created the segment (or that `reload` last
	 * applied), by identity, so that a second file is noticed. */
	uint64_t config_dev, config_ino;
	/* "COMP KEY\n" for each setting `bulkshim set` changed since the
	 * last reload, so that reload can say which live changes it undoes. */
	char live_set[2048];
};

/* Why a call was refused (or, in observe mode, would have been). */
enum bs_reason {
	REASON_FULL,		/* max_connections reached */
	REASON_INFLIGHT_FULL,	/* max_inflight reached */
	REASON_WAIT_TIMEOUT,	/* waited max_wait_ms for nothing */
	REASON_TOO_MANY_WAITING,	/* max_waiting callers already wait */
	REASON_CLASS_FULL,	/* the caller's class used its class limit */
	REASON_NO_SLOT,		/* the segment's socket table is full (max_sockets) */
	REASON_POOL_FULL,	/* the pool's shared part is lent out (pool.c) */
	REASON_CLASS_SHARED_FULL,	/* the compartment's unguaranteed part is lent out (share.c) */
	REASON_PROCESS_TABLE_FULL,	/* the segment's process table is full (max_processes) */
	REASON_MAX
};
/* The reasons counted in seg_comp's first arrays (rejected_by,
 * would_reject); the later ones in the arrays that follow them, added as the
 * layout grew: stat_reason_count() finds the counter of any reason. */
#define REASON_V2	6
#define REASON_V3	7	/* and those from here in the _v4 arrays */

/* Log-scale latency histogram: bucket i counts values in [2^(i-1), 2^i)
 * microseconds (bucket 0: below 1 us); the last bucket takes the rest. */
#define BS_HIST_BUCKETS 32
struct seg_hist {
	_Atomic uint64_t bucket[BS_HIST_BUCKETS];
	_Atomic uint64_t count;
	_Atomic uint64_t sum_us;
};

/* Per compartment and class: the class's own permits. */
struct seg_class {
	_Atomic uint32_t limit;		/* 0 = no cap */
	_Atomic uint32_t peak;
	_Atomic uint32_t in_use;	/* a tally: the next word is its tag */
	_Atomic uint32_t in_use_tag;
	_Atomic uint64_t admitted;
	_Atomic uint64_t rejected;
};

/*
 * The adaptive limit of a compartment (adaptive.c). `ctl` is the one word
 * the controller moves, by compare-and-swap: the limit in 1/16ths, the
 * latency baseline and the controller's phase. Admission reads only it (and
 * `mode`); the other words are for the CLI, written after a change.
 */
enum { AD_NONE = 0, AD_ON = 1, AD_OFF = 2 };	/* AD_OFF: pinned by `set` */
enum ad_reason { AD_R_NONE, AD_R_START, AD_R_RAMP, AD_R_GROW, AD_R_QUEUE, AD_R_SLOWER,
	AD_R_PINNED, AD_R_RESUMED, AD_R_MAX };
/* The controller that moves a compartment's adaptive limit: bulkshim's own
 * (adaptive.c), or one of the published ones, written from their
 * descriptions (Netflix concurrency-limits' Vegas, Gradient2 and AIMD,
 * Envoy's adaptive concurrency gradient controller: ad_published.c). */
enum ad_algorithm { AD_ALG_BULKSHIM = 0, AD_ALG_VEGAS = 1, AD_ALG_GRADIENT2 = 2, AD_ALG_AIMD = 3,
	AD_ALG_ENVOY = 4, AD_ALG_MAX };
struct seg_adaptive {
	_Atomic uint32_t mode;		/* AD_NONE: not adaptive */
	_Atomic uint32_t kind;		/* P_INFLIGHT or P_CONN: the permits it limits */
	_Atomic uint32_t min, max;
	_Atomic uint32_t window_ms, tolerance_pct;
	_Atomic uint32_t static_limit;	/* the configured limit, restored by adaptive=on */
	_Atomic uint32_t last_reason;	/* enum ad_reason of the last change */
	_Atomic uint64_t ctl;		/* see AD_CTL_* below */
	_Atomic uint64_t acc;		/* the open window: samples << 44 | sum of us */
	_Atomic uint64_t win_start_us;	/* CLOCK_MONOTONIC start of the open window */
	_Atomic uint64_t sample_us;	/* mean latency of the last closed window */
	_Atomic uint64_t sample_conc16;	/* its mean concurrency, in 1/16ths */
	_Atomic uint64_t windows;	/* windows closed */
	_Atomic uint64_t changes;	/* windows that moved the limit */
	_Atomic uint64_t last_change_ms;	/* CLOCK_REALTIME, 0 = never */
	_Atomic uint32_t last_from, last_to;
	_Atomic uint32_t algorithm;	/* enum ad_algorithm */
	/* Knobs of the published controllers (ad_alg.h's struct ad_pub_params). */
	_Atomic uint32_t timeout_ms, backoff_pct, min_rtt_interval_ms, min_concurrency;
	_Atomic uint32_t win_min_us;	/* the open window's shortest sample, 0 = none yet */
	/* The state a published controller keeps beside `ctl` (its long
	 * and short latency averages, say), each word changed by
	 * compare-and-swap like ctl. The bulkshim controller uses alg[0]
	 * and alg[1] while it learns its first baseline, and after it alg[0]
	 * for the spread of a varying service time, alg[1] for the open
	 * window's slow replies (atomic adds) with the edge above them, and
	 * alg[2], alg[3] for a baseline kept and the knee (adaptive.c). */
	_Atomic uint64_t alg[4];
};

/*
 * seg_adaptive's ctl word: the limit in 1/16ths in bits 0..23, the latency
 * baseline in microseconds in bits 24..49, and the controller's phase above
 * (adaptive.c's struct ad_state: ramping, windows at the floor (3 bits), a
 * probe under way, the last window high, the ratio at the first cut of a run
 * or before a probe, cuts that did not help).
 * acc, the open window: samples << 44 | the sum of their microseconds.
 */
#define AD_LIMIT_BITS	24	/* the limit in 1/16ths: up to 2^20 permits */
#define AD_BASE_BITS	26	/* baseline microseconds: up to 67 s */
#define AD_BASE_MAX	((1u << AD_BASE_BITS) - 1)
#define AD_CTL_LIMIT(w)	((uint32_t)((w) & ((1u << AD_LIMIT_BITS) - 1)))
#define AD_CTL_BASE(w)	((uint32_t)(((w) >> AD_LIMIT_BITS) & AD_BASE_MAX))
#define AD_CTL_RAMP	(1ULL << 50)
#define AD_CTL_FLOOR(w)	((uint32_t)(((w) >> 51) & 0x7))
#define AD_CTL_PROBE	(1ULL << 54)
#define AD_CTL_HIGH	(1ULL << 55)
#define AD_CTL_PREV(w)	((uint32_t)(((w) >> 56) & 0x3f))
#define AD_CTL_STUCK(w)	((uint32_t)((w) >> 62))
#define ACC_N_SHIFT	44
#define ACC_SUM_MASK	((1ULL << ACC_N_SHIFT) - 1)

/* Admissions per second for the last BS_RATE_SECONDS seconds: each entry
 * packs (second << 32 | count), second being CLOCK_MONOTONIC seconds. */
#define BS_RATE_SECONDS 64

/*
 * A drill (bulkshim drill): faults the library puts on a compartment's
 * connections for a while, written by the CLI and read by every attached
 * process at its next call. A drill runs while `faults` is not 0 and the
 * CLOCK_MONOTONIC millisecond is below `deadline_ms`: it ends on time with
 * no process left to end it. The CLI writes the settings, then
 * deadline_ms, then faults, then bumps `id` and the header's settings_seq;
 * a stop clears faults and deadline_ms and bumps both again.
 */
enum { DRILL_DELAY = 1, DRILL_STALL = 2, DRILL_REFUSE = 4, DRILL_RESET = 8,
	DRILL_CONNECT_DELAY = 16 };
struct seg_drill {
	_Atomic uint32_t allowed;	/* the config's `drills`: 1 = a drill may run */
	_Atomic uint32_t faults;	/* DRILL_* of the running drill, 0 = none */
	_Atomic uint32_t delay_ms;	/* DRILL_DELAY: each reply this much later */
	_Atomic uint32_t connect_delay_ms;	/* DRILL_CONNECT_DELAY */
	_Atomic uint32_t fraction_ppm;	/* connections it touches, per million */
	_Atomic int32_t by_pid;		/* the CLI that started it */
	_Atomic uint64_t id;		/* bumped by every start and every stop */
	_Atomic uint64_t start_ms;	/* CLOCK_MONOTONIC */
	_Atomic uint64_t deadline_ms;	/* CLOCK_MONOTONIC; over at or after it */
	_Atomic uint64_t start_realtime_ms;	/* CLOCK_REALTIME, for the views */
	_Atomic uint64_t touched;	/* calls the running drill delayed, stalled, refused or reset */
	_Atomic uint64_t spared;	/* calls of matched connections it could not touch */
};

struct seg_comp {
	char name[BS_NAME_MAX];
	_Atomic uint32_t limit;		/* max_connections; UINT32_MAX = none */
	_Atomic uint32_t peak;
	/* Tallies (tally.c): each count is followed by its tag word. */
	_Atomic uint32_t in_use;	/* connection permits granted by the rules */
	_Atomic uint32_t in_use_tag;
	_Atomic uint32_t inflight;
	_Atomic uint32_t inflight_tag;
	_Atomic uint32_t over;		/* connections let past a full limit in observe mode */
	_Atomic uint32_t over_tag;
	_Atomic uint32_t inflight_over;	/* likewise for requests in flight */
	_Atomic uint32_t inflight_over_tag;
	_Atomic uint32_t waiting;	/* callers waiting for a permit now */
	_Atomic int32_t reject_errno;
	_Atomic uint32_t enforce;	/* 0 = observe: count, refuse nothing */
	_Atomic uint32_t inflight_limit;	/* UINT32_MAX = none */
	_Atomic uint32_t inflight_peak;
	_Atomic uint32_t max_wait_ms;
	_Atomic uint32_t max_waiting;
	_Atomic uint32_t connect_timeout_ms;
	_Atomic uint32_t io_timeout_ms;
	/* The id of the kernel engine's compartment map that counts this
	 * compartment's connections with the library's, 0 = none: written by
	 * `bulkshim attach` and `reload`, cleared when the engine is unloaded.
	 * While it is set every admission takes a permit of the joint count
	 * in that map as well (P_KERN, shim/admit/kjoint.c). */
	_Atomic uint32_t kernel;
	_Atomic uint64_t admitted;
	_Atomic uint64_t rejected;	/* sum of rejected_by */
	_Atomic uint64_t last_rejection_ms;	/* CLOCK_REALTIME, 0 = never */
	_Atomic uint64_t reclaimed;	/* permits taken back from dead processes */
	_Atomic uint64_t inflight_admitted;
	_Atomic uint64_t connect_timeouts;
	_Atomic uint64_t io_timeouts;
	_Atomic uint64_t peak_rate;	/* most admissions seen in one second */
	_Atomic uint64_t rejected_by[REASON_V2];
	_Atomic uint64_t would_reject[REASON_V2];
	_Atomic uint64_t rate[BS_RATE_SECONDS];
	struct seg_hist h_connect;	/* the connect's duration */
	struct seg_hist h_reply;	/* first send to first reply byte */
	struct seg_hist h_wait;		/* time spent waiting for a permit */
	struct seg_class cls[BS_MAX_CLASSES];
	/* Pools (pool.c). */
	_Atomic uint32_t pool;		/* pool index + 1, 0 = none */
	_Atomic uint32_t guaranteed;	/* the guarantee; the ceiling is `limit` */
	_Atomic uint32_t guar_in_use;	/* unused (guarantees are share.c's) */
	_Atomic uint32_t guar_in_use_tag;
	_Atomic uint64_t rejected_by_more[REASON_V3 - REASON_V2];
	_Atomic uint64_t would_reject_more[REASON_V3 - REASON_V2];
	_Atomic uint32_t lent_hint;	/* the slot that borrowed last: where a rebalance looks first */
	uint32_t pad2;
	struct seg_adaptive ad;		/* the adaptive limit (adaptive.c) */
	_Atomic uint64_t reconciled;	/* permits whose socket the kernel had closed unseen */
	/* Fleet budgets: the agent (tools/fleet.c) writes this host's share
	 * and when its lease ends; admission reads them through
	 * limit_conn() (admit/limit.c). */
	_Atomic uint32_t fleet_limit;	/* 0 = not in a fleet budget */
	_Atomic uint32_t fleet_floor;
	_Atomic uint32_t fleet_share;	/* this host's share while the lease lasts */
	_Atomic uint32_t fleet_redis_ok;	/* 1: the agent's last round trip succeeded */
	_Atomic uint64_t fleet_expiry_ms;	/* CLOCK_MONOTONIC end of the lease, 0 = none */
	_Atomic uint64_t fleet_renewed_ms;	/* CLOCK_MONOTONIC of the last renewal */
	_Atomic int32_t fleet_agent_pid;	/* 0 = no agent has run */
	_Atomic uint32_t fleet_hosts;	/* hosts holding a lease, as Redis last said */
	/* The classes' guaranteed shares of the compartment
	 * (share.c). When cls_shares is 1 every class takes a class permit
	 * (its ceiling is cls[k].limit); one beyond cls_guaranteed[k] also
	 * takes one of the compartment's unguaranteed part, counted in the
	 * tally cls_lent, whose limit cls_shared is limit - the guarantees. */
	_Atomic uint32_t cls_guaranteed[BS_MAX_CLASSES];
	_Atomic uint32_t cls_shared;
	_Atomic uint32_t cls_shares;
	_Atomic uint32_t cls_lent;
	_Atomic uint32_t cls_lent_tag;
	_Atomic uint64_t rejected_by_v4[REASON_MAX - REASON_V3];
	_Atomic uint64_t would_reject_v4[REASON_MAX - REASON_V3];
	/* What the fleet agent last told Redis and saw, for the views: this
	 * host's demand (the most it needed over the last lease), and how
	 * often its share changed, in changes per minute times 100. */
	_Atomic uint32_t fleet_demand;
	_Atomic uint32_t fleet_churn_c;
	/* The gate of the compartment's refusal lines, shared by every
	 * process of the segment so that they print one a second between
	 * them (log_gate_due, shim/log.c): the CLOCK_MONOTONIC millisecond
	 * of the last line + 1 in the high LOG_GATE_TIME_BITS bits (0 =
	 * never), the lines suppressed since in the low LOG_GATE_COUNT_BITS. */
	_Atomic uint64_t log_gate;
	struct seg_drill drill;		/* the running drill, if any */
};

#define SLOT_NO_CLASS	0xffu
#define SLOT_NO_COMP	0xffffffffu	/* a pending slot: no permit yet */

/*
 * The permits a slot can stand for, each counted in one tally of its
 * compartment. A slot's `mark` word holds its generation in the high bits
 * (bumped each time the slot is taken), for each kind P a flag
 * MARK_HELD(P), a wide sequence and a few flags. MARK_HELD(P)
 * is only what the last change of P's tally away from this slot said (see
 * tally.c): whether the slot holds P is tally_held, which reads the
 * tally's tag first. MARK_RELEASED: the release gave everything back.
 */
/* P_CLENT: one of the compartment's unguaranteed part, lent to a class
 * beyond its guarantee; P_LENT: one of a pool's shared part, lent to a
 * compartment beyond its guarantee (share.c). A permit within a guarantee
 * is no kind of its own: MARK_GUARANTEED says so. P_KERN: one of the joint
 * count that the compartment shares with a kernel engine (seg_comp's
 * `kernel`), a tally in the engine's map (kjoint.c). */
enum permit_kind { P_CONN, P_CLASS, P_OVER, P_INFLIGHT, P_INFLIGHT_OVER, P_CLENT, P_LENT,
	P_KERN, P_KINDS };
#define MARK_HELD(p)	(1ULL << (p))
#define MARK_HELD_ALL	(MARK_HELD(P_KINDS) - 1)
#define MARK_RELEASED	(1ULL << 8)	/* released: holds nothing, takes nothing */
#define MARK_WAITING	(1ULL << 9)	/* counted in its compartment's `waiting` */
/* Moved on by every reflection of a tally into the mark (tally.c), so that
 * a compare-and-swap prepared before one fails; 30 bits, it never wraps
 * while a thread is preempted. */
#define MARK_SEQ	(0x3fffffffULL << 10)
#define MARK_SEQ_ONE	(1ULL << 10)
#define MARK_SEQ_OF(m)	((uint32_t)(((m) & MARK_SEQ) >> 10))
/* The slot's generation, 22 bits, above the sequence. */
#define MARK_GEN_SHIFT	40
#define MARK_GEN_MASK	0x3fffffu
#define MARK_GEN(m)	((uint32_t)((m) >> MARK_GEN_SHIFT) & MARK_GEN_MASK)
#define MARK_OF_GEN(g)	((uint64_t)((g) & MARK_GEN_MASK) << MARK_GEN_SHIFT)
/* The slot's permit of a guaranteed-share level (enum
 * share_level) was within its guarantee: no permit of the level's shared
 * part stands for it. Not counted anywhere (share.c explains why none is
 * needed); it only tells a release to pass the guarantee on. */
#define MARK_GUARANTEED(l)	(1ULL << (62 + (l)))

/* Requests of a compartment with max_inflight: one in REQ_SAMPLE has its
 * reply latency timed, recorded with weight REQ_SAMPLE (all of them while
 * the compartment's adaptive limit is on). */
#define REQ_SAMPLE	16u
#define SENT_WEIGHTED	(1ULL << 63)
/* Connects: every one is timed while its compartment admits up to
 * CONNECT_EXACT in a second; beyond that in the same second, one in
 * REQ_SAMPLE, recorded with weight REQ_SAMPLE (connect_us | SENT_WEIGHTED). */
#define CONNECT_EXACT	64u

/* One counted socket object, shared by every process holding it. */
struct seg_slot {
	_Atomic uint32_t state;
	_Atomic uint32_t comp;		/* or SLOT_NO_COMP while pending */
	/* The processes whose bitmap has this slot, and in the next word the
	 * tag of the last change, locked while it is under way (slot.c). */
	_Atomic uint32_t holders;
	_Atomic uint32_t holders_tag;
	_Atomic uint32_t cls;		/* class permit held, or SLOT_NO_CLASS */
	_Atomic int32_t op_pid;		/* process that set up the slot or waits on it */
	_Atomic uint64_t inode;		/* st_ino of the socket, unique host-wide */
	_Atomic uint64_t mark;		/* generation << 40 | sequence | permit flags */
	/* CLOCK_MONOTONIC of a timed request's first send, 0 if it is not
	 * timed; SENT_WEIGHTED: timed as one of REQ_SAMPLE (permit.c). */
	_Atomic uint64_t sent_us;
	/* Admission time until the connect is timed, 0 if it is not timed;
	 * SENT_WEIGHTED: timed as one of REQ_SAMPLE (CONNECT_EXACT). */
	_Atomic uint64_t connect_us;
	_Atomic uint64_t admit_us;	/* admission time, for adaptive connections */
};

/* The tag of a slot's holders count (slot.c): record index + 1, whether
 * the change dropped a hold, 12 bits of the record's generation, HTAG_LOCK
 * while the change is under way, and HTAG_SOLE when the count is 1 and the
 * record the tag names holds the slot alone without a bit in its row (the
 * slot's first hold). */
#define HTAG_DROP	(1u << 17)
#define HTAG_SOLE	(1u << 30)
#define HTAG_LOCK	(1u << 31)
#define HTAG_GEN_MASK	0xfffu
#define HTAG_REC(t)	((t) & 0x1ffffu)
#define HTAG_GEN(t)	(((t) >> 18) & HTAG_GEN_MASK)
#define HTAG(gen, drop, rec)	(((gen) & HTAG_GEN_MASK) << 18 | ((drop) ? HTAG_DROP : 0) | ((rec) + 1))

/* One process that holds or held permits; its bitmap row says which slots. */
struct seg_proc {
	_Atomic uint32_t state;
	_Atomic int32_t owner;		/* forking parent, or the reclaimer */
	/* pid and gen are one 64-bit word: a fork publishes its child's pid
	 * only into the record of the generation it prepared. */
	_Atomic int32_t pid;
	_Atomic uint32_t gen;		/* bumped each time the record is claimed */
	uint32_t uid;
	_Atomic uint32_t fork_locked;	/* a FORKING record has its fork lock */
	_Atomic uint64_t start;		/* start time in clock ticks, 0 = unknown */
	_Atomic uint64_t since_ms;	/* CLOCK_MONOTONIC when a fork claimed it */
};

/*
 * A tally (tally.c) is a 32-bit count of permits and, in the word after
 * it, a tag naming the last slot operation that changed it; both change by
 * one 64-bit compare-and-swap. The tag: bit 31 set for a give, bits 27..30
 * four bits of the slot's generation, then a stamp down to bit ib, and the
 * slot index + 1 (0: none) in bits 0..ib-1, where ib is as many bits as
 * the segment's slot count needs (32 - clz(nslots | 1)). The counts that
 * are tallies say so where they are declared.
 */
#define TAG_GIVE	(1u << 31)
#define TAG_GEN_SHIFT	27
#define TAG_GEN_MASK	0xfu
/* Each count and its tag word change by one 64-bit compare-and-swap. */
_Static_assert(offsetof(struct seg_comp, in_use) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_comp, inflight) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_comp, over) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_comp, inflight_over) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_class, in_use) % 8 == 0, "tally alignment");
_Static_assert(BS_MAX_SOCKETS <= (1u << 20), "a tag has room for a stamp of 6 bits");
_Static_assert(P_KINDS <= 8, "mark flags fit");
_Static_assert(offsetof(struct seg_comp, cls_lent) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_pool, lent) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_header, pools) % 8 == 0, "tally alignment");

static inline size_t
seg_align_up(size_t v, size_t a)
{
	return (v + a - 1) & ~(a - 1);
}

/* Fills the layout fields of h for the given counts: every offset and the
 * total size. A segment is valid only if its header holds exactly these. */
static inline void
seg_layout_fill(struct seg_header *h, uint32_t ncomp, uint32_t nslots, uint32_t nprocs)
{
	h->header_size = sizeof(*h);
	h->ncomp = ncomp;
	h->nslots = nslots;
	h->nprocs = nprocs;
	h->bitmap_words = (nslots + 63) / 64;
	h->off_comp = seg_align_up(sizeof(*h), 64);
	h->off_slots = seg_align_up(h->off_comp + (uint64_t)ncomp * sizeof(struct seg_comp), 64);
	h->off_procs = seg_align_up(h->off_slots + (uint64_t)nslots * sizeof(struct seg_slot), 64);
	h->off_bitmaps = seg_align_up(h->off_procs + (uint64_t)nprocs * sizeof(struct seg_proc), 64);
	h->total_size = seg_align_up(h->off_bitmaps +
	    (uint64_t)nprocs * h->bitmap_words * sizeof(uint64_t), 4096);
}

#endif
