/* log.c - rate-limited, async-signal-safe logging to stderr, as human lines or JSON objects. */
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "sys.h"

#define LOG_LINE_MAX 512
#define JSON_LINE_MAX 1280	/* every field is capped (in output bytes), so an object always fits */

static int log_level = LOG_WARN;
static bool log_json;
static char log_prog[64];

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

int
log_set_format(const char *word)
{
	if (strcmp(word, "text") == 0)
		log_json = false;
	else if (strcmp(word, "json") == 0)
		log_json = true;
	else
		return -EINVAL;
	return 0;
}

bool
log_is_json(void)
{
	return log_json;
}

void
log_set_program(const char *name)
{
	size_t n = 0;

	for (; name != NULL && name[n] != '\0' && n < sizeof(log_prog) - 1; n++)
		log_prog[n] = name[n];
	log_prog[n] = '\0';
}

uint64_t
now_mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

uint64_t
now_mono_s(void)
{
	struct timespec ts;

	/* The coarse clock, no later than CLOCK_MONOTONIC: it is kept by the
	 * tick, so the vDSO reads it without the time stamp counter. */
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec;
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

/* Reads no further than fits (and one more, so that *pos tells the caller
 * the text was cut): a name in the shared segment whose NUL another process
 * wrote over must not be read beyond the mapping. */
static void
put_str(char *buf, size_t len, size_t *pos, const char *s)
{
	if (s == NULL)
		s = "(null)";
	while (*s && *pos < len)
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

/* A JSON string of s, its escaped text cut at max bytes (then ending in
 * "..."): quotes and backslashes escaped, control characters replaced by
 * '?' (escaped, they would come back whole to whoever decodes the line and
 * prints it), other bytes as they are (write_line scrubs them). */
static void
put_json_str(char *buf, size_t len, size_t *pos, const char *s, size_t max)
{
	size_t start;

	put_char(buf, len, pos, '"');
	start = *pos;
	for (; s != NULL && *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;

		if (*pos - start >= max) {
			put_str(buf, len, pos, "...");
			break;
		}
		if (c == '"' || c == '\\')
			put_char(buf, len, pos, '\\');
		put_char(buf, len, pos, c < 0x20 || c == 0x7f ? '?' : (char)c);
	}
	put_char(buf, len, pos, '"');
}

/* ",\"key\": " */
static void
put_key(char *buf, size_t len, size_t *pos, const char *key)
{
	put_str(buf, len, pos, ", \"");
	put_str(buf, len, pos, key);
	put_str(buf, len, pos, "\": ");
}

/* n as at least width digits. */
static void
put_padded(char *buf, size_t len, size_t *pos, unsigned long long n, int width)
{
	unsigned long long p = 1;

	for (int i = 1; i < width; i++)
		p *= 10;
	for (; p > 1 && n < p; p /= 10)
		put_char(buf, len, pos, '0');
	put_uint(buf, len, pos, n, 10);
}

/* Milliseconds since the epoch as "2026-12-01T01:02:03.456Z", computed here
 * because gmtime_r is not async-signal-safe (days to civil date: H. Hinnant). */
static void
put_time(char *buf, size_t len, size_t *pos, uint64_t ms)
{
	uint64_t secs = ms / 1000;
	long long z = (long long)(secs / 86400) + 719468, era = z / 146097;
	unsigned doe = (unsigned)(z - era * 146097);
	unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
	unsigned day = doy - (153 * mp + 2) / 5 + 1, month = mp < 10 ? mp + 3 : mp - 9;
	long long year = (long long)yoe + era * 400 + (month <= 2);
	unsigned sod = (unsigned)(secs % 86400);

	put_char(buf, len, pos, '"');
	put_padded(buf, len, pos, (unsigned long long)year, 4);
	put_char(buf, len, pos, '-');
	put_padded(buf, len, pos, month, 2);
	put_char(buf, len, pos, '-');
	put_padded(buf, len, pos, day, 2);
	put_char(buf, len, pos, 'T');
	put_padded(buf, len, pos, sod / 3600, 2);
	put_char(buf, len, pos, ':');
	put_padded(buf, len, pos, sod / 60 % 60, 2);
	put_char(buf, len, pos, ':');
	put_padded(buf, len, pos, sod % 60, 2);
	put_char(buf, len, pos, '.');
	put_padded(buf, len, pos, ms % 1000, 3);
	put_str(buf, len, pos, "Z\"");
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

/* The length of the UTF-8 sequence at s (n > 0 bytes left) when it is well
 * formed and encodes printable text; 0 for a control character (C0, DEL,
 * C1), a line or paragraph separator, or a byte of malformed UTF-8 (a lone
 * 0x9b is CSI to a terminal that reads 8-bit controls). */
static size_t
printable_len(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	uint32_t cp;
	size_t len;

	if (c < 0x80)
		return c >= 0x20 && c != 0x7f;
	if (c >= 0xc2 && c <= 0xdf) {
		len = 2;
		cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	/* Overlong forms, surrogates and what lies beyond U+10FFFF are
	 * malformed; U+0080..U+009F are the C1 controls. */
	if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp <= 0x9f || cp == 0x2028 || cp == 0x2029)
		return 0;
	return len;
}

void
log_scrub(char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		size_t k = printable_len((const unsigned char *)s + i, n - i);

		if (k == 0)
			s[i++] = '?';
		else
			i += k;
	}
}

bool
log_name(char *out, size_t len, const char *field, size_t size)
{
	/* Each byte read once: another process may be writing the name. */
	const volatile char *f = field;
	bool ok = true;
	size_t i;

	if (len == 0)
		return false;
	for (i = 0; i < size; i++) {
		char ch = f[i];

		if (ch == '\0')
			break;
		if (i + 1 == len) {
			ok = false;
			break;
		}
		ok = ok && bs_name_char(ch);
		out[i] = bs_name_char(ch) ? ch : '?';
	}
	if (i == size)
		ok = false;
	if (i == 0 && len > 1) {
		out[i++] = '?';
		ok = false;
	}
	out[i] = '\0';
	return ok;
}

/* Writes line (n bytes, room for one more) and a newline with the raw
 * system call: the shim's own write wrapper (if any) must not see it, and
 * stdio is not signal-safe. Whatever the arguments held, the line is one
 * line of printable text: text from the shared segment is anybody's. */
static void
write_line(char *line, size_t n)
{
	int saved = errno;

	log_scrub(line, n);
	line[n++] = '\n';
	sys_call(SYS_write, 2, (long)line, (long)n, 0, 0, 0);
	errno = saved;
}

static void
emit(const char *prefix_fmt, const char *fmt, va_list ap)
{
	char line[LOG_LINE_MAX];
	size_t n;

	n = bs_format(line, sizeof(line), prefix_fmt, (int)sys_getpid());
	n += format_v(line + n, sizeof(line) - n, fmt, ap);
	if (n >= sizeof(line) - 2) {
		n = sizeof(line) - 5;
		memcpy(line + n, "...", 3);
		n += 3;
	}
	write_line(line, n);
}

/* One JSON object: time, pid, program, level, the refusal's fields when r
 * is not NULL, and the message as the human line says it. */
static void
emit_json(int level, const char *msg, const struct log_refusal *r, uint64_t suppressed)
{
	static const char *const levels[] = { "off", "error", "warn", "info", "debug" };
	char line[JSON_LINE_MAX];
	size_t n = 0;

	put_str(line, sizeof(line), &n, "{\"time\": ");
	put_time(line, sizeof(line), &n, now_real_ms());
	put_key(line, sizeof(line), &n, "pid");
	put_uint(line, sizeof(line), &n, (unsigned long long)sys_getpid(), 10);
	put_key(line, sizeof(line), &n, "program");
	put_json_str(line, sizeof(line), &n, log_prog, 100);
	put_key(line, sizeof(line), &n, "level");
	put_json_str(line, sizeof(line), &n, levels[level >= 0 && level <= LOG_DEBUG ? level : 0],
	    10);
	if (r != NULL) {
		put_key(line, sizeof(line), &n, "compartment");
		put_json_str(line, sizeof(line), &n, r->compartment, 100);
		put_key(line, sizeof(line), &n, "reason");
		put_json_str(line, sizeof(line), &n, r->reason, 40);
		put_key(line, sizeof(line), &n, "operation");
		put_json_str(line, sizeof(line), &n, r->operation, 20);
		put_key(line, sizeof(line), &n, "destination");
		put_json_str(line, sizeof(line), &n, r->destination, 240);
		put_key(line, sizeof(line), &n, "in_use");
		put_uint(line, sizeof(line), &n, r->in_use, 10);
		put_key(line, sizeof(line), &n, "limit");
		if (r->limit == UINT32_MAX)
			put_str(line, sizeof(line), &n, "null");
		else
			put_uint(line, sizeof(line), &n, r->limit, 10);
		put_key(line, sizeof(line), &n, "suppressed");
		put_uint(line, sizeof(line), &n, suppressed, 10);
	}
	put_key(line, sizeof(line), &n, "message");
	put_json_str(line, sizeof(line), &n, msg, 300);
	put_char(line, sizeof(line), &n, '}');
	if (n >= sizeof(line) - 1)	/* cannot happen with the caps above */
		return;
	write_line(line, n);
}

void
log_json_message(int level, const char *msg)
{
	emit_json(level, msg, NULL, 0);
}

void
bs_log(int level, const char *fmt, ...)
{
	va_list ap;

	if (level > log_level || level == LOG_OFF)
		return;
	va_start(ap, fmt);
	if (log_json) {
		char msg[LOG_LINE_MAX];

		format_v(msg, sizeof(msg), fmt, ap);
		emit_json(level, msg, NULL, 0);
	} else {
		emit("bulkshim[%d]: ", fmt, ap);
	}
	va_end(ap);
}

bool
log_gate_due(_Atomic uint64_t *gate, uint64_t *skipped)
{
	const uint64_t count_max = (1ULL << LOG_GATE_COUNT_BITS) - 1;
	uint64_t now, w, last, next;

	if (log_level < LOG_WARN)
		return false;
	/* The time is the millisecond + 1, so that 0 means never; CLOCK_MONOTONIC
	 * is one clock for every process of the host (2^40 ms is 34 years). */
	now = (now_mono_ms() + 1) & ((1ULL << LOG_GATE_TIME_BITS) - 1);
	w = atomic_load(gate);
	for (int tries = 0; tries < 64; tries++) {
		last = w >> LOG_GATE_COUNT_BITS;
		/* A time after now was not written by a process of this clock:
		 * the line goes out and the word is made sane again. */
		if (last != 0 && last <= now && now - last < 1000) {
			next = (w & count_max) == count_max ? w : w + 1;
			if (next == w || atomic_compare_exchange_weak(gate, &w, next))
				return false;
			continue;
		}
		if (atomic_compare_exchange_weak(gate, &w, now << LOG_GATE_COUNT_BITS)) {
			*skipped = w & count_max;
			return true;
		}
	}
	return false;
}

void
log_refusal(const struct log_refusal *r, uint64_t skipped)
{
	char tail[64];

	if (log_json) {
		emit_json(LOG_WARN, r->message, r, skipped);
		return;
	}
	if (skipped == 0) {
		bs_log(LOG_WARN, "%s", r->message);
		return;
	}
	bs_format(tail, sizeof(tail), " (%llu similar suppressed)", (unsigned long long)skipped);
	bs_log(LOG_WARN, "%s%s", r->message, tail);
}
