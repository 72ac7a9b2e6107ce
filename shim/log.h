/* log.h - logging to stderr, as text or JSON lines, async-signal-safe; the clocks. */
#ifndef BULKSHIM_LOG_H
#define BULKSHIM_LOG_H

#include "bulkshim.h"

enum bs_log_level { LOG_OFF, LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };

/* Sets the level from a BULKSHIM_LOG value; returns -EINVAL for an unknown word. */
int log_set_level(const char *word);
int log_get_level(void);
/* Writes "bulkshim[pid]: <message>\n" to stderr with one write(2) if level is
 * enabled. Supports %s %d %u %ld %lu %lld %llu %x %c %%; async-signal-safe.
 * Overlong messages are cut and end in "...". Every line, text or JSON, is
 * scrubbed as log_scrub does before it is written. */
void bs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same formatter into a buffer; returns the length written (without NUL). */
size_t bs_format(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Replaces in s[0..n) with '?' every byte that is not printable text: C0
 * and C1 control characters and DEL (raw or UTF-8 encoded), the Unicode line
 * and paragraph separators, and each byte of malformed UTF-8. The length
 * stays n. Async-signal-safe; cannot fail. */
void log_scrub(char *s, size_t n);
/* A name read from the shared segment, fit to log or print: the bytes of
 * field (size bytes, whose NUL is not trusted) up to its first NUL, each one
 * outside the characters a config accepts in names (bs_name_char) replaced
 * by '?', cut to len - 1 bytes; an empty name gives "?". out may be field.
 * Returns true if the name is one a config can give (not empty, terminated,
 * every character allowed, not cut). Async-signal-safe; leaves errno. */
bool log_name(char *out, size_t len, const char *field, size_t size);
/* BULKSHIM_LOG_FORMAT and the config's log_format: "text" (the default,
 * "bulkshim[pid]: message") or "json" (one object a line); -EINVAL else. */
int log_set_format(const char *word);
bool log_is_json(void);
/* Writes msg as one JSON line of the given level, whatever the level and
 * format set: time, pid, program, level and message, as bs_log's JSON
 * lines (the CLI's long-running commands, tools/cli_log.c). */
void log_json_message(int level, const char *msg);
/* The program name JSON lines carry (cut at 63 bytes). */
void log_set_program(const char *name);
/* A refusal, for log_refusal: the human message and its fields. */
struct log_refusal {
	const char *message;
	const char *compartment, *reason, *operation, *destination;
	uint32_t in_use, limit;		/* limit UINT32_MAX: none */
};
/* The split of a segment compartment's log_gate word (seg_layout.h). */
#define LOG_GATE_COUNT_BITS	24
#define LOG_GATE_TIME_BITS	(64 - LOG_GATE_COUNT_BITS)
/* For a gate every process of a segment shares (a compartment's
 * log_gate): true when a refusal line may go out now, at
 * most one a second across all the processes, with the count of those
 * the processes suppressed since the last line in *skipped; false counts
 * this one as suppressed (in the word, so the next line, whichever
 * process prints it, reports it). Nothing is claimed or counted when this
 * process logs no warnings. Lock-free and async-signal-safe; a word
 * another process damaged lets a line through rather than silence the
 * compartment, and a word that keeps changing under a bounded number of
 * tries suppresses this line uncounted rather than spin. */
bool log_gate_due(_Atomic uint64_t *gate, uint64_t *skipped);
/* Writes the line of a refusal that log_gate_due let through, as text
 * or JSON; async-signal-safe. */
void log_refusal(const struct log_refusal *r, uint64_t skipped);
/* Milliseconds of CLOCK_MONOTONIC and CLOCK_REALTIME; microseconds of
 * CLOCK_MONOTONIC. */
uint64_t now_mono_ms(void);
uint64_t now_mono_us(void);
/* Whole seconds of CLOCK_MONOTONIC, read from the cheaper coarse clock (a
 * tick behind it at most). */
uint64_t now_mono_s(void);
uint64_t now_real_ms(void);

#endif
