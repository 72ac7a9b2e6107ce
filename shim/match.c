/* match.c - destination rules: parsing, lookup tables built once, lock-free lookup. */
#include "shim.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

/* The tables are built at init; running out of memory there must become an
 * error message, not uthash's default exit(). A failed add leaves hh.tbl NULL. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

#define PORT_ANY_LO	0
#define PORT_ANY_HI	65535
#define HOST_LEN_MAX	253
#define LABEL_LEN_MAX	63
#define UNIX_PATH_LEN	(BS_UNIX_PATH_MAX - 1)	/* room for the NUL */
#define SHOWN_MAX	80	/* destination text quoted in messages */
#define LEARN_SLOTS	(2 * BS_LEARNED_MAX)	/* power of two, half full at most */

/* One port range of a site; a site's ranges are sorted narrowest first. */
struct mrange {
	uint16_t lo, hi;
	int32_t comp;
	uint32_t order;		/* position in the caller's rules, breaks ties */
};

/* An address and prefix length, keyed by the masked 16-byte address. */
struct ip_site {
	UT_hash_handle hh;
	uint8_t addr[16];
	uint32_t first, count;	/* slice of matcher.ranges */
};

/* A unix socket path ('@' first for abstract) or a host name. */
struct name_site {
	UT_hash_handle hh;
	char *name;
	uint32_t first, count;
};

struct learned_entry {
	uint8_t addr[16];
	uint16_t lo, hi;
	int32_t comp;
};

/* Written by match_learn, read by match_find without a lock. An entry is
 * filled first and then published by a release store of its index + 1 into
 * an open-addressing slot; entries are never changed or removed, so a reader
 * that sees a slot also sees the whole entry, and an empty slot ends a probe. */
struct learned {
	_Atomic uint32_t reserved;	/* entries claimed by writers */
	_Atomic uint32_t count;		/* entries published */
	_Atomic uint32_t slot[LEARN_SLOTS];
	struct learned_entry e[BS_LEARNED_MAX];
};

struct matcher {
	struct ip_site *ip[129];	/* one table per prefix length */
	uint8_t prefixes[129];		/* lengths in use below 128, longest first */
	int nprefixes;
	struct name_site *unix_sites;
	struct name_site *host_sites;
	struct mrange *ranges;
	struct ip_site *ip_store;
	struct name_site *name_store;
	char *names;
	struct learned *learned;
};

static void set_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* Locale-free character classes: match_find and match_learn may run where
 * the locale functions are not safe, and host names are ASCII anyway. */
