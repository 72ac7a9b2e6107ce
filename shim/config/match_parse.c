/* match_parse.c - destinations as text and as keys: parsing rules, writing them back, address keys. */
#include "config/match_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#define LABEL_LEN_MAX	63
#define UNIX_PATH_LEN	(BS_UNIX_PATH_MAX - 1)	/* room for the NUL */
#define SHOWN_MAX	80	/* destination text quoted in messages */

/* Formats a message into err, cut to errlen; nothing is written when err
 * is NULL or errlen is 0. */
void match_set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* Locale-free character classes, like match_lower's. */
static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
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
			match_set_err(err, errlen, "port range \"%.*s\" starts above its end in \"%s\"",
				      (int)n, s, shown);
			return -EINVAL;
		}
	}
	r->port_lo = (uint16_t)lo;
	r->port_hi = (uint16_t)hi;
	return 0;
bad:
	match_set_err(err, errlen, "bad port \"%.*s\" in \"%s\"", (int)(n > 16 ? 16 : n), s, shown);
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
		match_set_err(err, errlen, "missing address in \"%s\"", shown);
		return -EINVAL;
	}
	if (n >= sizeof(buf)) {
		match_set_err(err, errlen, "bad %s address in \"%s\"", fam, shown);
		return -EINVAL;
	}
	memcpy(buf, s, n);
	buf[n] = '\0';
	slash = strchr(buf, '/');
	if (slash != NULL) {
		*slash++ = '\0';
		if (parse_num(slash, strlen(slash), 999, &prefix) < 0) {
			match_set_err(err, errlen, "bad prefix \"/%s\" in \"%s\"", slash, shown);
			return -EINVAL;
		}
		if (prefix > (unsigned)maxp) {
			match_set_err(err, errlen, "prefix /%u is too long for %s", prefix, fam);
			return -EINVAL;
		}
	}
	if (inet_pton(family, buf, raw) != 1) {
		match_set_err(err, errlen, "bad %s address \"%s\" in \"%s\"", fam, buf, shown);
		return -EINVAL;
	}
	r->kind = RULE_IP;
	if (family == AF_INET) {
		match_map_ipv4(r->addr, raw);
		prefix += 96;
	} else {
		memcpy(r->addr, raw, 16);
	}
	r->prefix = (int)prefix;
	match_mask_addr(r->addr, r->prefix);
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
		match_set_err(err, errlen, "missing address in \"%s\"", shown);
		return -EINVAL;
	}
	if (n > HOST_LEN_MAX) {
		match_set_err(err, errlen, "host name of %zu characters is longer than %d in \"%s\"",
			      n, HOST_LEN_MAX, shown);
		return -EINVAL;
	}
	for (size_t i = 0; i <= n; i++) {
		char c = i < n ? s[i] : '.';

		if (c == '.') {
			if (i == label) {
				match_set_err(err, errlen, "empty label in host name \"%.*s\"", (int)n, s);
				return -EINVAL;
			}
			if (s[label] == '-' || s[i - 1] == '-') {
				match_set_err(err, errlen, "label starts or ends with '-' in host name \"%s\"",
					      shown);
				return -EINVAL;
			}
			if (i - label > LABEL_LEN_MAX) {
				match_set_err(err, errlen, "label of %zu characters is longer than %d in \"%s\"",
					      i - label, LABEL_LEN_MAX, shown);
				return -EINVAL;
			}
			last = label;
			label = i + 1;
			continue;
		}
		if (!is_alpha(c) && !is_digit(c) && c != '-') {
			match_set_err(err, errlen, "bad character '%c' in host name \"%s\"", c, shown);
			return -EINVAL;
		}
		if (!is_digit(c))
			numeric = false;
	}
	if (numeric) {
		match_set_err(err, errlen, "bad IPv4 address \"%.*s\" in \"%s\"", (int)n, s, shown);
		return -EINVAL;
	}
	bool last_digits = true;
	for (size_t i = last; i < n; i++)
		if (!is_digit(s[i]))
			last_digits = false;
	if (last_digits) {
		match_set_err(err, errlen, "host name \"%.*s\" ends in an all-digit label", (int)n, s);
		return -EINVAL;
	}
	r->kind = RULE_HOST;
	for (size_t i = 0; i < n; i++)
		r->host[i] = match_lower(s[i]);
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
		match_set_err(err, errlen, "empty unix socket name in \"%s\"", shown);
		return -EINVAL;
	}
	if (n > max) {
		match_set_err(err, errlen, "unix socket %s of %zu bytes is longer than %zu in \"%s\"",
			      p[0] == '@' ? "name" : "path", p[0] == '@' ? n - 1 : n,
			      p[0] == '@' ? max - 1 : max, shown);
		return -EINVAL;
	}
	r->kind = RULE_UNIX;
	memcpy(r->path, p, n + 1);
	return 0;
}

/* Parses one destination (see match.h for the forms). Returns 0, or -EINVAL
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
		match_set_err(err, errlen, "empty destination");
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
			match_set_err(err, errlen, "missing \"]\" in \"%s\"", shown);
			return -EINVAL;
		}
		rc = parse_addr(text + 1, (size_t)(close - text - 1), AF_INET6, r, shown, err, errlen);
		if (rc < 0)
			return rc;
		if (close[1] == '\0')
			return 0;
		if (close[1] != ':') {
			match_set_err(err, errlen, "expected \":port\" after \"]\" in \"%s\"", shown);
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

/* Renders a rule the way a config would write it, for messages, cut to len
 * and NUL-terminated. */
void match_rule_text(const struct rule *r, char *buf, size_t len)
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
		size_t n = match_unix_key(sa, len, key);

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
	if (match_inet_key(sa, len, addr, &port) < 0) {
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

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
/* The lower case of an ASCII letter, any other c unchanged. Locale-free:
 * match_find and match_learn may run where the locale functions are not
 * safe, and host names are ASCII anyway. */
char match_lower(char c)
{
	return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

/* Clears the bits of addr beyond the first prefix bits; a prefix of 128
 * leaves it alone. */
void match_mask_addr(uint8_t *addr, int prefix)
{
	int i = prefix / 8;

	if (i >= 16)
		return;
	if (prefix % 8)
		addr[i++] &= (uint8_t)(0xff << (8 - prefix % 8));
	for (; i < 16; i++)
		addr[i] = 0;
}

/* Writes the 4-byte IPv4 address in4 into addr as ::ffff:a.b.c.d. */
BS_LTO_INLINE void match_map_ipv4(uint8_t addr[16], const void *in4)
{
	memset(addr, 0, 10);
	addr[10] = 0xff;
	addr[11] = 0xff;
	memcpy(addr + 12, in4, 4);
}

/* Reads the 16-byte (IPv4-mapped for AF_INET) address and port of an inet
 * sockaddr; returns -1 for anything else or a short length. */
BS_LTO_INLINE int match_inet_key(const struct sockaddr *sa, socklen_t len, uint8_t addr[16],
    uint16_t *port)
{
	sa_family_t family;

	if (sa == NULL || len < (socklen_t)sizeof(sa_family_t))
		return -1;
	memcpy(&family, &sa->sa_family, sizeof(family));
	if (family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
		struct sockaddr_in in;

		memcpy(&in, sa, sizeof(in));
		match_map_ipv4(addr, &in.sin_addr);
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
BS_LTO_INLINE size_t match_unix_key(const struct sockaddr *sa, socklen_t len,
    char key[BS_UNIX_PATH_MAX + 1])
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
#pragma GCC diagnostic pop
