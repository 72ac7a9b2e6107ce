/* match_int.h - private to match.c and match_parse.c. */
#ifndef BULKSHIM_MATCH_INT_H
#define BULKSHIM_MATCH_INT_H

#include <string.h>

#include "config/match.h"

#define PORT_ANY_LO	0
#define PORT_ANY_HI	65535
#define HOST_LEN_MAX	253	/* without a trailing dot */
void match_set_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
char match_lower(char c);
/* The keys every lookup takes (match_parse.c), inlined into match_find under
 * LTO as they were when they shared its file. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE void match_map_ipv4(uint8_t addr[16], const void *in4);
BS_LTO_INLINE int match_inet_key(const struct sockaddr *sa, socklen_t len, uint8_t addr[16],
    uint16_t *port);
BS_LTO_INLINE size_t match_unix_key(const struct sockaddr *sa, socklen_t len,
    char key[BS_UNIX_PATH_MAX + 1]);
#pragma GCC diagnostic pop
void match_rule_text(const struct rule *r, char *buf, size_t len);


/* ---- the matcher's tables, shared by match_table.c and match_learn.c ---- */

/* uthash's keys here are 16-byte addresses and short names, hashed on every
 * connect once per prefix length in use: a word-at-a-time multiplicative
 * hash with a final mix (uthash takes the low bits) costs a fraction of
 * uthash's default Jenkins hash. */
static inline uint32_t match_key_hash(const void *key, size_t n)
{
	const unsigned char *p = key;
	uint64_t h = 0x243f6a8885a308d3ULL ^ n, w;

	if (n == 16) {
		/* An address: two multiplies, the high half, folded. */
		uint64_t a, b;
		uint32_t x;

		memcpy(&a, p, 8);
		memcpy(&b, p + 8, 8);
		x = (uint32_t)(((a * 0x9e3779b97f4a7c15ULL) ^ b) * 0xbf58476d1ce4e5b9ULL >> 32);
		return x ^ x >> 15;
	}
	for (; n >= 8; p += 8, n -= 8) {
		memcpy(&w, p, 8);
		h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
		h ^= h >> 32;
	}
	if (n > 0) {
		w = 0;
		memcpy(&w, p, n);
		h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
	}
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ULL;
	h ^= h >> 32;
	return (uint32_t)h;
}
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = match_key_hash((keyptr), (keylen)))

/* The tables are built at init; running out of memory there must become an
 * error message, not uthash's default exit(). A failed add leaves hh.tbl NULL. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

#define LEARN_SLOTS	(2 * BS_LEARNED_MAX)	/* power of two, half full at most */
/* An entry of a memo (below): MEMO_SET, the compartment + 1 (0: none) in
 * bits 48..58, the port and the address in network order below. */
#define V4MEMO_BITS	8
#define V4MEMO		(1u << V4MEMO_BITS)
#define MEMO_SET	(1ULL << 63)
#define MEMO_KEY	((1ULL << 48) - 1)
_Static_assert(BS_MAX_COMPARTMENTS < (1 << 11), "a compartment fits a memo entry");
#define UMEMO_BITS	4
#define UMEMO		(1u << UMEMO_BITS)

/* Entries direct-mapped by address and port. A learned address can change
 * answers, so match_learn puts a new, empty memo in place of the old one,
 * which stays allocated until match_free: a lookup that began before the
 * learn may still write into it, and nobody reads it. */
struct memo {
	struct memo *older;	/* in matcher.retired */
	_Atomic uint64_t e[V4MEMO];
};

/* The memo of a matcher that could not allocate a new one: all misses,
 * never written (match_learn.c). */
extern struct memo match_memo_off;

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
	const char *host;	/* the name it was learned for: a host site's */
};

/* An address a host name resolved to when the config was loaded: a RULE_IP
 * /128 rule that carries the name (cfg_resolve_hosts). The rule matches it;
 * this keeps the name, for match_carry. */
struct resolved {
	const char *host;	/* the name of a host site of this matcher */
	uint8_t addr[16];
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


/* An exact IPv4 site (/128 of an IPv4-mapped address) in the open-addressing
 * table of exact IPv4 sites: the address in network order, its slice of
 * matcher.ranges; count 0 marks an empty entry. */
struct v4site {
	uint32_t addr;
	uint32_t first, count;
};

/* Per prefix length: a bit per (hashed) network in use, so that a connect
 * that matches nothing skips most tables after a hash and one load. */
#define FILTER_BITS	4096u
#define FILTER_BIT(h)	(((h) >> 20) & (FILTER_BITS - 1))

struct matcher {
	struct ip_site *ip[129];	/* one table per prefix length */
	uint64_t mask[129][2];		/* prefix length -> address mask, memory order */
	uint64_t filter[129][FILTER_BITS / 64];
	uint8_t prefixes[129];		/* lengths in use below 128, longest first */
	int nprefixes;
	/* With many prefix lengths in use: per IPv4 /16 (the first two bytes
	 * of an IPv4 address), bit q says that some IPv4 rule of prefix
	 * length q (0..31, as ::ffff:0:0/(96 + q)) covers part of that /16.
	 * An IPv4 connect then tries only those lengths, and the lengths
	 * below 96 (IPv6 rules wide enough to hold IPv4-mapped addresses). */
	uint32_t *v4lens;
	int nwide;		/* prefixes[nwide..] are the lengths below 96 */
	/* Every exact IPv4 site, also in ip[128], by address: at most half
	 * full, 2^v4bits entries (NULL: none). The common connect, to one
	 * IPv4 address and port, is a multiply and a load or two here. */
	struct v4site *v4tab;
	unsigned v4bits;
	/* With many exact IPv4 sites: per IPv4 /16, whether one lies in it,
	 * so that an address of another /16 skips v4tab's probe. */
	uint64_t *v4exact;
	struct name_site *unix_sites;
	struct name_site *host_sites;
	struct mrange *ranges;
	struct ip_site *ip_store;
	struct name_site *name_store;
	char *names;
	struct learned *learned;
	struct resolved *resolved;
	uint32_t nresolved;
	/* The answers of recent IPv4 lookups (v4_find_memo). A service
	 * connects to the same few destinations again and again; each is a
	 * load and a compare here after its first connect. */
	struct memo *_Atomic memo;
	struct memo *_Atomic retired;	/* memos replaced, freed with the matcher */
	/* The unix path sites found last, UMEMO of them by path (unix_find):
	 * no learning changes them, so they stay right for the matcher's life. */
	const struct name_site *_Atomic *umemo;
};

/* The hash of a 16-byte address in a learned table. */
static inline uint32_t match_addr_hash(const uint8_t addr[16])
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

/* The host site naming host (case-insensitive, one trailing dot ignored),
 * or NULL (match_learn.c). */
const struct name_site *match_find_host(const struct matcher *m, const char *host);
/* Notes, for match_carry, the RULE_IP rules of rules[0..n) that carry the
 * host name they were resolved from, under the name of that host's own
 * site (match_learn.c, at match_build). */
void match_keep_resolved(struct matcher *m, const struct rule *rules, size_t n);

#endif
