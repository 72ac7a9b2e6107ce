/* fdtable.h - private to interpose/: descriptor -> counted socket, a flat array read lock-free. */
#ifndef BULKSHIM_FDTABLE_H
#define BULKSHIM_FDTABLE_H

#include "bulkshim.h"

/* The accessors that every wrapper reads are inlined into it under LTO
 * (BS_LTO_INLINE). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"

/* Sizes the table from /proc/sys/fs/nr_open with mmap. Returns 0 or -errno. */
int fdt_init(void);

/* The current settings sequence (0 until the segment is attached). */
BS_LTO_INLINE uint32_t fdt_seq(void);
/* The whole entry of a descriptor that fdt_valid passed, read with a
 * sequentially consistent load (a check that must see another thread's
 * verdict, io.c's drop_plain). */
BS_LTO_INLINE uint64_t fdt_entry_sync(int fd);

/* The high half of an entry whose socket needs nothing on its I/O: its
 * compartment limits no requests in flight and times out no I/O, as of the
 * settings sequence in the low 31 bits. */
#define FDT_PLAIN	0x80000000u

/* fdt_entry of a descriptor that fdt_valid passed: the load alone. */
BS_LTO_INLINE uint64_t fdt_entry_valid(int fd);

/* The whole entry of fd: slot + 1 in the low half (0: not counted), the
 * cached verdict in the high half; FDT_FRESH for an uncounted socket fresh
 * from socket(). A bounds check and one load. */
BS_LTO_INLINE uint64_t fdt_entry(int fd);

/* The slot + 1 recorded for fd, 0 if untracked. */
BS_LTO_INLINE uint32_t fdt_get(int fd);

/* True if a counted entry lets its I/O go straight to libc: its verdict is
 * plain as of the current settings sequence. */
BS_LTO_INLINE bool fdt_plain(uint64_t e);

/* Where the settings sequence is (NULL: nowhere yet). */
void fdt_set_seq(_Atomic uint32_t *seq);
/* Caches `verdict` (FDT_PLAIN | sequence, or 0) in fd's entry if the entry
 * is still `was` apart from its verdict. */
void fdt_verdict(int fd, uint64_t was, uint32_t verdict);
/* True if fd fits in the table. */
BS_LTO_INLINE bool fdt_valid(int fd);
/* Records slot for fd (with no verdict) and returns what was recorded
 * before (slot + 1 or 0). */
uint32_t fdt_set(int fd, uint32_t slot);
/* Raises the high-water mark (fdt_high) to fd + 1. */
BS_LTO_INLINE void fdt_raise_high(int fd);
/* fdt_set of a descriptor that fdt_valid passed. Inline: every counted
 * connect records its slot. */
BS_LTO_INLINE uint32_t fdt_set_valid(int fd, uint32_t slot);
/* fdt_take of a descriptor whose entry fdt_get just read as counted (the
 * table, sized once, never moves). */
BS_LTO_INLINE uint32_t fdt_take_counted(int fd);
/* Forgets fd and returns what was recorded (slot + 1 or 0). Inline: every
 * close of a counted socket takes its entry. */
BS_LTO_INLINE uint32_t fdt_take(int fd);
/* One past the highest fd ever recorded, to bound range scans. */
int fdt_high(void);
/* The "fresh" mark: the whole entry of a descriptor that is not counted
 * but is a stream socket from socket() not yet connected, which a fork may
 * share before its connect (see fork in spawn.c) and whose connect
 * need not ask its type. Kept in the entry itself, so that a connect reads
 * it with the descriptor's one lookup, and the slot a counted connect
 * records clears it. Stale marks are harmless: fork checks each
 * descriptor before acting on it. */
#define FDT_FRESH	((uint64_t)0x40000000u << 32)
/* Marks fd fresh (socket(), after fresh_fd), unless its entry is counted. */
void fdt_mark_fresh(int fd);
/* Clears fd's fresh mark, if it fits in the table and has one. */
void fdt_clear_fresh(int fd);
/* Forgets the slot recorded for fd and returns it (slot + 1 or 0), leaving
 * the fresh mark if `fresh`: a socket whose admission was refused, or
 * whose connect failed at once, is unconnected again. */
uint32_t fdt_unclaim(int fd, bool fresh);
/* The first fresh-marked descriptor >= fd, or -1. */
int fdt_next_fresh(int fd);
/* Forgets fd if its entry is still e (slot + 1); true if it did. */
bool fdt_take_if(int fd, uint32_t e);

#pragma GCC diagnostic pop

#endif
