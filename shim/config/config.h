/* config.h - the configuration: loaded and validated once, immutable after. */
#ifndef BULKSHIM_CONFIG_H
#define BULKSHIM_CONFIG_H

#include "bulkshim.h"
#include "config/match.h"

#define BS_MAX_PATTERNS	64	/* program-name patterns per class */
#define BS_NO_POOL	(-1)
/* Defaults of the adaptive knobs, documented in bulkshim.conf(5). */
#define AD_DEF_WINDOW_MS	100
#define AD_DEF_TOLERANCE_PCT	115
/* The published controllers' defaults (admit/ad_published.c says where
 * each comes from). */
#define AD_DEF_TIMEOUT_MS		5000	/* AIMDLimit's DEFAULT_TIMEOUT */
#define AD_DEF_BACKOFF_PCT		90	/* AIMDLimit's backoffRatio */
#define AD_DEF_GRADIENT2_TOLERANCE_PCT	150	/* Gradient2Limit's rttTolerance */
#define AD_DEF_MIN_RTT_INTERVAL_MS	60000	/* Envoy's documented example interval */
#define AD_DEF_MIN_CONCURRENCY		3	/* Envoy's min_concurrency */

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
	bool drills;			/* `bulkshim drill` may fault its connections */
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
	uint32_t ad_algorithm;		/* enum ad_algorithm: the controller */
	/* The published controllers' knobs (admit/ad_alg.h). */
	uint32_t ad_timeout_ms, ad_backoff_pct, ad_min_rtt_interval_ms, ad_min_concurrency;
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
	/* This host's name in the fleet; by default "<host name>/<segment>",
	 * so that two segments of one machine never share one. */
	char host[BS_HOST_MAX];
	uint32_t lease_ms;
	uint32_t interval_ms;		/* renewal period */
	uint32_t timeout_ms;		/* Redis connect and reply timeout */
	uint32_t max_hosts;		/* `hosts`: floors held back for all; 0 = known only */
	uint32_t forget_s;		/* how long Redis counts what a silent host may hold */
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
	bool drills;		/* the default of every compartment's drills: false */
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
	/* After a load that resolved host names: one line per host-name
	 * destination that gave no address, "FILE:LINE: ...", each ending in
	 * '\n' (NULL when every name gave some), and how many lines. */
	char *unresolved;
	size_t nunresolved;
};

/* Loads and validates path into *cfg (which it zeroes first). Host names are
 * resolved with a bounded wait when resolve is true. Returns 0; -ENOENT when
 * the file does not exist; -EINVAL (or another -errno) with one message
 * "FILE:LINE: what is wrong" in err. On error *cfg holds nothing to free. */
int cfg_load(const char *path, struct bs_config *cfg, bool resolve, char *err, size_t errlen);
/* Checks the sums of cfg that cfg_load checks across compartments, for a
 * config whose limits were changed since it was loaded (`bulkshim set`
 * puts the live values in): with CFG_SUM_BUDGET the compartments'
 * max_connections (a pool's as the most it can have in use) within the
 * budget's pool less its reserve; with CFG_SUM_POOLS each pool's
 * guarantees within its size less its reserve, each at most its
 * compartment's ceiling. Returns 0, or -EINVAL (-ENOMEM) with one message
 * "FILE: ..." in err that shows the arithmetic. */
#define CFG_SUM_BUDGET	1u
#define CFG_SUM_POOLS	2u
int cfg_check_sums(struct bs_config *cfg, unsigned which, char *err, size_t errlen);
/* The segment name a config file gets when it names none: its base name
 * without the extension. */
void cfg_default_segment(const char *path, char *out, size_t outlen);
/* Why errno EAGAIN and max_inflight are refused together: a refused send
 * answering EAGAIN on a blocking socket is retried at once, a busy loop. */
extern const char cfg_eagain_spin[];
/* The most connections pool p of cfg can have in use: its size less its
 * reserve, or less when its compartments' ceilings sum to less. */
uint64_t cfg_pool_most(const struct bs_config *cfg, size_t p);
/* Parses "ECONNREFUSED" etc.; returns the errno value or -EINVAL. */
int cfg_errno_value(const char *name);
const char *cfg_errno_name(int value);
void cfg_free(struct bs_config *cfg);
/* cfg_load, but err gets every error it finds, one "FILE:LINE: ..." per
 * line (libconfig's syntax errors stop it at the first), for `check`. */
/* config_adaptive.c: the name of controller `alg` ("bulkshim", "vegas",
 * "gradient2", "aimd", "envoy"; "?" for an unknown number), and the number
 * of a name (-1 if unknown). */
const char *ad_alg_name(unsigned alg);
int ad_alg_parse(const char *name);

int cfg_load_all(const char *path, struct bs_config *cfg, bool resolve, char *err, size_t errlen);
/* The segment a config file names (its "segment" key, else the default
 * from its name), even when the file has errors, so that a process that
 * runs inert because of them can say so in the segment. */
void cfg_segment_of(const char *path, char *out, size_t outlen);
/* True if ch may be part of a compartment, pool, class or segment name. */
bool cfg_name_char(char ch);
/* Of the names in known (NULL-terminated), the one closest to name (a
 * typo's likely meaning), or NULL if none is close. */
const char *cfg_closest(const char *name, const char *const *known);
/* True if path parses and sets strict = true, so that a config with an error
 * elsewhere can still ask for strict mode. False on any doubt. */
bool cfg_wants_strict(const char *path);

#endif
