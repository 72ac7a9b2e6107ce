/* fuzz_config.c - libFuzzer target: the config loader on arbitrary file contents. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config/config.h"
#include "log.h"

/*
 * Each input becomes the whole contents of a config file, read by cfg_load
 * exactly as the shim reads one at start-up, without resolving host names
 * (no network in a fuzzer). The file is a memfd reached through
 * /proc/self/fd, so nothing touches the disk.
 *
 * libconfig's @include reads another file by name, here next to the memfd
 * in /proc/self/fd: the fuzzer's own descriptors, whose contents change
 * from run to run. Inputs that ask for an include are skipped, so that a
 * finding can be replayed; what an include may be (a regular file, 16 MiB
 * in all) is tested in tests/unit/test_config.c.
 */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char path[64];

static bool
asks_for_include(const uint8_t *data, size_t size)
{
	static const char word[] = "include";

	for (size_t i = 0; i + sizeof(word) - 1 < size; i++) {
		size_t k;

		if (data[i] != '@')
			continue;
		for (k = 0; k < sizeof(word) - 1; k++) {
			uint8_t c = data[i + 1 + k];

			if ((c | 0x20) != (uint8_t)word[k])
				break;
		}
		if (k == sizeof(word) - 1)
			return true;
	}
	return false;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct bs_config cfg;
	char err[BS_ERRLEN];
	int r;

	if (size > 1 << 20 || asks_for_include(data, size))
		return 0;
	if (memfd < 0) {
		memfd = memfd_create("fuzz_config.cfg", MFD_CLOEXEC);
		if (memfd < 0) {
			perror("memfd_create");
			_exit(2);
		}
		snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
		log_set_level("off");
	}
	if (ftruncate(memfd, 0) < 0 || pwrite(memfd, data, size, 0) != (ssize_t)size) {
		perror("memfd");
		_exit(2);
	}
	memset(err, 0x5a, sizeof(err));
	r = cfg_load(path, &cfg, false, err, sizeof(err));
	if (r == 0) {
		/* A loaded config keeps the promises config.h makes about it. */
		if (cfg.ncomp == 0 || cfg.ncomp > BS_MAX_COMPARTMENTS || cfg.nrules > BS_MAX_RULES)
			__builtin_trap();
		for (size_t i = 0; i < cfg.nrules; i++) {
			if (cfg.rules[i].comp < 0 || (size_t)cfg.rules[i].comp >= cfg.ncomp)
				__builtin_trap();
		}
		if (memchr(cfg.segment, '\0', sizeof(cfg.segment)) == NULL)
			__builtin_trap();
		cfg_free(&cfg);
	} else if (memchr(err, '\0', sizeof(err)) == NULL || err[0] == '\0') {
		/* Every refusal says why, in a terminated string. */
		__builtin_trap();
	}
	return 0;
}
