/* loadgen.h - the bench's closed-loop load: threads that repeat one request until a deadline. */
#ifndef LOADGEN_H
#define LOADGEN_H

/*
 * Runs THREADS threads for SECONDS; each calls one() again and again and
 * records when it ended, what it returned ("ok", "refused", ...) and how
 * long it took; a thread whose request was not "ok" pauses PAUSE_MS before
 * the next. Then prints every record, sorted by end time, as one JSON list
 * of [end time s, outcome, latency ms] on stdout. Returns 0, or 1 when it
 * could not start its threads.
 */
int loadgen_run(int threads, double seconds, double pause_ms, const char *(*one)(void));

#endif
