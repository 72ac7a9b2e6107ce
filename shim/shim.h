/* shim.h - the one internal header of libbulkshim.so and the bulkshim CLI. */
#ifndef BULKSHIM_SHIM_H
#define BULKSHIM_SHIM_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#define BS_EXPORT __attribute__((visibility("default")))
/* On the shim's globals read by every wrapper: addressed directly, not
 * through the global offset table. */
#define BS_HIDDEN __attribute__((visibility("hidden")))
/* A function of one file that the library's build (link-time optimised,
 * -DBS_LTO) inlines into its callers in other files: the permit takes of a
 * connect. Elsewhere (the CLI, the tests, `make SHIM_LTO=`) a plain call. */
#ifdef BS_LTO
#define BS_LTO_INLINE __attribute__((always_inline))
#else
#define BS_LTO_INLINE
#endif

#define BS_VERSION		"0.1.0"
#define BS_NAME_MAX		64	/* compartment and segment names, with NUL */
#define BS_HOST_MAX		256	/* host names in rules, with NUL */
#define BS_UNIX_PATH_MAX	108	/* sizeof(sun_path) */
#define BS_MAX_COMPARTMENTS	1024
#define BS_MAX_RULES		100000
#define BS_MAX_LIMIT		1000000	/* larger limits are taken for typos */
#define BS_MAX_WAIT_MS		600000	/* max_wait_ms */
#define BS_MAX_TIMEOUT_MS	3600000	/* connect_timeout_ms, io_timeout_ms */
#define BS_MAX_PROCESSES	65536
#define BS_MAX_SOCKETS		(1u << 20)
#define BS_LEARNED_MAX		1024	/* addresses learned from getaddrinfo */
#define BS_DEFAULT_CONFIG	"/etc/bulkshim/bulkshim.cfg"
#define BS_EX_CONFIG		78	/* sysexits.h EX_CONFIG */
#define BS_ERRLEN		1024

/* ---- log.c: levels, async-signal-safe formatting ---- */

enum bs_log_level { LOG_OFF, LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };

/* Sets the level from a BULKSHIM_LOG value; returns -EINVAL for an unknown word. */
int log_set_level(const char *word);
int log_get_level(void);
/* Writes "bulkshim[pid]: <message>\n" to stderr with one write(2) if level is
 * enabled. Supports %s %d %u %ld %lu %lld %llu %x %c %%; async-signal-safe.
 * Overlong messages are cut and end in "...". */
