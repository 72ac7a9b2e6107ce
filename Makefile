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
# What the code needs is added also to a CFLAGS given on the command line
# (`make CFLAGS=-O3`), which would otherwise replace it.
override CFLAGS += -std=gnu11 -D_GNU_SOURCE -fPIC $(WARN)
PKGS    := libconfig
PC_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PC_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -lconfig)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null || echo -lcmocka)
# hiredis is the fleet agent's (tools/fleet*.c): the CLI links it, the shim never does.
HIREDIS_LIBS := $(shell pkg-config --libs hiredis 2>/dev/null || echo -lhiredis)
# libcurl is the drill's URL probes' (tools/drill_probe.c): the CLI links it, the shim never does.
CURL_CFLAGS := $(shell pkg-config --cflags libcurl 2>/dev/null)
CURL_LIBS := $(shell pkg-config --libs libcurl 2>/dev/null || echo -lcurl)

# The shim's sources, by layer: shim/interpose/ (the exported names and what each process keeps
# for itself), shim/admit/ (admission and the counts in the shared segment), shim/config/ (the
# configuration and the destination rules); beside them bulkshim.h, seg_layout.h (the segment's
# layout), log.c and sys.c serve all three. Objects are named by their file alone, so every
# source name is unique across the folders.
SHIM_DIRS := shim/interpose shim/admit shim/config shim
vpath %.c $(SHIM_DIRS)
SHIM_H  := $(wildcard shim/*.h shim/*/*.h) kernel/kern.h
# What the shim and the CLI share; the files of shim/interpose/ are the shim's own.
COMMON  := config_load config_file config_setting config_comp config_pool config_fleet \
           config_resolve config_adaptive match_parse match_learn match_table segment adaptive ad_step \
           ad_published ad_dispatch limit tally share pool stats slot proc reconcile kjoint permit \
           drill repair guard mappers log sys
