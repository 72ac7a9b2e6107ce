/* fleet.h - what the fleet agent's files share: the Redis side of a fleet budget. */
#ifndef BULKSHIM_FLEET_H
#define BULKSHIM_FLEET_H

#include <stdbool.h>
#include <stdint.h>

#include "admit/admit.h"
#include "log.h"
#include "sys.h"

struct fleet_conn;	/* a connection to Redis with the script loaded */

/* The renewal script, tools/fleet.lua, built into the binary (fleet_script.c). */
extern const char fleet_lua[];

/* Segment compartment states of fleet_redis_ok, for status and metrics. */
enum { FLEET_NO_AGENT = 0, FLEET_OK = 1, FLEET_UNREACHABLE = 2, FLEET_REFUSED = 3 };
/* "no agent", "ok", "unreachable", "refused". */
const char *fleet_state_name(uint32_t state);

/* The fleet agent of a compartment, as the views judge it from the
 * segment (fleet_view.c): none (never ran, exited or died: its pid is
 * gone), running, stopped (alive but stopped by a signal, SIGSTOP or a
 * frozen cgroup: it renews nothing) or not renewing (alive, Redis last
 * answered, yet its lease ran out a lease ago: hung, or Redis hangs). */
enum { FLEET_AGENT_NONE = 0, FLEET_AGENT_RUNNING = 1, FLEET_AGENT_STOPPED = 2,
	FLEET_AGENT_NOT_RENEWING = 3 };
/* "none", "running", "stopped", "not renewing". */
const char *fleet_agent_name(uint32_t agent);

/* Who is calling, besides the host name of the config (cfg_fleet.host). */
struct fleet_me {
	/* The segment this agent serves, on this boot of this machine: the
	 * same for every agent of that segment (a restarted one takes over
	 * its entry), different for any other segment anywhere, so that two
	 * agents given one host name are told apart. */
	char token[96];
	/* The agent as a person reads it: pid, machine, segment. */
	char agent[192];
};
/* Fills me for the agent of segment `segment` (its name in the config). */
void fleet_me_init(struct fleet_me *me, const char *segment);

/* A host's report on one compartment, and what Redis answered. */
struct fleet_ask {
	const char *comp;	/* compartment name */
	uint32_t limit, floor, ceiling, held, want, applied;
	/* The agent stops: the host is on its floor, and Redis records what it
	 * holds and ends its lease (the answer's share is 0). */
	bool leave;
	/* Answer: */
	bool ok;
	uint32_t share, live, known;
	uint32_t in_force;	/* the fleet_limit in force: the lowest of the live hosts' */
	char lowest[BS_HOST_MAX];	/* the host whose limit that is */
	char note[256];		/* from the script, or the error */
	bool refused;		/* Redis answered with an error, not a failure to talk */
	/* The share is short of this host's target only until other live
	 * hosts lower theirs at their next calls: call again sooner. */
	bool soon;
};

/* Connects to f->redis within f->timeout_ms and authenticates with the
 * password in f->password_file, if any. Returns the connection, or NULL with
 * the reason in err; *refused is true when Redis answered but said no
 * (a wrong password), false when it could not be reached. */
struct fleet_conn *fleet_connect(const struct cfg_fleet *f, bool *refused, char *err,
    size_t errlen);
/* Renews the leases of n compartments in one pipelined round trip: one run of
 * the script each, with seq (growing), the lease and who calls (me). Fills
 * each ask's answer. Returns 0, or -EIO when the connection failed (it must
 * then be freed; the asks not answered have ok false), with the reason in err. */
int fleet_renew(struct fleet_conn *fc, const struct cfg_fleet *f, const struct fleet_me *me,
    struct fleet_ask *asks, size_t n, uint64_t seq, char *err, size_t errlen);
/* The Redis key of a compartment of fleet `fleet`. */
void fleet_key(const char *fleet, const char *comp, char *out, size_t len);
void fleet_disconnect(struct fleet_conn *fc);
/* Every host's entry of compartment comp as Redis holds it, for --status:
 * calls fn once per host with the entry's fields. Returns the number of
 * hosts, or -EIO (-EPROTO) with the reason in err. */
struct fleet_entry {
	char host[BS_HOST_MAX];
	const char *agent;	/* "" when the entry has none */
	uint64_t share, applied, held, want, floor, ceiling, expires, seen, limit;
	/* What Redis counts against the budget for this host: for a live
	 * lease the largest of share, applied and held; for one run out the
	 * floor too (the host keeps what it opened, and may open its floor). */
	uint64_t reserved;
	/* The host's share changes per minute, as Redis weighs them (about the
	 * last minute); 0 in the entry of an older agent. */
	double churn;
	bool old;	/* left by an agent older than tokens: a floor once run out */
};
int fleet_entries(struct fleet_conn *fc, const char *fleet, const char *comp, uint64_t *now_ms,
    void (*fn)(const struct fleet_entry *e, void *arg), void *arg, char *err, size_t errlen);

/* ---- fleet_seg.c: the agent and its segment ---- */

struct seg_perm;
struct seg_user;
/* What the agent does about its segment. */
enum fleet_seg_step {
	FSEG_ATTACH,	/* it exists, and both the service and the agent can use it */
	FSEG_CREATE,	/* create it: the agent can give it to the config's owner */
	FSEG_WAIT,	/* leave it to the service's programs, which create it */
	FSEG_REFUSE,	/* it would be, or is, of no use to the service or the agent */
};
/* The step for cfg's segment, whose owner, group and mode are *p (NULL
 * while it does not exist), for an agent running as self and a service
 * running as svc (the config's owner; NULL when it names none). msg gets
 * the line to log: why it waits (who creates the segment), why it refuses,
 * with the fix; a warning, or nothing, otherwise. Pure but for the names of users and groups. */
enum fleet_seg_step fleet_seg_plan(const struct bs_config *cfg, const struct seg_perm *p,
    const struct seg_user *self, const struct seg_user *svc, char *msg, size_t len);

#endif
