/* fuzz_match.c - libFuzzer target: destination parsing, table building and lookup. */
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "config/config.h"
#include "log.h"

/*
 * An input is up to MAX_LINES destination strings, one a line, then a NUL
 * byte, then the raw bytes of a socket address: its first byte picks the
 * family (AF_INET, AF_INET6, AF_UNIX or whatever the bytes say), its second
 * the length passed to match_find (anything from 0 to a sockaddr_storage),
 * the rest fills the address. Each line that parses becomes a rule of its
 * own compartment; the rules are built into a matcher and the address is
 * looked up. Beyond "no crash", the target checks that each IP or Unix rule
 * matches its own address (some rule must: the most specific one may be
 * another's), and that a host rule matches an address once learned for it.
 */

#define MAX_LINES	16
#define LINE_MAX_LEN	4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The address rule r names, as a socket address; its length, or 0. */
static socklen_t
rule_addr(const struct rule *r, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (r->kind == RULE_IP) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(r->port_lo);
		memcpy(&in6->sin6_addr, r->addr, 16);
		return sizeof(*in6);
	}
	if (r->kind == RULE_UNIX) {
		struct sockaddr_un *un = (struct sockaddr_un *)ss;
		size_t n = strnlen(r->path, sizeof(r->path));

		if (n == 0 || n > sizeof(un->sun_path))
			return 0;
		un->sun_family = AF_UNIX;
		memcpy(un->sun_path, r->path, n);
		if (r->path[0] == '@') {
			un->sun_path[0] = '\0';
			return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
		}
		return (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
		    (n < sizeof(un->sun_path) ? n + 1 : n));
	}
	return 0;
}

static void
check_format(const struct sockaddr *sa, socklen_t len)
{
	char small[8], big[256];

	memset(small, 0x5a, sizeof(small));
	match_format(sa, len, small, sizeof(small));
	match_format(sa, len, big, sizeof(big));
	if (memchr(small, '\0', sizeof(small)) == NULL || memchr(big, '\0', sizeof(big)) == NULL)
		__builtin_trap();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct rule rules[MAX_LINES];
	struct sockaddr_storage ss, own;
	const uint8_t *end = memchr(data, '\0', size), *p = data, *tail;
	char line[LINE_MAX_LEN + 1], err[BS_ERRLEN];
	struct matcher *m;
	size_t n = 0, tail_len;
	socklen_t len, olen;

	if (end == NULL)
		end = data + size;
	while (p < end && n < MAX_LINES) {
		const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
		size_t k = (size_t)((nl != NULL ? nl : end) - p);

		if (k <= LINE_MAX_LEN) {
			memcpy(line, p, k);
			line[k] = '\0';
			rules[n].comp = (int)n;
			rules[n].line = (int)n + 1;
			err[0] = '\0';
			if (match_parse(line, &rules[n], err, sizeof(err)) == 0) {
				rules[n].comp = (int)n;
				n++;
			} else if (err[0] == '\0' || memchr(err, '\0', sizeof(err)) == NULL) {
				__builtin_trap();	/* a refusal always says why */
			}
		}
		p = nl != NULL ? nl + 1 : end;
	}

	/* The raw address after the NUL. */
	tail = end < data + size ? end + 1 : end;
	tail_len = (size_t)(data + size - tail);
	memset(&ss, 0, sizeof(ss));
	len = 0;
	if (tail_len >= 2) {
		static const sa_family_t fam[4] = { AF_INET, AF_INET6, AF_UNIX, AF_UNSPEC };

		len = (socklen_t)(tail[1] % (sizeof(ss) + 1));
		memcpy((char *)&ss + sizeof(sa_family_t), tail + 2,
		    tail_len - 2 < sizeof(ss) - sizeof(sa_family_t) ?
		    tail_len - 2 : sizeof(ss) - sizeof(sa_family_t));
		ss.ss_family = tail[0] < 4 ? fam[tail[0]] : tail[0];
	}

	m = match_build(rules, n, err, sizeof(err));
	if (m == NULL) {
		if (err[0] == '\0')
			__builtin_trap();
		return 0;
	}
	if (match_find(m, (struct sockaddr *)&ss, len) >= (int)n)
		__builtin_trap();
	check_format((struct sockaddr *)&ss, len);
	for (size_t i = 0; i < n; i++) {
		olen = rule_addr(&rules[i], &own);
		if (olen != 0) {
			int c = match_find(m, (struct sockaddr *)&own, olen);

			if (c < 0 || c >= (int)n)
				__builtin_trap();
			check_format((struct sockaddr *)&own, olen);
		}
		if (rules[i].kind == RULE_HOST) {
			/* Learn the raw address (if it is one) for this host. */
			int c = match_learn(m, rules[i].host, (struct sockaddr *)&ss);

			if (c >= (int)n)
				__builtin_trap();
			if (!match_has_host(m, rules[i].host))
				__builtin_trap();
		}
	}
	if (match_find(m, (struct sockaddr *)&ss, len) >= (int)n)
		__builtin_trap();
	match_free(m);
	return 0;
}
