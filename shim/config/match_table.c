/* match_table.c - destination rules: lookup tables built once and read lock-free. */
#include "config/match_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

/* The table of every matcher without a host name's rule: always empty. */
static struct learned no_learned;

/* Rejects what match_parse never produces, so that a caller's bug shows up
 * here and not as a rule that silently never matches. */
static int check_rule(const struct rule *r, size_t i, char *err, size_t errlen)
{
	uint8_t masked[16];

	if (r->comp < 0) {
		match_set_err(err, errlen, "rule %zu (line %d) has no compartment", i, r->line);
		return -EINVAL;
	}
	switch (r->kind) {
	case RULE_IP:
		if (r->prefix < 0 || r->prefix > 128 || r->port_lo > r->port_hi)
			break;
		memcpy(masked, r->addr, 16);
		match_mask_addr(masked, r->prefix);
		if (memcmp(masked, r->addr, 16) != 0)
			break;
		return 0;
	case RULE_UNIX:
		if (r->path[0] != '\0' && memchr(r->path, '\0', sizeof(r->path)) != NULL)
			return 0;
		break;
	case RULE_HOST:
		if (r->host[0] != '\0' && memchr(r->host, '\0', sizeof(r->host)) != NULL &&
		    r->port_lo <= r->port_hi)
			return 0;
		break;
	}
	match_set_err(err, errlen, "rule %zu (line %d) is malformed", i, r->line);
	return -EINVAL;
}

/* See match.h. */
int match_rule_cmp(const struct rule *x, const struct rule *y)
{
	int c;

	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	if (x->kind == RULE_IP) {
		if (x->prefix != y->prefix)
			return x->prefix < y->prefix ? -1 : 1;
		c = memcmp(x->addr, y->addr, 16);
	} else {
		c = strcmp(x->kind == RULE_UNIX ? x->path : x->host,
			   y->kind == RULE_UNIX ? y->path : y->host);
	}
	if (c != 0)
		return c;
	if (x->kind != RULE_UNIX) {
		if (x->port_lo != y->port_lo)
			return x->port_lo < y->port_lo ? -1 : 1;
		if (x->port_hi != y->port_hi)
			return x->port_hi < y->port_hi ? -1 : 1;
	}
	return 0;
}

/* See match.h. */
int match_rule_order(const void *a, const void *b)
{
	const struct rule *x = *(const struct rule *const *)a;
	const struct rule *y = *(const struct rule *const *)b;
	int c = match_rule_cmp(x, y);

	if (c != 0)
		return c;
	return x < y ? -1 : (x > y);
}

static bool same_site(const struct rule *x, const struct rule *y)
{
	if (x->kind != y->kind)
		return false;
	if (x->kind == RULE_IP)
		return x->prefix == y->prefix && memcmp(x->addr, y->addr, 16) == 0;
	return strcmp(x->kind == RULE_UNIX ? x->path : x->host,
		      y->kind == RULE_UNIX ? y->path : y->host) == 0;
}

static bool same_ports(const struct rule *x, const struct rule *y)
{
	return x->kind == RULE_UNIX || (x->port_lo == y->port_lo && x->port_hi == y->port_hi);
}

/* Narrowest range first; equal widths keep the order of the config. */
static int range_cmp(const void *a, const void *b)
{
	const struct mrange *x = a, *y = b;
	unsigned wx = (unsigned)x->hi - x->lo, wy = (unsigned)y->hi - y->lo;

	if (wx != wy)
		return wx < wy ? -1 : 1;
	return x->order < y->order ? -1 : (x->order > y->order);
}

