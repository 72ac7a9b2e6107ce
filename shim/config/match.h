/* match.h - destination rules and the matcher that finds a destination's compartment. */
#ifndef BULKSHIM_MATCH_H
#define BULKSHIM_MATCH_H

#include "bulkshim.h"

enum rule_kind { RULE_IP = 1, RULE_UNIX, RULE_HOST };

/* One destination of a compartment. IPv4 is kept as IPv4-mapped IPv6 so that
 * ::ffff:a.b.c.d and a.b.c.d match the same rules. */
struct rule {
	int kind;
	uint8_t addr[16];	/* RULE_IP: network address, masked */
	int prefix;		/* RULE_IP: 0..128 */
	uint16_t port_lo, port_hi;
	char path[BS_UNIX_PATH_MAX + 1];	/* RULE_UNIX; '@' first = abstract */
	char host[BS_HOST_MAX];	/* RULE_HOST, lower case; for a RULE_IP /128
				 * resolved from a name at load, that name */
	int comp;		/* compartment index */
	int line;		/* config line, for messages */
};

struct matcher;

/* Parses one destination string into *r (comp and line are left alone).
 * Returns 0, or -EINVAL with a reason in err. */
int match_parse(const char *text, struct rule *r, char *err, size_t errlen);
/* The one order of rules by destination: kind, then site (prefix and
 * address, unix path or host name), then port range (none for a unix
 * path). 0 for the same destination, which two compartments may not share
 * (cfg_check_duplicates) and one may repeat (match_build). */
int match_rule_cmp(const struct rule *x, const struct rule *y);
/* qsort's comparator of an array of const struct rule *: by destination
 * (match_rule_cmp), then by position, so duplicates end up next to each
 * other and the first of them is the one that came first. */
int match_rule_order(const void *a, const void *b);
/* Builds the lookup tables for n rules. RULE_HOST rules are kept for
 * match_learn; their resolved addresses are added by the caller as RULE_IP.
 * Returns NULL with a reason in err (out of memory, duplicate rule). */
struct matcher *match_build(const struct rule *rules, size_t n, char *err, size_t errlen);
/* The compartment of the most specific rule matching sa, or -1. Lock-free,
 * no allocation, async-signal-safe. */
int match_find(const struct matcher *m, const struct sockaddr *sa, socklen_t len);
/* Records that `host` resolved to sa: if a RULE_HOST rule names host, sa is
 * matched from now on with that rule's ports. Returns the compartment, -1 if
 * no rule names host, or -ENOSPC when the learned table is full. */
int match_learn(struct matcher *m, const char *host, const struct sockaddr *sa);
/* Learns into `to` every address `from` knows for a host name, the ones
 * resolved at load and the ones learned since, so that new rules built at a
 * reload keep what the process found: each address of a name that `to`
 * still has a rule for then matches with that rule's ports and compartment.
 * Safe while `from` is in use. Returns how many of `from`'s addresses (one
 * per port range of a name) name a host that `to` has, or -ENOSPC when
 * `to`'s learned table filled up. */
int match_carry(struct matcher *to, const struct matcher *from);
/* Puts m in place of the rules in *cur, after carrying into m what those
 * knew (match_carry); *next names m meanwhile, for match_learn_in. One
 * publisher at a time. The old rules stay allocated: another thread may
 * still be reading them. Returns match_carry's count, or -ENOSPC. */
int match_publish(_Atomic(struct matcher *) *cur, _Atomic(struct matcher *) *next,
    struct matcher *m);
/* match_learn into the rules in *cur, and into those that match_publish is
 * putting in their place, so that once it returns the address is matched by
 * whichever rules are in place. Returns what the last match_learn did. */
int match_learn_in(_Atomic(struct matcher *) *cur, _Atomic(struct matcher *) *next,
    const char *host, const struct sockaddr *sa);
/* True if some RULE_HOST rule names host (case-insensitive). */
bool match_has_host(const struct matcher *m, const char *host);
void match_free(struct matcher *m);
/* Clears the bits of a 16-byte address after its first `prefix` bits. */
void match_mask_addr(uint8_t *addr, int prefix);
/* Writes "1.2.3.4:80", "[::1]:80" or "unix:/path" for sa into buf. */
void match_format(const struct sockaddr *sa, socklen_t len, char *buf, size_t buflen);

#endif
