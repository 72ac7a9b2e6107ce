/* fuzz_segment.c - libFuzzer target: random bytes in every field of a segment under a client that keeps running. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "admit/admit.h"
#include "config/config.h"
#include "log.h"

/*
 * Any writer of a segment can put anything in it at any moment, and the
 * processes attached to it must neither crash nor hang (libFuzzer's
 * -timeout says a hang). One segment is set up at start-up from a config
 * with a pool, classes, requests in flight, an adaptive limit and a wait;
 * this process is its client. Each input is a script:
 *
 *   byte 0      what the client does at the end besides giving back what it
 *               holds and reading what status reads: bit 0 reclaims the
 *               dead, bit 1 reconciles with the kernel, bit 2 has another
 *               process attach and the CLI open the segment (the system
 *               calls of these are slow: the fuzzer chooses how often)
 *   byte 1..8   the client's operations before the damage (one a byte)
 *   then        patches, each 3 bytes of offset (modulo the segment's size),
 *               1 byte of length (1 to 64) and that many bytes written there
 *   after the last patch, or at a 0xff length byte, the operations after
 *   the damage (one a byte)
 *
 * Every run starts from the pristine segment and the client's own state as
 * they were after set-up. The second attach is another process starting,
 * with the repairs it makes under the lock.
 */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char config_text[] =
    "segment = \"%s\";\n"
    "max_processes = 8;\nmax_sockets = 64;\n"
    "classes = { batch = [ \"fuzz-batch\" ]; };\n"
    "pools = ( { name = \"db\"; size = 6; reserved = 1; } );\n"
    "compartments = (\n"
    "  { name = \"a\"; destinations = [ \"127.0.0.1:1\" ]; max_connections = 3;\n"
    "    max_inflight = 2; pool = \"db\"; guaranteed = 1;\n"
    "    class_limits = { batch = 2; }; class_guaranteed = { default = 1; batch = 0; }; },\n"
    "  { name = \"b\"; destinations = [ \"127.0.0.1:2\" ]; max_connections = 4;\n"
    "    pool = \"db\"; guaranteed = 2; max_wait_ms = 1; },\n"
    "  { name = \"c\"; destinations = [ \"127.0.0.1:3\" ]; max_connections = 8;\n"
    "    max_inflight = 8; adaptive = { min = 1; max = 8; }; }\n"
    ");\n";

#define HELD_MAX	32

static struct bs_config cfg;
static struct seg *seg;
static void *pristine;
static _Atomic uint32_t *lcount0;
static int rec0;
static uint32_t hint0;
static uint64_t sole0;

static void
fail(const char *what, const char *err)
{
	fprintf(stderr, "fuzz_segment: %s: %s\n", what, err);
	_exit(2);
}

static void
remove_segment(void)
{
	char name[BS_NAME_MAX + 16];

	seg_shm_name(cfg.segment, name, sizeof(name));
	shm_unlink(name);
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char path[64], text[sizeof(config_text) + 64], err[BS_ERRLEN], seg_name[32];
	int fd;

	(void)argc;
	(void)argv;
	log_set_level("off");
	snprintf(seg_name, sizeof(seg_name), "fuzz%d", (int)getpid());
	snprintf(text, sizeof(text), config_text, seg_name);
	fd = memfd_create("fuzz_segment.cfg", MFD_CLOEXEC);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
		fail("memfd", "cannot write the config");
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (cfg_load(path, &cfg, false, err, sizeof(err)) < 0)
		fail("config", err);
	if (seg_attach(&cfg, &seg, err, sizeof(err)) < 0)
		fail("attach", err);
	atexit(remove_segment);
	if (proc_record(seg) < 0)
		fail("record", "process table full");
	pristine = malloc(seg->size);
	lcount0 = calloc(seg->nslots, sizeof(*lcount0));
	if (pristine == NULL || lcount0 == NULL)
		fail("set-up", "out of memory");
	memcpy(pristine, seg->base, seg->size);
	memcpy((void *)lcount0, (void *)seg->lcount, seg->nslots * sizeof(*lcount0));
	rec0 = atomic_load(&seg->rec);
	hint0 = atomic_load(&seg->hint);
	sole0 = atomic_load(&seg->sole);
	return 0;
}

static void
restore(void)
{
	memcpy(seg->base, pristine, seg->size);
	memcpy((void *)seg->lcount, (void *)lcount0, seg->nslots * sizeof(*lcount0));
	atomic_store(&seg->rec, rec0);
	atomic_store(&seg->hint, hint0);
	atomic_store(&seg->sole, sole0);
	atomic_store(&seg->busy, 0);
	atomic_store(&seg->forking, 0);
}

