/* run_check.c - what `bulkshim run` checks before it starts a program: the config, and that the shim can see the program's calls. */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cli.h"

#define SCRIPT_DEPTH	4	/* #! interpreters followed, like the kernel's limit */

/* The file execvp would run for name, into out; false if none. */
static bool
find_program(const char *name, char *out, size_t len)
{
	const char *path = getenv("PATH");

	if (strchr(name, '/') != NULL) {
		snprintf(out, len, "%s", name);
		return access(out, X_OK) == 0;
	}
	if (path == NULL || *path == '\0')
		path = "/usr/local/bin:/usr/bin:/bin";
	while (*path != '\0') {
		size_t n = strcspn(path, ":");

		snprintf(out, len, "%.*s/%s", (int)n, n ? path : ".", name);
		if (access(out, X_OK) == 0)
			return true;
		path += n + (path[n] == ':');
	}
	return false;
}

/* Reads len bytes at off of fd into buf; false on a short read. */
static bool
read_at(int fd, void *buf, size_t len, uint64_t off)
{
	return pread(fd, buf, len, (off_t)off) == (ssize_t)len;
}

/*
 * Reads the 64-bit ELF headers of fd: whether it asks for a dynamic loader
 * (PT_INTERP) and whether it carries a Go build section. Returns NULL when
 * the shim can see its calls, else why not.
 */
static const char *
elf_blind(int fd)
{
	Elf64_Ehdr eh;
	Elf64_Shdr sh, strs;
	bool interp = false;

	if (!read_at(fd, &eh, sizeof(eh), 0) || eh.e_ident[EI_CLASS] != ELFCLASS64)
		return NULL;	/* 32-bit or odd: let the loader judge */
	for (unsigned i = 0; i < eh.e_phnum; i++) {
		Elf64_Phdr ph;

		if (!read_at(fd, &ph, sizeof(ph), eh.e_phoff + (uint64_t)i * eh.e_phentsize))
			return NULL;
		interp = interp || ph.p_type == PT_INTERP;
	}
	if (eh.e_shstrndx != SHN_UNDEF && eh.e_shstrndx < eh.e_shnum &&
	    read_at(fd, &strs, sizeof(strs), eh.e_shoff + (uint64_t)eh.e_shstrndx * eh.e_shentsize)) {
		for (unsigned i = 0; i < eh.e_shnum; i++) {
			char name[32] = "";

			if (!read_at(fd, &sh, sizeof(sh), eh.e_shoff + (uint64_t)i * eh.e_shentsize))
				break;
			if (sh.sh_name >= strs.sh_size)
				continue;
			if (pread(fd, name, sizeof(name) - 1, (off_t)(strs.sh_offset + sh.sh_name)) <= 0)
				continue;
			if (strcmp(name, ".go.buildinfo") == 0 || strcmp(name, ".note.go.buildid") == 0)
				return "a Go program: Go makes its own system calls, past libc";
		}
	}
	if (!interp)
		return "statically linked: no dynamic loader, so nothing is preloaded";
	return NULL;
}

/*
 * Why the shim cannot see the calls of the program at path, or NULL. A
 * script is judged by its interpreter (through env(1) too).
 */
static const char *
blind_reason(const char *path, int depth, char *buf, size_t len)
{
	char head[256], next[PATH_MAX], *p, *word, *save = NULL;
	struct stat st;
	const char *why = NULL;
	ssize_t n;
	int fd;

	if (stat(path, &st) < 0)
		return NULL;	/* execvp will say why */
	if ((st.st_mode & S_ISUID) && st.st_uid != getuid())
		return "setuid: the loader drops LD_PRELOAD for it (secure execution)";
	if ((st.st_mode & S_ISGID) && st.st_gid != getgid())
		return "setgid: the loader drops LD_PRELOAD for it (secure execution)";
	if (getxattr(path, "security.capability", NULL, 0) > 0)
		return "it has file capabilities: the loader drops LD_PRELOAD for it (secure execution)";
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return NULL;
	n = pread(fd, head, sizeof(head) - 1, 0);
	head[n > 0 ? n : 0] = '\0';
	if (n >= 4 && memcmp(head, ELFMAG, SELFMAG) == 0) {
		why = elf_blind(fd);
	} else if (n > 2 && head[0] == '#' && head[1] == '!' && depth < SCRIPT_DEPTH) {
		head[strcspn(head, "\n")] = '\0';
		word = strtok_r(head + 2, " \t", &save);
		p = word && strcmp(word, "/usr/bin/env") == 0 ? strtok_r(NULL, " \t", &save) : NULL;
		while (p != NULL && p[0] == '-')	/* env -S and the like */
			p = strtok_r(NULL, " \t", &save);
		if (p != NULL ? find_program(p, next, sizeof(next)) :
		    (word != NULL && snprintf(next, sizeof(next), "%s", word) > 0)) {
			const char *inner = blind_reason(next, depth + 1, buf, len);

			if (inner != NULL) {
				snprintf(buf, len, "its interpreter %s is %s", next, inner);
				why = buf;
			}
		}
	}
	close(fd);
	return why;
}

