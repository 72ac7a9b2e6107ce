/* bulkshim.h - what every layer shares: the version, names and limits, visibility. */
#ifndef BULKSHIM_H
#define BULKSHIM_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#define BS_EXPORT __attribute__((visibility("default")))
/* On the shim's globals read by every wrapper: addressed directly, not
 * through the global offset table. */
#define BS_HIDDEN __attribute__((visibility("hidden")))
/* A function of one file that the library's build (link-time optimised,
 * -DBS_LTO) inlines into its callers in other files: the permit takes of a
 * connect. Elsewhere (the CLI, the tests, `make SHIM_LTO=`) a plain call. */
#ifdef BS_LTO
#define BS_LTO_INLINE __attribute__((always_inline))
#else
#define BS_LTO_INLINE
#endif

#define BS_VERSION		"0.1.0"
#define BS_NAME_MAX		64	/* compartment and segment names, with NUL */
#define BS_HOST_MAX		256	/* host names in rules, with NUL */
#define BS_UNIX_PATH_MAX	108	/* sizeof(sun_path) */
#define BS_MAX_COMPARTMENTS	1024
#define BS_MAX_CLASSES		8	/* class 0 is "default" */
#define BS_CLASS_NAME_MAX	32	/* with NUL */
#define BS_MAX_POOLS		16	/* pools of a config (and of a segment) */
#define BS_MAX_RULES		100000
#define BS_MAX_LIMIT		1000000	/* larger limits are taken for typos */
#define BS_MAX_WAIT_MS		600000	/* max_wait_ms */
#define BS_MAX_TIMEOUT_MS	3600000	/* connect_timeout_ms, io_timeout_ms */
#define BS_MAX_PROCESSES	65536
#define BS_MAX_SOCKETS		(1u << 20)
#define BS_LEARNED_MAX		1024	/* addresses learned from getaddrinfo */
#define BS_DEFAULT_CONFIG	"/etc/bulkshim/bulkshim.cfg"
#define BS_EX_CONFIG		78	/* sysexits.h EX_CONFIG */
#define BS_ERRLEN		1024

/* The characters of a compartment, class, pool or segment name, as a config
 * accepts them: [A-Za-z0-9_.-] (class names also leave out '.'). */
static inline bool
bs_name_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	    ch == '_' || ch == '.' || ch == '-';
}

#endif
