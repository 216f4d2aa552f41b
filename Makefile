# stoker build. `make` builds the library, CLI and C tests (release mode).
#   make run    - the README's main job: build, make the default dataset, bench it
#   make test   - the README's test command: every suite, every sanitizer mode
# MODE=release|asan|tsan picks the build flavour (build/$(MODE)/).
# WERROR=1 (default in this repository) turns warnings into errors; packagers
# building downstream can pass WERROR=0.
#   make install [PREFIX=/usr/local] [DESTDIR=/stage]
#               - the header, libstoker.a, libstoker.so (soname
#                 libstoker.so.MAJOR), stoker.pc, the `stoker` tool, its man
#                 page and the docs
#   make uninstall (same PREFIX/DESTDIR) removes exactly those files.
#   The Python package installs with pip (pyproject.toml, setup.py): see README.

MODE ?= release
WERROR ?= 1
CC ?= gcc
PYTHON ?= /usr/bin/python3
B := build/$(MODE)

WARN := -Wall -Wextra -Wshadow -Wconversion -Wstrict-prototypes -Wmissing-prototypes \
        -Wvla -Wformat=2 -Wundef -Wpointer-arith -Wcast-qual -Wnull-dereference
ifeq ($(WERROR),1)
WARN += -Werror
endif

BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -g -pthread -Iinclude -Isrc $(WARN)
ifeq ($(MODE),release)
OPT := -O2
else ifeq ($(MODE),asan)
OPT := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
else ifeq ($(MODE),tsan)
OPT := -O1 -fsanitize=thread
else
$(error MODE must be release, asan or tsan)
endif

CFLAGS_ALL := $(BASE_CFLAGS) $(OPT) $(CFLAGS)
# The libraries libstoker links, listed once: stoker.pc's Libs.private,
# python/Makefile and setup.py (pip install) read this line.
LIB_DEPS := -ljpeg -lspng -lxxhash -lzstd -lsnappy -lz -ljansson -lcurl -ldl -lpthread -lm
LDLIBS_ALL := $(LIB_DEPS) $(LDLIBS)
LDFLAGS_ALL := $(filter -fsanitize=%,$(OPT)) -pthread $(LDFLAGS)

# The version lives in include/stoker.h (STK_VERSION_MAJOR/MINOR/PATCH) and
# nowhere else: the shared library's file name and soname and stoker.pc read it
# from there, as setup.py does for the Python package.
version_part = $(shell sed -n 's/^\#define STK_VERSION_$(1)  *\([0-9][0-9]*\)$$/\1/p' include/stoker.h)
VERSION_MAJOR := $(call version_part,MAJOR)
VERSION_MINOR := $(call version_part,MINOR)
VERSION_PATCH := $(call version_part,PATCH)
ifeq ($(words $(VERSION_MAJOR) $(VERSION_MINOR) $(VERSION_PATCH)),3)
VERSION := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)
else
$(error cannot read STK_VERSION_MAJOR/MINOR/PATCH from include/stoker.h)
endif
SONAME := libstoker.so.$(VERSION_MAJOR)
SOFILE := libstoker.so.$(VERSION)