int
run_check_program(const char *prog, bool force)
{
	char path[PATH_MAX], buf[PATH_MAX + 256];
	const char *why;

	if (!find_program(prog, path, sizeof(path)))
		return 0;	/* execvp says "not found" */
	why = blind_reason(path, 0, buf, sizeof(buf));
	if (why == NULL)
		return 0;
	if (force) {
		cli_log(LOG_WARN, "bulkshim: warning: ", "%s is %s; the shim cannot see its calls "
		    "and it runs WITHOUT LIMITS (--force)", path, why);
		return 0;
	}
	cli_log(LOG_ERROR, "bulkshim: ", "%s is %s; the shim cannot see its calls, so it would "
	    "run without limits. Not started: `bulkshim run --kernel` counts its connects in the "
	    "kernel instead (root, or CAP_BPF and CAP_NET_ADMIN); --force runs it without "
	    "limits", path, why);
	return -1;
}

void
cli_print_errors(char *errs)
{
	for (char *line = errs, *nl; line != NULL && *line != '\0'; line = nl) {
		if ((nl = strchr(line, '\n')) != NULL)
			*nl++ = '\0';
		cli_log(LOG_ERROR, "bulkshim: ", "%s", line);
	}
}

/* BULKSHIM_STRICT's values that mean yes, as the library reads them. */
static bool
env_true(const char *v)
{
	return v != NULL && (strcmp(v, "1") == 0 || strcmp(v, "yes") == 0 ||
	    strcmp(v, "true") == 0 || strcmp(v, "on") == 0);
}

int
run_check_config(const char *path)
{
	struct bs_config cfg;
	char err[BS_ERRLEN];

	/* What the library does at start-up, host names included, with
	 * every error said at once. */
	if (cfg_load_all(path, &cfg, true, err, sizeof(err)) < 0) {
		cli_print_errors(err);
		cli_log(LOG_ERROR, "bulkshim: ", "not started: with this config the program would "
		    "run without limits");
		return -1;
	}
	/* A segment that a stranger made first would leave it unprotected. */
	if (seg_check_owner(&cfg, err, sizeof(err)) < 0) {
		cli_log(LOG_ERROR, "bulkshim: ", "%s", err);
		cli_log(LOG_ERROR, "bulkshim: ", "not started: the program would run without limits");
		cfg_free(&cfg);
		return -1;
	}
	/* A name that gave no address leaves its destinations unprotected
	 * until the program looks the name up itself: said here, and in
	 * strict mode (which promises never to run unprotected) not started. */
	if (cfg.unresolved != NULL) {
		bool strict = cfg.strict || env_true(getenv("BULKSHIM_STRICT"));

		for (char *line = cfg.unresolved, *nl; *line != '\0'; line = nl) {
			nl = line + strcspn(line, "\n");
			if (*nl == '\n')
				*nl++ = '\0';
			fprintf(stderr, "bulkshim: %s%s\n", strict ? "" : "warning: ", line);
		}
		if (strict) {
			fprintf(stderr, "bulkshim: not started: strict mode, and %zu host name%s of %s "
			    "gave no address\n", cfg.nunresolved, cfg.nunresolved == 1 ? "" : "s",
			    path);
			cfg_free(&cfg);
			return -1;
		}
		fprintf(stderr, "bulkshim: warning: starting with %zu destination%s NOT PROTECTED "
		    "(strict = true; or BULKSHIM_STRICT=1 refuses to start instead)\n",
		    cfg.nunresolved, cfg.nunresolved == 1 ? "" : "s");
	}
	cfg_free(&cfg);
	return 0;
}
