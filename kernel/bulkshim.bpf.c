/* bulkshim.bpf.c - the kernel engine: connection permits per destination compartment, in BPF. */
#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "kern.h"

/*
 * cgroup/connect4 and cgroup/connect6 run for every connect(2) of a stream
 * socket created in the cgroup (or below it), whatever made the call: libc,
 * Go's runtime, a raw syscall, io_uring. They find the destination's
 * compartment in the trie, take one permit with a compare-and-swap on the
 * compartment's count, and mark the socket in its socket storage.
 * cgroup/sock_release runs once when the kernel frees the socket, after the
 * last descriptor in the last process is gone (dup, fork, SCM_RIGHTS, kill):
 * it gives the permit back only for a socket the program marked.
 *
 * The count a permit is taken from is the compartment's joint count, which
 * the preloaded library takes from too (kern.h): one limit for both. A
 * socket that a preloaded process in the cgroup already admitted carries
 * KSOCK_LIB, written by the library before its connect: it is the
 * library's, and passes here uncounted.
 */

#define SOCK_STREAM	1
#define ECONNREFUSED	111
#define CAS_TRIES	64

char LICENSE[] SEC("license") = "GPL";

/* bpf_set_retval exists from Linux 5.18; the loader clears this on older
 * kernels, and the verifier drops the call as dead code (refusals are then
 * EPERM). */
const volatile __u32 have_set_retval = 1;

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, KERN_MAX_SITES);
	__type(key, struct kern_key);
	__type(value, struct kern_site);
} sites SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, KERN_MAX_COMPS);
	__type(key, __u32);
	__type(value, struct kern_comp);
} comps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct kern_sock);
} socks SEC(".maps");

/* The compartment of the most specific rule for the address in k and port:
 * the longest prefix that has a range holding port, as match_find decides. */
static __always_inline int
find_comp(struct kern_key *k, __u16 port)
{
	for (int d = 0; d < KERN_DEPTH; d++) {
		struct kern_site *s = bpf_map_lookup_elem(&sites, k);

		if (s == NULL)
			return -1;
		for (int i = 0; i < KERN_SITE_RANGES; i++) {
			if (i >= s->n)
				break;
			if (port >= s->r[i].lo && port <= s->r[i].hi)
				return (int)s->r[i].comp;
		}
		if (s->prefix == 0)
			return -1;
		k->prefixlen = s->prefix - 1;
	}
	return -1;
}

/* Raises the peak to now: what both engines hold at once, the joint count
 * (which holds every connection the library admitted or let past, kern.h)
 * and this program's sockets let past a full limit. */
static __always_inline void
note_peak(struct kern_comp *c, __u32 now)
{
	for (int i = 0; i < 4; i++) {
		__u32 p = c->peak;

		if (now <= p || __sync_val_compare_and_swap(&c->peak, p, now) == p)
			return;
	}
}

/* One permit of c: true if taken. The program's own count goes up first,
 * so it is never below what the program holds of the joint count. The
 * joint count (shared with the library, which writes its tag: kern.h) only
 * moves by a compare-and-swap of its count below the limit, so it never
 * passes the limit; should the swap keep losing to other CPUs and
 * processes, an add that is undone when it went past the limit decides
 * instead, which is just as exact. Only the count word is written, never
 * the tag beside it. */
static __always_inline bool
take_permit(struct kern_comp *c)
{
	__u32 lim = c->limit, cur, old;
	bool ok = true;

	__sync_fetch_and_add(&c->begun, 1);
	__sync_fetch_and_add(&c->in_use, 1);
	for (int i = 0; i < CAS_TRIES; i++) {
		cur = c->joint;
		if (lim != KERN_NO_LIMIT && cur >= lim)
			goto full;
		if (__sync_val_compare_and_swap(&c->joint, cur, cur + 1) == cur) {
			note_peak(c, cur + 1 + c->over);
			goto done;
		}
	}
	old = __sync_fetch_and_add(&c->joint, 1);
	if (lim != KERN_NO_LIMIT && old >= lim) {
		__sync_fetch_and_add(&c->joint, -1);
		goto full;
	}
	note_peak(c, old + 1 + c->over);
	goto done;
full:
	__sync_fetch_and_add(&c->in_use, -1);
	ok = false;
done:
	__sync_fetch_and_add(&c->done, 1);
	return ok;
}

