/* test_match.c - unit tests of destination parsing, lookup precedence and learning. */
#include "../../shim/config/match_table.c"
#include "../../shim/config/match_learn.c"

#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

static char err[BS_ERRLEN];

/* Parses text into a rule of compartment comp that must be valid. */
static struct rule rule_ok(const char *text, int comp)
{
	struct rule r = { .comp = comp, .line = comp + 1 };

	err[0] = '\0';
	if (match_parse(text, &r, err, sizeof(err)) != 0)
		fail_msg("\"%s\" did not parse: %s", text, err);
	return r;
}

/* Parses text that must be refused; the reason is left in err. */
static void parse_bad(const char *text)
{
	struct rule r = { 0 };

	err[0] = '\0';
	if (match_parse(text, &r, err, sizeof(err)) != -EINVAL)
		fail_msg("\"%s\" parsed but should not have", text);
	if (err[0] == '\0')
		fail_msg("\"%s\" was refused without a reason", text);
}

static struct sockaddr_in sa4(const char *ip, uint16_t port)
{
	struct sockaddr_in in = { .sin_family = AF_INET, .sin_port = htons(port) };

	assert_int_equal(inet_pton(AF_INET, ip, &in.sin_addr), 1);
	return in;
}

static struct sockaddr_in6 sa6(const char *ip, uint16_t port)
{
	struct sockaddr_in6 in6 = { .sin6_family = AF_INET6, .sin6_port = htons(port) };

	assert_int_equal(inet_pton(AF_INET6, ip, &in6.sin6_addr), 1);
	return in6;
}

static int find4(const struct matcher *m, const char *ip, uint16_t port)
{
	struct sockaddr_in in = sa4(ip, port);

	return match_find(m, (const struct sockaddr *)&in, sizeof(in));
}

static int find6(const struct matcher *m, const char *ip, uint16_t port)
{
	struct sockaddr_in6 in6 = sa6(ip, port);

	return match_find(m, (const struct sockaddr *)&in6, sizeof(in6));
}

/* Builds a matcher from destination texts; texts[i] goes to compartment comps[i]. */
static struct matcher *build(const char *const *texts, const int *comps, size_t n)
{
	struct rule *rules = calloc(n ? n : 1, sizeof(*rules));
	struct matcher *m;

	assert_non_null(rules);
	for (size_t i = 0; i < n; i++)
		rules[i] = rule_ok(texts[i], comps[i]);
	m = match_build(rules, n, err, sizeof(err));
	free(rules);
	if (m == NULL)
		fail_msg("match_build failed: %s", err);
	return m;
}

#define BUILD(texts, comps) build(texts, comps, sizeof(texts) / sizeof(texts[0]))

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---- parsing ---- */

/* A destination that parses, and the rule it must make: for an IP rule the
 * address (IPv4 or IPv6 text) and the prefix in that family's bits, for a
 * unix rule the path, for a host rule the name; the ports lo..hi for all
 * but unix rules. */
struct parse_case {
	const char *text;
	int kind;
	const char *want;
	int prefix;
	unsigned lo, hi;
};

static const struct parse_case parses[] = {
	{ "10.0.0.5:443", RULE_IP, "10.0.0.5", 32, 443, 443 },
	/* No port is any port. */
	{ "10.0.0.5", RULE_IP, "10.0.0.5", 32, 0, 65535 },
	{ "10.2.0.0/16", RULE_IP, "10.2.0.0", 16, 0, 65535 },
	{ "10.2.0.0/16:8080", RULE_IP, "10.2.0.0", 16, 8080, 8080 },
	{ "10.0.0.5:1000-2000", RULE_IP, "10.0.0.5", 32, 1000, 2000 },
	{ "192.168.0.0/24:1-65535", RULE_IP, "192.168.0.0", 24, 1, 65535 },
	/* The bits under the mask are cleared. */
	{ "10.2.3.4/16", RULE_IP, "10.2.0.0", 16, 0, 65535 },
	{ "[2001:db8:ffff::1/32]:443", RULE_IP, "2001:db8::", 32, 443, 443 },
	{ "[::1]:9001", RULE_IP, "::1", 128, 9001, 9001 },
	{ "[2001:db8::/32]:443", RULE_IP, "2001:db8::", 32, 443, 443 },
	{ "[::1]", RULE_IP, "::1", 128, 0, 65535 },
	{ "::1", RULE_IP, "::1", 128, 0, 65535 },
	{ "fe80::/10", RULE_IP, "fe80::", 10, 0, 65535 },
	{ "[2001:db8::1]:8000-8100", RULE_IP, "2001:db8::1", 128, 8000, 8100 },
	/* An IPv4-mapped IPv6 address makes the IPv4 rule. */
	{ "[::ffff:10.0.0.5]:443", RULE_IP, "10.0.0.5", 32, 443, 443 },
	{ "unix:/run/recs.sock", RULE_UNIX, "/run/recs.sock", 0, 0, 0 },
	{ "unix:@recs", RULE_UNIX, "@recs", 0, 0, 0 },
	/* A host name is kept in lower case, without one trailing dot. */
	{ "Payments.Internal:443", RULE_HOST, "payments.internal", 0, 443, 443 },
	{ "db-1.example.com:5432-5439", RULE_HOST, "db-1.example.com", 0, 5432, 5439 },
	{ "localhost", RULE_HOST, "localhost", 0, 0, 65535 },
	{ "example.com.:80", RULE_HOST, "example.com", 0, 80, 80 },
};

static void each_destination_parses_into_its_rule(void **state)
{
	(void)state;
	for (size_t i = 0; i < NELEM(parses); i++) {
		const struct parse_case *k = &parses[i];
		struct rule r = rule_ok(k->text, 0);
		uint8_t want[16];
		int prefix = k->prefix;
		struct in_addr in;

		if (r.kind != k->kind)
			fail_msg("row %zu, \"%s\": kind %d, want %d", i, k->text, r.kind, k->kind);
		if (k->kind == RULE_IP) {
			if (inet_pton(AF_INET, k->want, &in) == 1) {
				match_map_ipv4(want, &in);
				prefix += 96;
			} else {
				assert_int_equal(inet_pton(AF_INET6, k->want, want), 1);
			}
			if (memcmp(r.addr, want, 16) != 0)
				fail_msg("row %zu, \"%s\": the address is not %s", i, k->text, k->want);
			if (r.prefix != prefix)
				fail_msg("row %zu, \"%s\": prefix %d, want %d", i, k->text, r.prefix,
				    prefix);
		} else if (strcmp(k->kind == RULE_UNIX ? r.path : r.host, k->want) != 0) {
			fail_msg("row %zu, \"%s\": \"%s\", want \"%s\"", i, k->text,
			    k->kind == RULE_UNIX ? r.path : r.host, k->want);
		}
		if (k->kind != RULE_UNIX && (r.port_lo != k->lo || r.port_hi != k->hi))
			fail_msg("row %zu, \"%s\": ports %u-%u, want %u-%u", i, k->text, r.port_lo,
			    r.port_hi, k->lo, k->hi);
	}
}

