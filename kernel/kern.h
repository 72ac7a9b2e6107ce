/* kern.h - what the kernel engine's BPF program and its user-space side share: map layouts. */
#ifndef BULKSHIM_KERN_H
#define BULKSHIM_KERN_H

/* Included by the BPF program (with <linux/types.h> from its own headers)
 * and by the CLI; fixed-width kernel types only, no padding surprises. */
#include <linux/types.h>

#define KERN_MAX_COMPS	1024	/* = BS_MAX_COMPARTMENTS */
#define KERN_MAX_SITES	100000	/* = BS_MAX_RULES */
#define KERN_SITE_RANGES 16	/* port ranges of one address and prefix */
#define KERN_DEPTH	32	/* nested prefixes that contain one address */
#define KERN_NAME_MAX	64	/* = BS_NAME_MAX */
#define KERN_NO_LIMIT	0xffffffffu

/* The key of the destination trie: the IPv4-mapped (for IPv4) or IPv6
 * address, and how many of its leading bits a rule names. */
struct kern_key {
	__u32 prefixlen;
	__u8 addr[16];
};

struct kern_range {
	__u16 lo, hi;
	__u32 comp;
};

/* One address and prefix of the rules: its port ranges, narrowest first
 * and in config order on a tie, as match.c ranks them; prefix repeats the
 * key's so that a miss on every port can go on to the next shorter prefix. */
struct kern_site {
	__u32 prefix;
	__u32 n;
	struct kern_range r[KERN_SITE_RANGES];
};

/*
 * One compartment. The CLI writes name, limit, enforce and reject_errno;
 * the program counts.
 *
 * joint and joint_tag are the compartment's one count of connections,
 * shared with the preloaded library (shim/admit/kjoint.c): the sockets the
 * program admitted plus the library's permits of kind P_KERN (one for each
 * connection the library admitted, or let past a full limit in observe
 * mode: past the limit). They are a
 * tally of the library's (shim/admit/tally.c): joint_tag names the last
 * library operation on it. The program moves only the count, by
 * compare-and-swap below the limit and by a release that never takes it
 * below 0, and never the tag, so the tag still names the library's last
 * operation and the library's protocol holds. in_use is the program's own
 * part, exact: raised before its take of joint and lowered after its give,
 * so it is never below what the program holds in joint. A reset of the
 * library's leftovers puts joint back to in_use (kjoint.c), reading both
 * while `begun` equals `done`.
 */
struct kern_comp {
	char name[KERN_NAME_MAX];
	__u32 limit;		/* KERN_NO_LIMIT = none */
	__u32 in_use;		/* sockets the program admitted and holds */
	__u32 peak;		/* the most joint + over ever held */
	__u32 over;		/* observe mode: sockets let past a full limit */
	__u32 enforce;		/* 0 = observe: count, refuse nothing */
	__s32 reject_errno;	/* positive, e.g. ECONNREFUSED */
	__u64 admitted;
	__u64 rejected;
	__u64 would_reject;
	__u64 released;
	__u64 last_rejection_ns;	/* CLOCK_BOOTTIME, 0 = never */
	__u64 unmarked;		/* admissions skipped: no socket storage */
	__u32 joint;		/* the program's and the library's permits (above) */
	__u32 joint_tag;	/* the library's tally tag; the program never writes it */
	/* The program's takes and gives begun and done: a reset reads joint
	 * and in_use together only while none is under way (kjoint.c). */
	__u32 begun;
	__u32 done;
};

/* What a socket carries in its socket storage: admitted by the program
 * (KSOCK_PERMIT, KSOCK_OVER), or by the library (KSOCK_LIB, written from
 * user space by a preloaded process in the cgroup: the program lets it
 * through uncounted and gives nothing back for it). */
enum { KSOCK_NONE = 0, KSOCK_PERMIT = 1, KSOCK_OVER = 2, KSOCK_LIB = 3 };
struct kern_sock {
	__u32 comp;
	__u32 kind;
};

#endif
