/* sys.h - raw system calls for every layer: the instruction, futexes, small /proc reads. */
#ifndef BULKSHIM_SYS_H
#define BULKSHIM_SYS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * The preloaded library exports a syscall() wrapper of its own (libuv
 * closes descriptors through it), so nothing below the wrappers may call
 * syscall(): it would enter the wrapper again. These make the system call
 * with the instruction itself (libc's syscall() on other machines, where
 * the library exports no such wrapper). In the CLI they are the same calls.
 */

/* System call n with six arguments. Returns the result, or -1 with errno
 * set, like syscall(2). */
long sys_call(long n, long a1, long a2, long a3, long a4, long a5, long a6);
/* Sleeps while *word == val (FUTEX_WAIT, shared between processes), at
 * most `us` microseconds. A wake, a signal or the timeout ends it. */
void sys_futex_wait(_Atomic uint32_t *word, uint32_t val, uint64_t us);
/* Wakes up to n waiters of word (n INT_MAX: all). */
void sys_futex_wake(_Atomic uint32_t *word, int n);
/* close(2), fcntl(2) with a pointer argument, socket(2), sendto(2) and
 * recv(2) by the instruction: the library's own wrappers of those names
 * must not see the layers' own descriptors. -1 with errno as libc. */
int sys_close(int fd);
int sys_fcntl(int fd, int cmd, void *arg);
int sys_socket(int domain, int type, int protocol);
long sys_sendto(int fd, const void *buf, size_t len, int flags, const void *sa, unsigned salen);
long sys_recv(int fd, void *buf, size_t len, int flags);
long sys_read(int fd, void *buf, size_t len);
/* This process's pid, asked of the kernel (never a cached value). */
pid_t sys_getpid(void);
/* Reads up to len - 1 bytes of a small file into buf, NUL-terminated. Returns
 * the bytes read or -errno. Async-signal-safe. */
long sys_read_small(const char *path, char *buf, size_t len);
/* True if pid is alive and, when start is not 0, started at `start`: a
 * zombie that is not a thread-group leader with live threads counts as
 * dead. Without /proc, a signal probe that errs on "alive". */
bool sys_pid_alive(pid_t pid, uint64_t start);
/* The start time of pid in clock ticks (field 22 of /proc/PID/stat), 0 if
 * unknown. */
uint64_t sys_pid_start(pid_t pid);

#endif
