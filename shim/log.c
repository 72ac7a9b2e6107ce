/* log.c - rate-limited, async-signal-safe logging to stderr. */
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define LOG_LINE_MAX 512

static int log_level = LOG_WARN;

/* Per compartment: when the last rejection line went out and how many were
 * suppressed since. The compare-and-swap lets one thread through. */
static struct {
	_Atomic uint64_t last_ms;
	_Atomic uint64_t suppressed;
} rej_state[BS_MAX_COMPARTMENTS];

int
log_set_level(const char *word)
{
	static const char *names[] = { "off", "error", "warn", "info", "debug" };

	for (int i = 0; i < 5; i++) {
		if (strcmp(word, names[i]) == 0) {
			log_level = i;
			return 0;
		}
	}
	return -EINVAL;
}

int
log_get_level(void)
{
	return log_level;
}

uint64_t
now_mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

uint64_t
now_mono_ms(void)
{
	return now_mono_us() / 1000;
}

uint64_t
now_real_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Appends c at *pos if room remains; the last byte of buf is kept for NUL. */
static void
put_char(char *buf, size_t len, size_t *pos, char c)
{
	if (*pos + 1 < len)
		buf[*pos] = c;
	(*pos)++;
}

static void
put_str(char *buf, size_t len, size_t *pos, const char *s)
{
	if (s == NULL)
		s = "(null)";
	while (*s)
		put_char(buf, len, pos, *s++);
}

static void
put_uint(char *buf, size_t len, size_t *pos, unsigned long long v, unsigned base)
{
	char tmp[24];
	int n = 0;

	do {
		tmp[n++] = "0123456789abcdef"[v % base];
		v /= base;
	} while (v != 0);
	while (n > 0)
		put_char(buf, len, pos, tmp[--n]);
}

/* A printf subset written without stdio or locale, so that it is
 * async-signal-safe: %s %d %u %x %c %%, with the l and ll modifiers. */
static size_t
format_v(char *buf, size_t len, const char *fmt, va_list ap)
{
	size_t pos = 0;

	for (const char *p = fmt; *p; p++) {
		int longs = 0;

		if (*p != '%') {
			put_char(buf, len, &pos, *p);
			continue;
		}
		p++;
		while (*p == 'l') {
			longs++;
			p++;
		}
		switch (*p) {
		case 's':
			put_str(buf, len, &pos, va_arg(ap, const char *));
			break;
		case 'c':
			put_char(buf, len, &pos, (char)va_arg(ap, int));
			break;
		case 'd': {
			long long v = longs == 0 ? va_arg(ap, int) :
			    longs == 1 ? va_arg(ap, long) : va_arg(ap, long long);
			unsigned long long u = (unsigned long long)v;

			if (v < 0) {
				put_char(buf, len, &pos, '-');
				u = 0 - u;
			}
			put_uint(buf, len, &pos, u, 10);
			break;
		}
		case 'u':
		case 'x': {
			unsigned long long v = longs == 0 ? va_arg(ap, unsigned) :
			    longs == 1 ? va_arg(ap, unsigned long) :
			    va_arg(ap, unsigned long long);

			put_uint(buf, len, &pos, v, *p == 'x' ? 16 : 10);
			break;
		}
		case '%':
			put_char(buf, len, &pos, '%');
			break;
		case '\0':
			p--;
			break;
		default:
			put_char(buf, len, &pos, '?');
			break;
		}
	}
	if (len > 0)
		buf[pos < len ? pos : len - 1] = '\0';
	return pos < len ? pos : (len > 0 ? len - 1 : 0);
}

size_t
bs_format(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	size_t n;

	va_start(ap, fmt);
	n = format_v(buf, len, fmt, ap);
	va_end(ap);
	return n;
}

/* Writes one line with the raw system call: the shim's own write wrapper
 * (if any) must not see it, and stdio is not signal-safe. */
static void
emit(const char *prefix_fmt, const char *fmt, va_list ap)
{
	char line[LOG_LINE_MAX];
	size_t n;
	int saved = errno;

	n = bs_format(line, sizeof(line), prefix_fmt, (int)syscall(SYS_getpid));
	n += format_v(line + n, sizeof(line) - n, fmt, ap);
	if (n >= sizeof(line) - 2) {
		n = sizeof(line) - 5;
		memcpy(line + n, "...", 3);
		n += 3;
	}
	line[n++] = '\n';
	syscall(SYS_write, 2, line, n);
	errno = saved;
}

void
bs_log(int level, const char *fmt, ...)
{
	va_list ap;

	if (level > log_level || level == LOG_OFF)
		return;
	va_start(ap, fmt);
	emit("bulkshim[%d]: ", fmt, ap);
	va_end(ap);
}

void
log_rejection(unsigned comp, const char *fmt, ...)
{
	va_list ap;
	uint64_t now, last, skipped;
	char tail[64];

	if (log_level < LOG_WARN)
		return;
	if (comp >= BS_MAX_COMPARTMENTS)
		comp = 0;
	/* last_ms holds the time of the last line + 1, so 0 means never:
	 * a line goes out only a full second after the previous one. */
	now = now_mono_ms() + 1;
	last = atomic_load(&rej_state[comp].last_ms);
	if ((last != 0 && now - last < 1000) ||
	    !atomic_compare_exchange_strong(&rej_state[comp].last_ms, &last, now)) {
		atomic_fetch_add(&rej_state[comp].suppressed, 1);
		return;
	}
	skipped = atomic_exchange(&rej_state[comp].suppressed, 0);
	va_start(ap, fmt);
	if (skipped == 0) {
		emit("bulkshim[%d]: ", fmt, ap);
	} else {
		char fmt2[256];

		bs_format(tail, sizeof(tail), " (%llu similar suppressed)",
		    (unsigned long long)skipped);
		/* Append the tail to the format; a literal '%' in it cannot
		 * occur since it holds only digits and words. */
		bs_format(fmt2, sizeof(fmt2), "%s%s", fmt, tail);
		emit("bulkshim[%d]: ", fmt2, ap);
	}
	va_end(ap);
}
