# stoker build. `make` builds the library, CLI and C tests (release mode).
#   make run    - the README's main job: build, make the default dataset, bench it
#   make test   - the README's test command: every suite, every sanitizer mode
# MODE=release|asan|tsan picks the build flavour (build/$(MODE)/).
# WERROR=1 (default in this repository) turns warnings into errors; packagers
# building downstream can pass WERROR=0.

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
LDLIBS_ALL := -ljpeg -lspng -lxxhash -lcurl -lpthread -lm $(LDLIBS)
LDFLAGS_ALL := $(filter -fsanitize=%,$(OPT)) -pthread $(LDFLAGS)

LIB_SRCS := $(sort $(wildcard src/*.c src/*/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/obj/%.o)
TOOL_SRCS := $(sort $(wildcard tools/*.c))
TEST_SRCS := $(sort $(wildcard tests/c/test_*.c))
TEST_UTIL := tests/c/testutil.c
TEST_BINS := $(TEST_SRCS:tests/c/%.c=$(B)/tests/%)

.PHONY: all lib tools tests deps run test clean python
all: lib tools tests

lib: $(B)/libstoker.a $(B)/libstoker.so
tools: $(B)/stoker
tests: $(TEST_BINS)

$(B)/obj/%.o: %.c $(wildcard include/*.h src/*.h src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fvisibility=hidden -c $< -o $@

$(B)/libstoker.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/libstoker.so: $(LIB_OBJS)
	$(CC) -shared $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(B)/stoker: $(TOOL_SRCS) $(B)/libstoker.a include/stoker.h
	$(CC) $(CFLAGS_ALL) -o $@ $(TOOL_SRCS) $(B)/libstoker.a $(LDFLAGS_ALL) $(LDLIBS_ALL)

$(B)/tests/%: tests/c/%.c $(TEST_UTIL) tests/c/testutil.h $(B)/libstoker.a $(wildcard tools/*.c tools/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Wno-conversion -o $@ $< $(TEST_UTIL) $(B)/libstoker.a $(LDFLAGS_ALL) $(LDLIBS_ALL)

deps:
	@scripts/install-deps.sh

python: lib
	$(MAKE) -C python MODE=$(MODE)

run: deps
	@scripts/main-job.sh

test: deps
	@scripts/test-all.sh

clean:
	rm -rf build