/* A destination that is refused, and its reason: exactly exact, or
 * containing part, or (neither given) any reason at all. */
struct refusal {
	const char *text, *exact, *part;
};

static const struct refusal refusals[] = {
	{ "10.0.0.1:99999", "bad port \"99999\" in \"10.0.0.1:99999\"", NULL },
	{ "10.0.0.1:0", NULL, "bad port \"0\"" },
	{ "10.0.0.1:0-80", NULL, NULL },
	{ "10.0.0.1:90-80", NULL, "90-80" },
	{ "10.0.0.0/33", "prefix /33 is too long for IPv4", NULL },
	{ "[::/129]:80", "prefix /129 is too long for IPv6", NULL },
	/* One trailing dot is dropped, not two. */
	{ "example.com..:80", NULL, NULL },
	/* Garbage. */
	{ "", NULL, NULL }, { ":80", NULL, NULL }, { "10.0.0.1:", NULL, NULL },
	{ "10.0.0.1:http", NULL, NULL }, { "10.0.0.1:80:90", NULL, NULL }, { "[::1", NULL, NULL },
	{ "[::1]80", NULL, NULL }, { "[10.0.0.1]:80", NULL, NULL }, { "10.0.0.0/x", NULL, NULL },
	{ "10.0.0.300", NULL, NULL }, { "1.2.3", NULL, NULL }, { "host.123", NULL, NULL },
	{ "a..b", NULL, NULL }, { "exa mple.com", NULL, NULL }, { "host_name:80", NULL, NULL },
	{ "10.0.0.1:80-", NULL, NULL }, { "10.0.0.1:-80", NULL, NULL }, { "unix:", NULL, NULL },
	{ "unix:@", NULL, NULL }, { "fe80::1%eth0", NULL, NULL }, { "-", NULL, NULL },
	{ "10.0.0.0/", NULL, NULL }, { "[::1]:", NULL, NULL }, { "10.0.0.1:1-2-3", NULL, NULL },
};

static void each_bad_destination_is_refused_with_its_reason(void **state)
{
	struct rule r = { 0 };

	(void)state;
	for (size_t i = 0; i < NELEM(refusals); i++) {
		const struct refusal *k = &refusals[i];

		parse_bad(k->text);
		if (k->exact != NULL && strcmp(err, k->exact) != 0)
			fail_msg("row %zu, \"%s\": the reason is \"%s\", want \"%s\"", i, k->text, err,
			    k->exact);
		if (k->part != NULL && strstr(err, k->part) == NULL)
			fail_msg("row %zu, \"%s\": the reason \"%s\" lacks \"%s\"", i, k->text, err,
			    k->part);
	}
	assert_int_equal(match_parse(NULL, &r, err, sizeof(err)), -EINVAL);
}

static void parse_leaves_comp_and_line_alone(void **state)
{
	(void)state;
	struct rule r = { .comp = 7, .line = 42 };

	assert_int_equal(match_parse("10.0.0.1", &r, err, sizeof(err)), 0);
	assert_int_equal(r.comp, 7);
	assert_int_equal(r.line, 42);
}

static void parse_refuses_long_unix_path_instead_of_cutting_it(void **state)
{
	char *text = malloc(4001), ok[200];

	(void)state;
	assert_non_null(text);
	memcpy(text, "unix:/", 6);
	memset(text + 6, 'a', 3994);
	text[4000] = '\0';
	parse_bad(text);
	assert_non_null(strstr(err, "longer than 107"));
	free(text);
	/* 107 bytes fit with the NUL, 108 do not. */
	snprintf(ok, sizeof(ok), "unix:/%0106d", 0);
	(void)rule_ok(ok, 0);
	snprintf(ok, sizeof(ok), "unix:/%0107d", 0);
	parse_bad(ok);
	/* An abstract name may fill all of sun_path after its NUL. */
	snprintf(ok, sizeof(ok), "unix:@%0107d", 0);
	(void)rule_ok(ok, 0);
	snprintf(ok, sizeof(ok), "unix:@%0108d", 0);
	parse_bad(ok);
}

static void parse_rejects_long_host_names(void **state)
{
	char name[400];

	(void)state;
	/* 63 + 1 + 63 + 1 + 63 + 1 + 61 = 253 characters: the longest allowed. */
	memset(name, 'a', sizeof(name));
	name[63] = name[127] = name[191] = '.';
	name[253] = '\0';
	(void)rule_ok(name, 0);
	name[253] = 'a';
	name[254] = '\0';
	parse_bad(name);
	assert_non_null(strstr(err, "longer than 253"));
	memset(name, 'b', 64);
	strcpy(name + 64, ".com:80");
	parse_bad(name);
	assert_non_null(strstr(err, "longer than 63"));
}

/* ---- matching ---- */

/* Rules (texts[i] of compartment comps[i]) and lookups against them: each
 * address (an IPv4 or an IPv6 one, by its text) and port must find
 * compartment want, or -1 for none. */
struct lookup {
	const char *ip;
	uint16_t port;
	int want;
};

struct find_case {
	const char *what;
	const char *texts[12];
	int comps[12];
	struct lookup q[12];
};

/* Builds k's rules and checks each of its lookups. */
static void check_lookups(const struct find_case *k)
{
	size_t n = 0;
	struct matcher *m;

	while (k->texts[n] != NULL)
		n++;
	m = build(k->texts, k->comps, n);
	for (const struct lookup *q = k->q; q->ip != NULL; q++) {
		int got = strchr(q->ip, ':') ? find6(m, q->ip, q->port) : find4(m, q->ip, q->port);

		if (got != q->want)
			fail_msg("%s: %s port %u finds %d, want %d", k->what, q->ip, q->port, got,
			    q->want);
	}
	match_free(m);
}

