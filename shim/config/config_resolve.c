/* config_resolve.c - resolves the host names of a config at load, with one bounded wait. */
#include "config/config_int.h"
#include "config/match_int.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Running out of memory must become an error message, not an exit(). */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

/* An address, port range pair already among the /128 rules. */
struct seen {
	UT_hash_handle hh;
	struct {
		uint8_t addr[16];
		uint16_t lo, hi;
	} key;
};

/* One distinct host name being resolved. */
struct query {
	UT_hash_handle hh;
	struct gaicb cb;
	struct addrinfo hints;
	struct addrinfo *res;
	int status;		/* getaddrinfo_a's answer; EAI_INPROGRESS: none in time */
	char name[BS_HOST_MAX];
};

static bool seen_add(struct seen **set, const uint8_t addr[16], uint16_t lo, uint16_t hi,
		     int *rc)
{
	struct seen probe, *e;

	memset(&probe, 0, sizeof(probe));
	memcpy(probe.key.addr, addr, 16);
	probe.key.lo = lo;
	probe.key.hi = hi;
	HASH_FIND(hh, *set, &probe.key, sizeof(probe.key), e);
	if (e != NULL)
		return false;
	e = malloc(sizeof(*e));
	if (e == NULL) {
		*rc = -ENOMEM;
		return false;
	}
	*e = probe;
	HASH_ADD(hh, *set, key, sizeof(e->key), e);
	if (e->hh.tbl == NULL) {
		free(e);
		*rc = -ENOMEM;
		return false;
	}
	return true;
}

/* Waits for the queries with one deadline for all of them. */
static void wait_queries(struct gaicb **list, size_t n, unsigned timeout_ms)
{
	struct gaicb **wait = malloc(n * sizeof(*wait));
	struct timespec end, now, left;

	if (wait == NULL)
		return;
	memcpy(wait, list, n * sizeof(*wait));
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += timeout_ms / 1000;
	end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	for (;;) {
		size_t pending = 0;

		/* gai_suspend returns at once while a finished request is
		 * still in the list, so finished ones are taken out. */
		for (size_t i = 0; i < n; i++) {
			if (wait[i] != NULL && gai_error(wait[i]) != EAI_INPROGRESS)
				wait[i] = NULL;
			pending += wait[i] != NULL;
		}
		if (pending == 0)
			break;
		clock_gettime(CLOCK_MONOTONIC, &now);
		left.tv_sec = end.tv_sec - now.tv_sec;
		left.tv_nsec = end.tv_nsec - now.tv_nsec;
		if (left.tv_nsec < 0) {
			left.tv_sec--;
			left.tv_nsec += 1000000000L;
		}
		if (left.tv_sec < 0 || (left.tv_sec == 0 && left.tv_nsec == 0))
			break;
		gai_suspend((const struct gaicb *const *)wait, (int)n, &left);
	}
	free(wait);
}

/* What became of a name that gave no address, as the lines of
 * cfg->unresolved say it. */
static const char *unresolved_why(int status, unsigned timeout_ms, char *buf, size_t len)
{
	if (status == EAI_INPROGRESS || status == EAI_CANCELED)
		snprintf(buf, len, "got no answer within resolve_timeout_ms %u", timeout_ms);
	else if (status == 0 || status == EAI_NODATA || status == EAI_ADDRFAMILY)
		snprintf(buf, len, "resolves to nothing (no IPv4 or IPv6 address)");
	else
		snprintf(buf, len, "resolves to nothing (%s)", gai_strerror(status));
	return buf;
}

/* Appends to cfg->unresolved the line of host rule i, whose name gave no
 * address (status: getaddrinfo_a's answer). Returns 0, or -ENOMEM. */
static int note_unresolved(struct cfg_ctx *c, size_t i, int status)
{
	struct bs_config *cfg = c->cfg;
	const struct rule *r = &cfg->rules[i];
	const char *file = c->src != NULL && c->src[i].file != NULL ? c->src[i].file : c->path;
	char why[128], dest[BS_HOST_MAX + 16], line[BS_ERRLEN];
	size_t old = cfg->unresolved != NULL ? strlen(cfg->unresolved) : 0, n;
	char *more;

	match_rule_text(r, dest, sizeof(dest));
	n = (size_t)snprintf(line, sizeof(line), "%s:%d: host \"%s\" of compartment \"%s\" %s: "
			     "connections to %s are not limited until "
			     "the program's own lookup of the name returns an address\n", file,
			     r->line, r->host, cfg->comp[r->comp].name,
			     unresolved_why(status, cfg->resolve_timeout_ms, why, sizeof(why)), dest);
	if (n >= sizeof(line)) {
		n = sizeof(line) - 1;
		line[n - 1] = '\n';
	}
	if ((more = realloc(cfg->unresolved, old + n + 1)) == NULL)
		return -ENOMEM;
	memcpy(more + old, line, n + 1);
	cfg->unresolved = more;
	cfg->nunresolved++;
	return 0;
}

