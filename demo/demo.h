/* demo.h - what the demo's shop, backend and load generator share. */
#ifndef BULKSHIM_DEMO_H
#define BULKSHIM_DEMO_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Parses "A.B.C.D:PORT" into *sa. Returns 0 or -EINVAL. */
static inline int
demo_parse_addr(const char *text, struct sockaddr_in *sa)
{
	char host[64], *end;
	const char *colon = strrchr(text, ':');
	unsigned long port;

	if (colon == NULL || (size_t)(colon - text) >= sizeof(host))
		return -EINVAL;
	memcpy(host, text, (size_t)(colon - text));
	host[colon - text] = '\0';
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno != 0 || *end != '\0' || end == colon + 1 || port > 65535)
		return -EINVAL;
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -EINVAL;
}

#endif
