/* fleet_script.c - tools/fleet.lua, the lease renewal script, built into the bulkshim binary. */
#include "fleet.h"

/* The assembler copies the file in at build time (the Makefile makes this
 * object depend on it); a NUL follows so that it is one C string. */
__asm__(".section .rodata\n"
	".global fleet_lua\n"
	".type fleet_lua, @object\n"
	"fleet_lua:\n"
	".incbin \"tools/fleet.lua\"\n"
	".byte 0\n"
	".size fleet_lua, . - fleet_lua\n"
	".previous\n");