/* Adds one site for the sorted rules order[i..j) with their ranges. */
static int add_site(struct matcher *m, const struct rule *const *order, size_t i, size_t j,
		    const struct rule *base, size_t *nranges, size_t *nip, size_t *nname,
		    size_t *names_used, char *err, size_t errlen)
{
	const struct rule *a = order[i], *kept = NULL;
	uint32_t first = (uint32_t)*nranges;

	for (size_t k = i; k < j; k++) {
		const struct rule *r = order[k];

		if (kept != NULL && same_ports(kept, r)) {
			char text[BS_HOST_MAX + 16];

			if (kept->comp == r->comp)
				continue;	/* the same rule twice: harmless */
			match_rule_text(r, text, sizeof(text));
			match_set_err(err, errlen,
				      "duplicate destination \"%s\" in compartments %d and %d (lines %d and %d)",
				      text, kept->comp, r->comp, kept->line, r->line);
			return -EEXIST;
		}
		kept = r;
		m->ranges[*nranges] = (struct mrange){
			.lo = r->kind == RULE_UNIX ? PORT_ANY_LO : r->port_lo,
			.hi = r->kind == RULE_UNIX ? PORT_ANY_HI : r->port_hi,
			.comp = r->comp,
			.order = (uint32_t)(r - base),
		};
		(*nranges)++;
	}
	uint32_t count = (uint32_t)*nranges - first;
	qsort(m->ranges + first, count, sizeof(m->ranges[0]), range_cmp);

	if (a->kind == RULE_IP) {
		struct ip_site *s = &m->ip_store[(*nip)++];

		uint32_t h = match_key_hash(a->addr, 16);

		memcpy(s->addr, a->addr, 16);
		s->first = first;
		s->count = count;
		m->filter[a->prefix][FILTER_BIT(h) / 64] |= 1ULL << (FILTER_BIT(h) % 64);
		HASH_ADD(hh, m->ip[a->prefix], addr, 16, s);
		if (s->hh.tbl == NULL)
			goto oom;
		return 0;
	}
	struct name_site *s = &m->name_store[(*nname)++];
	const char *name = a->kind == RULE_UNIX ? a->path : a->host;
	size_t len = strlen(name);

	s->name = m->names + *names_used;
	memcpy(s->name, name, len + 1);
	*names_used += len + 1;
	s->first = first;
	s->count = count;
	if (a->kind == RULE_UNIX)
		HASH_ADD_KEYPTR(hh, m->unix_sites, s->name, len, s);
	else
		HASH_ADD_KEYPTR(hh, m->host_sites, s->name, len, s);
	if (s->hh.tbl == NULL)
		goto oom;
	return 0;
oom:
	match_set_err(err, errlen, "out of memory building the destination tables");
	return -ENOMEM;
}

static const uint8_t v4_mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

#define V4EXACT_MIN	64	/* exact IPv4 sites from which v4exact pays */

static uint32_t v4_slot(uint32_t addr, unsigned bits)
{
	return (addr * 0x9e3779b1u) >> (32 - bits);
}

/* Fills m->v4tab with the exact IPv4 sites of ip[128]. Returns 0 or -ENOMEM. */
static int build_v4tab(struct matcher *m)
{
	const struct ip_site *site, *tmp;
	size_t n = 0;

	HASH_ITER(hh, m->ip[128], site, tmp) {
		if (memcmp(site->addr, v4_mapped, 12) == 0)
			n++;
	}
	if (n == 0)
		return 0;
	for (m->v4bits = 1; ((size_t)1 << m->v4bits) < 2 * n; m->v4bits++)
		;
	m->v4tab = calloc((size_t)1 << m->v4bits, sizeof(*m->v4tab));
	if (m->v4tab == NULL)
		return -ENOMEM;
	if (n >= V4EXACT_MIN && (m->v4exact = calloc(65536 / 64, sizeof(*m->v4exact))) == NULL)
		return -ENOMEM;
	HASH_ITER(hh, m->ip[128], site, tmp) {
		uint32_t a, i;

		if (memcmp(site->addr, v4_mapped, 12) != 0)
			continue;
		memcpy(&a, site->addr + 12, 4);
		for (i = v4_slot(a, m->v4bits); m->v4tab[i].count != 0;
		     i = (i + 1) & ((1u << m->v4bits) - 1))
			;
		m->v4tab[i] = (struct v4site){ a, site->first, site->count };
		if (m->v4exact != NULL) {
			uint32_t k = (uint32_t)site->addr[12] << 8 | site->addr[13];

			m->v4exact[k / 64] |= 1ULL << (k % 64);
		}
	}
	return 0;
}

