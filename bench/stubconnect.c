/* stubconnect.c - a connect() that succeeds at once without a system call, for `make bench`. */
#include <sys/socket.h>

/*
 * Preloaded after libbulkshim.so (LD_PRELOAD="libbulkshim.so libstubconnect.so"),
 * this is what the shim's dlsym(RTLD_NEXT, "connect") finds, so a connect
 * loop times the shim's own work (lookup, permit, bookkeeping, its extra
 * system calls) without the 60-100 us a real loopback handshake costs here,
 * whose noise would bury a figure of a few hundred nanoseconds. Preloaded
 * alone, it is the baseline the shim's figure is taken against.
 */
__attribute__((visibility("default"))) int
connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	(void)fd;
	(void)sa;
	(void)len;
	return 0;
}