LIB_SRCS := $(sort $(wildcard src/*.c src/*/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/obj/%.o)

# CUDA: the device stage's conversion kernel (src/device/kernels.cu) is built
# by nvcc when there is one (on PATH, or the toolkit in /usr/local/cuda), into
# a fatbin the library carries as bytes (src/device/kernels_blob.S); nothing
# links against CUDA, which is loaded at run time (src/device/cuda.c). Without
# nvcc the library is built without kernels (`make NVCC=` forces that):
# device="cuda" then copies uint8 batches but refuses float conversion.
# SASS for Turing..Blackwell, plus PTX of the newest for GPUs after them.
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
CUDA_ARCHS ?= 75 80 86 89 90 100 120
NVCC_FLAGS := -O2 -Isrc $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
              -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
ifneq ($(NVCC),)
FATBIN := $(B)/gen/kernels.fatbin
LIB_OBJS += $(B)/obj/src/device/kernels_blob.o
CFLAGS_ALL += -DSTK_HAVE_CUDA_KERNELS=1
endif

# Test hooks (stk__alloc_fail_after, stk__iofault_arm, ...; src/internal.h)
# exist only in the test library, as SQLite's SQLITE_TEST: the installed
# libstoker.a/.so are built without STK_TEST; build/MODE/libstoker_test.a,
# which the C tests link, holds the same objects except that the sources that
# mention STK_TEST are compiled again with -DSTK_TEST (into obj-test/). Headers
# use STK_TEST only around declarations, so every other object is the same in
# both libraries.
HOOK_SRCS := $(shell grep -lw STK_TEST $(LIB_SRCS))
TEST_LIB_OBJS := $(filter-out $(HOOK_SRCS:%.c=$(B)/obj/%.o),$(LIB_OBJS)) \
                 $(HOOK_SRCS:%.c=$(B)/obj-test/%.o)

TOOL_SRCS := $(sort $(wildcard tools/*.c))
TEST_SRCS := $(sort $(wildcard tests/c/test_*.c))
TEST_UTIL := tests/c/testutil.c
TEST_BINS := $(TEST_SRCS:tests/c/%.c=$(B)/tests/%)

.PHONY: all lib tools tests deps run test check-docs clean python install uninstall cuda-status
all: lib tools tests

lib: $(B)/libstoker.a $(B)/libstoker.so
tools: $(B)/stoker
tests: $(TEST_BINS) $(B)/tests/libmockcuda.so

$(B)/obj/%.o: %.c $(wildcard include/*.h src/*.h src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fvisibility=hidden -c $< -o $@

$(B)/obj-test/%.o: %.c $(wildcard include/*.h src/*.h src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DSTK_TEST -fvisibility=hidden -c $< -o $@

$(B)/gen/kernels.fatbin: src/device/kernels.cu src/ops/convert.h
	@mkdir -p $(dir $@)
	$(NVCC) --fatbin $(NVCC_FLAGS) -o $@ $<

$(B)/obj/src/device/kernels_blob.o: src/device/kernels_blob.S $(FATBIN)
	@mkdir -p $(dir $@)
	$(CC) -c -DSTK_FATBIN='"$(FATBIN)"' -o $@ $<

# Which way the CUDA kernels were built, for `make test` to say.
cuda-status:
	@if [ -n "$(NVCC)" ]; then echo "CUDA kernels: built with $(NVCC) (sm $(CUDA_ARCHS) + PTX)"; \
	 else echo "CUDA kernels: skipped (no nvcc found); device=\"cuda\" copies uint8 only"; fi

$(B)/libstoker.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/libstoker_test.a: $(TEST_LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The shared library as a system installs it: the file carries the full
# version, its soname the major one (what programs record and the loader
# looks for), and libstoker.so (what -lstoker finds at link time) points at it.
$(B)/$(SOFILE): $(LIB_OBJS)
	$(CC) -shared $(LDFLAGS_ALL) -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS_ALL)

$(B)/libstoker.so: $(B)/$(SOFILE)
	ln -sfn $(SOFILE) $(B)/$(SONAME)
	ln -sfn $(SONAME) $@

# The tool is built on the public API alone: its sources see include/ and
# not src/ (tests/py/test_public_api.py checks the same by reading them).
TOOL_CFLAGS := $(filter-out -Isrc,$(CFLAGS_ALL))
$(B)/stoker: $(TOOL_SRCS) $(wildcard tools/*.h) $(B)/libstoker.a include/stoker.h
	$(CC) $(TOOL_CFLAGS) -o $@ $(TOOL_SRCS) $(B)/libstoker.a $(LDFLAGS_ALL) $(LDLIBS_ALL)

$(B)/tests/%: tests/c/%.c $(TEST_UTIL) tests/c/testutil.h $(B)/libstoker_test.a $(wildcard tools/*.c tools/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DSTK_TEST -Wno-conversion -o $@ $< $(TEST_UTIL) $(TEST_TOOLS_LIB) $(B)/libstoker_test.a $(LDFLAGS_ALL) $(LDLIBS_ALL)

# The tool's code but its main() (tools/stoker.c), for tests that call the
# subcommands directly (test_shards, test_mt_pack) instead of including .c files.
TOOL_LIB_SRCS := $(filter-out tools/stoker.c,$(TOOL_SRCS))
TOOL_LIB_OBJS := $(TOOL_LIB_SRCS:%.c=$(B)/obj/%.o)
$(B)/obj/tools/%.o: tools/%.c $(wildcard tools/*.h) include/stoker.h
	@mkdir -p $(dir $@)
	$(CC) $(TOOL_CFLAGS) -c $< -o $@
$(B)/libstoker_tools.a: $(TOOL_LIB_OBJS)
	rm -f $@ && ar rcs $@ $^
$(B)/tests/test_shards $(B)/tests/test_mt_pack: $(B)/libstoker_tools.a
$(B)/tests/test_shards $(B)/tests/test_mt_pack: TEST_TOOLS_LIB := $(B)/libstoker_tools.a

# A CPU stand-in for the CUDA driver: test_device runs the CUDA backend
# (src/device/cuda.c) against it through dlopen, as it would a real driver.
$(B)/tests/libmockcuda.so: tests/c/mock_cuda.c src/ops/convert.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Wno-conversion -Wno-missing-prototypes -shared -o $@ $< $(LDFLAGS_ALL)

deps:
	@scripts/install-deps.sh

python: lib
	$(MAKE) -C python MODE=$(MODE)

run: deps
	@scripts/main-job.sh

test: deps
	@scripts/test-all.sh

# Every relative link in README.md and docs/*.md resolves (also run by `make test`).
check-docs:
	@/usr/bin/python3 scripts/check-doc-links.py

# Installation directories (GNU names; override any of them on the command line).
PREFIX ?= /usr/local
bindir ?= $(PREFIX)/bin
libdir ?= $(PREFIX)/lib
includedir ?= $(PREFIX)/include
pkgconfigdir ?= $(libdir)/pkgconfig
docdir ?= $(PREFIX)/share/doc/stoker
mandir ?= $(PREFIX)/share/man
INSTALL ?= install
DOCS := README.md $(sort $(wildcard docs/*.md))

# The man page is made from the tool's own --help (scripts/make-man.sh).
$(B)/stoker.1: $(B)/stoker scripts/make-man.sh
	scripts/make-man.sh $(B)/stoker $@

# Builds what it installs first (MODE=release unless told otherwise). stoker.pc
# is written here, not at build time, because it names the install paths. The
# `stoker` tool is linked against libstoker.a, so it runs without the shared
# library; after installing into a system directory run `ldconfig` so that
# programs linked with -lstoker find libstoker.so.MAJOR.
install: lib tools $(B)/stoker.1
	$(INSTALL) -d $(DESTDIR)$(bindir) $(DESTDIR)$(libdir) $(DESTDIR)$(includedir) \
	    $(DESTDIR)$(pkgconfigdir) $(DESTDIR)$(docdir) $(DESTDIR)$(mandir)/man1
	$(INSTALL) -m 755 $(B)/stoker $(DESTDIR)$(bindir)/stoker
	$(INSTALL) -m 644 include/stoker.h $(DESTDIR)$(includedir)/stoker.h
	$(INSTALL) -m 644 $(B)/libstoker.a $(DESTDIR)$(libdir)/libstoker.a
	$(INSTALL) -m 755 $(B)/$(SOFILE) $(DESTDIR)$(libdir)/$(SOFILE)
	ln -sfn $(SOFILE) $(DESTDIR)$(libdir)/$(SONAME)
	ln -sfn $(SONAME) $(DESTDIR)$(libdir)/libstoker.so
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(libdir)|g' \
	    -e 's|@INCLUDEDIR@|$(includedir)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|@LIB_DEPS@|$(LIB_DEPS)|g' stoker.pc.in >$(DESTDIR)$(pkgconfigdir)/stoker.pc
	chmod 644 $(DESTDIR)$(pkgconfigdir)/stoker.pc
	$(INSTALL) -m 644 $(DOCS) $(DESTDIR)$(docdir)/
	$(INSTALL) -m 644 $(B)/stoker.1 $(DESTDIR)$(mandir)/man1/stoker.1

uninstall:
	rm -f $(DESTDIR)$(bindir)/stoker $(DESTDIR)$(includedir)/stoker.h \
	    $(DESTDIR)$(libdir)/libstoker.a $(DESTDIR)$(libdir)/$(SOFILE) \
	    $(DESTDIR)$(libdir)/$(SONAME) $(DESTDIR)$(libdir)/libstoker.so \
	    $(DESTDIR)$(pkgconfigdir)/stoker.pc $(DESTDIR)$(mandir)/man1/stoker.1 \
	    $(addprefix $(DESTDIR)$(docdir)/,$(notdir $(DOCS)))
	rmdir $(DESTDIR)$(docdir) 2>/dev/null || true

clean:
	rm -rf build