/* The exact IPv4 site of addr (network order), or NULL. */
static inline const struct v4site *v4_find(const struct matcher *m, uint32_t addr)
{
	uint32_t mask, k = ntohl(addr) >> 16;

	if (m->v4tab == NULL)
		return NULL;
	if (m->v4exact != NULL && !(m->v4exact[k / 64] >> (k % 64) & 1))
		return NULL;
	mask = (1u << m->v4bits) - 1;
	for (uint32_t i = v4_slot(addr, m->v4bits);; i = (i + 1) & mask) {
		const struct v4site *e = &m->v4tab[i];

		if (e->count == 0)
			return NULL;
		if (e->addr == addr)
			return e;
	}
}

/* Fills m->v4lens from the IPv4 sites of prefix 96 to 127 (sites, not
 * rules: a rule repeated in one compartment is one site). A site wider than
 * a /16 marks every /16 it covers; there are at most 2^q sites of IPv4
 * prefix q, so the work stays below 16 * 65536 marks. Returns 0 or -ENOMEM. */
static int build_v4lens(struct matcher *m)
{
	const struct ip_site *site, *tmp;

	m->v4lens = calloc(65536, sizeof(*m->v4lens));
	if (m->v4lens == NULL)
		return -ENOMEM;
	for (uint32_t q = 0; q < 32; q++) {
		HASH_ITER(hh, m->ip[96 + q], site, tmp) {
			uint32_t first, count;

			if (memcmp(site->addr, v4_mapped, 12) != 0)
				continue;
			first = (uint32_t)site->addr[12] << 8 | site->addr[13];
			count = q >= 16 ? 1 : 1u << (16 - q);
			first &= ~(count - 1);
			for (uint32_t k = first; k < first + count; k++)
				m->v4lens[k] |= 1u << q;
		}
	}
	return 0;
}

/* Builds the lookup tables for n rules as match_parse makes them (see
 * match.h). The same destination twice in one compartment is accepted; in two
 * compartments it is an error. Returns NULL with a reason in err. */
struct matcher *match_build(const struct rule *rules, size_t n, char *err, size_t errlen)
{
	const struct rule **order = NULL;
	struct matcher *m = NULL;
	size_t nip = 0, nname = 0, names_len = 0, nranges = 0, names_used = 0, nres = 0, nhost = 0;

	if (n > 0 && rules == NULL) {
		match_set_err(err, errlen, "no rules");
		return NULL;
	}
	if (n > UINT32_MAX / 2) {
		match_set_err(err, errlen, "too many rules: %zu", n);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		if (check_rule(&rules[i], i, err, errlen) < 0)
			return NULL;
		if (rules[i].kind == RULE_IP) {
			nip++;
			nres += rules[i].host[0] != '\0';
		} else {
			nhost += rules[i].kind == RULE_HOST;
			names_len += strlen(rules[i].kind == RULE_UNIX ? rules[i].path
					    : rules[i].host) + 1;
		}
	}
	nname = n - nip;
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		goto oom;
	/* Only a host name's rule learns: rules without one share an empty
	 * table that nothing writes (48 KB less for each matcher). */
	m->learned = nhost > 0 ? calloc(1, sizeof(*m->learned)) : &no_learned;
	atomic_init(&m->memo, calloc(1, sizeof(struct memo)));
	m->umemo = calloc(UMEMO, sizeof(*m->umemo));
	m->ranges = calloc(n + 1, sizeof(*m->ranges));
	m->ip_store = calloc(nip + 1, sizeof(*m->ip_store));
	m->name_store = calloc(nname + 1, sizeof(*m->name_store));
	m->names = malloc(names_len + 1);
	m->resolved = calloc(nres + 1, sizeof(*m->resolved));
	order = malloc((n + 1) * sizeof(*order));
	if (!m->learned || !atomic_load(&m->memo) || !m->umemo || !m->ranges || !m->ip_store ||
	    !m->name_store || !m->names || !m->resolved || !order)
		goto oom;

