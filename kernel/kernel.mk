# kernel/kernel.mk - the kernel engine: BPF object, bpftool skeleton, and the loader linked into the CLI.
#
# Included by the main Makefile after the other fragments (it adds to the
# CLI's link, plain and sanitized). The skeleton is generated into
# $(B)/kern, never committed. The BPF program reads only the UAPI context
# of its hooks (struct bpf_sock_addr, struct bpf_sock), so it builds from
# <linux/bpf.h> and needs no vmlinux.h from the build machine's kernel.

BPF_CLANG  ?= clang
BPFTOOL    ?= bpftool
BPF_LIBS   := $(shell pkg-config --libs libbpf 2>/dev/null || echo -lbpf -lelf -lz)
BPF_CFLAGS_USER := $(shell pkg-config --cflags libbpf 2>/dev/null)
BPF_ARCH_INC := /usr/include/$(shell $(CC) -dumpmachine)
KERN_SRC   := $(filter-out %.bpf.c,$(wildcard kernel/*.c))
KERN_O     := $(KERN_SRC:kernel/%.c=$(B)/kern/%.o)
KERN_ASAN_O := $(KERN_SRC:kernel/%.c=$(B)/asan/kern/%.o)
KERN_H     := kernel/engine.h kernel/kern.h $(SHIM_H)

$(B)/kern/bulkshim.bpf.o: kernel/bulkshim.bpf.c kernel/kern.h | $(B)/kern
	$(BPF_CLANG) -g -O2 -Wall -Werror -target bpf -mcpu=v3 -Ikernel -I$(BPF_ARCH_INC) \
		-c -o $@ $<
$(B)/kern/bulkshim.skel.h: $(B)/kern/bulkshim.bpf.o
	$(BPFTOOL) gen skeleton $< name bulkshim_bpf > $@.tmp && mv $@.tmp $@
$(B)/kern/%.o: kernel/%.c $(KERN_H) $(B)/kern/bulkshim.skel.h | $(B)/kern
	$(CC) $(CFLAGS) -Ishim -I$(B)/kern $(BPF_CFLAGS_USER) $(PC_CFLAGS) -c -o $@ $<
$(B)/asan/kern/%.o: kernel/%.c $(KERN_H) $(B)/kern/bulkshim.skel.h | $(B)/asan/kern
	$(CC) $(CFLAGS) $(SAN_FLAGS) -Ishim -I$(B)/kern $(BPF_CFLAGS_USER) $(PC_CFLAGS) -c -o $@ $<
$(B)/kern $(B)/asan/kern:
	mkdir -p $@

# The CLI links the engine and libbpf; its subcommands see engine.h.
$(B)/cli/cmd_kernel.o $(B)/asan/cli/cmd_kernel.o: $(KERN_H)
$(B)/bulkshim: $(KERN_O)
$(B)/bulkshim: PC_LIBS += $(BPF_LIBS)
$(B)/asan/bulkshim: $(KERN_ASAN_O)
$(B)/asan/bulkshim: PC_LIBS += $(BPF_LIBS)
.SECONDARY: $(KERN_ASAN_O)

# ---- tests: clients no preload can reach, and the chaos run under the engine ----

KERN_HELPERS := $(B)/tests/kclient $(B)/tests/kclient_static $(B)/tests/goclient_static \
                $(B)/tests/goclient_cgo
GO_ENV := HOME=$(abspath $(B))/go GOCACHE=$(abspath $(B))/go/cache GOPATH=$(abspath $(B))/go \
          GOFLAGS=-mod=mod GOPROXY=off
GO_SRC := tests/kernel/goclient/main.go tests/kernel/goclient/go.mod

.PHONY: kernel-helpers chaos-kernel chaos-kernel-short
kernel-helpers: $(KERN_HELPERS)
integration check-sanitize: kernel-helpers
chaos: chaos-kernel
chaos-short: chaos-kernel-short

$(B)/tests/kclient: tests/kernel/kclient.c | $(B)/tests
	$(CC) $(CFLAGS) -o $@ $< -luring
$(B)/tests/kclient_static: tests/kernel/kclient.c | $(B)/tests
	$(CC) $(CFLAGS) -static -o $@ $< -luring
# Go's runtime makes its own system calls: static (CGO_ENABLED=0) and with
# cgo, which links libc but still connects without it.
$(B)/tests/goclient_static: $(GO_SRC) | $(B)/tests
	cd tests/kernel/goclient && $(GO_ENV) CGO_ENABLED=0 go build -o $(abspath $@) .
$(B)/tests/goclient_cgo: $(GO_SRC) | $(B)/tests
	cd tests/kernel/goclient && $(GO_ENV) CGO_ENABLED=1 go build -tags netcgo -o $(abspath $@) .

# Skipped, with the reason, where this machine cannot load BPF programs.
# -k: the engine alone; -m -S: the engine and the library on the same
# compartments, with one count, while workers also make children with
# posix_spawn and vfork.
chaos-kernel: chaos-bin
	@if r=$$(sh tests/kernel/can_load.sh); then \
		$(B)/tests/chaos -b $(B) -k -t $(CHAOS_SECONDS) && \
		$(B)/tests/chaos -b $(B) -m -S -t $(CHAOS_SECONDS); \
	else echo "chaos -k, -m -S: skipped: $$r"; fi
chaos-kernel-short: chaos-bin
	@if r=$$(sh tests/kernel/can_load.sh); then \
		$(B)/tests/chaos -b $(B) -k -t $(CHAOS_SHORT_SECONDS) && \
		$(B)/tests/chaos -b $(B) -m -S -t $(CHAOS_SHORT_SECONDS); \
	else echo "chaos -k, -m -S: skipped: $$r"; fi

# ---- benchmark: connect + close with the kernel engine, none, and the library ----

.PHONY: bench-kernel
bench: bench-kernel
bench-kernel:
	$(BENCH_MAKE) all bench-build
	python3 bench/kernel.py --build $(B) --out bench/results-kernel.md