/* Gives back a permit the program took: the joint count first, then the
 * program's own. The joint count never goes below 0 (a damaged count may
 * be put right meanwhile). Both steps, like a take's, lie between a count
 * of `begun` and one of `done`. */
static __always_inline void
give_permit(struct kern_comp *c)
{
	__u32 cur, old;

	__sync_fetch_and_add(&c->begun, 1);
	for (int i = 0; i < CAS_TRIES; i++) {
		cur = c->joint;
		if (cur == 0)
			goto own;
		if (__sync_val_compare_and_swap(&c->joint, cur, cur - 1) == cur)
			goto own;
	}
	old = __sync_fetch_and_add(&c->joint, -1);
	if (old == 0)
		__sync_fetch_and_add(&c->joint, 1);
own:
	__sync_fetch_and_add(&c->in_use, -1);
	__sync_fetch_and_add(&c->done, 1);
}

/* Decides a connect of ctx's socket to the address in k: 1 lets it go on,
 * 0 refuses it (with the compartment's errno where the kernel can say it). */
static __always_inline int
admit(struct bpf_sock_addr *ctx, struct kern_key *k)
{
	struct kern_sock *st;
	struct kern_comp *c;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	__u32 idx;
	int comp;

	if (ctx->type != SOCK_STREAM)
		return 1;
	st = bpf_sk_storage_get(&socks, ctx->sk, 0, 0);
	if (st != NULL && st->kind != KSOCK_NONE)
		return 1;	/* a second connect, or one the library admitted */
	comp = find_comp(k, port);
	if (comp < 0)
		return 1;
	idx = (__u32)comp;
	c = bpf_map_lookup_elem(&comps, &idx);
	if (c == NULL)
		return 1;
	if (st == NULL)
		st = bpf_sk_storage_get(&socks, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (st == NULL) {
		/* Without a mark the permit could never go back: let the
		 * connect through uncounted, and count that instead. */
		__sync_fetch_and_add(&c->unmarked, 1);
		return 1;
	}
	st->comp = idx;
	if (take_permit(c)) {
		st->kind = KSOCK_PERMIT;
		__sync_fetch_and_add(&c->admitted, 1);
		return 1;
	}
	if (!c->enforce) {
		st->kind = KSOCK_OVER;
		note_peak(c, c->joint + __sync_add_and_fetch(&c->over, 1));
		__sync_fetch_and_add(&c->would_reject, 1);
		return 1;
	}
	__sync_fetch_and_add(&c->rejected, 1);
	c->last_rejection_ns = bpf_ktime_get_boot_ns();
	if (have_set_retval) {
		int e = c->reject_errno;

		bpf_set_retval(-(e > 0 && e < 4096 ? e : ECONNREFUSED));
	}
	return 0;
}

SEC("cgroup/connect4")
int bs_connect4(struct bpf_sock_addr *ctx)
{
	struct kern_key k = { .prefixlen = 128 };

	k.addr[10] = 0xff;
	k.addr[11] = 0xff;
	*(__u32 *)&k.addr[12] = ctx->user_ip4;
	return admit(ctx, &k);
}

SEC("cgroup/connect6")
int bs_connect6(struct bpf_sock_addr *ctx)
{
	struct kern_key k = { .prefixlen = 128 };
	__u32 *a = (__u32 *)k.addr;

	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	return admit(ctx, &k);
}

SEC("cgroup/sock_release")
int bs_release(struct bpf_sock *sk)
{
	struct kern_sock *st = bpf_sk_storage_get(&socks, sk, 0, 0);
	struct kern_comp *c;
	__u32 idx;

	if (st == NULL || st->kind == KSOCK_NONE || st->kind == KSOCK_LIB)
		return 1;
	idx = st->comp;
	c = bpf_map_lookup_elem(&comps, &idx);
	if (c != NULL) {
		if (st->kind == KSOCK_PERMIT)
			give_permit(c);
		else
			__sync_fetch_and_add(&c->over, -1);
		__sync_fetch_and_add(&c->released, 1);
	}
	st->kind = KSOCK_NONE;
	return 1;
}
