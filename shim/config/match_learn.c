/* match_learn.c - host names learned from getaddrinfo, and carried into the rules of a reload. */
#include "config/match_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

struct memo match_memo_off;

/* Notes, for match_carry, the RULE_IP rules that carry the host name they
 * were resolved from, under the name of that host's own site. */
void match_keep_resolved(struct matcher *m, const struct rule *rules, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct name_site *s;

		if (rules[i].kind != RULE_IP || rules[i].host[0] == '\0' ||
		    memchr(rules[i].host, '\0', sizeof(rules[i].host)) == NULL ||
		    (s = match_find_host(m, rules[i].host)) == NULL)
			continue;
		m->resolved[m->nresolved].host = s->name;
		memcpy(m->resolved[m->nresolved++].addr, rules[i].addr, 16);
	}
}

/* Copies host in lower case without one trailing dot; returns its length,
 * or 0 when it cannot name a rule. */
static size_t host_key(const char *host, char key[BS_HOST_MAX])
{
	size_t n;

	if (host == NULL)
		return 0;
	n = strnlen(host, HOST_LEN_MAX + 2);
	if (n > 1 && host[n - 1] == '.')
		n--;
	if (n == 0 || n > HOST_LEN_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		key[i] = match_lower(host[i]);
	key[n] = '\0';
	return n;
}

const struct name_site *match_find_host(const struct matcher *m, const char *host)
{
	const struct name_site *s = NULL;
	char key[BS_HOST_MAX];
	size_t n;

	if (m == NULL || (n = host_key(host, key)) == 0)
		return NULL;
	HASH_FIND(hh, m->host_sites, key, n, s);
	return s;
}

/* True if some RULE_HOST rule names host, ignoring case and one trailing
 * dot; false also for a NULL matcher or host. */
bool match_has_host(const struct matcher *m, const char *host)
{
	return match_find_host(m, host) != NULL;
}

static bool learned_has(const struct learned *l, const uint8_t addr[16], const struct mrange *r,
			const char *host)
{
	uint32_t h = match_addr_hash(addr);

	for (uint32_t probe = 0; probe < LEARN_SLOTS; probe++) {
		uint32_t v = atomic_load_explicit(&l->slot[(h + probe) & (LEARN_SLOTS - 1)],
						  memory_order_acquire);
		const struct learned_entry *e;

		if (v == 0)
			return false;
		e = &l->e[v - 1];
		if (memcmp(e->addr, addr, 16) == 0 && e->lo == r->lo && e->hi == r->hi &&
		    e->comp == r->comp && e->host == host)
			return true;
	}
	return false;
}

/* Claims, fills and publishes one learned entry. Writers never wait for each
 * other: the claim is a CAS on `reserved`, and each entry is published on
 * its own by a release CAS into a free slot. No lock means nothing for a
 * fork in another thread to leave locked. */
static int learned_add(struct learned *l, const uint8_t addr[16], const struct mrange *r,
		       const char *host)
{
	uint32_t idx = atomic_load_explicit(&l->reserved, memory_order_relaxed);
	uint32_t h = match_addr_hash(addr);

	do {
		if (idx >= BS_LEARNED_MAX)
			return -ENOSPC;
	} while (!atomic_compare_exchange_weak_explicit(&l->reserved, &idx, idx + 1,
							memory_order_relaxed,
							memory_order_relaxed));
	memcpy(l->e[idx].addr, addr, 16);
	l->e[idx].lo = r->lo;
	l->e[idx].hi = r->hi;
	l->e[idx].comp = r->comp;
	l->e[idx].host = host;
	/* At most BS_LEARNED_MAX of the 2 * BS_LEARNED_MAX slots are ever
	 * used, so a free slot is always found. */
	for (uint32_t probe = 0;; probe++) {
		uint32_t zero = 0;

		if (atomic_compare_exchange_strong_explicit(
			    &l->slot[(h + probe) & (LEARN_SLOTS - 1)], &zero, idx + 1,
			    memory_order_release, memory_order_relaxed))
			break;
	}
	atomic_fetch_add_explicit(&l->count, 1, memory_order_release);
	return 0;
}

/* Puts an empty memo in place of m's, after a learned address was
 * published: a lookup that loads the new memo sees the address (the
 * exchanges of concurrent learners form one release sequence). Without the
 * memory for one, lookups go without (memo_off) until the next learn. */
static void memo_renew(struct matcher *m)
{
	struct memo *mm = calloc(1, sizeof(*mm)), *old;

	old = atomic_exchange(&m->memo, mm != NULL ? mm : &match_memo_off);
	if (old == &match_memo_off)
		return;
	old->older = atomic_load(&m->retired);
	while (!atomic_compare_exchange_weak(&m->retired, &old->older, old))
		;
}

/* Adds addr, for the host site s, with each port range of s; *added is set
 * when an entry is new. Returns 0, or -ENOSPC when the table is full. */
static int learn_site(struct matcher *m, const struct name_site *s, const uint8_t addr[16],
		      bool *added)
{
	for (uint32_t i = s->first; i < s->first + s->count; i++) {
		const struct mrange *r = &m->ranges[i];

		if (learned_has(m->learned, addr, r, s->name))
			continue;
		if (learned_add(m->learned, addr, r, s->name) < 0)
			return -ENOSPC;
		*added = true;
	}
	return 0;
}

/* Records that host resolved to sa (AF_INET or AF_INET6; its port is not
 * used): sa then matches with the port range of every RULE_HOST rule that
 * names host, ranking as an exact /128 rule. Safe against concurrent
 * match_find and match_learn calls; two threads learning the same address
 * at once may both add it, which costs a slot and changes no answer.
 * Returns the compartment of the host's first rule, -1 if no rule names host
 * (or an argument is NULL or not inet), or -ENOSPC when the table is full. */
int match_learn(struct matcher *m, const char *host, const struct sockaddr *sa)
{
	const struct name_site *s = match_find_host(m, host);
	bool added = false;
	uint8_t addr[16];
	uint16_t port;
	socklen_t len;
	int rc;

	if (s == NULL || sa == NULL)
		return -1;
	len = sa->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
	if (match_inet_key(sa, len, addr, &port) < 0)
		return -1;
	rc = learn_site(m, s, addr, &added);
	/* Also when the table filled part way: what was added is seen. */
	if (added)
		memo_renew(m);
	return rc < 0 ? rc : m->ranges[s->first].comp;
}

/* Learns into `to` that host resolved to addr (16 bytes), without renewing
 * its memo. Returns 1, 0 when no rule of `to` names host, or -ENOSPC. */
static int carry_one(struct matcher *to, const char *host, const uint8_t addr[16], bool *added)
{
	const struct name_site *s = match_find_host(to, host);

	if (s == NULL)
		return 0;
	return learn_site(to, s, addr, added) < 0 ? -ENOSPC : 1;
}

/* See match.h. */
int match_carry(struct matcher *to, const struct matcher *from)
{
	bool added = false;
	int n = 0, r = 0;

	if (to == NULL || from == NULL || to == from)
		return 0;
	for (uint32_t i = 0; i < from->nresolved && r >= 0; i++) {
		r = carry_one(to, from->resolved[i].host, from->resolved[i].addr, &added);
		n += r > 0;
	}
	/* Published entries only: a slot names an entry filled before it. */
	for (uint32_t i = 0; i < LEARN_SLOTS && r >= 0; i++) {
		uint32_t v = atomic_load_explicit(&from->learned->slot[i], memory_order_acquire);

		if (v == 0)
			continue;
		r = carry_one(to, from->learned->e[v - 1].host, from->learned->e[v - 1].addr, &added);
		n += r > 0;
	}
	/* One new memo for all of it (each is kept until match_free). */
	if (added)
		memo_renew(to);
	return r < 0 ? -ENOSPC : n;
}

/*
 * A reload and the program's lookups meet here. A learner that loaded the
 * old rules may add to them after the carry read them; so the reloader
 * names the new rules in *next before the carry, and a learner, after its
 * learn, learns into *next too, and into *cur if that changed meanwhile.
 * The two fences order each side's write before its read: either the carry
 * reads the learner's entry, or the learner reads *next or the new *cur.
 * So the new rules have every address learned before the reload, from the
 * moment they are in place, and every later one once its learn returns.
 */

/* See match.h. */
int match_publish(_Atomic(struct matcher *) *cur, _Atomic(struct matcher *) *next,
		  struct matcher *m)
{
	struct matcher *old = atomic_load(cur);
	int n;

	atomic_store(next, m);
	atomic_thread_fence(memory_order_seq_cst);
	n = match_carry(m, old);
	atomic_store(cur, m);
	atomic_store(next, NULL);
	return n;
}

/* See match.h. */
int match_learn_in(_Atomic(struct matcher *) *cur, _Atomic(struct matcher *) *next,
		   const char *host, const struct sockaddr *sa)
{
	struct matcher *m = atomic_load(cur), *n, *now;
	int r;

	for (;;) {
		r = match_learn(m, host, sa);
		atomic_thread_fence(memory_order_seq_cst);
		if ((n = atomic_load(next)) != NULL && n != m)
			r = match_learn(n, host, sa);
		if ((now = atomic_load(cur)) == m)
			return r;
		m = now;
	}
}