struct client {
	int held[HELD_MAX];
	int n;
	uint64_t ino;
	bool waited;
};

/* One operation of the client, chosen by byte op. */
static void
step(struct client *cl, uint8_t op)
{
	enum bs_reason why = REASON_MAX;
	uint32_t ci = (op >> 3) % seg->ncomp;
	struct seg_comp *c = seg_comp(seg, ci);
	int k = cl->n > 0 ? (op >> 3) % cl->n : 0;

	switch (op & 7) {
	case 0:
	case 1: {
		/* A connect; the first of an input with these bits may wait,
		 * only while the segment says 1 ms at most (a wait costs its
		 * time, and the fuzzer's speed is what finds things). */
		bool wait = (op & 0x21) == 0x21 && !cl->waited && seg_max_wait_ms(c) <= 1;
		int slot = permit_acquire(seg, c, (op >> 6) & 1, ++cl->ino, wait, &why);

		cl->waited |= wait;

		if (slot >= 0 && cl->n < HELD_MAX)
			cl->held[cl->n++] = slot;
		else if (slot >= 0)
			slot_drop(seg, (uint32_t)slot);
		break;
	}
	case 2:
		if (cl->n > 0)
			permit_inflight_begin(seg, (uint32_t)cl->held[k], false, &why);
		break;
	case 3:
		if (cl->n > 0)
			permit_inflight_end(seg, (uint32_t)cl->held[k]);
		break;
	case 4:
		if (cl->n > 0)
			permit_inflight_cancel(seg, (uint32_t)cl->held[k]);
		break;
	case 5:
		/* A close. */
		if (cl->n > 0) {
			slot_drop(seg, (uint32_t)cl->held[k]);
			cl->held[k] = cl->held[--cl->n];
		}
		break;
	case 6:
		/* A dup, then its close. */
		if (cl->n > 0) {
			slot_hold(seg, (uint32_t)cl->held[k]);
			slot_drop(seg, (uint32_t)cl->held[k]);
		}
		break;
	default:
		permit_tick(seg, c, (op >> 6) & 1);
		break;
	}
}

/* What status and metrics read, with no use made of it but to be read. */
static void
read_all(void)
{
	volatile uint64_t sink = 0;

	for (uint32_t i = 0; i < seg->nprocs; i++)
		sink += seg_proc_held(seg, i);
	for (uint32_t p = 0; p < seg->h->npools && p < BS_MAX_POOLS; p++) {
		uint32_t lent;

		sink += pool_in_use(seg, p, &lent) + lent;
	}
	for (uint32_t i = 0; i < seg->ncomp; i++) {
		sink += ad_current(seg_comp(seg, i));
		sink += (uint64_t)strlen(stat_reason_name((enum bs_reason)seg->comp[i].limit));
	}
	(void)sink;
}

/* Another process attaching (validation, and the repairs made under the
 * lock) and the CLI opening the damaged segment. */
static void
second_look(void)
{
	char err[BS_ERRLEN];
	struct seg *other = NULL;

	if (seg_attach(&cfg, &other, err, sizeof(err)) == 0)
		seg_close(other);
	other = NULL;
	if (seg_open(cfg.segment, false, &other, err, sizeof(err)) == 0)
		seg_close(other);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct client cl = { .n = 0, .ino = 1000, .waited = false };
	uint8_t end = size > 0 ? data[0] : 0;
	size_t i;

	restore();
	for (i = 1; i < size && i < 9; i++)
		step(&cl, data[i]);
	while (i + 4 <= size && data[i + 3] != 0xff) {
		size_t off = ((size_t)data[i] | (size_t)data[i + 1] << 8 | (size_t)data[i + 2] << 16) %
		    seg->size;
		size_t len = (size_t)(data[i + 3] % 64) + 1;

		i += 4;
		if (len > size - i)
			len = size - i;
		if (len > seg->size - off)
			len = seg->size - off;
		memcpy((char *)seg->base + off, data + i, len);
		i += len;
	}
	for (i += 4; i < size; i++)
		step(&cl, data[i]);
	while (cl.n > 0)
		slot_drop(seg, (uint32_t)cl.held[--cl.n]);
	if (end & 1)
		proc_reclaim(seg, false);
	if (end & 2)
		reconcile_run(seg, NULL);
	read_all();
	if (end & 4)
		second_look();
	return 0;
}