INTERPOSE := $(patsubst shim/interpose/%.c,%,$(wildcard shim/interpose/*.c))
SHIM_O  := $(COMMON:%=$(B)/shim/%.o) $(INTERPOSE:%=$(B)/shim/%.o)
CLI_O   := $(COMMON:%=$(B)/cli/%.o) $(patsubst tools/%.c,$(B)/cli/%.o,$(wildcard tools/*.c)) \
           $(B)/cli/web_page.o
HELPERS := $(patsubst tests/helpers/%.c,$(B)/tests/%,$(wildcard tests/helpers/*.c))
UNITS   := $(patsubst tests/unit/%.c,$(B)/tests/%,$(wildcard tests/unit/test_*.c))

.PHONY: all test check deps unit integration preload clean install uninstall deb deb-test
all: $(B)/libbulkshim.so $(B)/bulkshim

# The library is built with link-time optimisation: one counted call runs
# through the wrappers, permit.c, slot.c and tally.c, and LTO inlines across
# them what a per-file build calls. `make SHIM_LTO=` turns it off.
SHIM_LTO ?= -flto=auto
# Its calls into libc (errno, fstat, the clock) go through the GOT without a
# PLT stub: the library is linked -z now, so nothing is bound lazily anyway.
SHIM_CODE := -fvisibility=hidden -fno-plt
$(B)/shim/%.o: %.c $(SHIM_H) | $(B)/shim
	$(CC) $(CFLAGS) $(SHIM_LTO) $(if $(SHIM_LTO),-DBS_LTO) $(SHIM_CODE) -Ishim $(PC_CFLAGS) -c -o $@ $<
$(B)/cli/%.o: %.c $(SHIM_H) | $(B)/cli
	$(CC) $(CFLAGS) -Ishim $(PC_CFLAGS) -c -o $@ $<
$(B)/cli/%.o: tools/%.c tools/cli.h $(SHIM_H) $(B)/cli/libdir | $(B)/cli
	$(CC) $(CFLAGS) -Ishim $(PC_CFLAGS) -DBS_LIBDIR='"$(LIBDIR)/bulkshim"' -c -o $@ $<
# The web page that `bulkshim serve` answers, linked in with .incbin (a
# pattern, so that the sanitizer builds in tests/hardening.mk get it too).
%/cli/web_page.o: tools/web/page.S tools/web/index.html
	@mkdir -p $(@D)
	$(CC) -c -o $@ tools/web/page.S
$(B)/cli/cmd_serve.o $(B)/cli/serve_web.o: tools/serve.h
# Where `bulkshim run` looks for the installed library; a changed LIBDIR
# (make install PREFIX=...) rebuilds the CLI.
$(B)/cli/libdir: FORCE | $(B)/cli
	@echo '$(LIBDIR)/bulkshim' | cmp -s - $@ || echo '$(LIBDIR)/bulkshim' > $@
FORCE:

$(B)/libbulkshim.so: $(SHIM_O)
	$(CC) $(CFLAGS) $(SHIM_LTO) $(SHIM_CODE) $(LDFLAGS) -shared -o $@ $^ $(PC_LIBS) -ldl -lpthread -Wl,-z,now -Wl,-z,nodelete
$(B)/bulkshim: $(CLI_O)
	$(CC) $(LDFLAGS) -o $@ $^ $(PC_LIBS) $(HIREDIS_LIBS) $(CURL_LIBS) -lm -lpthread
$(B)/cli/fleet.o $(B)/cli/fleet_redis.o $(B)/cli/fleet_script.o $(B)/cli/fleet_view.o \
	$(B)/cli/fleet_seg.o $(B)/cli/cmd_metrics.o: tools/fleet.h
$(B)/cli/fleet_script.o: tools/fleet.lua
$(B)/cli/cmd_drill.o $(B)/cli/drill_seg.o $(B)/cli/drill_probe.o $(B)/cli/drill_verdict.o \
	$(B)/cli/drill_plot.o: tools/drill.h
$(B)/cli/drill_probe.o: override CFLAGS += $(CURL_CFLAGS)

$(B)/tests/%: tests/helpers/%.c | $(B)/tests
	$(CC) $(CFLAGS) -o $@ $< -lpthread
# A unit test may include the sources it tests (to reach their statics):
# the objects of those are left out of its link.
unit_includes = $(patsubst %,$(2)/%.o,$(shell sed -n \
	's|^\#include "\.\./\.\./shim/\(.*/\)\{0,1\}\([a-z_]*\)\.c"|\2|p' $(1)))
$(B)/tests/test_%: tests/unit/test_%.c $(wildcard tests/unit/*.h) $(COMMON:%=$(B)/cli/%.o) $(SHIM_H) | $(B)/tests
	$(CC) $(CFLAGS) -Ishim $(PC_CFLAGS) -o $@ $< \
		$(filter-out $(call unit_includes,$<,$(B)/cli),$(COMMON:%=$(B)/cli/%.o)) \
		$(PC_LIBS) $(CMOCKA_LIBS) -lpthread

# The segment access unit includes the CLI's files that it tests, and so does the
# unit of the views' abbreviations.
$(B)/tests/test_seg_access: tools/seg_access.c tools/fleet_seg.c tools/cli.h tools/fleet.h
$(B)/tests/test_abbrev: tools/cli_format.c tools/cli.h
# The drill's verdict unit includes the CLI's files of the verdict and the drill's words.
$(B)/tests/test_drill_verdict: tools/drill_verdict.c tools/drill_seg.c tools/cli_format.c \
	tools/drill.h tools/cli.h

# The fleet lease unit drives the agent's Redis calls against a redis-server of its own: it
# links the CLI's fleet objects and hiredis instead of the shim's shared code.
FLEET_LEASE_O = $(B)/cli/fleet_redis.o $(B)/cli/fleet_script.o
$(B)/tests/test_fleet_lease: tests/unit/test_fleet_lease.c $(FLEET_LEASE_O) tools/fleet.h \
		$(SHIM_H) | $(B)/tests
	$(CC) $(CFLAGS) -Ishim -Itools $(PC_CFLAGS) -o $@ $< $(FLEET_LEASE_O) $(HIREDIS_LIBS) \
		$(CMOCKA_LIBS)

$(B) $(B)/shim $(B)/cli $(B)/tests:
	mkdir -p $@

# `make test` first installs what a fresh Debian machine lacks, then builds
# in a second make so that pkg-config sees the new packages.
test: deps
	$(MAKE) --no-print-directory all $(UNITS) $(HELPERS)
	$(MAKE) --no-print-directory check
check: unit integration demo-test chaos-short deb-test
unit: $(UNITS)
	@sh tests/run-units.sh $(UNITS)
# Real programs, by subject: tests/{preload,cli,kernel,fleet,web,docs}; TESTS= passes folders
# and name filters to the runner (make integration TESTS="tests/cli test_hostile").
integration: all $(HELPERS)
	@python3 tests/lib/run.py $(TESTS)
# The name the integration tests had when they all lived in tests/preload.
preload: integration
deps:
	@sh tests/deps.sh

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/bulkshim $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man7 $(DESTDIR)$(DOCDIR)/configs
	install -m 755 $(B)/bulkshim $(DESTDIR)$(BINDIR)/bulkshim
	install -m 755 $(B)/libbulkshim.so $(DESTDIR)$(LIBDIR)/bulkshim/libbulkshim.so
	for m in man1/bulkshim.1 man5/bulkshim.conf.5 man7/libbulkshim.7; do \
		sed -e 's|/usr/local/lib/bulkshim|$(LIBDIR)/bulkshim|g' \
		    -e 's|/usr/local/share/doc/bulkshim|$(DOCDIR)|g' \
		    -e 's|/usr/local/bin/bulkshim|$(BINDIR)/bulkshim|g' man/$${m#*/} > $(DESTDIR)$(MANDIR)/$$m && \
		chmod 644 $(DESTDIR)$(MANDIR)/$$m || exit 1; \
	done
	install -m 644 configs/*.cfg $(DESTDIR)$(DOCDIR)/configs/
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/bulkshim $(DESTDIR)$(LIBDIR)/bulkshim/libbulkshim.so \
		$(DESTDIR)$(MANDIR)/man1/bulkshim.1 $(DESTDIR)$(MANDIR)/man5/bulkshim.conf.5 \
		$(DESTDIR)$(MANDIR)/man7/libbulkshim.7
	rm -rf $(DESTDIR)$(DOCDIR)
	-rmdir $(DESTDIR)$(LIBDIR)/bulkshim

clean:
	rm -rf $(B)

# The Debian package, built by dpkg-buildpackage from debian/ in a copy of
# the tree (so that nothing lands beside it): $(B)/deb/bulkshim_*.deb.
deb:
	rm -rf $(B)/deb && mkdir -p $(B)/deb/src
	tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C $(B)/deb/src
	cd $(B)/deb/src && dpkg-buildpackage -b -uc -us
	@ls $(B)/deb/*.deb
# As root: lintian, apt-get install, a preloaded curl limited, the units, apt-get purge.
deb-test: deb
	@python3 tests/ops/test_package.py $$(ls $(B)/deb/bulkshim_*.deb | grep -v dbgsym | head -1)

# Fragments of the demo, the hardening runs and the benchmarks.
-include demo/demo.mk
-include demo/fleet.mk
-include tests/hardening.mk
-include tests/model/model.mk
-include bench/bench.mk
-include bench/adaptive.mk
-include bench/fleet.mk
# The kernel engine adds to the CLI's link: after the fragments above.
-include kernel/kernel.mk
