/* cli_log.c - the own lines of the long-running commands (fleet, serve, run) on stderr: text, or the library's JSON objects. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static bool json;
static int warned;

void
cli_log_init(const char *program, bool config_json)
{
	const char *format = getenv("BULKSHIM_LOG_FORMAT");

	log_set_program(program);
	json = config_json;
	/* As the library decides: the variable, when set, over the config. */
	if (format != NULL && *format != '\0') {
		if (strcmp(format, "json") == 0)
			json = true;
		else if (strcmp(format, "text") == 0)
			json = false;
		else if (!warned++)
			cli_log(LOG_WARN, "bulkshim: ", "BULKSHIM_LOG_FORMAT=%s is not text or json; "
			    "using %s", format, json ? "json" : "text");
	}
}

bool
cli_log_json(void)
{
	return json;
}

void
cli_log(int level, const char *prefix, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	if (!json) {
		fputs(prefix, stderr);
		vfprintf(stderr, fmt, ap);
		fputc('\n', stderr);
		va_end(ap);
		return;
	}
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* Whatever the message holds (a name from Redis, an error from a
	 * config), the object stays one line: emit_json escapes and scrubs. */
	fflush(stderr);
	log_json_message(level, msg);
}