	for (int p = 0; p <= 128; p++) {
		uint8_t ones[16];

		memset(ones, 0xff, sizeof(ones));
		match_mask_addr(ones, p);
		memcpy(m->mask[p], ones, sizeof(ones));
	}
	for (size_t i = 0; i < n; i++)
		order[i] = &rules[i];
	qsort(order, n, sizeof(*order), match_rule_order);
	nip = nname = 0;
	for (size_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && same_site(order[i], order[j]); j++)
			;
		if (add_site(m, order, i, j, rules, &nranges, &nip, &nname, &names_used,
			     err, errlen) < 0)
			goto fail;
	}
	for (int p = 127; p >= 0; p--)
		if (m->ip[p] != NULL)
			m->prefixes[m->nprefixes++] = (uint8_t)p;
	for (m->nwide = 0; m->nwide < m->nprefixes && m->prefixes[m->nwide] >= 96; m->nwide++)
		;
	if (m->nprefixes > 4 && build_v4lens(m) < 0)
		goto oom;
	if (build_v4tab(m) < 0)
		goto oom;
	match_keep_resolved(m, rules, n);
	free(order);
	return m;
oom:
	match_set_err(err, errlen, "out of memory building the destination tables");
fail:
	free(order);
	match_free(m);
	return NULL;
}

/* Frees what match_build made; NULL is fine, and nothing can fail. */
void match_free(struct matcher *m)
{
	if (m == NULL)
		return;
	for (int p = 0; p <= 128; p++)
		HASH_CLEAR(hh, m->ip[p]);
	HASH_CLEAR(hh, m->unix_sites);
	HASH_CLEAR(hh, m->host_sites);
	free(m->ranges);
	free(m->ip_store);
	free(m->name_store);
	free(m->names);
	if (m->learned != &no_learned)
		free(m->learned);
	free(m->resolved);
	free(m->umemo);
	if (atomic_load(&m->memo) != &match_memo_off)
		free(atomic_load(&m->memo));
	for (struct memo *o = atomic_load(&m->retired), *next; o != NULL; o = next) {
		next = o->older;
		free(o);
	}
	free(m->v4lens);
	free(m->v4tab);
	free(m->v4exact);
	free(m);
}

/* The first (narrowest) range of s holding port, or -1; *width gets its width. */
static int site_range(const struct matcher *m, uint32_t first, uint32_t count, uint16_t port,
		      unsigned *width)
{
	for (uint32_t i = first; i < first + count; i++) {
		const struct mrange *r = &m->ranges[i];

		if (port >= r->lo && port <= r->hi) {
			*width = (unsigned)r->hi - r->lo;
			return r->comp;
		}
	}
	return -1;
}

/* The narrowest learned range for addr holding port, or -1. The first
 * entry published wins a tie, like the config order does for rules. */
static int learned_find(const struct learned *l, const uint8_t addr[16], uint16_t port,
			unsigned *width)
{
	uint32_t h = match_addr_hash(addr);
	int best = -1;

	for (uint32_t probe = 0; probe < LEARN_SLOTS; probe++) {
		uint32_t v = atomic_load_explicit(&l->slot[(h + probe) & (LEARN_SLOTS - 1)],
						  memory_order_acquire);
		const struct learned_entry *e;

		if (v == 0)
			break;
		e = &l->e[v - 1];
		if (memcmp(e->addr, addr, 16) != 0 || port < e->lo || port > e->hi)
			continue;
		if (best < 0 || (unsigned)e->hi - e->lo < *width) {
			best = e->comp;
			*width = (unsigned)e->hi - e->lo;
		}
	}
	return best;
}

/* The compartment of the rule of prefix length p matching address a and
 * port, or -1. */