void bs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same formatter into a buffer; returns the length written (without NUL). */
size_t bs_format(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Logs a rejection for compartment `comp`, at most once a second per
 * compartment, with the count of the lines it suppressed since the last one. */
void log_rejection(unsigned comp, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* BULKSHIM_LOG_FORMAT and the config's log_format: "text" (the default,
 * "bulkshim[pid]: message") or "json" (one object a line); -EINVAL else. */
int log_set_format(const char *word);
bool log_is_json(void);
/* The program name JSON lines carry (cut at 63 bytes). */
void log_set_program(const char *name);
/* A refusal, for log_refusal: the human message and its fields. */
struct log_refusal {
	const char *message;
	const char *compartment, *reason, *operation, *destination;
	uint32_t in_use, limit;		/* limit UINT32_MAX: none */
};
/* True when a rejection line of compartment comp may go out now (at most
 * one a second per compartment), with the count suppressed since the last
 * one in *skipped; false counts this one as suppressed. Async-signal-safe. */
bool log_rejection_due(unsigned comp, uint64_t *skipped);
/* Writes the line of a refusal that log_rejection_due let through, as text
 * or JSON; async-signal-safe. */
void log_refusal(const struct log_refusal *r, uint64_t skipped);
/* Milliseconds of CLOCK_MONOTONIC and CLOCK_REALTIME; microseconds of
 * CLOCK_MONOTONIC. */
uint64_t now_mono_ms(void);
uint64_t now_mono_us(void);
/* Whole seconds of CLOCK_MONOTONIC, read from the cheaper coarse clock (a
 * tick behind it at most). */
uint64_t now_mono_s(void);
uint64_t now_real_ms(void);

/* ---- match.c, match_parse.c: destination rules, pure ---- */

enum rule_kind { RULE_IP = 1, RULE_UNIX, RULE_HOST };

/* One destination of a compartment. IPv4 is kept as IPv4-mapped IPv6 so that
 * ::ffff:a.b.c.d and a.b.c.d match the same rules. */
struct rule {
	int kind;
	uint8_t addr[16];	/* RULE_IP: network address, masked */
	int prefix;		/* RULE_IP: 0..128 */
	uint16_t port_lo, port_hi;
	char path[BS_UNIX_PATH_MAX + 1];	/* RULE_UNIX; '@' first = abstract */
	char host[BS_HOST_MAX];	/* RULE_HOST, lower case; for a RULE_IP /128
				 * resolved from a name at load, that name */
	int comp;		/* compartment index */
	int line;		/* config line, for messages */
};

struct matcher;

/* Parses one destination string into *r (comp and line are left alone).
 * Returns 0, or -EINVAL with a reason in err. */
int match_parse(const char *text, struct rule *r, char *err, size_t errlen);
/* Builds the lookup tables for n rules. RULE_HOST rules are kept for
 * match_learn; their resolved addresses are added by the caller as RULE_IP.
 * Returns NULL with a reason in err (out of memory, duplicate rule). */
struct matcher *match_build(const struct rule *rules, size_t n, char *err, size_t errlen);
/* The compartment of the most specific rule matching sa, or -1. Lock-free,
 * no allocation, async-signal-safe. */
int match_find(const struct matcher *m, const struct sockaddr *sa, socklen_t len);
/* Records that `host` resolved to sa: if a RULE_HOST rule names host, sa is
 * matched from now on with that rule's ports. Returns the compartment, -1 if
 * no rule names host, or -ENOSPC when the learned table is full. */
int match_learn(struct matcher *m, const char *host, const struct sockaddr *sa);
/* Learns into `to` every address `from` knows for a host name, the ones
 * resolved at load and the ones learned since, so that new rules built at a
 * reload keep what the process found: each address of a name that `to`
 * still has a rule for then matches with that rule's ports and compartment.
 * Safe while `from` is in use. Returns how many of `from`'s addresses (one
 * per port range of a name) name a host that `to` has, or -ENOSPC when
 * `to`'s learned table filled up. */
int match_carry(struct matcher *to, const struct matcher *from);
/* Puts m in place of the rules in *cur, after carrying into m what those
 * knew (match_carry); *next names m meanwhile, for match_learn_in. One
 * publisher at a time. The old rules stay allocated: another thread may
 * still be reading them. Returns match_carry's count, or -ENOSPC. */
int match_publish(_Atomic(struct matcher *) *cur, _Atomic(struct matcher *) *next,
    struct matcher *m);
/* match_learn into the rules in *cur, and into those that match_publish is
 * putting in their place, so that once it returns the address is matched by
 * whichever rules are in place. Returns what the last match_learn did. */
int match_learn_in(_Atomic(struct matcher *) *cur, _Atomic(struct matcher *) *next,
    const char *host, const struct sockaddr *sa);
/* True if some RULE_HOST rule names host (case-insensitive). */
bool match_has_host(const struct matcher *m, const char *host);
void match_free(struct matcher *m);
/* Writes "1.2.3.4:80", "[::1]:80" or "unix:/path" for sa into buf. */
void match_format(const struct sockaddr *sa, socklen_t len, char *buf, size_t buflen);

/* Internal to match.c and match_parse.c. */
#define PORT_ANY_LO	0
#define PORT_ANY_HI	65535
#define HOST_LEN_MAX	253	/* without a trailing dot */
void match_set_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
char match_lower(char c);
void match_mask_addr(uint8_t *addr, int prefix);
void match_map_ipv4(uint8_t addr[16], const void *in4);
int match_inet_key(const struct sockaddr *sa, socklen_t len, uint8_t addr[16], uint16_t *port);
size_t match_unix_key(const struct sockaddr *sa, socklen_t len, char key[BS_UNIX_PATH_MAX + 1]);
void match_rule_text(const struct rule *r, char *buf, size_t len);

/* ---- config*.c: libconfig parsing and validation, at init only ---- */

#define BS_MAX_CLASSES	8	/* class 0 is "default" */
#define BS_CLASS_NAME_MAX 32	/* with NUL */
#define BS_MAX_PATTERNS	64	/* program-name patterns per class */
#define BS_MAX_POOLS	16	/* pools of a config (and of a segment) */
#define BS_NO_POOL	(-1)

struct cfg_compartment {
	char name[BS_NAME_MAX];
	int line;
	uint32_t max_connections;	/* 0 = no connection limit */
	uint32_t max_inflight;		/* 0 = no in-flight limit */
	uint32_t max_wait_ms;		/* 0 = fail fast */
	uint32_t max_waiting;		/* 0 = the limit (max_connections, else max_inflight) */
	uint32_t connect_timeout_ms;	/* 0 = none */
	uint32_t io_timeout_ms;		/* 0 = none */
	bool enforce;			/* false = observe only */
	uint32_t class_limit[BS_MAX_CLASSES];	/* 0 = no cap for that class */
	/* class_guaranteed = { ... }: the classes split the compartment
	 * (share.c); every class then has a limit, its ceiling. */
	bool class_shares;
	int class_line;
	uint32_t class_guaranteed[BS_MAX_CLASSES];
	int reject_errno;	/* ECONNREFUSED unless set */
	int pool;		/* index in bs_config.pools, or BS_NO_POOL */
	uint32_t guaranteed;	/* permits of the pool nobody else may take */
	int pool_line;		/* line of `pool` / `guaranteed`, for messages */
	/* adaptive = { ... } (adaptive.c): the limit moves with the latency. */
	bool adaptive;
	uint32_t ad_min, ad_max;	/* bounds of the adaptive limit */
	uint32_t ad_initial;		/* where it starts in a fresh segment */
	uint32_t ad_window_ms;		/* shortest measurement window */
	uint32_t ad_tolerance_pct;	/* a sample up to this % of the baseline is no queue */
	uint32_t fleet_limit;	/* 0 = not in a fleet budget */
	uint32_t fleet_floor;	/* what this host may use without a valid lease */
};

/* A pool: capacity shared by compartments, each with a guarantee (pool.c). */
struct cfg_pool {
	char name[BS_NAME_MAX];
	int line;
	uint32_t size;
	uint32_t reserved;	/* never handed out */
};

/* A priority class and the program names (fnmatch patterns) that get it. */
struct cfg_class {
	char name[BS_CLASS_NAME_MAX];
	int line;
	size_t npatterns;
	char patterns[BS_MAX_PATTERNS][BS_NAME_MAX];
};

/* The `fleet = { ... }` block: where the agent leases shares (config_fleet.c). */
#define BS_FLEET_ADDR_MAX	(BS_UNIX_PATH_MAX + 8)	/* "unix:" + path, or host:port */
struct cfg_fleet {
	bool on;		/* the block is present */
	int line;
	char redis[BS_FLEET_ADDR_MAX];	/* "host:port" or "unix:/path" */
	char password_file[PATH_MAX];	/* "" = no AUTH */
	char name[BS_NAME_MAX];		/* the fleet, shared by every host */
	char host[BS_HOST_MAX];		/* this host's name in the fleet */
	uint32_t lease_ms;
	uint32_t interval_ms;		/* renewal period */
	uint32_t timeout_ms;		/* Redis connect and reply timeout */
	uint32_t max_hosts;		/* `hosts`: floors held back for all; 0 = known only */
};

struct bs_config {
	char path[PATH_MAX];
	char segment[BS_NAME_MAX];
	bool has_budget;
	uint32_t pool, reserved;
	bool strict;
	unsigned mode;		/* segment permission bits, default 0600 */
	bool has_owner, has_group;
	uid_t owner;
	gid_t group;
	uint32_t max_processes;	/* process table of the segment */
	uint32_t max_sockets;	/* socket table of the segment */
	unsigned resolve_timeout_ms;
	bool enforce;		/* the default of every compartment's enforce */
	size_t nclass;		/* classes[0] is "default", always present */
	struct cfg_class classes[BS_MAX_CLASSES];
	size_t ncomp;
	struct cfg_compartment *comp;
	size_t nrules;
	struct rule *rules;
	size_t npools;
	struct cfg_pool pools[BS_MAX_POOLS];
	struct cfg_fleet fleet;
	bool log_json;		/* log_format = "json" */
};

/* Loads and validates path into *cfg (which it zeroes first). Host names are
 * resolved with a bounded wait when resolve is true. Returns 0; -ENOENT when
 * the file does not exist; -EINVAL (or another -errno) with one message
 * "FILE:LINE: what is wrong" in err. On error *cfg holds nothing to free. */
int cfg_load(const char *path, struct bs_config *cfg, bool resolve, char *err, size_t errlen);
/* The segment name a config file gets when it names none: its base name
 * without the extension. */
void cfg_default_segment(const char *path, char *out, size_t outlen);
/* Why errno EAGAIN and max_inflight are refused together: a refused send
 * answering EAGAIN on a blocking socket is retried at once, a busy loop. */
extern const char cfg_eagain_spin[];
/* Parses "ECONNREFUSED" etc.; returns the errno value or -EINVAL. */
int cfg_errno_value(const char *name);
const char *cfg_errno_name(int value);
void cfg_free(struct bs_config *cfg);
/* cfg_load, but err gets every error it finds, one "FILE:LINE: ..." per
 * line (libconfig's syntax errors stop it at the first), for `check`. */
int cfg_load_all(const char *path, struct bs_config *cfg, bool resolve, char *err, size_t errlen);
/* The segment a config file names (its "segment" key, else the default
 * from its name), even when the file has errors, so that a process that
 * runs inert because of them can say so in the segment. */
void cfg_segment_of(const char *path, char *out, size_t outlen);
/* True if path parses and sets strict = true, so that a config with an error
 * elsewhere can still ask for strict mode. False on any doubt. */
bool cfg_wants_strict(const char *path);

/* Internal to config*.c: the state of one cfg_load, and the pieces it is made of. */
struct config_setting_t;	/* libconfig's config_setting_t */

/* Where a parsed destination came from, for the duplicate message. The
 * strings belong to libconfig and are only read before config_destroy. */
struct rule_src {
	const char *text;
	const char *file;
};

/* A stretch of a config's text as parsed (cfg_read_file): its lines from
 * `first` on are those of `file` (NULL: the config itself) from `line` on. */
struct cfg_span {
	int first, line;
	const char *file;
};

struct cfg_ctx {
	const char *path;
	struct bs_config *cfg;
	char *err;
	size_t errlen;
	struct rule_src *src;	/* one per parsed rule */
	size_t cap;		/* room in cfg->rules and src */
	bool has_sockets;
	bool has_compartments;
	const struct config_setting_t *budget;
	const struct config_setting_t *sockets;	/* max_sockets, when set */
	char *text;		/* the text parsed, to place string elements */
	size_t *line_end;	/* offset of the end of each line */
	size_t nlines;
	struct cfg_span *span;	/* where each line of text comes from */
	size_t nspan, spancap;
	char **files;		/* the included files' names, for the spans */
	size_t nfiles;
	bool all;		/* report every error, not only the first (cfg_load_all) */
	int first_rc;		/* the first error's code, when all */
	int scan_line;		/* string_at(): where the last string found ends, */
	size_t scan_off;	/* so a line of many strings is scanned once */
};

/* config_file.c: a config's text, read so that no file can stall the reader. */
#define BS_CONFIG_MAX	(16u << 20)	/* bytes of a config and all it includes */
/* Reads the file c->path into c->text (NUL-terminated) and c->line_end,
 * each @include line replaced by the text of the file it names (a relative
 * name found after dir, when not NULL), ten deep at most, and c->span: the
 * config and each file it includes must be a regular file, read without
 * blocking, BS_CONFIG_MAX bytes in all, with no NUL byte. Returns 0, or
 * -errno (-ENOENT, -EISDIR, -EINVAL, -EFBIG...) with the message in c's
 * error buffer; the caller calls cfg_text_free either way. */
int cfg_read_file(struct cfg_ctx *c, const char *dir);
/* The file (NULL: the config itself) and line of line `line` of c->text. */
void cfg_place(const struct cfg_ctx *c, int line, const char **file, int *at);
void cfg_text_free(struct cfg_ctx *c);

/* config_setting.c: typed access to settings, with messages at FILE:LINE. */
int cfg_fail_at(struct cfg_ctx *c, const char *file, int line, int rc, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* The file (NULL: the config itself) and line where setting s is written. */
void cfg_where(const struct cfg_ctx *c, const struct config_setting_t *s, const char **file,
    int *line);
int cfg_line_of(const struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_fail(struct cfg_ctx *c, const struct config_setting_t *s, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* After a failed step: in cfg_load_all mode keeps rc as the result and
 * returns true (go on to find the next error); else returns false. */
bool cfg_go_on(struct cfg_ctx *c, int rc);
const char *cfg_type_name(int type);
const char *cfg_key_of(const struct config_setting_t *s);
const char *cfg_closest(const char *name, const char *const *known);
int cfg_unknown_key(struct cfg_ctx *c, const struct config_setting_t *s, const char *const *known,
		    const char *where);
bool cfg_is_known(const char *name, const char *const *known);
int cfg_get_int(struct cfg_ctx *c, const struct config_setting_t *s, long long *out);
int cfg_get_range(struct cfg_ctx *c, const struct config_setting_t *s, long long lo, long long hi,
		  long long *out);
int cfg_get_bool(struct cfg_ctx *c, const struct config_setting_t *s, bool *out);
int cfg_get_string(struct cfg_ctx *c, const struct config_setting_t *s, const char **out);
bool cfg_name_char(char ch);
int cfg_check_name(struct cfg_ctx *c, const struct config_setting_t *s, const char *what,
		   const char *name);
/* config_comp.c: classes, compartments and their destinations, then checks across them. */
int cfg_push_rule(struct cfg_ctx *c, const struct rule *r, const char *text, const char *file);
int cfg_parse_classes(struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_parse_compartments(struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_check_duplicates(struct cfg_ctx *c);
int cfg_check_budget(struct cfg_ctx *c);
/* config_pool.c: pools, a compartment's `pool` and `guaranteed`, and the
 * pools' start-up assertion (sum of guarantees within size - reserved). */
int cfg_parse_pools(struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_parse_comp_pool(struct cfg_ctx *c, const struct config_setting_t *g,
    struct cfg_compartment *comp);
int cfg_check_pools(struct cfg_ctx *c);
/* config_fleet.c: the fleet block and the fleet keys of a compartment. */
int cfg_parse_fleet(struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_parse_comp_fleet(struct cfg_ctx *c, const struct config_setting_t *g,
    struct cfg_compartment *comp);
int cfg_check_fleet(struct cfg_ctx *c);
/* config_resolve.c: host-name destinations, resolved at load with a bounded wait. */
int cfg_resolve_hosts(struct cfg_ctx *c);
/* config_adaptive.c: the `adaptive = { ... }` group of a compartment. */
int cfg_parse_adaptive(struct cfg_ctx *c, const struct config_setting_t *s,
    struct cfg_compartment *comp);

/* ---- segment.c, procs.c: the shared-memory layout, process records, holds ---- */

#define SEG_MAGIC	0x314d48534b4c5542ULL	/* "BULKSHM1" */
#define SEG_VERSION	6	/* 6: struct seg_pool's in_use_stat */

enum { SLOT_FREE = 0, SLOT_USED = 1, SLOT_INIT = 2, SLOT_RELEASING = 3 };
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
	/* Layout version 3: the pools. */
	uint32_t npools;
	struct seg_pool pools[BS_MAX_POOLS];
	/* Version 3 (issue 12): who attached, and who ran without limits. */
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
	REASON_NO_SLOT,		/* the segment's socket or process table is full */
	REASON_POOL_FULL,	/* the pool's shared part is lent out (pool.c) */
	REASON_CLASS_SHARED_FULL,	/* the compartment's unguaranteed part is lent out (share.c) */
	REASON_MAX
};
/* The reasons counted in seg_comp's first arrays (layout version 2); the
 * later ones are counted in the arrays at its end: seg_rejected_by(). */
#define REASON_V2	6
#define REASON_V3	7	/* and those from here in the arrays of layout 4 */

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
struct seg_adaptive {
	_Atomic uint32_t mode;		/* AD_NONE: not adaptive */
	_Atomic uint32_t kind;		/* P_INFLIGHT or P_CONN: the permits it limits */
	_Atomic uint32_t min, max;
	_Atomic uint32_t window_ms, tolerance_pct;
	_Atomic uint32_t static_limit;	/* the configured limit, restored by adaptive=on */
	_Atomic uint32_t last_reason;	/* enum ad_reason of the last change */
	_Atomic uint64_t ctl;		/* see AD_CTL_* in adaptive.c */
	_Atomic uint64_t acc;		/* the open window: samples << 44 | sum of us */
	_Atomic uint64_t win_start_us;	/* CLOCK_MONOTONIC start of the open window */
	_Atomic uint64_t sample_us;	/* mean latency of the last closed window */
	_Atomic uint64_t sample_conc16;	/* its mean concurrency, in 1/16ths */
	_Atomic uint64_t windows;	/* windows closed */
	_Atomic uint64_t changes;	/* windows that moved the limit */
	_Atomic uint64_t last_change_ms;	/* CLOCK_REALTIME, 0 = never */
	_Atomic uint32_t last_from, last_to;
};

/* Admissions per second for the last BS_RATE_SECONDS seconds: each entry
 * packs (second << 32 | count), second being CLOCK_MONOTONIC seconds. */
#define BS_RATE_SECONDS 64

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
	uint32_t pad;
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
	struct seg_hist h_connect;	/* connect() duration */
	struct seg_hist h_reply;	/* first send to first reply byte */
	struct seg_hist h_wait;		/* time spent waiting for a permit */
	struct seg_class cls[BS_MAX_CLASSES];
	/* Pools (pool.c), layout version 3. */
	_Atomic uint32_t pool;		/* pool index + 1, 0 = none */
	_Atomic uint32_t guaranteed;	/* the guarantee; the ceiling is `limit` */
	_Atomic uint32_t guar_in_use;	/* unused since layout 4 (guarantees are share.c's) */
	_Atomic uint32_t guar_in_use_tag;
	_Atomic uint64_t rejected_by_more[REASON_V3 - REASON_V2];
	_Atomic uint64_t would_reject_more[REASON_V3 - REASON_V2];
	_Atomic uint32_t lent_hint;	/* the slot that borrowed last: where a rebalance looks first */
	uint32_t pad2;
	struct seg_adaptive ad;		/* layout 3: the adaptive limit (adaptive.c) */
	_Atomic uint64_t reconciled;	/* permits whose socket the kernel had closed unseen */
	/* Fleet budgets (issue 16): the agent (tools/fleet.c) writes this
	 * host's share and when its lease ends; admission reads them through
	 * seg_conn_limit(). */
	_Atomic uint32_t fleet_limit;	/* 0 = not in a fleet budget */
	_Atomic uint32_t fleet_floor;
	_Atomic uint32_t fleet_share;	/* this host's share while the lease lasts */
	_Atomic uint32_t fleet_redis_ok;	/* 1: the agent's last round trip succeeded */
	_Atomic uint64_t fleet_expiry_ms;	/* CLOCK_MONOTONIC end of the lease, 0 = none */
	_Atomic uint64_t fleet_renewed_ms;	/* CLOCK_MONOTONIC of the last renewal */
	_Atomic int32_t fleet_agent_pid;	/* 0 = no agent has run */
	_Atomic uint32_t fleet_hosts;	/* hosts holding a lease, as Redis last said */
	/* Layout version 4: the classes' guaranteed shares of the compartment
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
};

/*
 * The connection limit admission enforces now: max_connections, lowered in
 * a fleet budget to this host's share while its lease lasts, and to
 * fleet_floor once the lease has passed by this host's own clock, so that an
 * agent killed or cut off from Redis cannot keep a share that Redis gives
 * away (the agent's lease ends before Redis's does). One load unless the
 * compartment is in a fleet; lock-free and async-signal-safe.
 */
/* seg_conn_limit's fleet part, out of line (permit.c): its clock read would
 * otherwise cost every take registers it does not need without a fleet. */
uint32_t seg_fleet_limit(const struct seg_comp *c, uint32_t lim);

static inline uint32_t
seg_conn_limit(const struct seg_comp *c)
{
	uint32_t lim = atomic_load_explicit(&c->limit, memory_order_relaxed);

	if (__builtin_expect(atomic_load_explicit(&c->fleet_limit, memory_order_relaxed) == 0, 1))
		return lim;
	return seg_fleet_limit(c, lim);
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

#define SLOT_NO_CLASS	0xffu
#define SLOT_NO_COMP	0xffffffffu	/* a pending slot: no permit yet */

/*
 * The permits a slot can stand for, each counted in one tally of its
 * compartment. A slot's `mark` word holds its generation in the high bits
 * (bumped each time the slot is taken), for each kind P a flag
 * MARK_HELD(P), a wide sequence and a few flags. Layout 5: MARK_HELD(P)
 * is only what the last change of P's tally away from this slot said (see
 * tally.c): whether the slot holds P is tally_held, which reads the
 * tally's tag first. MARK_RELEASED: the release gave everything back.
 */
/* P_CLENT: one of the compartment's unguaranteed part, lent to a class
 * beyond its guarantee; P_LENT: one of a pool's shared part, lent to a
 * compartment beyond its guarantee (share.c). A permit within a guarantee
 * is no kind of its own: MARK_GUARANTEED says so. */
enum permit_kind { P_CONN, P_CLASS, P_OVER, P_INFLIGHT, P_INFLIGHT_OVER, P_CLENT, P_LENT,
	P_KINDS };
#define MARK_HELD(p)	(1ULL << (p))
#define MARK_HELD_ALL	(MARK_HELD(P_KINDS) - 1)
#define MARK_RELEASED	(1ULL << 7)	/* released: holds nothing, takes nothing */
#define MARK_WAITING	(1ULL << 8)	/* counted in its compartment's `waiting` */
/* Moved on by every reflection of a tally into the mark (tally.c), so that
 * a compare-and-swap prepared before one fails; 31 bits, it never wraps
 * while a thread is preempted. */
#define MARK_SEQ	(0x7fffffffULL << 9)
#define MARK_SEQ_ONE	(1ULL << 9)
#define MARK_SEQ_OF(m)	((uint32_t)(((m) & MARK_SEQ) >> 9))
/* The slot's generation, 22 bits, above the sequence. */
#define MARK_GEN_SHIFT	40
#define MARK_GEN_MASK	0x3fffffu
#define MARK_GEN(m)	((uint32_t)((m) >> MARK_GEN_SHIFT) & MARK_GEN_MASK)
#define MARK_OF_GEN(g)	((uint64_t)((g) & MARK_GEN_MASK) << MARK_GEN_SHIFT)
/* Layout 4: the slot's permit of a guaranteed-share level (enum
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
	 * tag of the last change, locked while it is under way (procs.c). */
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
	_Atomic uint64_t admit_us;	/* layout 3: admission time, for adaptive connections */
};

/* The tag of a slot's holders count (procs.c): record index + 1, whether
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
	_Atomic uint32_t hint;		/* where the next slot search starts */
	/* The fields of a tally tag, whose slot index takes as few bits as
	 * the segment's slot count needs (tally.c, set by segment.c). */
	uint32_t tag_imask, tag_wmask, tag_smask, tag_one, tag_sshift;
	uint64_t my_start;
	pid_t my_pid;			/* getpid(), updated by seg_fork_child */
	uint64_t ino;			/* the segment object's inode */
	/* The fork gate: threads changing what this process holds are
	 * `busy`; fork raises `forking` and waits for busy to drain, so the
	 * child's record is a snapshot of a still moment (procs.c). */
	_Atomic uint32_t busy;
	_Atomic uint32_t forking;
	/* The holders word of a slot that record `rec` holds alone (procs.c),
	 * kept so that a connect and a close need not build it; 0 when not
	 * known (then it is built). */
	_Atomic uint64_t sole;
	/* This process records a descriptor for every permit it takes (the
	 * preloaded library): a full compartment is then reconciled against
	 * the kernel before a refusal (reconcile.c). The CLI, the tests and
	 * the benchmarks that take permits standing for no descriptor leave
	 * it false: their permits would look like sockets gone unseen. */
	bool reconciles;
	/* Whether a call on descriptor fd (with these send flags) may block
	 * (the preloaded library's shim_blocking; NULL elsewhere): asked only
	 * when a connect finds its compartment full and could wait (the
	 * descriptor admission was given as its `wait`). */
	bool (*blocking)(int fd, int flags);
};

/* Creates or attaches the segment that cfg names and maps each compartment of
 * cfg to the segment's compartment of the same name. The descriptor is closed
 * before returning. Returns 0 or -errno with a message in err. */
int seg_attach(const struct bs_config *cfg, struct seg **out, char *err, size_t errlen);
/* Maps an existing segment by name, for the CLI; writable asks for O_RDWR.
 * Validates it like seg_attach. Returns 0 or -errno with a message in err. */
int seg_open(const char *name, bool writable, struct seg **out, char *err, size_t errlen);
void seg_close(struct seg *s);
struct seg_header *seg_header(const struct seg *s);
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
struct seg_proc *seg_proc(const struct seg *s, uint32_t i);
/* Writes a compartment's configured limits and settings into the segment
 * (at creation, on a fresh start, and for `bulkshim reload`). */
void seg_apply_limits(struct seg_comp *c, const struct cfg_compartment *cc);
/* Says that some compartment's settings changed, after the change (bumps
 * the settings sequence): every process re-reads them at the next I/O of
 * each counted socket. */
void seg_settings_changed(struct seg *s);
/* The segment index of config compartment i, or -1. */
int seg_comp_index(const struct seg *s, size_t cfg_index);
/* Counts the bits set in a process's bitmap row. */
uint32_t seg_proc_held(const struct seg *s, uint32_t i);
/* Records the identity (device, inode) of config file path in h, for the
 * warning about two files on one segment; 0 when it cannot be read. */
void seg_note_config(struct seg_header *h, const char *path);
/* The shared-memory object name of a segment: "/bulkshim.<segment>". */
void seg_shm_name(const char *segment, char *out, size_t len);
/* Record rec's bitmap row: one bit per socket slot it holds. */
static inline _Atomic uint64_t *
seg_row(const struct seg *s, uint32_t rec)
{
	return s->bits + (size_t)rec * s->bitmap_words;
}

/* ---- permit.c: admission, waiting, requests in flight, statistics ---- */

/* Takes one connection permit of compartment comp (and of class cls within
 * it, if that class is capped) for the socket with inode ino, and records
 * this process as its holder. When the compartment is full and may_wait is
 * true, waits up to the compartment's max_wait_ms on a futex. In observe mode
 * a call that would be refused is let through and counted in would_reject.
 * Returns the slot index, or -EBUSY with *why set when refused. */
int seg_acquire(struct seg *s, uint32_t comp, uint32_t cls, uint64_t ino, bool may_wait,
    enum bs_reason *why);
/* A send on slot's socket: the socket becomes in flight unless it is already.
 * Returns 1 if this call made it in flight, 0 if it already was (or the
 * compartment does not count requests), -EBUSY with *why when refused. */
int seg_inflight_begin(struct seg *s, uint32_t slot, bool may_wait, enum bs_reason *why);
/* seg_inflight_begin and the end of a request (recording its reply
 * latency if `record`) for slot, whose mark m the caller read before its
 * compartment c (so that a slot reused meanwhile fails on its generation). */
int seg_request_begin(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c, bool may_wait,
    enum bs_reason *why);
int seg_request_quick(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c);
void seg_request_end(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c, bool record);
/* The reply (a byte, end of file or a hard error) arrived: the request in
 * flight ends and its latency is recorded. */
void seg_inflight_end(struct seg *s, uint32_t slot);
/* The connect of slot's socket completed (or the socket was first used,
 * which is when an event loop's non-blocking connect is known to have
 * completed): records the time since admission in h_connect, once. */
void seg_connect_done(struct seg *s, uint32_t slot);
/* seg_connect_done_in's end for a connect being timed (permit.c). */
void seg_connect_time(struct seg *s, uint32_t slot, struct seg_comp *c);
/* The same for slot of compartment c, known to the caller (connect).
 * Inline: a connect that is not timed (CONNECT_EXACT) pays one load. */
static inline __attribute__((always_inline)) void
seg_connect_done_in(struct seg *s, uint32_t slot, struct seg_comp *c)
{
	if (atomic_load_explicit(&s->slots[slot].connect_us, memory_order_relaxed) != 0)
		seg_connect_time(s, slot, c);
}
/* The send that began a request failed, or the request was abandoned (an
 * I/O timeout, a hard error): end it without recording a reply latency. */
void seg_inflight_cancel(struct seg *s, uint32_t slot);
/* Zeroes every statistic of compartment i: counts, rejections by reason,
 * would-rejects, rates, histograms, timeouts, class counts; peaks restart
 * from what is held now. Permits, limits and settings are left alone. */
void seg_reset_counters(struct seg *s, uint32_t i);
/* Records one value in a histogram. Lock-free. */
void seg_hist_add(struct seg_hist *h, uint64_t us);
/* Records one sample standing for n values. */
void seg_hist_add_n(struct seg_hist *h, uint64_t us, uint64_t n);
/* Counts a refusal of compartment comp for reason why. */
void seg_count_rejection(struct seg *s, uint32_t comp, enum bs_reason why);
/* A short name for a reason: "full", "inflight_full", "wait_timeout",
 * "too_many_waiting", "class_full", "no_slot". */
const char *seg_reason_name(enum bs_reason why);
/* A pending slot for this process's socket with inode ino: held by this
 * process (one descriptor), no permit yet. For a socket about to be
 * admitted, or shared with a child about to be forked before its connect.
 * Returns the slot or -errno. */
int seg_pending_slot(struct seg *s, uint64_t ino);
/* True if slot is pending: held, but no compartment admitted it yet. */
bool seg_slot_pending(const struct seg *s, uint32_t slot);
/* True if slot holds a connection permit (or an observe-mode one). */
bool seg_slot_admitted(const struct seg *s, uint32_t slot);
/* Whether admission may wait for a permit of a full compartment: never,
 * always (the tests' seg_acquire), or if the descriptor given (>= 0) is
 * blocking, which is asked (s->blocking, a system call) only then. */
#define WAIT_NEVER	(-1)
#define WAIT_ALWAYS	(-2)
/* Admits the pending slot (which this process holds) into compartment comp,
 * like seg_acquire; `wait` is WAIT_NEVER, WAIT_ALWAYS or the descriptor
 * whose blocking mode decides. Returns 0, -EBUSY with *why, or -EALREADY if
 * another process sharing the socket is admitting it. */
int seg_acquire_pending(struct seg *s, uint32_t slot, uint32_t comp, uint32_t cls, int wait,
    enum bs_reason *why);
/* The fork gate: a thread about to change what this process holds in a way
 * a concurrent fork must not split enters it; fork waits for it to empty
 * (a bounded wait: a signal handler may fork while its own thread is in). */
void seg_gate_enter(struct seg *s);
void seg_gate_leave(struct seg *s);
/* fork closes the gate; seg_fork_child and seg_fork_parent open it. */
void seg_gate_close(struct seg *s);
/* Finishes an operation on slot that process `dead` (0: anyone) left half
 * done, if any (tally.c explains). */
void seg_resolve(struct seg *s, uint32_t slot, pid_t dead);
/* Finishes slot if nobody is left to: a slot no process holds that is
 * still in use (its last holder died before releasing it) is released; one
 * that process `dead` was setting up is freed, one it was releasing is
 * released. Safe against live workers: each step is claimed by CAS. */
void seg_release_orphan(struct seg *s, uint32_t slot, pid_t dead);
/* ---- pool.c: pools, guarantees, lending ---- */

/* The pool of compartment c, or NULL. Inline: admission asks it twice. */
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
/* tally_of for P_LENT: the pool's lent count, its limit the shared part;
 * NULL if c is in no pool. Inline: a borrowed permit's take asks it for its
 * own tally and for the slot its tally's tag names. */
static inline _Atomic uint32_t *
pool_tally_of(const struct seg *s, struct seg_comp *c, _Atomic uint32_t **limit)
{
	struct seg_pool *pool = seg_pool_at(s, c);

	if (pool == NULL)
		return NULL;
	if (limit != NULL)
		*limit = &pool->shared;
	return &pool->lent;
}
/* The counter of refusals (would: of observe-mode would-rejects) of c for
 * reason why, or NULL for no such reason. */
_Atomic uint64_t *seg_reason_count(struct seg_comp *c, enum bs_reason why, bool would);
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
/* Raises pool's peak to n, the use statistic just read. A count that went
 * below 0 after a kill (it wraps) raises no peak. */
static inline void
pool_raise_peak(struct seg_pool *pool, uint32_t n)
{
	uint32_t pk = atomic_load_explicit(&pool->peak, memory_order_relaxed);

	while (n > pk && n <= BS_MAX_SOCKETS &&
	    !atomic_compare_exchange_weak(&pool->peak, &pk, n))
		;
}
/* A member of pool took a connection permit: the use statistic goes up
 * and the peak with it. Inline: every take in a pool asks it. */
static inline void
pool_note_use(struct seg_pool *pool)
{
	pool_raise_peak(pool, atomic_fetch_add_explicit(&pool->in_use_stat, 1,
	    memory_order_relaxed) + 1);
}
/* A slot of a member of pool is being released: the use statistic goes
 * down (before the slot's permits do). */
static inline void
pool_note_release(struct seg_pool *pool)
{
	atomic_fetch_sub_explicit(&pool->in_use_stat, 1, memory_order_relaxed);
}
/* Sets the use statistic of every pool whose members hold nothing to 0
 * (after a reclaim: what a killed thread left one low is right again). */
void pool_resync_use(struct seg *s);
/* Zeroes pool p's refusals and restarts its peak from what its members
 * have in use now (`bulkshim reset`); never a permit, a count in use or a
 * size. Does nothing for p past the segment's pools. */
void pool_reset_counters(struct seg *s, uint32_t p);
/* Wakes every waiter asleep on pool's lent word (pool_wake). */
void pool_wake_all(struct seg_pool *pool);
/* A waiter of c goes to sleep on the pool (delta 1) or wakes (-1). */
void pool_sleepers(struct seg *s, const struct seg_comp *c, int delta);

/* ---- share.c: guaranteed shares, one mechanism for pools and classes ---- */

/* The two levels: a compartment's share of its pool, a class's share of
 * its compartment. */
enum share_level { SHARE_POOL, SHARE_CLASS, SHARE_LEVELS };
/* After the level's own permit of slot (P_CONN, P_CLASS), whose take
 * made its count v: within the guarantee (v <= *guaranteed) the slot is
 * marked so, else it takes a permit of the level's shared part.
 * TALLY_TAKEN, TALLY_FULL (*seen the shared count) or TALLY_BUSY. */
int share_take(struct seg *s, uint32_t slot, uint32_t gen, enum share_level l, uint32_t v,
    _Atomic uint32_t *guaranteed, uint32_t *seen);
/* Gives back slot's permits of level l (its shared permit, then its own),
 * passing a guarantee on as a release does; used when admission stops
 * half-way. */
void share_give(struct seg *s, uint32_t slot, uint32_t gen, enum share_level l);
/* The guarantee of level l of compartment comp (class cls, for
 * SHARE_CLASS) went from old to now (set, reload). Raised: up to the
 * difference of its permits lent by the shared part move onto it. Lowered:
 * up to the difference of its permits within it become lent ones, past the
 * shared part's limit if need be, so that a lowered guarantee is never
 * exceeded. */
void share_guarantee_changed(struct seg *s, uint32_t comp, uint32_t cls, enum share_level l,
    uint32_t old, uint32_t now);
/* True if compartment c is in a pool and would borrow (it holds its
 * guarantee) from a shared part that is all lent: a reconcile may find
 * permits of the pool whose sockets are gone. */
bool share_pool_full(const struct seg *s, const struct seg_comp *c);
/* True if c's classes split it and its unguaranteed part is all lent. */
bool share_classes_full(const struct seg_comp *c);
/* The compartment's classes' shared part: its limit less their
 * guarantees (after a change of either). */
void share_update_classes(struct seg_comp *c);
/* Slot's hand-over of level l, when something is lent (share_released). */
void share_hand_over(struct seg *s, uint32_t slot, uint32_t gen, enum share_level l);


/* ---- tally.c: counts that a killed thread cannot leave wrong ---- */

enum { TALLY_TAKEN, TALLY_FULL, TALLY_BUSY, TALLY_MISS };
/* The compartment of a slot, or NULL (a pending slot, or garbage). */
static inline struct seg_comp *
seg_slot_comp(const struct seg *s, const struct seg_slot *sl)
{
	return seg_comp(s, atomic_load(&sl->comp));
}
/* The count that permit kind p of slot sl is counted in, and in *limit (if
 * not NULL) its limit (NULL: none); NULL if the slot names no such count. */
_Atomic uint32_t *tally_of(const struct seg *s, const struct seg_slot *sl, int p,
    _Atomic uint32_t **limit);
/* Changes sl's mark while it is of generation gen, has every flag of need
 * and none of deny: clears clr, sets set. False if it cannot. (Not for
 * MARK_HELD: tally.c alone writes those.) */
bool slot_mark_change(struct seg_slot *sl, uint32_t gen, uint64_t need, uint64_t deny,
    uint64_t clr, uint64_t set);
/* One attempt to take permit kind p for slot (of generation gen): one
 * tagged compare-and-swap of its tally. TALLY_TAKEN, TALLY_FULL (*seen: the
 * count at the limit) or TALLY_BUSY (the slot holds one, or a kind of
 * `deny`, a MARK_HELD mask, or it is released). */
int tally_take(struct seg *s, uint32_t slot, uint32_t gen, int p, uint64_t deny, uint32_t *seen);
/* tally_take past the limit (a guarantee lowered live, share.c). */
int tally_take_past(struct seg *s, uint32_t slot, uint32_t gen, int p);
/* tally_take and tally_give of P_INFLIGHT for a slot of compartment c,
 * which the caller read after the slot's mark m (so a slot reused meanwhile
 * fails on its generation). */
int tally_take_inflight(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c,
    uint32_t *seen);
bool tally_give_inflight(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c);
/* tally_take of P_CONN for a slot of compartment c (the caller read the
 * slot's compartment: c is the one it names), and of P_LENT for a slot of
 * a compartment in pool: inlined into admission (BS_LTO_INLINE; GCC warns
 * that a body it cannot see in this file might not be inlinable, and LTO
 * inlines it). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE int tally_take_conn(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    uint32_t *seen, uint32_t *took);
BS_LTO_INLINE int tally_take_lent(struct seg *s, uint32_t slot, uint32_t gen,
    struct seg_pool *pool, uint32_t *seen);
#pragma GCC diagnostic pop
/* Takes back the take that tally value w of count stands for, if the
 * tally still reads w (tally_take_own's, landed after its slot's release). */
void tally_undo(_Atomic uint32_t *count, uint64_t w);
/* tally_give_inflight's fast path alone (the tally's tag is the slot's own
 * take): true if it gave, false if not that case (nothing done). */
/* A waiter of c's in-flight count wakes (tally_give_inflight_own's). */
void tally_wake_inflight(struct seg_comp *c);

#define TAG_GIVE	(1u << 31)
#define TAG_GEN_SHIFT	27
#define TAG_GEN_MASK	0xfu

/* The tag bits that name slot (of generation gen): index and generation. */
static inline __attribute__((always_inline)) uint32_t
tag_who(uint32_t slot, uint32_t gen)
{
	return (slot + 1) | (gen & TAG_GEN_MASK) << TAG_GEN_SHIFT;
}

static inline __attribute__((always_inline)) bool
tag_names(const struct seg *s, uint32_t tag, uint32_t who)
{
	return (tag & s->tag_wmask) == who;
}

static inline __attribute__((always_inline)) bool
tag_give(uint32_t tag)
{
	return (tag & TAG_GIVE) != 0;
}

/* The stamp of an operation on a tally whose tag names the slot already
 * (own: the last stamp counted up) or another slot (from the slot's mark
 * sequence, in the upper half of the stamp). */
static inline __attribute__((always_inline)) uint32_t
stamp_own(const struct seg *s, uint32_t tag)
{
	return ((tag & s->tag_smask) + s->tag_one) & s->tag_smask;
}

/* The stamp of an operation on a tally whose tag names another slot, or
 * none: from the slot's mark sequence m, in the upper half of the stamp. */
static inline __attribute__((always_inline)) uint32_t
stamp_new(const struct seg *s, uint64_t m)
{
	return (MARK_SEQ_OF(m) << s->tag_sshift) & s->tag_smask;
}

/* The compare-and-swap of slot's take, tag `tag`, from tally value w
 * (whose tag and count the caller checked: the fast paths below), and the
 * check after it: TALLY_TAKEN (*seen, unless NULL: the count before),
 * TALLY_BUSY (released meanwhile: undone), or TALLY_MISS (the tally moved:
 * nothing done). */
static inline __attribute__((always_inline)) int
take_swap(struct seg *s, uint32_t slot, uint32_t gen, uint32_t tag, _Atomic uint32_t *count,
    uint64_t w, uint32_t *seen)
{
	_Atomic uint64_t *t = (_Atomic uint64_t *)(uintptr_t)count;
	uint64_t nw = (uint64_t)tag << 32 | ((uint32_t)w + 1), m;

	if (!atomic_compare_exchange_strong(t, &w, nw))
		return TALLY_MISS;
	if (seen != NULL)
		*seen = (uint32_t)w;
	m = atomic_load(&s->slots[slot].mark);
	if (__builtin_expect(MARK_GEN(m) != gen || (m & MARK_RELEASED), 0)) {
		tally_undo(count, nw);
		return TALLY_BUSY;
	}
	return TALLY_TAKEN;
}

/* A take's fast path for a tally whose tag is 0 (a release untagged it:
 * nobody to reflect), below lim: take_loop's own steps for that case, with
 * nothing else live. TALLY_TAKEN (*took: the tag it wrote), TALLY_BUSY
 * (released meanwhile: undone), or TALLY_MISS (not that case, nothing
 * done). */
static inline __attribute__((always_inline)) int
tally_take_clear(struct seg *s, uint32_t slot, uint32_t gen, int p, _Atomic uint32_t *count,
    uint32_t lim, uint32_t *seen, uint32_t *took)
{
	uint64_t w = atomic_load((_Atomic uint64_t *)(uintptr_t)count), m;

	/* Untagged and below lim, in one comparison: a tag makes w >= 2^32. */
	if (__builtin_expect(w >= lim, 0))
		return TALLY_MISS;
	m = atomic_load(&s->slots[slot].mark);
	if (MARK_GEN(m) != gen || (m & (MARK_RELEASED | MARK_HELD(p))))
		return TALLY_MISS;
	*took = tag_who(slot, gen) | stamp_new(s, m);
	return take_swap(s, slot, gen, *took, count, w, seen);
}

/* A take's fast path (tally.c's take_loop starts with it): the tally's tag
 * is the slot's own give (nobody to reflect), its mark m0 says it is not
 * released, and the count is below lim. TALLY_TAKEN, TALLY_BUSY (released
 * meanwhile: undone), or TALLY_MISS (not that case, nothing done). */
static inline __attribute__((always_inline)) int
tally_take_own(struct seg *s, uint32_t slot, uint64_t m0, _Atomic uint32_t *count, uint32_t lim,
    uint32_t *seen)
{
	uint32_t gen = MARK_GEN(m0), who = tag_who(slot, gen), tag;
	uint64_t w = atomic_load((_Atomic uint64_t *)(uintptr_t)count);

	tag = (uint32_t)(w >> 32);
	if (__builtin_expect(tag_names(s, tag, who) && tag_give(tag) && !(m0 & MARK_RELEASED) &&
	    (uint32_t)w < lim, 1))
		return take_swap(s, slot, gen, who | stamp_own(s, tag), count, w, seen);
	return TALLY_MISS;
}

/* The in-flight take's fast path, for a caller that found c's adaptive
 * limit off (seg_request_quick): the static limit is the limit. */
static inline __attribute__((always_inline)) int
tally_take_inflight_own(struct seg *s, uint32_t slot, uint64_t m0, struct seg_comp *c,
    uint32_t *seen)
{
	return tally_take_own(s, slot, m0, &c->inflight, atomic_load(&c->inflight_limit), seen);
}

/* A give's fast path (tally.c's give_loop starts with it): the tally's tag
 * is the slot's own take, so the slot holds the permit and nobody needs a
 * reflection. The tally's new value if it gave (never 0: the caller wakes
 * waiters), 0 if not that case (nothing done). */
static inline __attribute__((always_inline)) uint64_t
tally_give_own(struct seg *s, uint32_t slot, uint32_t gen, _Atomic uint32_t *count)
{
	_Atomic uint64_t *t = (_Atomic uint64_t *)(uintptr_t)count;
	uint32_t who = tag_who(slot, gen), tag, cur;
	uint64_t w = atomic_load(t), nw;

	tag = (uint32_t)(w >> 32);
	cur = (uint32_t)w;
	if (!__builtin_expect(cur != 0 && tag_names(s, tag, who) && !tag_give(tag), 1))
		return 0;
	nw = (uint64_t)(who | TAG_GIVE | stamp_own(s, tag)) << 32 | (cur - 1);
	return atomic_compare_exchange_strong(t, &w, nw) ? nw : 0;
}

static inline __attribute__((always_inline)) bool
tally_give_inflight_own(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c)
{
	if (!tally_give_own(s, slot, gen, &c->inflight))
		return false;
	if (atomic_load(&c->waiting) > 0)
		tally_wake_inflight(c);
	return true;
}

/* Gives back permit kind p of slot if it holds it; true if it did. */
bool tally_give(struct seg *s, uint32_t slot, uint32_t gen, int p);
/* Whether slot (of generation gen) holds permit kind p: its tally's tag
 * if that names the slot, else the slot's mark. */
bool tally_held(const struct seg *s, uint32_t slot, uint32_t gen, int p);
/* tally_held for the tally count, which the caller knows is p's of slot. */
bool tally_held_at(const struct seg *s, uint32_t slot, uint32_t gen, int p,
    _Atomic uint32_t *count);
/* The release of slot (claimed SLOT_RELEASING by the caller), of
 * compartment c in pool (the caller's reads of the slot's and c's; NULL:
 * none): gives back every permit it holds and marks it MARK_RELEASED.
 * Returns what it held (MARK_HELD flags). */
uint64_t tally_release(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    struct seg_pool *pool);
/* The slot (of generation gen, holding nothing) moves to the next
 * generation: a take of the old one still counted is undone as if the
 * slot were released. For a pending slot whose admission was refused. */
void tally_renew(struct seg *s, uint32_t slot, uint32_t gen);
/* Sets the segment's tag fields (segment.c, after mapping it). */
void tally_format(struct seg *s);
/* Undoes every take of a released slot still counted (its taker died
 * before it could see the release): run when a process is found dead or
 * has exec'd. */
void tally_sweep(struct seg *s);

/* Internal to segment.c, procs.c and permit.c. */
uint32_t seg_dec_floor(_Atomic uint32_t *v);
int seg_my_record(struct seg *s);
/* The first hold of a slot being claimed: record rec, holders 1, held
 * through the holders word alone (HTAG_SOLE), no bit in rec's row. */
void seg_hold_first(struct seg *s, int rec, uint32_t slot);
/* Word w of record rec's holds: its row's word w and the slots w * 64 ..
 * w * 64 + 63 it holds alone through their holders word (HTAG_SOLE). For
 * readers that list a record's holds (reconcile, the CLI). */
uint64_t seg_held_bits(const struct seg *s, uint32_t rec, uint32_t w);
/* Drops record rec's hold of slot, if it has one; the last hold releases
 * the slot's permits (seg_release_slot). True if this drop released it. */
bool seg_drop_hold(struct seg *s, int rec, uint32_t slot, bool reclaimed);
/* Gives back every permit of a slot nobody holds and frees it; only the
 * caller that moves it from SLOT_USED to SLOT_RELEASING (with its pid)
 * does. */
void seg_release_slot(struct seg *s, uint32_t slot, bool reclaimed);
/* Another local descriptor refers to slot. */
void seg_hold(struct seg *s, uint32_t slot);
/* A local descriptor of slot is gone; the permit goes back when the last
 * descriptor in the last process holding the socket is gone. */
void seg_drop(struct seg *s, uint32_t slot);
/* Takes back the permits of dead processes. When `throttle` is true it runs
 * at most every 100 ms host-wide. Returns the number of processes reclaimed. */
int seg_reclaim(struct seg *s, bool throttle);
/* True if pid is alive and, when start is not 0, started at `start`. */
bool seg_pid_alive(pid_t pid, uint64_t start);
/* The start time of pid in clock ticks (field 22 of /proc/PID/stat), 0 if unknown. */
uint64_t seg_pid_start(pid_t pid);
/* Finds the slot of a socket inode, or -1. */
int seg_find_inode(const struct seg *s, uint64_t ino);
/* A fork under way: the child's record (-1: none), its generation, and the
 * descriptor holding the record's fork lock (-1: none). */
struct seg_fork {
	int rec;
	uint32_t gen;
	int lockfd;
};
/* Fork support: before fork, builds the child's process record holding every
 * slot this process holds, into *f. After fork, call seg_fork_child(s, f) in
 * the child and seg_fork_parent(s, f, pid) in the parent (pid < 0 undoes the
 * record); both close the lock descriptor. */
void seg_fork_prepare(struct seg *s, struct seg_fork *f);
/* False if the child's record was lost (reclaimed): the caller forgets its
 * descriptors and adopts what it still can with seg_adopt. */
bool seg_fork_child(struct seg *s, const struct seg_fork *f);
void seg_fork_parent(struct seg *s, const struct seg_fork *f, pid_t pid);
/* Adopts the record this PID had before exec (same start time) and slots of
 * inherited descriptors; `cb` is told each descriptor that refers to a slot.
 * Slots of the old image without a descriptor left are dropped. */
void seg_adopt(struct seg *s, void (*cb)(int fd, uint32_t slot));
/* Releases everything this process holds and frees its record at once. */
void seg_detach_all(struct seg *s);
/* Normal exit: marks this process's record exited, so that its holds go
 * back (and the record is freed) as soon as it is dead, at the next reclaim,
 * which this makes run unthrottled; not while the kernel still has its
 * sockets open or its other threads still run. */
void seg_exit(struct seg *s);

/* ---- share.c, inline: the guaranteed path of admission ---- */

/*
 * Marks slot (of generation gen, holding its own permit of level l) as
 * within its guarantee: one compare-and-swap of its mark. TALLY_TAKEN, or
 * TALLY_BUSY if the slot is no longer what the caller took it for. Inline:
 * this is all the guaranteed path of a connect costs (share.c).
 */
static inline int
share_mark(struct seg *s, uint32_t slot, uint32_t gen, enum share_level l)
{
	_Atomic uint64_t *mark = &s->slots[slot].mark;
	uint64_t m = atomic_load_explicit(mark, memory_order_relaxed);

	/* The caller has just taken the level's own permit: the slot holds
	 * it unless it was released meanwhile. */
	do {
		if (MARK_GEN(m) != gen || (m & MARK_RELEASED))
			return TALLY_BUSY;
	} while (!atomic_compare_exchange_weak(mark, &m, m | MARK_GUARANTEED(l)));
	return TALLY_TAKEN;
}

/*
 * After slot's permit of compartment c, in pool, whose take made in_use v:
 * within the guarantee if v is, else a permit lent by the pool
 * (share_take). TALLY_TAKEN, TALLY_FULL with *full the word to wait on,
 * or TALLY_BUSY.
 */
static inline __attribute__((always_inline)) int
pool_take(struct seg *s, struct seg_comp *c, struct seg_pool *pool, uint32_t slot, uint32_t gen,
    uint32_t took, uint32_t v, uint32_t *seen, _Atomic uint32_t **full)
{
	uint32_t lent;
	int r;

	if (v <= atomic_load_explicit(&c->guaranteed, memory_order_relaxed)) {
		/* Lent beyond the shared part (it shrank live, or a
		 * guarantee grew): nothing more until it drains, guaranteed
		 * or not, so that the pool never has more than size -
		 * reserved in use. Lending never passes the shared part, so
		 * once this reads below it, it stays so. (A borrower's take
		 * below refuses by the same comparison.) */
		lent = atomic_load(&pool->lent);
		if (lent > atomic_load(&pool->shared)) {
			*seen = lent;
			*full = &pool->lent;
			return TALLY_FULL;
		}
		r = share_mark(s, slot, gen, SHARE_POOL);
	} else {
		/* Right after the compartment's take (tag `took`), which
		 * found the slot of its generation, not released, after its
		 * compare-and-swap: the check after this one covers what came
		 * since, and the slot holds no lent permit (this step alone
		 * takes one, once an admission). Untagged and below the
		 * shared part (one comparison, as in tally_take_clear), the
		 * tally takes that compare-and-swap alone, with the same tag:
		 * the slot has made no earlier change of this tally to tell
		 * it from. */
		uint64_t w = atomic_load((_Atomic uint64_t *)(uintptr_t)&pool->lent);

		r = TALLY_MISS;
		if (__builtin_expect(w < atomic_load(&pool->shared), 1))
			r = take_swap(s, slot, gen, took, &pool->lent, w, NULL);
		if (r == TALLY_MISS)
			r = tally_take_lent(s, slot, gen, pool, seen);
		if (r == TALLY_TAKEN)	/* where a hand-over looks first (share.c's pass_on) */
			atomic_store_explicit(&c->lent_hint, slot, memory_order_relaxed);
		else if (r == TALLY_FULL)
			*full = &pool->lent;
	}
	if (r == TALLY_TAKEN)
		pool_note_use(pool);
	return r;
}

/* A pool permit went back to lent, the pool's tally of them: wakes the
 * pool's waiters, if any. Inline: every borrowed permit's release asks it,
 * and the tally it gave to is the pool, without a lookup. */
static inline void
pool_wake(_Atomic uint32_t *lent)
{
	struct seg_pool *pool = (struct seg_pool *)((uintptr_t)lent -
	    offsetof(struct seg_pool, lent));

	if (atomic_load_explicit(&pool->sleepers, memory_order_relaxed) > 0)
		pool_wake_all(pool);
}

/* Slot, whose mark is m (with a MARK_GUARANTEED flag), of compartment c
 * in pool (each NULL: none, as the release read them), is about to give
 * back its permits: see share_hand_over. Two loads when nobody borrows. */
static inline void
share_released(struct seg *s, uint32_t slot, uint64_t m, const struct seg_comp *c,
    struct seg_pool *pool)
{
	if (c == NULL)
		return;
	/* Nobody borrows: nothing to hand over. The flag may stay, the slot
	 * is being freed (its next generation starts with a clean mark) and
	 * this release is the only one; share_hand_over hands over only
	 * while the slot still holds its own permit. */
	if ((m & MARK_GUARANTEED(SHARE_POOL)) && pool != NULL &&
	    atomic_load_explicit(&pool->lent, memory_order_relaxed) != 0)
		share_hand_over(s, slot, MARK_GEN(m), SHARE_POOL);
	if ((m & MARK_GUARANTEED(SHARE_CLASS)) &&
	    atomic_load_explicit(&c->cls_lent, memory_order_relaxed) != 0)
		share_hand_over(s, slot, MARK_GEN(m), SHARE_CLASS);
}

/* ---- adaptive.c: the limit that sizes itself from measured latency ---- */

/* The controller's state, unpacked from seg_adaptive.ctl. */
struct ad_state {
	uint32_t limit16;	/* the limit in 1/16ths */
	uint32_t base_us;	/* latency baseline, 0 = none yet */
	bool ramp;		/* still ramping (doubling) since the start */
	uint32_t floor_windows;	/* windows in a row at the floor with latency high */
	bool high;		/* the last window was above the tolerance */
	uint32_t prev16;	/* latency / baseline in 1/16ths at the first cut of a run */
	uint32_t stuck;		/* cuts of the run that did not lower the latency */
};
struct ad_params {
	uint32_t min, max, tolerance_pct;
	bool observe;		/* enforce = false: the limit holds nothing back */
};
/* One closed window: samples, their mean latency and the mean concurrency
 * (Little's law: the sum of latencies over the window's length). */
struct ad_window {
	uint64_t n, mean_us, conc16;
	bool stall;		/* from ad_tick: ages of requests in flight */
	/* Of a stall window: the replies that came in it, and their mean. */
	uint64_t done, done_mean_us;
};
uint64_t ad_pack(const struct ad_state *st);
void ad_unpack(uint64_t ctl, struct ad_state *st);
/* The pure controller: the state after window w; returns the reason of a
 * change of the limit (AD_R_NONE: none). */
enum ad_reason ad_step(const struct ad_params *p, struct ad_state *st, const struct ad_window *w);
/* The adaptive limit of c now (whole permits), UINT32_MAX if c has none. */
uint32_t ad_current(const struct seg_comp *c);
/* The limit a take of permit kind p in c is held to now: `lim`, or the
 * adaptive limit when lower. Called by a take (tally.c); one load when c is not
 * adaptive. */
static inline uint32_t
ad_limit(const struct seg_comp *c, int p, uint32_t lim)
{
	uint32_t a;

	if (__builtin_expect(atomic_load_explicit(&c->ad.mode, memory_order_relaxed) != AD_ON, 1) ||
	    atomic_load_explicit(&c->ad.kind, memory_order_relaxed) != (uint32_t)p)
		return lim;
	a = ad_current(c);
	return a < lim ? a : lim;
}
/* Whether c's adaptive limit is on and limits permit kind p. */
static inline bool
ad_on(const struct seg_comp *c, int p)
{
	return __builtin_expect(atomic_load_explicit(&c->ad.mode, memory_order_relaxed) == AD_ON, 0) &&
	    atomic_load_explicit(&c->ad.kind, memory_order_relaxed) == (uint32_t)p;
}
/* A request of c (of permit kind p) completed after us microseconds: adds
 * the sample to the open window; the completion that finds the window over
 * closes it (one CAS decides who) and moves the limit (one CAS on ctl). */
void ad_sample(struct seg_comp *c, int p, uint64_t us, uint64_t now_us);
/* An admission attempt in c (permit kind p): when the open window is
 * overdue and most requests in flight are older than twice the tolerated
 * latency (a stalled backend, no completions to close it), closes it with
 * their ages as samples. One load, inline, when c is not adaptive; the
 * rest (ad_tick_scan) out of line; lock-free and async-signal-safe. */
void ad_tick_scan(struct seg *s, struct seg_comp *c, int p);
static inline void
ad_tick(struct seg *s, struct seg_comp *c, int p)
{
	if (__builtin_expect(atomic_load_explicit(&c->ad.mode, memory_order_relaxed) != AD_ON, 1) ||
	    atomic_load_explicit(&c->ad.kind, memory_order_relaxed) != (uint32_t)p)
		return;
	ad_tick_scan(s, c, p);
}
/* `bulkshim reset`: zeroes the adaptive statistics (windows, changes, last
 * change, last sample); the limit and its baseline stay. */
void ad_reset_stats(struct seg_comp *c);
/* Writes the configured adaptive settings into c (seg_apply_limits). */
void ad_apply(struct seg_comp *c, const struct cfg_compartment *cc);
/* `set NAME adaptive=off`: pins the current limit into the static word;
 * `on`: resumes from the current limit with the configured static limit
 * back. Returns -EINVAL if c is not adaptive. */
int ad_set_mode(struct seg_comp *c, bool on);
/* `set NAME max_inflight V` (the limit c's adaptive one moves) while it is
 * on: turns it off, noting the pin of V as the last change. */
void ad_pin(struct seg_comp *c, uint32_t v);
const char *ad_reason_name(unsigned r);
const char *ad_mode_name(unsigned mode);
/* Defaults of the knobs, documented in bulkshim.conf(5). */
#define AD_DEF_WINDOW_MS	100
#define AD_DEF_TOLERANCE_PCT	115
#define AD_MIN_SAMPLES		4
/* ---- reconcile.c: holds checked against the kernel ---- */

/* Gives back the holds whose socket is gone: this process's recorded
 * descriptors by fstat, other live processes' holds (of compartment comp,
 * or all if comp < 0) through /proc/PID/fd. Never drops a hold on doubt.
 * Returns the permits given back (each counted in `reconciled`). */
int seg_reconcile(struct seg *s, int comp);
/* A connection permit of compartment comp was found missing, for `why`
 * (REASON_FULL, or REASON_POOL_FULL: then the stale permit may be another
 * compartment's and every one is reconciled): reconciles, at most every
 * 100 ms per process and only in a process whose permits are its
 * descriptors (s->reconciles). Returns the permits given back, after which
 * admission takes once more (take_wait, before it would wait). A connect
 * that finds room pays nothing for this. */
int reconcile_refused(struct seg *s, uint32_t comp, enum bs_reason why);
/* A class of compartment comp is at its cap, or its unguaranteed part has
 * nothing left to lend: reclaims dead holders and reconciles comp (each
 * throttled). Returns the permits given back, after which admission tries
 * the class's permits once more. */
int reconcile_class_full(struct seg *s, uint32_t comp);

/* ---- fdtable.c: descriptor -> tracked socket, lock-free ---- */

/* Sizes the table from /proc/sys/fs/nr_open with mmap. Returns 0 or -errno. */
int fdt_init(void);

/* The table (fdtable.c): read inline by every wrapper. `size` is 0 until
 * the table is mapped; `seq` points to the segment's settings sequence
 * once attached (a word that stays 0 before). */
struct fdt_tab {
	_Atomic uint64_t *t;
	_Atomic uint32_t size;
	_Atomic uint32_t *seq;
};
extern struct fdt_tab fdt_tab BS_HIDDEN;

/* The high half of an entry whose socket needs nothing on its I/O: its
 * compartment limits no requests in flight and times out no I/O, as of the
 * settings sequence in the low 31 bits. */
#define FDT_PLAIN	0x80000000u

/* fdt_entry of a descriptor that fdt_valid passed: the load alone. */
static inline uint64_t
fdt_entry_valid(int fd)
{
	return atomic_load_explicit(&fdt_tab.t[fd], memory_order_relaxed);
}

/* The whole entry of fd: slot + 1 in the low half (0: not counted), the
 * cached verdict in the high half; FDT_FRESH for an uncounted socket fresh
 * from socket(). A bounds check and one load. */
static inline uint64_t
fdt_entry(int fd)
{
	if ((unsigned)fd >= atomic_load_explicit(&fdt_tab.size, memory_order_acquire))
		return 0;
	return fdt_entry_valid(fd);
}

/* The slot + 1 recorded for fd, 0 if untracked. */
static inline uint32_t
fdt_get(int fd)
{
	return (uint32_t)fdt_entry(fd);
}

/* True if a counted entry lets its I/O go straight to libc: its verdict is
 * plain as of the current settings sequence. */
static inline bool
fdt_plain(uint64_t e)
{
	return (uint32_t)(e >> 32) ==
	    (FDT_PLAIN | atomic_load_explicit(fdt_tab.seq, memory_order_acquire));
}

/* Where the settings sequence is (NULL: nowhere yet). */
void fdt_set_seq(_Atomic uint32_t *seq);
/* Caches `verdict` (FDT_PLAIN | sequence, or 0) in fd's entry if the entry
 * is still `was` apart from its verdict. */
void fdt_verdict(int fd, uint64_t was, uint32_t verdict);
/* True if fd fits in the table. */
static inline bool
fdt_valid(int fd)
{
	return fd >= 0 && (uint32_t)fd < atomic_load_explicit(&fdt_tab.size, memory_order_acquire);
}
/* One past the highest fd ever recorded (fdt_high). */
extern _Atomic int fdt_high_water BS_HIDDEN;
/* Records slot for fd (with no verdict) and returns what was recorded
 * before (slot + 1 or 0). */
uint32_t fdt_set(int fd, uint32_t slot);
/* Raises the high-water mark (fdt_high) to fd + 1. */
static inline void
fdt_raise_high(int fd)
{
	int high = atomic_load_explicit(&fdt_high_water, memory_order_relaxed);

	while (fd >= high && !atomic_compare_exchange_weak(&fdt_high_water, &high, fd + 1))
		;
}
/* fdt_set of a descriptor that fdt_valid passed. Inline: every counted
 * connect records its slot. */
static inline uint32_t
fdt_set_valid(int fd, uint32_t slot)
{
	fdt_raise_high(fd);
	return (uint32_t)atomic_exchange(&fdt_tab.t[fd], (uint64_t)slot + 1);
}
/* fdt_take of a descriptor whose entry fdt_get just read as counted (the
 * table, sized once, never moves). */
static inline uint32_t
fdt_take_counted(int fd)
{
	return (uint32_t)atomic_exchange(&fdt_tab.t[fd], 0);
}
/* Forgets fd and returns what was recorded (slot + 1 or 0). Inline: every
 * close of a counted socket takes its entry. */
static inline uint32_t
fdt_take(int fd)
{
	if (fdt_entry(fd) == 0)
		return 0;
	return fdt_take_counted(fd);
}
/* One past the highest fd ever recorded, to bound range scans. */
int fdt_high(void);
/* The "fresh" mark: the whole entry of a descriptor that is not counted
 * but is a stream socket from socket() not yet connected, which a fork may
 * share before its connect (see fork in interpose.c) and whose connect
 * need not ask its type. Kept in the entry itself, so that a connect reads
 * it with the descriptor's one lookup, and the slot a counted connect
 * records clears it. Stale marks are harmless: fork checks each
 * descriptor before acting on it. */
#define FDT_FRESH	((uint64_t)0x40000000u << 32)
/* Marks fd fresh (socket(), after fresh_fd), unless its entry is counted. */
void fdt_mark_fresh(int fd);
/* Clears fd's fresh mark, if it fits in the table and has one. */
void fdt_clear_fresh(int fd);
/* Forgets the slot recorded for fd and returns it (slot + 1 or 0), leaving
 * the fresh mark if `fresh`: a socket whose admission was refused, or
 * whose connect failed at once, is unconnected again. */
uint32_t fdt_unclaim(int fd, bool fresh);
/* The first fresh-marked descriptor >= fd, or -1. */
int fdt_next_fresh(int fd);
/* Forgets fd if its entry is still e (slot + 1); true if it did. */
bool fdt_take_if(int fd, uint32_t e);

/* ---- real.c: the real libc functions ---- */

struct addrinfo;
struct msghdr;
struct mmsghdr;
struct iovec;
struct timespec;
struct real_fns {
	int (*connect)(int, const struct sockaddr *, socklen_t);
	int (*close)(int);
	int (*dup)(int);
	int (*dup2)(int, int);
	int (*dup3)(int, int, int);
	int (*fcntl)(int, int, ...);
	int (*fcntl64)(int, int, ...);
	int (*close_range)(unsigned, unsigned, int);
	void (*closefrom)(int);
	int (*fclose)(void *);
	pid_t (*fork)(void);
	int (*socket)(int, int, int);
	int (*accept)(int, struct sockaddr *, socklen_t *);
	int (*accept4)(int, struct sockaddr *, socklen_t *, int);
	ssize_t (*sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
	ssize_t (*sendmsg)(int, const struct msghdr *, int);
	int (*getaddrinfo)(const char *, const char *, const struct addrinfo *,
			   struct addrinfo **);
	/* The send and receive families, for requests in flight. */
	ssize_t (*send)(int, const void *, size_t, int);
	ssize_t (*write)(int, const void *, size_t);
	ssize_t (*writev)(int, const struct iovec *, int);
	int (*sendmmsg)(int, struct mmsghdr *, unsigned, int);
	ssize_t (*sendfile)(int, int, off_t *, size_t);
	ssize_t (*sendfile64)(int, int, off_t *, size_t);
	ssize_t (*recv)(int, void *, size_t, int);
	ssize_t (*recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
	ssize_t (*recvmsg)(int, struct msghdr *, int);
	int (*recvmmsg)(int, struct mmsghdr *, unsigned, int, struct timespec *);
	ssize_t (*read)(int, void *, size_t);
	ssize_t (*readv)(int, const struct iovec *, int);
	ssize_t (*recv_chk)(int, void *, size_t, size_t, int);
	ssize_t (*recvfrom_chk)(int, void *, size_t, size_t, int, struct sockaddr *,
				socklen_t *);
	ssize_t (*read_chk)(int, void *, size_t, size_t);
	pid_t (*_Fork)(void);
	int (*clone)(int (*)(void *), void *, int, void *, ...);
	void *(*dlopen)(const char *, int);
	void *(*dlmopen)(long, const char *, int);
};

/* Entries start at trampolines that bind on first use, so none is ever NULL. */
extern struct real_fns real BS_HIDDEN;

/* Binds every real function once with dlsym(RTLD_NEXT). Safe to call from
 * any wrapper at any time; a recursive call (dlsym calling back into a
 * wrapper) returns at once, and the trampolines then use the raw system
 * calls. Aborts if dlsym returns one of our own wrappers. */
void real_bind(void);
bool real_bound(void);
/* A system call made with the instruction itself, past libc's syscall()
 * and the shim's wrapper of it. Returns the result or -1 with errno. */
long raw_syscall(long n, long a1, long a2, long a3, long a4, long a5, long a6);
/* libc's syscall(n, a[0..5]) once bound, the instruction before. */
long real_syscall6(long n, const long a[6]);

/* ---- interpose.c: the process-wide state ---- */

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
bool shim_active(void);
extern _Atomic int shim_unseen BS_HIDDEN;
/* procid.c: the pid asked of the kernel and compared with the cached one. */
bool shim_foreign_ask(void);
/* True in a process that shares our memory but is not the one the tables
 * describe (a vfork child, a clone), or a copy of it the fork wrapper did
 * not prepare: its descriptors are not ours. A system call only while such
 * a process may exist (procid.c); one load otherwise, inline. */
static inline bool
shim_foreign(void)
{
#if defined(__x86_64__)
	if (__builtin_expect(atomic_load_explicit(&shim_unseen, memory_order_relaxed) == 0, 1))
		return false;
#endif
	/* Elsewhere vfork is not wrapped (procid.c): always ask. */
	return shim_foreign_ask();
}
/* Registers the fork handler that marks children of unseen forks. */
void shim_watch_forks(void);
/* In the child of the fork wrapper: it is seen; shim.pid becomes its pid. */
void shim_forked_seen(void);
/* Records that fd refers to slot (exec adoption). */
void shim_adopt_fd(int fd, uint32_t slot);
/* The errno a refusal of compartment c answers with (an allowed one). */
int shim_reject_errno(const struct seg_comp *c);
/* True if a call with these flags may block on fd. One fcntl. */
bool shim_blocking(int fd, int flags);
/* Logs a refusal (rate-limited) in words that say why. */
void shim_log_refusal(uint32_t comp, enum bs_reason why, const char *what, const char *dest);
enum admit { ADMIT_PASS, ADMIT_COUNTED, ADMIT_REFUSED };
/* What admission found for a descriptor it counted, handed down the path so
 * that the caller looks nothing up again. */
struct admitted {
	uint32_t slot;
	struct seg_comp *c;
	bool fresh;		/* the descriptor was marked fresh (fdt_mark_fresh) */
};
/* Decides a connect (or TCP Fast Open send) of fd to sa: ADMIT_PASS when
 * nothing is to be counted, ADMIT_COUNTED when a permit was taken for fd
 * (then *got says which slot of which compartment), ADMIT_REFUSED with errno
 * set when the compartment refused. */
enum admit shim_admit(int fd, const struct sockaddr *sa, socklen_t len, const char *what,
    struct admitted *got);
/* After the real connect of an admitted descriptor (got): one that failed
 * at once gives its permit back. */
void shim_settle(int fd, long r, const struct admitted *got);
/* Rebuilds the destination rules if `bulkshim reload` changed them. */
void shim_maybe_reload(void);

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

#endif
