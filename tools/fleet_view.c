/* fleet_view.c - a compartment's fleet budget: read for the snapshot, shown by status, watch and metrics. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "fleet.h"

const char *
fleet_agent_name(uint32_t agent)
{
	switch (agent) {
	case FLEET_AGENT_RUNNING: return "running";
	case FLEET_AGENT_STOPPED: return "stopped";
	case FLEET_AGENT_NOT_RENEWING: return "not renewing";
	default: return "none";
	}
}

/* Whether process pid is stopped (by SIGSTOP, a debugger or a frozen
 * cgroup): its state in /proc/PID/stat, after the command's parenthesis. */
static bool
pid_stopped(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (f == NULL)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return p != NULL && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

/* The agent's liveness: from its pid (the agent clears it when it exits),
 * its process state, and the lease it renews. A lease whose end passed
 * more than a lease ago (expiry - renewed is two thirds of one) while the
 * last word from Redis was ok has an agent that does not work. */
static uint32_t
agent_of(const struct cli_comp *c, uint64_t now, uint64_t expiry, uint64_t renewed)
{
	if (c->fleet_agent_pid <= 0 || !sys_pid_alive(c->fleet_agent_pid, 0))
		return FLEET_AGENT_NONE;
	if (pid_stopped(c->fleet_agent_pid))
		return FLEET_AGENT_STOPPED;
	if (c->fleet_state == FLEET_OK && expiry != 0 && renewed != 0 && expiry > renewed &&
	    now > expiry && now - expiry > (expiry - renewed) * 3 / 2)
		return FLEET_AGENT_NOT_RENEWING;
	return FLEET_AGENT_RUNNING;
}

void
cli_read_fleet(const struct seg_comp *sc, struct cli_comp *c)
{
	uint64_t now = now_mono_ms(), expiry, renewed;

	c->fleet_limit = atomic_load(&sc->fleet_limit);
	c->fleet_lease_age_ms = UINT64_MAX;
	if (c->fleet_limit == 0)
		return;
	c->fleet_floor = atomic_load(&sc->fleet_floor);
	c->fleet_share = atomic_load(&sc->fleet_share);
	c->fleet_hosts = atomic_load(&sc->fleet_hosts);
	c->fleet_demand = atomic_load(&sc->fleet_demand);
	c->fleet_churn_c = atomic_load(&sc->fleet_churn_c);
	c->fleet_state = atomic_load(&sc->fleet_redis_ok);
	c->fleet_agent_pid = atomic_load(&sc->fleet_agent_pid);
	expiry = atomic_load(&sc->fleet_expiry_ms);
	renewed = atomic_load(&sc->fleet_renewed_ms);
	c->fleet_lease = now < expiry;
	c->fleet_lease_left_ms = c->fleet_lease ? expiry - now : 0;
	if (renewed != 0)
		c->fleet_lease_age_ms = now > renewed ? now - renewed : 0;
	/* An agent that died left its last state behind, and one that is
	 * stopped does not talk to Redis whatever it last heard. */
	c->fleet_agent = agent_of(c, now, expiry, renewed);
	if (c->fleet_agent == FLEET_AGENT_NONE || c->fleet_agent == FLEET_AGENT_STOPPED)
		c->fleet_state = FLEET_NO_AGENT;
}

void
cli_json_fleet(FILE *f, const struct cli_comp *c)
{
	/* No limit at all is null, as a damaged one is ("unlimited" and
	 * "damaged" tell them apart), never 0. */
	cli_json_value(f, "live_limit", c->live_limit, c->live_limit == UINT32_MAX ||
	    CLI_DAMAGED(c->damaged, CF_LIVE_LIMIT));
	cli_json_field(f, c->damaged, CF_FLEET_LIMIT, c->fleet_limit);
	if (c->fleet_limit == 0)
		return;
	fprintf(f, ", \"fleet_floor\": %u, \"fleet_share\": %u, \"fleet_lease\": %s, "
	    "\"fleet_lease_left_ms\": %llu, \"fleet_lease_age_ms\": %lld, \"fleet_redis\": \"%s\", "
	    "\"fleet_redis_reachable\": %s, \"fleet_hosts\": %u, \"fleet_demand\": %u, "
	    "\"fleet_churn_per_min\": %u.%02u", c->fleet_floor, c->fleet_share,
	    c->fleet_lease ? "true" : "false", (unsigned long long)c->fleet_lease_left_ms,
	    c->fleet_lease_age_ms == UINT64_MAX ? -1LL : (long long)c->fleet_lease_age_ms,
	    fleet_state_name(c->fleet_state), c->fleet_state == FLEET_OK ? "true" : "false",
	    c->fleet_hosts, c->fleet_demand, c->fleet_churn_c / 100, c->fleet_churn_c % 100);
	fprintf(f, ", \"fleet_agent\": \"%s\", \"fleet_agent_pid\": %d",
	    fleet_agent_name(c->fleet_agent), c->fleet_agent == FLEET_AGENT_NONE ? 0 : (int)c->fleet_agent_pid);
}

void
cli_fleet_line(const struct cli_comp *c, const char *name, char *buf, size_t len)
{
	char age[32];

	if (name == NULL)
		name = c->name;

	if (c->fleet_lease_age_ms == UINT64_MAX)
		snprintf(age, sizeof(age), "never renewed");
	else
		snprintf(age, sizeof(age), "renewed %.1fs ago", (double)c->fleet_lease_age_ms / 1000);
	if (c->fleet_lease)
		snprintf(buf, len, "%s: fleet share %u of %u (floor %u), lease %.1fs left, %s, "
		    "redis %s, %u host%s", name, c->fleet_share, c->fleet_limit, c->fleet_floor,
		    (double)c->fleet_lease_left_ms / 1000, age, fleet_state_name(c->fleet_state),
		    c->fleet_hosts, c->fleet_hosts == 1 ? "" : "s");
	else
		snprintf(buf, len, "%s: ON FLOOR %u of fleet limit %u (no valid lease, %s), "
		    "redis %s", name, c->fleet_floor, c->fleet_limit, age,
		    fleet_state_name(c->fleet_state));
}

void
cli_text_fleet(FILE *f, const struct cli_comp *all, uint32_t n)
{
	char line[256];
	bool any = false;

	for (uint32_t i = 0; i < n; i++) {
		if (all[i].fleet_limit == 0)
			continue;
		if (!any)
			fputc('\n', f);
		any = true;
		cli_fleet_line(&all[i], NULL, line, sizeof(line));
		fprintf(f, "%s\n", line);
	}
}