static inline int find_len(const struct matcher *m, const uint64_t a[2], int p, uint16_t port)
{
	const struct ip_site *s;
	unsigned width = 0;
	uint64_t key[2];
	uint32_t h;

	key[0] = a[0] & m->mask[p][0];
	key[1] = a[1] & m->mask[p][1];
	h = match_key_hash(key, 16);
	if (!(m->filter[p][FILTER_BIT(h) / 64] >> (FILTER_BIT(h) % 64) & 1))
		return -1;
	HASH_FIND_BYHASHVALUE(hh, m->ip[p], key, 16, h, s);
	return s != NULL ? site_range(m, s->first, s->count, port, &width) : -1;
}

/* The compartment for addr and port, or -1. For an IPv4-mapped address,
 * `exact` is its exact site (NULL: none) if `looked`, that is if the
 * caller looked it up already. */
static int find_ip(const struct matcher *m, const uint8_t addr[16], uint16_t port,
		   const struct v4site *exact, bool looked)
{
	unsigned width = 0, lwidth = 0;
	bool mapped = looked || memcmp(addr, v4_mapped, 12) == 0;
	bool v4 = m->v4lens != NULL && mapped;
	uint32_t k = (uint32_t)addr[12] << 8 | addr[13];
	uint64_t a[2];
	int best = -1, c;

	/* Learned addresses rank as /128 rules: compare them with the static
	 * /128 table first, where the narrower range wins and a static rule
	 * wins a tie. Every exact IPv4 rule is in v4tab as well. */
	if (mapped) {
		if (!looked) {
			uint32_t a4;

			memcpy(&a4, addr + 12, 4);
			exact = v4_find(m, a4);
		}
		if (exact != NULL)
			best = site_range(m, exact->first, exact->count, port, &width);
	} else {
		const struct ip_site *s = NULL;

		HASH_FIND(hh, m->ip[128], addr, 16, s);
		if (s != NULL)
			best = site_range(m, s->first, s->count, port, &width);
	}
	/* Nothing learned (no host-name rule resolved yet): no probe. */
	c = atomic_load_explicit(&m->learned->count, memory_order_acquire) == 0 ? -1 :
	    learned_find(m->learned, addr, port, &lwidth);
	if (c >= 0 && (best < 0 || lwidth < width))
		best = c;
	if (best >= 0)
		return best;
	memcpy(a, addr, 16);
	if (v4) {
		/* IPv4: the lengths of the rules covering its /16, longest
		 * first, then the IPv6 rules wide enough to hold it. */
		uint32_t lens = m->v4lens[k];

		while (lens != 0) {
			int q = 31 - __builtin_clz(lens);

			lens &= ~(1u << q);
			if ((c = find_len(m, a, 96 + q, port)) >= 0)
				return c;
		}
		for (int i = m->nwide; i < m->nprefixes; i++) {
			if ((c = find_len(m, a, m->prefixes[i], port)) >= 0)
				return c;
		}
		return -1;
	}
	for (int i = 0; i < m->nprefixes; i++) {
		if ((c = find_len(m, a, m->prefixes[i], port)) >= 0)
			return c;
	}
	return -1;
}

/* The answer for IPv4 address and port `key` (sa), written into its entry
 * of memo mm (loaded before anything learned was read). */
static __attribute__((noinline)) int v4_find_memo(const struct matcher *m,
    const struct sockaddr *sa, struct memo *mm, _Atomic uint64_t *memo, uint64_t key)
{
	const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
	const struct v4site *exact = v4_find(m, in->sin_addr.s_addr);
	int c = -1;

	/* An exact rule for the address and port, with nothing learned
	 * (which could be narrower), decides before the 16-byte key is made. */
	if (exact != NULL && atomic_load_explicit(&m->learned->count, memory_order_acquire) == 0) {
		unsigned width;

		c = site_range(m, exact->first, exact->count, ntohs(in->sin_port), &width);
	}
	if (c < 0) {
		uint8_t addr[16];
		uint16_t port;

		if (match_inet_key(sa, sizeof(struct sockaddr_in), addr, &port) < 0)
			return -1;
		c = find_ip(m, addr, port, exact, true);
	}
	if (mm != &match_memo_off)
		atomic_store_explicit(memo, MEMO_SET | (uint64_t)(c + 1) << 48 | key,
		    memory_order_relaxed);
	return c;
}