static const struct find_case lookups[] = {
	{ "an IPv4 address and port", { "10.0.0.5:443" }, { 0 },
	  { { "10.0.0.5", 443, 0 }, { "10.0.0.5", 80, -1 }, { "10.0.0.6", 443, -1 } } },
	{ "an IPv4 address, any port", { "10.0.0.5" }, { 0 },
	  { { "10.0.0.5", 1, 0 }, { "10.0.0.5", 65535, 0 } } },
	{ "IPv4 networks", { "10.2.0.0/16:8080", "0.0.0.0/0:25" }, { 0, 1 },
	  { { "10.2.0.1", 8080, 0 }, { "10.2.255.255", 8080, 0 }, { "10.3.0.1", 8080, -1 },
	    { "10.2.0.1", 8081, -1 }, { "192.0.2.1", 25, 1 } } },
	/* With more than four prefix lengths in use, an IPv4 address tries only
	 * the lengths of the rules covering its /16, and the IPv6 rules wide
	 * enough to hold it: the most specific rule must still win, a rule
	 * wider than a /16 must still be found, and a miss must stay a miss.
	 * 192.168.16.1 is under no IPv4 rule: the IPv6 rule holding every
	 * IPv4-mapped address answers. */
	{ "many prefix lengths",
	  { "10.0.0.0/8", "10.2.0.0/15", "10.2.0.0/16", "10.2.3.0/24", "10.2.3.128/25",
	    "10.2.3.200/30", "192.168.0.0/20", "[::fffe:0:0/95]", "[2001:db8::/32]" },
	  { 0, 1, 2, 3, 4, 5, 6, 7, 8 },
	  { { "10.2.3.201", 80, 5 }, { "10.2.3.129", 80, 4 }, { "10.2.3.1", 80, 3 },
	    { "10.2.9.9", 80, 2 }, { "10.3.0.1", 80, 1 }, { "10.200.0.1", 80, 0 },
	    { "192.168.15.255", 80, 6 }, { "192.168.16.1", 80, 7 }, { "2001:db8::1", 80, 8 },
	    { "2001:db9::1", 80, -1 } } },
	{ "many prefix lengths, misses",
	  { "10.0.0.0/8", "10.2.0.0/15", "10.2.0.0/16", "10.2.3.0/24", "10.2.3.128/25",
	    "172.16.0.0/12:443" },
	  { 0, 1, 2, 3, 4, 5 },
	  { { "11.0.0.1", 80, -1 }, { "172.31.255.255", 443, 5 }, { "172.31.255.255", 80, -1 },
	    { "172.32.0.0", 443, -1 } } },
	/* With many prefix lengths, an IPv4 address skips the exact (/128)
	 * table when its /16 holds no exact rule: exact rules must still be
	 * found and still win over wider ones, in their own /16 and under a
	 * wider rule. */
	{ "exact IPv4 rules among many prefix lengths",
	  { "10.0.0.0/8", "10.2.0.0/15", "10.2.0.0/16", "10.2.3.0/24", "10.2.3.128/25",
	    "10.2.3.7:80", "10.9.1.1", "192.168.1.1:5432", "[::ffff:172.16.0.1]" },
	  { 0, 1, 2, 3, 4, 5, 6, 7, 8 },
	  { { "10.2.3.7", 80, 5 }, { "10.2.3.7", 81, 3 }, { "10.9.1.1", 7, 6 },
	    { "10.9.1.2", 7, 0 }, { "192.168.1.1", 5432, 7 }, { "192.168.1.1", 5433, -1 },
	    { "192.168.1.2", 5432, -1 }, { "172.16.0.1", 1, 8 }, { "::ffff:172.16.0.1", 1, 8 },
	    { "172.16.0.2", 1, -1 } } },
	{ "a port range includes both ends", { "10.0.0.5:1000-2000" }, { 0 },
	  { { "10.0.0.5", 999, -1 }, { "10.0.0.5", 1000, 0 }, { "10.0.0.5", 1500, 0 },
	    { "10.0.0.5", 2000, 0 }, { "10.0.0.5", 2001, -1 } } },
	{ "IPv6", { "[::1]:9001", "[2001:db8::/32]:443", "fe80::/10" }, { 0, 1, 2 },
	  { { "::1", 9001, 0 }, { "::1", 9002, -1 }, { "2001:db8:1::2", 443, 1 },
	    { "2001:db9::2", 443, -1 }, { "fe80::1234", 7, 2 } } },
	{ "an IPv4-mapped IPv6 address finds the IPv4 rule", { "10.0.0.5:443", "10.2.0.0/16" },
	  { 0, 1 },
	  { { "::ffff:10.0.0.5", 443, 0 }, { "::ffff:10.2.9.9", 1, 1 }, { "::10.0.0.5", 443, -1 } } },
	{ "an IPv4 address finds the IPv4-mapped IPv6 rule", { "[::ffff:10.0.0.5]:443" }, { 3 },
	  { { "10.0.0.5", 443, 3 } } },
};

static void each_lookup_finds_its_compartment(void **state)
{
	(void)state;
	for (size_t i = 0; i < NELEM(lookups); i++)
		check_lookups(&lookups[i]);
}

/* Exact IPv4 rules live in a table of their own (v4tab, with a /16 filter
 * from 64 of them on): each is found, from AF_INET and from an
 * IPv4-mapped AF_INET6 address alike; another port or address of the same
 * /16 falls to the wider rule, another /16 to nothing. */
static void find_many_exact_ipv4_from_both_families(void **state)
{
	enum { N = 200 };
	struct rule rules[N + 1];
	struct matcher *m;
	char text[64];

	(void)state;
	for (int i = 0; i < N; i++) {
		snprintf(text, sizeof(text), "10.1.%d.%d:80", i / 16, i % 16 * 3);
		rules[i] = rule_ok(text, i % 5);
	}
	rules[N] = rule_ok("10.1.0.0/16", 9);
	m = match_build(rules, N + 1, err, sizeof(err));
	assert_non_null(m);
	for (int i = 0; i < N; i++) {
		snprintf(text, sizeof(text), "10.1.%d.%d", i / 16, i % 16 * 3);
		assert_int_equal(find4(m, text, 80), i % 5);
		assert_int_equal(find4(m, text, 81), 9);
		snprintf(text, sizeof(text), "::ffff:10.1.%d.%d", i / 16, i % 16 * 3);
		assert_int_equal(find6(m, text, 80), i % 5);
		snprintf(text, sizeof(text), "10.1.%d.%d", i / 16, i % 16 * 3 + 1);
		assert_int_equal(find4(m, text, 80), 9);
	}
	assert_int_equal(find4(m, "10.2.0.0", 80), -1);
	match_free(m);
}

static struct sockaddr_un sun_of(const char *path, socklen_t *len)
{
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	size_t n = strlen(path);

	/* The rest of sun_path is zero already: a path of 108 bytes has no NUL. */
	memcpy(un.sun_path, path, n < sizeof(un.sun_path) ? n : sizeof(un.sun_path));
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	return un;
}

static void find_unix_path(void **state)
{
	static const char *const t[] = { "unix:/run/recs.sock" };
	static const int c[] = { 4 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_un un;
	socklen_t len;

	(void)state;
	un = sun_of("/run/recs.sock", &len);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len), 4);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, sizeof(un)), 4);
	un = sun_of("/run/recs.sock2", &len);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len), -1);
	un = sun_of("/run/recs.soc", &len);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len), -1);
	match_free(m);
}

static void find_unix_path_without_nul_honours_len(void **state)
{
	static const char *const t[] = { "unix:/run/recs.sock" };
	static const int c[] = { 4 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_un un;
	socklen_t len = offsetof(struct sockaddr_un, sun_path) + strlen("/run/recs.sock");

	(void)state;
	memset(&un, 'X', sizeof(un));
	un.sun_family = AF_UNIX;
	memcpy(un.sun_path, "/run/recs.sock", 14);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len), 4);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len - 1), -1);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len + 1), -1);
	match_free(m);
}