/* Resolves every host named by a RULE_HOST rule at once with getaddrinfo_a
 * and appends each address as a RULE_IP /128 rule with the host rule's
 * ports, compartment and line. A host that fails or is late is skipped: the
 * shim also learns addresses from the program's own lookups. An address
 * already among the /128 rules with the same ports is skipped too, in any
 * compartment: the rule written first wins, so two names of one address
 * cannot turn into a duplicate-destination error that depends on DNS.
 * Each name that gave no address adds a line to cfg->unresolved.
 * Returns 0, or -ENOMEM with a message. */
int cfg_resolve_hosts(struct cfg_ctx *c)
{
	struct bs_config *cfg = c->cfg;
	size_t nparsed = cfg->nrules, nq = 0;
	struct query *byname = NULL, *q, **qs = NULL;
	struct gaicb **list = NULL;
	struct seen *set = NULL, *e, *tmp;
	int rc = 0;

	for (size_t i = 0; i < nparsed && rc == 0; i++) {
		if (cfg->rules[i].kind != RULE_HOST)
			continue;
		HASH_FIND_STR(byname, cfg->rules[i].host, q);
		if (q != NULL)
			continue;
		if ((q = calloc(1, sizeof(*q))) == NULL) {
			rc = -ENOMEM;
			break;
		}
		snprintf(q->name, sizeof(q->name), "%s", cfg->rules[i].host);
		HASH_ADD_STR(byname, name, q);
		if (q->hh.tbl == NULL) {
			free(q);
			rc = -ENOMEM;
			break;
		}
		nq++;
	}
	if (rc < 0 || nq == 0)
		goto done;
	qs = calloc(nq, sizeof(*qs));
	list = calloc(nq, sizeof(*list));
	if (qs == NULL || list == NULL) {
		rc = -ENOMEM;
		goto done;
	}
	nq = 0;
	for (q = byname; q != NULL; q = q->hh.next) {
		q->hints.ai_family = AF_UNSPEC;
		q->hints.ai_socktype = SOCK_STREAM;
		q->cb.ar_name = q->name;
		q->cb.ar_request = &q->hints;
		qs[nq] = q;
		list[nq++] = &q->cb;
	}
	/* When this fails part way, the requests not queued look finished
	 * with no result, and the queued ones are waited for as usual. */
	getaddrinfo_a(GAI_NOWAIT, list, (int)nq, NULL);
	wait_queries(list, nq, cfg->resolve_timeout_ms);
	for (size_t i = 0; i < nq; i++) {
		int st = gai_error(&qs[i]->cb);

		if (st == EAI_INPROGRESS) {
			st = gai_cancel(&qs[i]->cb);
			if (st == EAI_NOTCANCELED) {
				/* A resolver thread still owns this request
				 * and will write into it: leave it be. */
				HASH_DEL(byname, qs[i]);
				qs[i] = NULL;
				continue;
			}
			st = st == EAI_ALLDONE ? gai_error(&qs[i]->cb) : EAI_INPROGRESS;
		}
		qs[i]->status = st;
		if (st == 0)
			qs[i]->res = qs[i]->cb.ar_result;
	}

	for (size_t i = 0; i < nparsed && rc == 0; i++) {
		if (cfg->rules[i].kind == RULE_IP && cfg->rules[i].prefix == 128)
			seen_add(&set, cfg->rules[i].addr, cfg->rules[i].port_lo,
				 cfg->rules[i].port_hi, &rc);
	}
	for (size_t i = 0; i < nparsed && rc == 0; i++) {
		struct rule host = cfg->rules[i];
		bool any = false;

		if (host.kind != RULE_HOST)
			continue;
		HASH_FIND_STR(byname, host.host, q);
		for (const struct addrinfo *ai = q ? q->res : NULL; ai && rc == 0; ai = ai->ai_next) {
			struct rule r = { .kind = RULE_IP, .prefix = 128, .port_lo = host.port_lo,
					  .port_hi = host.port_hi, .comp = host.comp,
					  .line = host.line };

			if (ai->ai_family == AF_INET && ai->ai_addrlen >= sizeof(struct sockaddr_in)) {
				const struct sockaddr_in *in = (const struct sockaddr_in *)ai->ai_addr;

				r.addr[10] = r.addr[11] = 0xff;
				memcpy(r.addr + 12, &in->sin_addr, 4);
			} else if (ai->ai_family == AF_INET6 &&
				   ai->ai_addrlen >= sizeof(struct sockaddr_in6)) {
				const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ai->ai_addr;

				memcpy(r.addr, &in6->sin6_addr, 16);
			} else {
				continue;
			}
			/* The name goes along, for a reload to keep (match_carry). */
			memcpy(r.host, host.host, sizeof(r.host));
			any = true;
			if (seen_add(&set, r.addr, r.port_lo, r.port_hi, &rc))
				rc = cfg_push_rule(c, &r, NULL, NULL);
		}
		if (!any && rc == 0)
			rc = note_unresolved(c, i, q != NULL ? q->status : EAI_INPROGRESS);
	}
done:
	HASH_ITER(hh, set, e, tmp) {
		HASH_DEL(set, e);
		free(e);
	}
	while (byname != NULL) {
		q = byname;
		HASH_DEL(byname, q);
		if (q->res != NULL)
			freeaddrinfo(q->res);
		free(q);
	}
	free(qs);
	free(list);
	if (rc < 0)
		return cfg_fail(c, NULL, rc, "out of memory resolving host names");
	return 0;
}
