/* mappers.c - which processes map a segment's object, from /proc/PID/maps: what a stranger's object, or one to remove, is still used by. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>

#include "admit/admit.h"
#include "sys.h"

/* Whether one line of /proc/PID/maps ("start-end perms offset dev inode
 * path") maps inode ino at a path ending in `path`. */
static bool
maps_line_is(const char *line, size_t len, uint64_t ino, const char *path)
{
	size_t plen = strlen(path), i = 0;
	uint64_t v = 0;

	for (int field = 0; field < 4; field++) {
		while (i < len && line[i] != ' ')
			i++;
		while (i < len && line[i] == ' ')
			i++;
	}
	while (i < len && line[i] >= '0' && line[i] <= '9')
		v = v * 10 + (uint64_t)(line[i++] - '0');
	return v == ino && len >= plen && memcmp(line + len - plen, path, plen) == 0;
}

/* Whether pid maps inode ino at path. */
static bool
pid_maps(const char *pid, uint64_t ino, const char *path)
{
	char file[64], buf[8192];
	size_t have = 0;
	long fd, n;
	bool found = false;

	if (strlen(pid) > 20)
		return false;
	memcpy(file, "/proc/", 6);
	strcpy(file + 6, pid);
	strcat(file, "/maps");
	fd = sys_call(SYS_openat, AT_FDCWD, (long)file, O_RDONLY | O_CLOEXEC, 0, 0, 0);
	if (fd < 0)
		return false;
	while (!found && (n = sys_read((int)fd, buf + have, sizeof(buf) - have)) > 0) {
		char *line = buf, *nl;

		have += (size_t)n;
		while (!found && (nl = memchr(line, '\n', have - (size_t)(line - buf))) != NULL) {
			found = maps_line_is(line, (size_t)(nl - line), ino, path);
			line = nl + 1;
		}
		have -= (size_t)(line - buf);
		if (have == sizeof(buf))
			have = 0;	/* a line longer than the buffer: not ours */
		memmove(buf, line, have);
	}
	sys_close((int)fd);
	return found;
}

int
seg_mappers(uint64_t ino, const char *path, pid_t *pids, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	pid_t self = sys_getpid();
	int n = 0;

	if (d == NULL)
		return -errno;
	while ((e = readdir(d)) != NULL) {
		pid_t pid;

		if (e->d_name[0] < '1' || e->d_name[0] > '9')
			continue;
		pid = (pid_t)atoi(e->d_name);
		if (pid == self || !pid_maps(e->d_name, ino, path))
			continue;
		if (n < max)
			pids[n] = pid;
		n++;
	}
	closedir(d);
	return n;
}
