# Makefile - builds libbulkshim.so and the bulkshim CLI; `make test` runs every test.
-include config.mak

PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
LIBDIR  ?= $(PREFIX)/lib
MANDIR  ?= $(PREFIX)/share/man
DOCDIR  ?= $(PREFIX)/share/doc/bulkshim
DESTDIR ?=

CC      ?= cc
B       := build
WARN    := -Wall -Wextra -Wstrict-prototypes -Wmissing-prototypes -Wshadow \
           -Wpointer-arith -Wcast-qual -Wformat-security \
           -Werror=implicit-function-declaration
CFLAGS  ?= -O2 -g
CFLAGS  += -std=gnu11 -D_GNU_SOURCE -fPIC $(WARN)
PKGS    := libconfig
PC_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PC_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -lconfig)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null || echo -lcmocka)

# What the shim and the CLI share; interpose.c, io.c, init.c and real.c are the shim's own.
COMMON  := config config_setting config_comp config_resolve match match_parse segment procs permit \
           tally fdtable log
SHIM_O  := $(COMMON:%=$(B)/shim/%.o) $(B)/shim/real.o $(B)/shim/interpose.o $(B)/shim/io.o \
           $(B)/shim/init.o
CLI_O   := $(COMMON:%=$(B)/cli/%.o) $(patsubst tools/%.c,$(B)/cli/%.o,$(wildcard tools/*.c))
HELPERS := $(patsubst tests/helpers/%.c,$(B)/tests/%,$(wildcard tests/helpers/*.c))
UNITS   := $(patsubst tests/unit/%.c,$(B)/tests/%,$(wildcard tests/unit/test_*.c))

.PHONY: all test check deps unit preload clean install uninstall
all: $(B)/libbulkshim.so $(B)/bulkshim

$(B)/shim/%.o: shim/%.c shim/shim.h | $(B)/shim
	$(CC) $(CFLAGS) -fvisibility=hidden $(PC_CFLAGS) -c -o $@ $<
$(B)/cli/%.o: shim/%.c shim/shim.h | $(B)/cli
	$(CC) $(CFLAGS) $(PC_CFLAGS) -c -o $@ $<
$(B)/cli/%.o: tools/%.c tools/cli.h shim/shim.h $(B)/cli/libdir | $(B)/cli
	$(CC) $(CFLAGS) -Ishim $(PC_CFLAGS) -DBS_LIBDIR='"$(LIBDIR)/bulkshim"' -c -o $@ $<
# Where `bulkshim run` looks for the installed library; a changed LIBDIR
# (make install PREFIX=...) rebuilds the CLI.
$(B)/cli/libdir: FORCE | $(B)/cli
	@echo '$(LIBDIR)/bulkshim' | cmp -s - $@ || echo '$(LIBDIR)/bulkshim' > $@
FORCE:

$(B)/libbulkshim.so: $(SHIM_O)
	$(CC) -shared -o $@ $^ $(PC_LIBS) -ldl -lpthread -Wl,-z,now -Wl,-z,nodelete
$(B)/bulkshim: $(CLI_O)
	$(CC) -o $@ $^ $(PC_LIBS) -lpthread

$(B)/tests/%: tests/helpers/%.c | $(B)/tests
	$(CC) $(CFLAGS) -o $@ $< -lpthread
$(B)/tests/test_%: tests/unit/test_%.c $(wildcard tests/unit/*.h) $(COMMON:%=$(B)/cli/%.o) shim/shim.h | $(B)/tests
	$(CC) $(CFLAGS) -Ishim $(PC_CFLAGS) -o $@ $< $(filter-out $(B)/cli/$*.o,$(COMMON:%=$(B)/cli/%.o)) \
		$(PC_LIBS) $(CMOCKA_LIBS) -lpthread

$(B) $(B)/shim $(B)/cli $(B)/tests:
	mkdir -p $@

# `make test` first installs what a fresh Debian machine lacks, then builds
# in a second make so that pkg-config sees the new packages.
test: deps
	$(MAKE) --no-print-directory all $(UNITS) $(HELPERS)
	$(MAKE) --no-print-directory check
check: unit preload demo-test chaos-short
unit: $(UNITS)
	@sh tests/run-units.sh $(UNITS)
preload: all $(HELPERS)
	@python3 tests/preload/run.py
deps:
	@sh tests/deps.sh

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/bulkshim $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man7 $(DESTDIR)$(DOCDIR)/configs
	install -m 755 $(B)/bulkshim $(DESTDIR)$(BINDIR)/bulkshim
	install -m 755 $(B)/libbulkshim.so $(DESTDIR)$(LIBDIR)/bulkshim/libbulkshim.so
	install -m 644 man/bulkshim.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 644 man/bulkshim.conf.5 $(DESTDIR)$(MANDIR)/man5/
	install -m 644 man/libbulkshim.7 $(DESTDIR)$(MANDIR)/man7/
	install -m 644 configs/*.cfg $(DESTDIR)$(DOCDIR)/configs/
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/bulkshim $(DESTDIR)$(LIBDIR)/bulkshim/libbulkshim.so \
		$(DESTDIR)$(MANDIR)/man1/bulkshim.1 $(DESTDIR)$(MANDIR)/man5/bulkshim.conf.5 \
		$(DESTDIR)$(MANDIR)/man7/libbulkshim.7
	rm -rf $(DESTDIR)$(DOCDIR)
	-rmdir $(DESTDIR)$(LIBDIR)/bulkshim

clean:
	rm -rf $(B)

# Fragments of the demo, the hardening runs and the benchmarks.
-include tools/demo/demo.mk
-include tests/hardening.mk
-include bench/bench.mk
# The kernel engine adds to the CLI's link: after the fragments above.
-include kernel/kernel.mk