static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static char to_lower(char c)
{
	return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

/* Clears the bits of addr beyond the first prefix bits. */
static void mask_addr(uint8_t *addr, int prefix)
{
	int i = prefix / 8;

	if (i >= 16)
		return;
	if (prefix % 8)
		addr[i++] &= (uint8_t)(0xff << (8 - prefix % 8));
	for (; i < 16; i++)
		addr[i] = 0;
}

static void map_ipv4(uint8_t addr[16], const void *in4)
{
	memset(addr, 0, 10);
	addr[10] = 0xff;
	addr[11] = 0xff;
	memcpy(addr + 12, in4, 4);
}

static bool is_mapped(const uint8_t addr[16])
{
	static const uint8_t head[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	return memcmp(addr, head, 12) == 0;
}

/* Parses 1..5 decimal digits of s[0..n) into *out, at most max. */
static int parse_num(const char *s, size_t n, unsigned max, unsigned *out)
{
	unsigned v = 0;

	if (n == 0 || n > 5)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (!is_digit(s[i]))
			return -EINVAL;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	if (v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

/* Parses "443" or "1000-2000" (s[0..n)) into r's port range. */
static int parse_ports(const char *s, size_t n, struct rule *r, const char *shown,
		       char *err, size_t errlen)
{
	const char *dash = memchr(s, '-', n);
	unsigned lo, hi;

	if (dash == NULL) {
		if (parse_num(s, n, 65535, &lo) < 0 || lo == 0)
			goto bad;
		hi = lo;
	} else {
		if (parse_num(s, (size_t)(dash - s), 65535, &lo) < 0 || lo == 0 ||
		    parse_num(dash + 1, n - (size_t)(dash - s) - 1, 65535, &hi) < 0 || hi == 0)
			goto bad;
		if (lo > hi) {
			set_err(err, errlen, "port range \"%.*s\" starts above its end in \"%s\"",
				(int)n, s, shown);
			return -EINVAL;
		}
	}
	r->port_lo = (uint16_t)lo;
	r->port_hi = (uint16_t)hi;
	return 0;
bad:
	set_err(err, errlen, "bad port \"%.*s\" in \"%s\"", (int)(n > 16 ? 16 : n), s, shown);
	return -EINVAL;
}

/* Parses an address with an optional "/prefix" (s[0..n)) of the given family
 * into r. Host bits beyond the prefix are masked off, not rejected:
 * "10.1.2.3/16" is a common way to write "the /16 of this host", and the
 * masked rule is the one compared for duplicates. */
static int parse_addr(const char *s, size_t n, int family, struct rule *r, const char *shown,
		      char *err, size_t errlen)
{
	const char *fam = family == AF_INET ? "IPv4" : "IPv6";
	int maxp = family == AF_INET ? 32 : 128;
	char buf[INET6_ADDRSTRLEN + 8];
	unsigned prefix = (unsigned)maxp;
	uint8_t raw[16];
	char *slash;

	if (n == 0) {
		set_err(err, errlen, "missing address in \"%s\"", shown);
		return -EINVAL;
	}
	if (n >= sizeof(buf)) {
		set_err(err, errlen, "bad %s address in \"%s\"", fam, shown);
		return -EINVAL;
	}
	memcpy(buf, s, n);
	buf[n] = '\0';
	slash = strchr(buf, '/');
	if (slash != NULL) {
		*slash++ = '\0';
		if (parse_num(slash, strlen(slash), 999, &prefix) < 0) {
			set_err(err, errlen, "bad prefix \"/%s\" in \"%s\"", slash, shown);
			return -EINVAL;
		}
		if (prefix > (unsigned)maxp) {
			set_err(err, errlen, "prefix /%u is too long for %s", prefix, fam);
			return -EINVAL;
		}
	}
	if (inet_pton(family, buf, raw) != 1) {
		set_err(err, errlen, "bad %s address \"%s\" in \"%s\"", fam, buf, shown);
		return -EINVAL;
	}
	r->kind = RULE_IP;
	if (family == AF_INET) {
		map_ipv4(r->addr, raw);
		prefix += 96;
	} else {
		memcpy(r->addr, raw, 16);
	}
	r->prefix = (int)prefix;
	mask_addr(r->addr, r->prefix);
	return 0;
}

/* Checks a host name (s[0..n), one trailing dot already gone) and stores it
 * in lower case. A name that is only digits and dots is a broken IPv4
 * address, and an all-digit last label is no DNS name either. */
static int parse_host(const char *s, size_t n, struct rule *r, const char *shown,
		      char *err, size_t errlen)
{
	size_t label = 0, last = 0;
	bool numeric = true;

	if (n == 0) {
		set_err(err, errlen, "missing address in \"%s\"", shown);
		return -EINVAL;
	}
	if (n > HOST_LEN_MAX) {
		set_err(err, errlen, "host name of %zu characters is longer than %d in \"%s\"",
			n, HOST_LEN_MAX, shown);
		return -EINVAL;
	}
	for (size_t i = 0; i <= n; i++) {
		char c = i < n ? s[i] : '.';

		if (c == '.') {
			if (i == label) {
				set_err(err, errlen, "empty label in host name \"%.*s\"", (int)n, s);
				return -EINVAL;
			}
			if (s[label] == '-' || s[i - 1] == '-') {
				set_err(err, errlen, "label starts or ends with '-' in host name \"%s\"",
					shown);
				return -EINVAL;
			}
			if (i - label > LABEL_LEN_MAX) {
				set_err(err, errlen, "label of %zu characters is longer than %d in \"%s\"",
					i - label, LABEL_LEN_MAX, shown);
				return -EINVAL;
			}
			last = label;
			label = i + 1;
			continue;
		}
		if (!is_alpha(c) && !is_digit(c) && c != '-') {
			set_err(err, errlen, "bad character '%c' in host name \"%s\"", c, shown);
			return -EINVAL;
		}
		if (!is_digit(c))
			numeric = false;
	}
	if (numeric) {
		set_err(err, errlen, "bad IPv4 address \"%.*s\" in \"%s\"", (int)n, s, shown);
		return -EINVAL;
	}
	bool last_digits = true;
	for (size_t i = last; i < n; i++)
		if (!is_digit(s[i]))
			last_digits = false;
	if (last_digits) {
		set_err(err, errlen, "host name \"%.*s\" ends in an all-digit label", (int)n, s);
		return -EINVAL;
	}
	r->kind = RULE_HOST;
	for (size_t i = 0; i < n; i++)
		r->host[i] = to_lower(s[i]);
	r->host[n] = '\0';
	return 0;
}

static int parse_unix(const char *p, struct rule *r, const char *shown, char *err, size_t errlen)
{
	size_t n = strlen(p);
	/* An abstract name fills the whole sun_path after its leading NUL,
	 * which the stored '@' stands for. */
	size_t max = p[0] == '@' ? BS_UNIX_PATH_MAX : UNIX_PATH_LEN;

	if (n == 0 || (p[0] == '@' && n == 1)) {
		set_err(err, errlen, "empty unix socket name in \"%s\"", shown);
		return -EINVAL;
	}
	if (n > max) {
		set_err(err, errlen, "unix socket %s of %zu bytes is longer than %zu in \"%s\"",
			p[0] == '@' ? "name" : "path", p[0] == '@' ? n - 1 : n,
			p[0] == '@' ? max - 1 : max, shown);
		return -EINVAL;
	}
	r->kind = RULE_UNIX;
	memcpy(r->path, p, n + 1);
	return 0;
}

/* Parses one destination (see shim.h for the forms). Returns 0, or -EINVAL
 * with a short reason in err. */
int match_parse(const char *text, struct rule *r, char *err, size_t errlen)
{
	int comp = r->comp, line = r->line;
	char shown[SHOWN_MAX + 4];
	const char *host, *ports = NULL, *colon;
	size_t hostlen, n;
	int rc;

	memset(r, 0, sizeof(*r));
	r->comp = comp;
	r->line = line;
	r->port_lo = PORT_ANY_LO;
	r->port_hi = PORT_ANY_HI;
	if (text == NULL || text[0] == '\0') {
		set_err(err, errlen, "empty destination");
		return -EINVAL;
	}
	n = strlen(text);
	if (n > SHOWN_MAX)
		snprintf(shown, sizeof(shown), "%.*s...", SHOWN_MAX - 3, text);
	else
		memcpy(shown, text, n + 1);

	if (strncmp(text, "unix:", 5) == 0) {
		r->port_lo = r->port_hi = 0;
		return parse_unix(text + 5, r, shown, err, errlen);
	}
	if (text[0] == '[') {
		const char *close = strchr(text, ']');

		if (close == NULL) {
			set_err(err, errlen, "missing \"]\" in \"%s\"", shown);
			return -EINVAL;
		}
		rc = parse_addr(text + 1, (size_t)(close - text - 1), AF_INET6, r, shown, err, errlen);
		if (rc < 0)
			return rc;
		if (close[1] == '\0')
			return 0;
		if (close[1] != ':') {
			set_err(err, errlen, "expected \":port\" after \"]\" in \"%s\"", shown);
			return -EINVAL;
		}
		return parse_ports(close + 2, strlen(close + 2), r, shown, err, errlen);
	}
	colon = strchr(text, ':');
	if (colon != NULL && strchr(colon + 1, ':') != NULL)
		return parse_addr(text, n, AF_INET6, r, shown, err, errlen);

	host = text;
	hostlen = colon ? (size_t)(colon - text) : n;
	if (colon != NULL)
		ports = colon + 1;
	if (memchr(host, '/', hostlen) != NULL) {
		rc = parse_addr(host, hostlen, AF_INET, r, shown, err, errlen);
	} else {
		char buf[INET_ADDRSTRLEN];
		uint8_t raw[4];

		if (hostlen < sizeof(buf)) {
			memcpy(buf, host, hostlen);
			buf[hostlen] = '\0';
		}
		if (hostlen < sizeof(buf) && inet_pton(AF_INET, buf, raw) == 1) {
			rc = parse_addr(host, hostlen, AF_INET, r, shown, err, errlen);
		} else {
			if (hostlen > 1 && host[hostlen - 1] == '.')
				hostlen--;
			rc = parse_host(host, hostlen, r, shown, err, errlen);
		}
	}
	if (rc < 0 || ports == NULL)
		return rc;
	return parse_ports(ports, strlen(ports), r, shown, err, errlen);
}

/* Renders a rule the way a config would write it, for messages. */
static void rule_text(const struct rule *r, char *buf, size_t len)
{
	char addr[INET6_ADDRSTRLEN], ports[16] = "";

	if (r->kind == RULE_UNIX) {
		snprintf(buf, len, "unix:%s", r->path);
		return;
	}
	if (r->port_lo != PORT_ANY_LO || r->port_hi != PORT_ANY_HI) {
		if (r->port_lo == r->port_hi)
			snprintf(ports, sizeof(ports), ":%u", r->port_lo);
		else
			snprintf(ports, sizeof(ports), ":%u-%u", r->port_lo, r->port_hi);
	}
	if (r->kind == RULE_HOST) {
		snprintf(buf, len, "%s%s", r->host, ports);
	} else if (is_mapped(r->addr) && r->prefix >= 96) {
		inet_ntop(AF_INET, r->addr + 12, addr, sizeof(addr));
		if (r->prefix == 128)
			snprintf(buf, len, "%s%s", addr, ports);
		else
			snprintf(buf, len, "%s/%d%s", addr, r->prefix - 96, ports);
	} else {
		inet_ntop(AF_INET6, r->addr, addr, sizeof(addr));
		if (r->prefix == 128)
			snprintf(buf, len, "[%s]%s", addr, ports);
		else
			snprintf(buf, len, "[%s/%d]%s", addr, r->prefix, ports);
	}
}

/* Rejects what match_parse never produces, so that a caller's bug shows up
 * here and not as a rule that silently never matches. */
static int check_rule(const struct rule *r, size_t i, char *err, size_t errlen)
{
	uint8_t masked[16];

	if (r->comp < 0) {
		set_err(err, errlen, "rule %zu (line %d) has no compartment", i, r->line);
		return -EINVAL;
	}
	switch (r->kind) {
	case RULE_IP:
		if (r->prefix < 0 || r->prefix > 128 || r->port_lo > r->port_hi)
			break;
		memcpy(masked, r->addr, 16);
		mask_addr(masked, r->prefix);
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
	set_err(err, errlen, "rule %zu (line %d) is malformed", i, r->line);
	return -EINVAL;
}

/* Orders rules by site (kind, then address and prefix, path or host), then
 * by port range, then by position, so duplicates end up next to each other
 * and the first of them is the one that came first. */
static int rule_cmp(const void *a, const void *b)
{
	const struct rule *x = *(const struct rule *const *)a;
	const struct rule *y = *(const struct rule *const *)b;
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
			rule_text(r, text, sizeof(text));
			set_err(err, errlen,
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

		memcpy(s->addr, a->addr, 16);
		s->first = first;
		s->count = count;
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
	set_err(err, errlen, "out of memory building the destination tables");
	return -ENOMEM;
}

/* Builds the lookup tables for n rules as match_parse makes them (see
 * shim.h). The same destination twice in one compartment is accepted; in two
 * compartments it is an error. Returns NULL with a reason in err. */
struct matcher *match_build(const struct rule *rules, size_t n, char *err, size_t errlen)
{
	const struct rule **order = NULL;
	struct matcher *m = NULL;
	size_t nip = 0, nname = 0, names_len = 0, nranges = 0, names_used = 0;

	if (n > 0 && rules == NULL) {
		set_err(err, errlen, "no rules");
		return NULL;
	}
	if (n > UINT32_MAX / 2) {
		set_err(err, errlen, "too many rules: %zu", n);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		if (check_rule(&rules[i], i, err, errlen) < 0)
			return NULL;
		if (rules[i].kind == RULE_IP)
			nip++;
		else
			names_len += strlen(rules[i].kind == RULE_UNIX ? rules[i].path
					    : rules[i].host) + 1;
	}
	nname = n - nip;
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		goto oom;
	m->learned = calloc(1, sizeof(*m->learned));
	m->ranges = calloc(n + 1, sizeof(*m->ranges));
	m->ip_store = calloc(nip + 1, sizeof(*m->ip_store));
	m->name_store = calloc(nname + 1, sizeof(*m->name_store));
	m->names = malloc(names_len + 1);
	order = malloc((n + 1) * sizeof(*order));
	if (!m->learned || !m->ranges || !m->ip_store || !m->name_store || !m->names || !order)
		goto oom;

	for (size_t i = 0; i < n; i++)
		order[i] = &rules[i];
	qsort(order, n, sizeof(*order), rule_cmp);
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
	free(order);
	return m;
oom:
	set_err(err, errlen, "out of memory building the destination tables");
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
	free(m->learned);
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

static uint32_t addr_hash(const uint8_t addr[16])
{
	uint64_t a, b;

	memcpy(&a, addr, 8);
	memcpy(&b, addr + 8, 8);
	a ^= b * 0x9e3779b97f4a7c15ULL;
	a ^= a >> 31;
	a *= 0xbf58476d1ce4e5b9ULL;
	a ^= a >> 29;
	return (uint32_t)a;
}

/* The narrowest learned range for addr holding port, or -1. The first
 * entry published wins a tie, like the config order does for rules. */
static int learned_find(const struct learned *l, const uint8_t addr[16], uint16_t port,
			unsigned *width)
{
	uint32_t h = addr_hash(addr);
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

static int find_ip(const struct matcher *m, const uint8_t addr[16], uint16_t port)
{
	unsigned width = 0, lwidth = 0;
	const struct ip_site *s;
	uint8_t key[16];
	int best = -1, c;

	/* Learned addresses rank as /128 rules: compare them with the static
	 * /128 table first, where the narrower range wins and a static rule
	 * wins a tie. */
	HASH_FIND(hh, m->ip[128], addr, 16, s);
	if (s != NULL)
		best = site_range(m, s->first, s->count, port, &width);
	c = learned_find(m->learned, addr, port, &lwidth);
	if (c >= 0 && (best < 0 || lwidth < width))
		best = c;
	if (best >= 0)
		return best;
	for (int i = 0; i < m->nprefixes; i++) {
		int p = m->prefixes[i];

		memcpy(key, addr, 16);
		mask_addr(key, p);
		HASH_FIND(hh, m->ip[p], key, 16, s);
		if (s != NULL && (c = site_range(m, s->first, s->count, port, &width)) >= 0)
			return c;
	}
	return -1;
}

/* Reads the 16-byte (IPv4-mapped for AF_INET) address and port of an inet
 * sockaddr; returns -1 for anything else or a short length. */
static int inet_key(const struct sockaddr *sa, socklen_t len, uint8_t addr[16], uint16_t *port)
{
	sa_family_t family;

	if (sa == NULL || len < (socklen_t)sizeof(sa_family_t))
		return -1;
	memcpy(&family, &sa->sa_family, sizeof(family));
	if (family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
		struct sockaddr_in in;

		memcpy(&in, sa, sizeof(in));
		map_ipv4(addr, &in.sin_addr);
		*port = ntohs(in.sin_port);
		return 0;
	}
	/* The kernel takes the 24-byte RFC 2133 sockaddr_in6 without a scope. */
	if (family == AF_INET6 && len >= 24) {
		struct sockaddr_in6 in6;

		memset(&in6, 0, sizeof(in6));
		memcpy(&in6, sa, len < sizeof(in6) ? len : sizeof(in6));
		memcpy(addr, &in6.sin6_addr, 16);
		*port = ntohs(in6.sin6_port);
		return 0;
	}
	return -1;
}

/* The unix socket key of sa: the path up to its NUL or len, or for an
 * abstract socket '@' and the name bytes up to len. Returns its length, or 0. */
static size_t unix_key(const struct sockaddr *sa, socklen_t len, char key[BS_UNIX_PATH_MAX + 1])
{
	size_t off = offsetof(struct sockaddr_un, sun_path), n;
	const char *path = (const char *)sa + off;

	if (len <= off)
		return 0;	/* unnamed: nothing to match */
	n = (size_t)len - off;
	if (n > BS_UNIX_PATH_MAX)
		n = BS_UNIX_PATH_MAX;
	if (path[0] != '\0') {
		n = strnlen(path, n);
		memcpy(key, path, n);
		return n;
	}
	if (n < 2)
		return 0;
	key[0] = '@';
	memcpy(key + 1, path + 1, n - 1);
	return n;
}

/* The compartment of the most specific rule matching sa, or -1 (also for a
 * NULL matcher or address and a length too short for the family).
 * Lock-free, allocation-free and async-signal-safe. */
int match_find(const struct matcher *m, const struct sockaddr *sa, socklen_t len)
{
	uint8_t addr[16];
	uint16_t port;

	if (m == NULL || sa == NULL || len < (socklen_t)sizeof(sa_family_t))
		return -1;
	if (sa->sa_family == AF_UNIX) {
		char key[BS_UNIX_PATH_MAX + 1];
		const struct name_site *s;
		size_t n = unix_key(sa, len, key);

		if (n == 0)
			return -1;
		HASH_FIND(hh, m->unix_sites, key, n, s);
		return s != NULL ? m->ranges[s->first].comp : -1;
	}
	if (inet_key(sa, len, addr, &port) < 0)
		return -1;
	return find_ip(m, addr, port);
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
		key[i] = to_lower(host[i]);
	key[n] = '\0';
	return n;
}

static const struct name_site *find_host(const struct matcher *m, const char *host)
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
	return find_host(m, host) != NULL;
}

static bool learned_has(const struct learned *l, const uint8_t addr[16], const struct mrange *r)
{
	uint32_t h = addr_hash(addr);

	for (uint32_t probe = 0; probe < LEARN_SLOTS; probe++) {
		uint32_t v = atomic_load_explicit(&l->slot[(h + probe) & (LEARN_SLOTS - 1)],
						  memory_order_acquire);
		const struct learned_entry *e;

		if (v == 0)
			return false;
		e = &l->e[v - 1];
		if (memcmp(e->addr, addr, 16) == 0 && e->lo == r->lo && e->hi == r->hi &&
		    e->comp == r->comp)
			return true;
	}
	return false;
}

/* Claims, fills and publishes one learned entry. Writers never wait for each
 * other: the claim is a CAS on `reserved`, and each entry is published on
 * its own by a release CAS into a free slot. No lock means nothing for a
 * fork in another thread to leave locked. */
static int learned_add(struct learned *l, const uint8_t addr[16], const struct mrange *r)
{
	uint32_t idx = atomic_load_explicit(&l->reserved, memory_order_relaxed);
	uint32_t h = addr_hash(addr);

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

/* Records that host resolved to sa (AF_INET or AF_INET6; its port is not
 * used): sa then matches with the port range of every RULE_HOST rule that
 * names host, ranking as an exact /128 rule. Safe against concurrent
 * match_find and match_learn calls; two threads learning the same address
 * at once may both add it, which costs a slot and changes no answer.
 * Returns the compartment of the host's first rule, -1 if no rule names host
 * (or an argument is NULL or not inet), or -ENOSPC when the table is full. */
int match_learn(struct matcher *m, const char *host, const struct sockaddr *sa)
{
	const struct name_site *s = find_host(m, host);
	uint8_t addr[16];
	uint16_t port;
	socklen_t len;

	if (s == NULL || sa == NULL)
		return -1;
	len = sa->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
	if (inet_key(sa, len, addr, &port) < 0)
		return -1;
	for (uint32_t i = s->first; i < s->first + s->count; i++) {
		const struct mrange *r = &m->ranges[i];

		if (learned_has(m->learned, addr, r))
			continue;
		if (learned_add(m->learned, addr, r) < 0)
			return -ENOSPC;
	}
	return m->ranges[s->first].comp;
}

/* Appends s (n bytes) at *pos, always leaving buf NUL-terminated. */
static void put(char *buf, size_t buflen, size_t *pos, const char *s, size_t n)
{
	if (*pos + 1 >= buflen)
		return;
	if (n > buflen - 1 - *pos)
		n = buflen - 1 - *pos;
	memcpy(buf + *pos, s, n);
	*pos += n;
	buf[*pos] = '\0';
}

static void put_str(char *buf, size_t buflen, size_t *pos, const char *s)
{
	put(buf, buflen, pos, s, strlen(s));
}

static void put_uint(char *buf, size_t buflen, size_t *pos, unsigned long v)
{
	char digits[24];
	size_t i = sizeof(digits);

	do {
		digits[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v != 0);
	put(buf, buflen, pos, digits + i, sizeof(digits) - i);
}

/* Writes "1.2.3.4:80", "[::1]:80" (IPv4-mapped addresses as IPv4),
 * "unix:/path", "unix:@name" (NUL bytes in the name as '@', other
 * unprintable bytes as '?') or "?" for anything else into buf, cut to fit
 * and always NUL-terminated unless buflen is 0. Async-signal-safe: glibc's
 * inet_ntop takes no lock and does not allocate. */
void match_format(const struct sockaddr *sa, socklen_t len, char *buf, size_t buflen)
{
	char text[INET6_ADDRSTRLEN];
	size_t pos = 0;
	uint8_t addr[16];
	uint16_t port;

	if (buf == NULL || buflen == 0)
		return;
	buf[0] = '\0';
	if (sa != NULL && len >= (socklen_t)sizeof(sa_family_t) && sa->sa_family == AF_UNIX) {
		char key[BS_UNIX_PATH_MAX + 1];
		size_t n = unix_key(sa, len, key);

		if (n == 0) {
			put_str(buf, buflen, &pos, "?");
			return;
		}
		for (size_t i = key[0] == '@' ? 1 : 0; i < n; i++) {
			if (key[i] == '\0')
				key[i] = '@';
			else if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] >= 0x7f)
				key[i] = '?';
		}
		put_str(buf, buflen, &pos, "unix:");
		put(buf, buflen, &pos, key, n);
		return;
	}
	if (inet_key(sa, len, addr, &port) < 0) {
		put_str(buf, buflen, &pos, "?");
		return;
	}
	if (is_mapped(addr)) {
		inet_ntop(AF_INET, addr + 12, text, sizeof(text));
		put_str(buf, buflen, &pos, text);
	} else {
		struct sockaddr_in6 in6;

		inet_ntop(AF_INET6, addr, text, sizeof(text));
		put_str(buf, buflen, &pos, "[");
		put_str(buf, buflen, &pos, text);
		memset(&in6, 0, sizeof(in6));
		memcpy(&in6, sa, len < sizeof(in6) ? len : sizeof(in6));
		if (in6.sin6_scope_id != 0) {
			put_str(buf, buflen, &pos, "%");
			put_uint(buf, buflen, &pos, in6.sin6_scope_id);
		}
		put_str(buf, buflen, &pos, "]");
	}
	put_str(buf, buflen, &pos, ":");
	put_uint(buf, buflen, &pos, port);
}