static void find_unix_abstract_name_up_to_len(void **state)
{
	static const char *const t[] = { "unix:@recs", "unix:/recs" };
	static const int c[] = { 5, 6 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_un un;
	socklen_t len = offsetof(struct sockaddr_un, sun_path) + 5;

	(void)state;
	memset(&un, 'X', sizeof(un));
	un.sun_family = AF_UNIX;
	memcpy(un.sun_path, "\0recs", 5);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len), 5);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len + 1), -1);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len - 1), -1);
	match_free(m);
}

static void find_misses_other_families(void **state)
{
	static const char *const t[] = { "0.0.0.0/0", "::/0" };
	static const int c[] = { 0, 1 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr sa = { .sa_family = AF_NETLINK };

	(void)state;
	assert_int_equal(match_find(m, &sa, sizeof(sa)), -1);
	assert_int_equal(find4(m, "1.2.3.4", 5), 0);
	assert_int_equal(find6(m, "2001::1", 5), 1);
	match_free(m);
}

/* ---- precedence ---- */

static const struct find_case precedence[] = {
	{ "an exact address and port beats a network", { "10.0.0.0/8:443", "10.0.0.5:443" },
	  { 0, 1 }, { { "10.0.0.5", 443, 1 }, { "10.0.0.6", 443, 0 } } },
	{ "the longer prefix wins", { "10.2.0.0/16", "10.2.3.0/24" }, { 0, 1 },
	  { { "10.2.3.4", 80, 1 }, { "10.2.4.4", 80, 0 } } },
	{ "the narrower port range wins on the same address",
	  { "10.0.0.5", "10.0.0.5:8000-8999", "10.0.0.5:8080" }, { 0, 1, 2 },
	  { { "10.0.0.5", 8080, 2 }, { "10.0.0.5", 8081, 1 }, { "10.0.0.5", 22, 0 } } },
	{ "an exact address with any port beats a network with the exact port",
	  { "10.0.0.0/24:443", "10.0.0.5" }, { 0, 1 },
	  { { "10.0.0.5", 443, 1 }, { "10.0.0.6", 443, 0 } } },
	{ "a shorter prefix serves the ports the longer one lacks", { "10.0.0.5:443", "10.0.0.0/8" },
	  { 0, 1 }, { { "10.0.0.5", 443, 0 }, { "10.0.0.5", 80, 1 } } },
};

static void the_most_specific_rule_wins(void **state)
{
	(void)state;
	for (size_t i = 0; i < NELEM(precedence); i++)
		check_lookups(&precedence[i]);
}

/* ---- building ---- */

/* Two rules of compartments 0 and 1 that make the same destination, with
 * their lines (0: rule_ok's), and the error: exactly exact, or containing
 * part. */
struct clash {
	const char *a, *b;
	int line_a, line_b;
	const char *exact, *part;
};

static const struct clash clashes[] = {
	{ "10.0.0.5:443", "[::ffff:10.0.0.5]:443", 4, 9,
	  "duplicate destination \"10.0.0.5:443\" in compartments 0 and 1 (lines 4 and 9)", NULL },
	/* The same after masking. */
	{ "10.2.0.0/16", "10.2.7.7/16", 0, 0, NULL, "10.2.0.0/16" },
	{ "unix:@x", "unix:@x", 0, 0, NULL, "unix:@x" },
	{ "api.example.com:443", "API.example.com.:443", 0, 0, NULL, "api.example.com:443" },
};

static void a_destination_in_two_compartments_is_an_error(void **state)
{
	(void)state;
	for (size_t i = 0; i < NELEM(clashes); i++) {
		const struct clash *k = &clashes[i];
		struct rule rules[2] = { rule_ok(k->a, 0), rule_ok(k->b, 1) };

		if (k->line_a != 0) {
			rules[0].line = k->line_a;
			rules[1].line = k->line_b;
		}
		err[0] = '\0';
		if (match_build(rules, 2, err, sizeof(err)) != NULL)
			fail_msg("row %zu: \"%s\" and \"%s\" built", i, k->a, k->b);
		if (k->exact != NULL && strcmp(err, k->exact) != 0)
			fail_msg("row %zu: the error is \"%s\", want \"%s\"", i, err, k->exact);
		if (k->part != NULL && strstr(err, k->part) == NULL)
			fail_msg("row %zu: the error \"%s\" lacks \"%s\"", i, err, k->part);
	}
}

static const struct find_case builds[] = {
	{ "a duplicate in one compartment is accepted",
	  { "10.0.0.5:443", "10.0.0.5:443", "unix:/a", "unix:/a", "h.example:1", "h.example:1" },
	  { 2, 2, 2, 2, 2, 2 }, { { "10.0.0.5", 443, 2 } } },
	{ "one address with other ports in two compartments", { "10.0.0.5:443", "10.0.0.5:80" },
	  { 0, 1 }, { { "10.0.0.5", 443, 0 }, { "10.0.0.5", 80, 1 } } },
};

static void rules_that_share_only_an_address_build(void **state)
{
	(void)state;
	for (size_t i = 0; i < NELEM(builds); i++)
		check_lookups(&builds[i]);
}

static void build_refuses_malformed_rules(void **state)
{
	struct rule r = rule_ok("10.0.0.0/8", 0);

	(void)state;
	r.addr[15] = 1;	/* host bits set behind match_parse's back */
	assert_null(match_build(&r, 1, err, sizeof(err)));
	r = rule_ok("10.0.0.1", -1);
	assert_null(match_build(&r, 1, err, sizeof(err)));
	assert_null(match_build(NULL, 3, err, sizeof(err)));
}

static void empty_matcher_matches_nothing(void **state)
{
	struct matcher *m = match_build(NULL, 0, err, sizeof(err));

	(void)state;
	assert_non_null(m);
	assert_int_equal(find4(m, "127.0.0.1", 80), -1);
	assert_false(match_has_host(m, "localhost"));
	match_free(m);
}

static void ten_thousand_rules_build_and_match(void **state)
{
	enum { N = 10000 };
	struct rule *rules = calloc(N + 2, sizeof(*rules));
	struct matcher *m;
	char text[64];

	(void)state;
	assert_non_null(rules);
	for (int i = 0; i < N; i++) {
		snprintf(text, sizeof(text), "10.%d.%d.%d:%d", i / 65536, (i / 256) % 256, i % 256,
			 1000 + i % 7);
		rules[i] = rule_ok(text, i % 100);
	}
	rules[N] = rule_ok("10.0.0.0/8", 100);
	rules[N + 1] = rule_ok("unix:/tmp/s", 101);
	m = match_build(rules, N + 2, err, sizeof(err));
	assert_non_null(m);
	for (int i = 0; i < N; i++) {
		snprintf(text, sizeof(text), "10.%d.%d.%d", i / 65536, (i / 256) % 256, i % 256);
		assert_int_equal(find4(m, text, (uint16_t)(1000 + i % 7)), i % 100);
		assert_int_equal(find4(m, text, 999), 100);
	}
	assert_int_equal(find4(m, "11.0.0.1", 1000), -1);
	match_free(m);
	free(rules);
}

/* ---- learning ---- */

static void learned_address_matches_with_the_host_rule_ports(void **state)
{
	static const char *const t[] = { "payments.internal:443", "10.0.0.0/8" };
	static const int c[] = { 3, 1 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_in in = sa4("10.9.9.9", 0);

	(void)state;
	assert_int_equal(find4(m, "10.9.9.9", 443), 1);
	assert_int_equal(match_learn(m, "payments.internal", (struct sockaddr *)&in), 3);
	/* A learned address ranks as a /128 rule, above the /8. */
	assert_int_equal(find4(m, "10.9.9.9", 443), 3);
	assert_int_equal(find6(m, "::ffff:10.9.9.9", 443), 3);
	assert_int_equal(find4(m, "10.9.9.9", 80), 1);
	match_free(m);
}

static void learning_ignores_case_and_one_trailing_dot(void **state)
{
	static const char *const t[] = { "api.example.com" };
	static const int c[] = { 2 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_in6 in6 = sa6("2001:db8::7", 0);

	(void)state;
	assert_true(match_has_host(m, "API.Example.COM."));
	assert_false(match_has_host(m, "api.example.com.."));
	assert_int_equal(match_learn(m, "API.example.com.", (struct sockaddr *)&in6), 2);
	assert_int_equal(find6(m, "2001:db8::7", 12345), 2);
	match_free(m);
}

static void learning_an_unknown_host_returns_minus_one(void **state)
{
	static const char *const t[] = { "api.example.com" };
	static const int c[] = { 2 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_in in = sa4("192.0.2.1", 0);

	(void)state;
	assert_int_equal(match_learn(m, "other.example.com", (struct sockaddr *)&in), -1);
	assert_int_equal(find4(m, "192.0.2.1", 80), -1);
	assert_int_equal(match_learn(m, NULL, (struct sockaddr *)&in), -1);
	assert_int_equal(match_learn(m, "api.example.com", NULL), -1);
	assert_int_equal(match_learn(NULL, "api.example.com", (struct sockaddr *)&in), -1);
	match_free(m);
}

static void learning_an_address_twice_adds_it_once(void **state)
{
	static const char *const t[] = { "a.example:80", "a.example:443" };
	static const int c[] = { 0, 1 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_in in = sa4("192.0.2.1", 0);

	(void)state;
	assert_true(match_learn(m, "a.example", (struct sockaddr *)&in) >= 0);
	assert_int_equal(atomic_load(&m->learned->count), 2);
	assert_true(match_learn(m, "a.example", (struct sockaddr *)&in) >= 0);
	assert_int_equal(atomic_load(&m->learned->count), 2);
	assert_int_equal(find4(m, "192.0.2.1", 80), 0);
	assert_int_equal(find4(m, "192.0.2.1", 443), 1);
	match_free(m);
}

/* Learns n addresses from 11.0.0.0 up for host, each of compartment comp. */
static void learn_block(struct matcher *m, const char *host, uint32_t n, int comp)
{
	struct sockaddr_in in = { .sin_family = AF_INET };

	for (uint32_t i = 0; i < n; i++) {
		in.sin_addr.s_addr = htonl(0x0b000000u + i);
		assert_int_equal(match_learn(m, host, (struct sockaddr *)&in), comp);
	}
}

static void learning_fails_with_enospc_when_full(void **state)
{
	static const char *const t[] = { "a.example" };
	static const int c[] = { 0 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_in in = sa4("192.0.2.1", 0);

	(void)state;
	learn_block(m, "a.example", BS_LEARNED_MAX, 0);
	in.sin_addr.s_addr = htonl(0x0c000000u);
	assert_int_equal(match_learn(m, "a.example", (struct sockaddr *)&in), -ENOSPC);
	for (uint32_t i = 0; i < BS_LEARNED_MAX; i++) {
		in.sin_addr.s_addr = htonl(0x0b000000u + i);
		assert_int_equal(match_find(m, (struct sockaddr *)&in, sizeof(in)), 0);
	}
	match_free(m);
}

/* ---- carrying what was learned into new rules (a reload) ---- */

/* The rules of a config loaded with its names resolved: "a.example:80"
 * (compartment 0) resolved to 192.0.2.1, and "b.example" (1) to 2001:db8::1,
 * as cfg_resolve_hosts appends them. */
static struct matcher *build_resolved(void)
{
	struct rule r[4];
	struct matcher *m;

	r[0] = rule_ok("a.example:80", 0);
	r[1] = rule_ok("b.example", 1);
	r[2] = rule_ok("192.0.2.1:80", 0);
	snprintf(r[2].host, sizeof(r[2].host), "a.example");
	r[3] = rule_ok("[2001:db8::1]", 1);
	snprintf(r[3].host, sizeof(r[3].host), "b.example");
	m = match_build(r, 4, err, sizeof(err));
	assert_non_null(m);
	return m;
}

static void a_reload_keeps_the_addresses_resolved_and_learned_for_its_names(void **state)
{
	/* The new rules: a.example moved to compartment 2 with other ports,
	 * b.example is the same, c.example is gone and d.example new. */
	static const char *const t[] = { "a.example:80-90", "b.example", "d.example" };
	static const int c[] = { 2, 1, 3 };
	static const char *const t0[] = { "c.example" };
	static const int c0[] = { 4 };
	struct matcher *old = build_resolved(), *gone = BUILD(t0, c0), *m = BUILD(t, c);
	struct sockaddr_in in = sa4("192.0.2.7", 0), in_c = sa4("192.0.2.9", 0);

	(void)state;
	assert_int_equal(match_learn(old, "A.example", (struct sockaddr *)&in), 0);
	assert_int_equal(match_learn(gone, "c.example", (struct sockaddr *)&in_c), 4);
	/* Nothing is known in the new rules before the carry. */
	assert_int_equal(find4(m, "192.0.2.1", 85), -1);
	assert_int_equal(find4(m, "192.0.2.7", 85), -1);
	assert_int_equal(find6(m, "2001:db8::1", 5432), -1);
	/* Resolved at load (two) and learned since (one). */
	assert_int_equal(match_carry(m, old), 3);
	assert_int_equal(find4(m, "192.0.2.1", 85), 2);
	assert_int_equal(find4(m, "192.0.2.7", 90), 2);
	assert_int_equal(find4(m, "192.0.2.7", 91), -1);
	assert_int_equal(find6(m, "2001:db8::1", 5432), 1);
	/* A name the new rules do not have carries nothing. */
	assert_int_equal(match_carry(m, gone), 0);
	assert_int_equal(find4(m, "192.0.2.9", 80), -1);
	/* Carrying again adds nothing, and a new rules' carry is carried on. */
	assert_int_equal(match_carry(m, old), 3);
	assert_int_equal(atomic_load(&m->learned->count), 3);
	match_free(old);
	old = m;
	m = BUILD(t, c);
	assert_int_equal(match_carry(m, old), 3);
	assert_int_equal(find4(m, "192.0.2.1", 80), 2);
	assert_int_equal(find6(m, "2001:db8::1", 1), 1);
	assert_int_equal(match_carry(m, NULL), 0);
	assert_int_equal(match_carry(m, m), 0);
	match_free(old);
	match_free(gone);
	match_free(m);
}

static void one_address_of_two_names_is_carried_for_each(void **state)
{
	/* 192.0.2.1 is both names' (one compartment); the new rules keep only
	 * the second name. */
	static const char *const t[] = { "a.example:80", "b.example:80" };
	static const int c[] = { 0, 0 };
	static const char *const t2[] = { "b.example:80" };
	static const int c2[] = { 0 };
	struct matcher *old = BUILD(t, c), *m = BUILD(t2, c2);
	struct sockaddr_in in = sa4("192.0.2.1", 0);

	(void)state;
	assert_int_equal(match_learn(old, "a.example", (struct sockaddr *)&in), 0);
	assert_int_equal(match_learn(old, "b.example", (struct sockaddr *)&in), 0);
	assert_int_equal(match_carry(m, old), 1);
	assert_int_equal(find4(m, "192.0.2.1", 80), 0);
	match_free(old);
	match_free(m);
}

static void a_carry_into_a_full_table_says_enospc(void **state)
{
	static const char *const t[] = { "a.example" };
	static const int c[] = { 0 };
	struct matcher *old = BUILD(t, c), *m = BUILD(t, c);
	struct sockaddr_in in = sa4("192.0.2.1", 0);

	(void)state;
	learn_block(old, "a.example", BS_LEARNED_MAX, 0);
	in.sin_addr.s_addr = htonl(0x0c000000u);
	assert_int_equal(match_learn(m, "a.example", (struct sockaddr *)&in), 0);
	assert_int_equal(match_carry(m, old), -ENOSPC);
	match_free(old);
	match_free(m);
}

static void an_address_learned_part_way_into_a_full_table_is_matched(void **state)
{
	/* One entry left: the name's first range gets it, the second not. */
	static const char *const t[] = { "a.example:80", "a.example:443", "fill.example" };
	static const int c[] = { 0, 1, 2 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_in in = sa4("192.0.2.1", 0);

	(void)state;
	learn_block(m, "fill.example", BS_LEARNED_MAX - 1, 2);
	/* Asked before: the memo of answers holds "none" for it. */
	assert_int_equal(find4(m, "192.0.2.1", 80), -1);
	assert_int_equal(match_learn(m, "a.example", (struct sockaddr *)&in), -ENOSPC);
	assert_int_equal(find4(m, "192.0.2.1", 80), 0);
	assert_int_equal(find4(m, "192.0.2.1", 443), -1);
	match_free(m);
}

struct learner {
	struct matcher *m;
	uint32_t base;
};

static void *learn_many(void *arg)
{
	struct learner *l = arg;
	struct sockaddr_in in = { .sin_family = AF_INET };

	for (uint32_t i = 0; i < 200; i++) {
		in.sin_addr.s_addr = htonl(l->base + i);
		if (match_learn(l->m, "a.example", (struct sockaddr *)&in) != 0)
			return (void *)1;
		if (match_find(l->m, (struct sockaddr *)&in, sizeof(in)) != 0)
			return (void *)1;
	}
	return NULL;
}

static void concurrent_learners_all_get_published(void **state)
{
	static const char *const t[] = { "a.example" };
	static const int c[] = { 0 };
	struct matcher *m = BUILD(t, c);
	struct learner l[4];
	pthread_t th[4];
	void *ret;

	(void)state;
	for (int i = 0; i < 4; i++) {
		l[i] = (struct learner){ .m = m, .base = 0x0a000000u + (uint32_t)i * 0x10000u };
		assert_int_equal(pthread_create(&th[i], NULL, learn_many, &l[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(th[i], &ret), 0);
		assert_null(ret);
	}
	assert_int_equal(atomic_load(&m->learned->count), 800);
	match_free(m);
}

/* Rules without a host name never learn, so they share one empty table
 * instead of 48 KB each; learning and carrying into them add nothing. */
static void rules_without_a_host_name_share_an_empty_learned_table(void **state)
{
	static const char *const t[] = { "10.0.0.1:80", "unix:/run/x.sock" };
	static const int c[] = { 0, 1 };
	static const char *const th[] = { "a.example:80" };
	static const int ch[] = { 0 };
	struct matcher *m = BUILD(t, c), *m2 = BUILD(t, c), *h = BUILD(th, ch);
	struct sockaddr_in in = sa4("192.0.2.1", 80);

	(void)state;
	assert_ptr_equal(m->learned, &no_learned);
	assert_ptr_equal(m2->learned, &no_learned);
	assert_ptr_not_equal(h->learned, &no_learned);
	assert_int_equal(match_learn(h, "a.example", (struct sockaddr *)&in), 0);
	assert_int_equal(match_learn(m, "a.example", (struct sockaddr *)&in), -1);
	assert_int_equal(match_carry(m, h), 0);
	assert_int_equal(atomic_load(&no_learned.count), 0);
	assert_int_equal(find4(m, "192.0.2.1", 80), -1);
	assert_int_equal(find4(m, "10.0.0.1", 80), 0);
	match_free(m);
	match_free(m2);
	match_free(h);
}

/* A learner and a reloader at once: the reloader keeps putting one of two
 * matchers of the same rules in place (match_publish), the learner learns
 * new addresses (match_learn_in). Once a learn has returned, its address
 * must be matched by whatever rules are in place, now and after: a reload
 * that published while the learn was under way must not lose it. */
struct publish_race {
	_Atomic(struct matcher *) cur, next;
	struct matcher *pair[2];
	atomic_bool done;
	uint32_t learned, lost, reloads;
};

static void *reload_many(void *arg)
{
	struct publish_race *r = arg;

	for (uint32_t i = 0; i < 200000 && !atomic_load(&r->done); i++) {
		if (match_publish(&r->cur, &r->next, r->pair[(i + 1) % 2]) < 0)
			return (void *)1;
		r->reloads++;
	}
	return NULL;
}

static void a_learn_during_a_reload_is_in_the_new_rules(void **state)
{
	static const char *const t[] = { "a.example:80" };
	static const int c[] = { 0 };
	struct publish_race r = { .pair = { BUILD(t, c), BUILD(t, c) } };
	struct sockaddr_in in = sa4("10.0.0.0", 80);
	pthread_t th;
	void *ret;

	(void)state;
	atomic_store(&r.cur, r.pair[0]);
	assert_int_equal(pthread_create(&th, NULL, reload_many, &r), 0);
	/* Up to 1000 addresses (the learned table holds 1024), until one is
	 * lost; each learn is given a little time to meet a reload. */
	for (uint32_t i = 0; i < 1000 && r.lost == 0; i++) {
		in.sin_addr.s_addr = htonl(0x0a000000u + i);
		if (match_learn_in(&r.cur, &r.next, "a.example", (struct sockaddr *)&in) != 0)
			break;
		r.learned++;
		for (int k = 0; k < 3; k++) {
			if (match_find(atomic_load(&r.cur), (struct sockaddr *)&in, sizeof(in)) != 0)
				r.lost++;
			sched_yield();
		}
	}
	atomic_store(&r.done, true);
	assert_int_equal(pthread_join(th, &ret), 0);
	assert_null(ret);
	print_message("%u learned during %u reloads, %u lost\n", r.learned, r.reloads, r.lost);
	assert_int_equal(r.lost, 0);
	assert_int_equal(r.learned, 1000);
	match_free(r.pair[0]);
	match_free(r.pair[1]);
}

/* ---- the memo of IPv4 answers ---- */

/* Each IPv4 answer, asked twice (the second time from the memo, or after a
 * colliding destination took its entry), is the one of the lookup without
 * the memo. */
static void memo_answers_as_the_full_lookup(void **state)
{
	static const char *const t[] = { "10.0.0.0/8", "10.1.0.0/16:443", "10.1.2.3:80",
		"10.1.2.3:8000-8100", "192.0.2.0/24:1-1024", "::ffff:10.2.0.0/112" };
	static const int c[] = { 0, 1, 2, 3, 4, 5 };
	struct matcher *m = BUILD(t, c);
	uint32_t x = 12345, seen[7] = { 0 };

	(void)state;
	for (int round = 0; round < 2; round++) {
		x = 12345;
		for (int i = 0; i < 20000; i++) {
			static const uint32_t nets[] = { 0x0a010203u, 0x0a010000u, 0x0a020000u,
				0xc0000200u, 0x0b000000u };
			static const uint16_t ports[] = { 80, 443, 8050, 1024, 1025, 22 };
			struct sockaddr_in in = { .sin_family = AF_INET };
			int want, got;

			x = x * 1103515245u + 12345u;
			in.sin_addr.s_addr = htonl(nets[(x >> 8) % 5] | ((x >> 12) & 3));
			in.sin_port = htons(ports[(x >> 16) % 6]);
			want = inet_find(m, (const struct sockaddr *)&in, sizeof(in));
			got = match_find(m, (const struct sockaddr *)&in, sizeof(in));
			if (got != want)
				fail_msg("round %d: %08x:%u gave %d, not %d", round,
				    ntohl(in.sin_addr.s_addr), ntohs(in.sin_port), got, want);
			seen[want + 1]++;
		}
	}
	/* Every compartment, and no compartment, was an answer. */
	for (int i = 0; i < 7; i++)
		assert_true(seen[i] > 0);
	match_free(m);
}

/* Unix path names, asked again and again with each form of length, answer
 * as the table does: from the memo (16 entries for 48 paths, so they
 * collide), for paths that are prefixes of each other, and for paths no
 * rule names. */
static void memo_answers_unix_paths_as_the_table(void **state)
{
	static const char *const t[] = { "unix:/run/postgresql/.s.PGSQL.5432", "unix:/run/a",
		"unix:/run/ab", "unix:/run/a/b", "unix:@abstract", "unix:/tmp/x.sock" };
	static const int c[] = { 0, 1, 2, 3, 4, 5 };
	struct matcher *m = BUILD(t, c);
	char paths[48][64];
	int hits = 0;

	(void)state;
	for (int i = 0; i < 48; i++) {
		static const char *const base[] = { "/run/postgresql/.s.PGSQL.5432", "/run/a",
			"/run/ab", "/run/a/b", "/tmp/x.sock", "/run/postgresql/.s.PGSQL.543" };

		if (i < 6)
			snprintf(paths[i], sizeof(paths[i]), "%s", base[i]);
		else
			snprintf(paths[i], sizeof(paths[i]), "%s%d", base[i % 6], i);
	}
	for (uint32_t x = 7, k = 0; k < 30000; k++) {
		struct sockaddr_un un;
		const char *p;
		socklen_t len;
		int want, got;

		x = x * 1103515245u + 12345u;
		p = paths[(x >> 8) % 48];
		un = sun_of(p, &len);
		/* With the NUL, without it, or the whole structure. */
		if ((x >> 16) % 3 == 1)
			len--;
		else if ((x >> 16) % 3 == 2)
			len = sizeof(un);
		want = unix_find_table(m, (const struct sockaddr *)&un, len, NULL);
		got = match_find(m, (const struct sockaddr *)&un, len);
		if (got != want)
			fail_msg("%s (len %u) gave %d, not %d", p, (unsigned)len, got, want);
		hits += want >= 0;
	}
	assert_true(hits > 0);
	match_free(m);
}

struct asker {
	struct matcher *m;
	_Atomic uint32_t learned;	/* addresses learned so far */
	_Atomic bool stop;
	_Atomic uint32_t wrong;
};

/* Asks for the addresses around the one learned last, again and again:
 * once an address was learned, it must answer with the host rule. */
static void *ask_while_learning(void *arg)
{
	struct asker *a = arg;
	struct sockaddr_in in = { .sin_family = AF_INET, .sin_port = htons(443) };

	for (uint32_t n = 0; !atomic_load(&a->stop) && n < 20000000; n++) {
		uint32_t done = atomic_load(&a->learned);
		/* The one learned last, or the one being learned. */
		uint32_t i = (n & 1) || done == 0 ? done : done - 1;
		int got;

		in.sin_addr.s_addr = htonl(0x0a000000u + i);
		got = match_find(a->m, (const struct sockaddr *)&in, sizeof(in));
		if (i < done ? got != 1 : got != 0 && got != 1)
			atomic_fetch_add(&a->wrong, 1);
	}
	return NULL;
}

/* Threads that memoize an address's answer while another thread learns it
 * do not keep the old answer once match_learn has returned. */
static void memo_forgets_what_learning_changes(void **state)
{
	static const char *const t[] = { "db.internal:443", "10.0.0.0/8" };
	static const int c[] = { 1, 0 };
	struct matcher *m = BUILD(t, c);
	struct asker a = { .m = m };
	pthread_t th[2];

	(void)state;
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&th[i], NULL, ask_while_learning, &a), 0);
	for (uint32_t i = 0; i < BS_LEARNED_MAX; i++) {
		struct sockaddr_in in = { .sin_family = AF_INET };

		in.sin_addr.s_addr = htonl(0x0a000000u + i);
		assert_int_equal(match_learn(m, "db.internal", (struct sockaddr *)&in), 1);
		atomic_store(&a.learned, i + 1);
		/* After learning: the learned answer, memoized or not. */
		assert_int_equal(find4(m, inet_ntoa(in.sin_addr), 443), 1);
		assert_int_equal(find4(m, inet_ntoa(in.sin_addr), 80), 0);
	}
	atomic_store(&a.stop, true);
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_join(th[i], NULL), 0);
	assert_int_equal(atomic_load(&a.wrong), 0);
	match_free(m);
}

/* ---- bad input ---- */

static void find_tolerates_null_and_short_lengths(void **state)
{
	static const char *const t[] = { "0.0.0.0/0", "::/0", "unix:/a" };
	static const int c[] = { 0, 1, 2 };
	struct matcher *m = BUILD(t, c);
	struct sockaddr_in in = sa4("10.0.0.1", 80);
	struct sockaddr_in6 in6 = sa6("::1", 80);
	struct sockaddr_un un;
	socklen_t len;

	(void)state;
	un = sun_of("/a", &len);
	assert_int_equal(match_find(NULL, (struct sockaddr *)&in, sizeof(in)), -1);
	assert_int_equal(match_find(m, NULL, sizeof(in)), -1);
	assert_int_equal(match_find(m, (struct sockaddr *)&in, 0), -1);
	assert_int_equal(match_find(m, (struct sockaddr *)&in, 1), -1);
	assert_int_equal(match_find(m, (struct sockaddr *)&in, sizeof(in) - 1), -1);
	assert_int_equal(match_find(m, (struct sockaddr *)&in6, 23), -1);
	assert_int_equal(match_find(m, (struct sockaddr *)&in6, 24), 1);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, sizeof(sa_family_t)), -1);
	assert_int_equal(match_find(m, (struct sockaddr *)&un, len), 2);
	assert_false(match_has_host(NULL, "x"));
	assert_false(match_has_host(m, NULL));
	match_free(m);
	match_free(NULL);
}

/* ---- formatting ---- */

/* An IPv4 or IPv6 address (by its text), port and scope, and its text. */
struct format_case {
	const char *ip;
	uint16_t port;
	uint32_t scope;
	const char *want;
};

static const struct format_case formats[] = {
	{ "1.2.3.4", 80, 0, "1.2.3.4:80" },
	{ "::1", 80, 0, "[::1]:80" },
	{ "::ffff:10.0.0.5", 443, 0, "10.0.0.5:443" },
	{ "fe80::1", 22, 2, "[fe80::1%2]:22" },
};

static void each_ip_address_is_formatted_as_written(void **state)
{
	(void)state;
	for (size_t i = 0; i < NELEM(formats); i++) {
		const struct format_case *k = &formats[i];
		char buf[64];

		if (strchr(k->ip, ':') == NULL) {
			struct sockaddr_in in = sa4(k->ip, k->port);

			match_format((struct sockaddr *)&in, sizeof(in), buf, sizeof(buf));
		} else {
			struct sockaddr_in6 in6 = sa6(k->ip, k->port);

			in6.sin6_scope_id = k->scope;
			match_format((struct sockaddr *)&in6, sizeof(in6), buf, sizeof(buf));
		}
		if (strcmp(buf, k->want) != 0)
			fail_msg("row %zu, %s port %u: \"%s\", want \"%s\"", i, k->ip, k->port, buf,
			    k->want);
	}
}

static void format_unix_path_and_abstract(void **state)
{
	struct sockaddr_un un;
	socklen_t len;
	char buf[160];

	(void)state;
	un = sun_of("/run/recs.sock", &len);
	match_format((struct sockaddr *)&un, len, buf, sizeof(buf));
	assert_string_equal(buf, "unix:/run/recs.sock");
	memcpy(un.sun_path, "\0recs\0x\n", 8);
	match_format((struct sockaddr *)&un, offsetof(struct sockaddr_un, sun_path) + 8, buf,
		     sizeof(buf));
	assert_string_equal(buf, "unix:@recs@x?");
}

static void format_junk_is_a_question_mark(void **state)
{
	struct sockaddr_in in = sa4("1.2.3.4", 80);
	struct sockaddr sa = { .sa_family = AF_PACKET };
	char buf[16];

	(void)state;
	match_format(NULL, 16, buf, sizeof(buf));
	assert_string_equal(buf, "?");
	match_format((struct sockaddr *)&in, 4, buf, sizeof(buf));
	assert_string_equal(buf, "?");
	match_format(&sa, sizeof(sa), buf, sizeof(buf));
	assert_string_equal(buf, "?");
}

static void format_never_overflows(void **state)
{
	struct sockaddr_in6 in6 = sa6("2001:db8:1234:5678:9abc:def0:1234:5678", 65535);
	char buf[12];

	(void)state;
	memset(buf, 'Z', sizeof(buf));
	match_format((struct sockaddr *)&in6, sizeof(in6), buf, 8);
	assert_string_equal(buf, "[2001:d");
	assert_int_equal(buf[8], 'Z');
	match_format((struct sockaddr *)&in6, sizeof(in6), buf, 1);
	assert_string_equal(buf, "");
	match_format((struct sockaddr *)&in6, sizeof(in6), buf, 0);
	assert_string_equal(buf, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(each_destination_parses_into_its_rule),
		cmocka_unit_test(each_bad_destination_is_refused_with_its_reason),
		cmocka_unit_test(parse_leaves_comp_and_line_alone),
		cmocka_unit_test(parse_refuses_long_unix_path_instead_of_cutting_it),
		cmocka_unit_test(parse_rejects_long_host_names),
		cmocka_unit_test(each_lookup_finds_its_compartment),
		cmocka_unit_test(find_many_exact_ipv4_from_both_families),
		cmocka_unit_test(find_unix_path),
		cmocka_unit_test(find_unix_path_without_nul_honours_len),
		cmocka_unit_test(find_unix_abstract_name_up_to_len),
		cmocka_unit_test(find_misses_other_families),
		cmocka_unit_test(the_most_specific_rule_wins),
		cmocka_unit_test(a_destination_in_two_compartments_is_an_error),
		cmocka_unit_test(rules_that_share_only_an_address_build),
		cmocka_unit_test(build_refuses_malformed_rules),
		cmocka_unit_test(empty_matcher_matches_nothing),
		cmocka_unit_test(ten_thousand_rules_build_and_match),
		cmocka_unit_test(learned_address_matches_with_the_host_rule_ports),
		cmocka_unit_test(learning_ignores_case_and_one_trailing_dot),
		cmocka_unit_test(learning_an_unknown_host_returns_minus_one),
		cmocka_unit_test(learning_an_address_twice_adds_it_once),
		cmocka_unit_test(learning_fails_with_enospc_when_full),
		cmocka_unit_test(a_reload_keeps_the_addresses_resolved_and_learned_for_its_names),
		cmocka_unit_test(one_address_of_two_names_is_carried_for_each),
		cmocka_unit_test(a_carry_into_a_full_table_says_enospc),
		cmocka_unit_test(an_address_learned_part_way_into_a_full_table_is_matched),
		cmocka_unit_test(concurrent_learners_all_get_published),
		cmocka_unit_test(a_learn_during_a_reload_is_in_the_new_rules),
		cmocka_unit_test(rules_without_a_host_name_share_an_empty_learned_table),
		cmocka_unit_test(find_tolerates_null_and_short_lengths),
		cmocka_unit_test(memo_answers_as_the_full_lookup),
		cmocka_unit_test(memo_forgets_what_learning_changes),
		cmocka_unit_test(memo_answers_unix_paths_as_the_table),
		cmocka_unit_test(each_ip_address_is_formatted_as_written),
		cmocka_unit_test(format_unix_path_and_abstract),
		cmocka_unit_test(format_junk_is_a_question_mark),
		cmocka_unit_test(format_never_overflows),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
