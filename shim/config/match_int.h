/* match_int.h - private to match.c and match_parse.c. */
#ifndef BULKSHIM_MATCH_INT_H
#define BULKSHIM_MATCH_INT_H

#include "config/match.h"

#define PORT_ANY_LO	0
#define PORT_ANY_HI	65535
#define HOST_LEN_MAX	253	/* without a trailing dot */
void match_set_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
char match_lower(char c);
void match_map_ipv4(uint8_t addr[16], const void *in4);
int match_inet_key(const struct sockaddr *sa, socklen_t len, uint8_t addr[16], uint16_t *port);
size_t match_unix_key(const struct sockaddr *sa, socklen_t len, char key[BS_UNIX_PATH_MAX + 1]);
void match_rule_text(const struct rule *r, char *buf, size_t len);

#endif