/* The memo entry of a unix path of n bytes (n > 0): by its length and two
 * of its bytes, the last ones being where paths of one directory differ. */
static inline uint32_t umemo_slot(const char *path, size_t n)
{
	uint32_t h = (uint32_t)n * 0x9e3779b1u ^ (unsigned char)path[n - 1] ^
	    (uint32_t)(unsigned char)path[n / 2] << 8;

	return (h * 0x85ebca6bu) >> (32 - UMEMO_BITS);
}

/* The compartment of the rule naming unix socket sa, from the table, and
 * noted in memo (NULL: not a path name). */
static __attribute__((noinline)) int unix_find_table(const struct matcher *m,
    const struct sockaddr *sa, socklen_t len, const struct name_site *_Atomic *memo)
{
	char key[BS_UNIX_PATH_MAX + 1];
	const struct name_site *s;
	size_t n = match_unix_key(sa, len, key);

	if (n == 0)
		return -1;
	HASH_FIND(hh, m->unix_sites, key, n, s);
	if (s == NULL)
		return -1;
	if (memo != NULL)
		atomic_store_explicit(memo, s, memory_order_relaxed);
	return m->ranges[s->first].comp;
}

/* The compartment of the rule naming unix socket sa, or -1. A path name
 * found before is compared with its site in the memo: the path's bytes
 * once, instead of copying, hashing and comparing them in the table. */
static inline int unix_find(const struct matcher *m, const struct sockaddr *sa, socklen_t len)
{
	size_t off = offsetof(struct sockaddr_un, sun_path), n;
	const char *path = (const char *)sa + off;
	const struct name_site *_Atomic *memo;
	const struct name_site *s;

	if (len <= off || path[0] == '\0')
		return unix_find_table(m, sa, len, NULL);
	n = (size_t)len - off;
	n = strnlen(path, n < BS_UNIX_PATH_MAX ? n : BS_UNIX_PATH_MAX);
	memo = &m->umemo[umemo_slot(path, n)];
	s = atomic_load_explicit(memo, memory_order_relaxed);
	if (s != NULL && s->hh.keylen == n && memcmp(s->name, path, n) == 0)
		return m->ranges[s->first].comp;
	return unix_find_table(m, sa, len, memo);
}

/* The compartment of the most specific rule matching inet address sa
 * (IPv6, or IPv4 through v4_find_memo), or -1. */
static __attribute__((noinline)) int inet_find(const struct matcher *m,
    const struct sockaddr *sa, socklen_t len)
{
	uint8_t addr[16];
	uint16_t port;

	if (match_inet_key(sa, len, addr, &port) < 0)
		return -1;
	return find_ip(m, addr, port, NULL, false);
}

/* The compartment of the most specific rule matching sa, or -1 (also for a
 * NULL matcher or address and a length too short for the family).
 * Lock-free, allocation-free and async-signal-safe. */
int match_find(const struct matcher *m, const struct sockaddr *sa, socklen_t len)
{
	if (m == NULL || sa == NULL)
		return -1;
	if (len >= (socklen_t)sizeof(struct sockaddr_in) && sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
		uint64_t key = (uint64_t)in->sin_port << 32 | in->sin_addr.s_addr;
		/* Acquire: what was learned before this memo was put in place. */
		struct memo *mm = atomic_load_explicit(&m->memo, memory_order_acquire);
		_Atomic uint64_t *memo = &mm->e[v4_slot(in->sin_addr.s_addr ^
		    in->sin_port * 0x10001u, V4MEMO_BITS)];
		uint64_t e = atomic_load_explicit(memo, memory_order_relaxed);

		if ((e & (MEMO_SET | MEMO_KEY)) == (MEMO_SET | key))
			return (int)(e >> 48 & 0x7ff) - 1;
		return v4_find_memo(m, sa, mm, memo, key);
	}
	if (len < (socklen_t)sizeof(sa_family_t))
		return -1;
	if (sa->sa_family == AF_UNIX)
		return unix_find(m, sa, len);
	return inet_find(m, sa, len);
}
