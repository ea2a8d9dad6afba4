# rl: the one build entry point. `make` builds into $(BUILD)/, `make test`
# builds and runs every test, `make asan` / `make tsan` run the same tests
# under the sanitizers in their own build trees.

BUILD   ?= build
CC      ?= cc
SAN     ?=
OPT     ?= -O2
PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc
DESTDIR ?=
VERSION = 0.2.0
# The ABI's number, librl.so.ABI: raised when a struct or a signature of
# rl.h changes so that a gateway built against the old header would misread
# the library (1: rl_agent_counters gave its percentiles up for a
# histogram), and only then.
ABI = 1

CFLAGS_ALL = -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
             -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
             $(OPT) -g -fPIC -fvisibility=hidden -MMD -MP \
             -Iagent -Icommon -Irls -I$(BUILD)/gen -Itests/support \
             -Itests/bench $(SAN) \
             $(CFLAGS)
LDFLAGS_ALL = $(SAN) $(LDFLAGS)

# Link-time optimization with GCC, outside the sanitizer builds: a synced
# check crosses five files (check, synced, keys, decision, stats), and
# inlining across them took it from 35 to 29 ns on the development
# machine. The objects are fat, so a program that links librl.a without
# -flto gets the ordinary code. (clang has no fat LTO objects: no LTO.)
CC_IS_CLANG := $(findstring clang,$(shell $(CC) --version 2>/dev/null))
LTO ?= $(if $(SAN)$(CC_IS_CLANG),,-flto=auto -ffat-lto-objects)
CFLAGS_ALL  += $(LTO)
LDFLAGS_ALL += $(if $(LTO),-flto=auto)
LIB_AR = $(if $(LTO),gcc-ar,ar)

LIB_DEPS  = -lcyaml -lyaml -lhiredis -lssl -lcrypto -luv -lnng -lmsgpackc -lm -lpthread
# Criterion cannot run under ThreadSanitizer (its sandbox maps memory where
# TSan forbids it), so `make tsan` builds the same test files against a
# stand-in for its API: see tests/support/tsan/criterion/criterion.h.
TEST_HARNESS ?= criterion
ifeq ($(TEST_HARNESS),criterion)
TEST_DEPS    = -lcriterion -lhiredis -luv -lnng -lhttp_parser
HARNESS_SRC  =
else
TEST_DEPS    = -lhiredis -luv -lnng -lhttp_parser
HARNESS_SRC  = tests/support/tsan/runner.c
CFLAGS_ALL  += -Itests/support/tsan
endif

LIB_SRC    = $(wildcard common/*.c) $(wildcard agent/*.c)
RLCTL_SRC  = $(wildcard rlctl/*.c)
AGG_SRC    = aggregator/main.c aggregator/ingest.c aggregator/broadcast.c \
             aggregator/windows.c aggregator/service.c aggregator/metrics.c \
             aggregator/agents.c aggregator/window_call.c \
             aggregator/window_args.c aggregator/demand.c \
             aggregator/exchange.c aggregator/regions.c
TEST_SRC   = $(wildcard tests/unit/*.c) $(wildcard tests/integration/*.c) \
             tests/support/test_env.c tests/support/redis_server.c \
             tests/support/test_agent.c tests/support/test_aggregator.c \
             tests/support/test_gateway.c tests/support/test_process.c \
             tests/support/redis_cluster.c tests/support/test_proxy.c \
             tests/support/no_network.c tests/support/fake_aggregator.c \
             tests/support/test_fleet.c tests/support/test_certs.c \
             tests/support/test_rls.c tests/support/test_upstream.c \
             tests/support/test_regions.c aggregator/demand.c \
             $(HARNESS_SRC)
GW_SRC     = $(wildcard gateway/*.c)
# rl-rls's parts that the unit tests link (rls/, issue 30), and its wire
# types: protoc-c makes C of rls/proto's files under $(BUILD)/gen.
RLS_PROTO  = envoy/service/ratelimit/v3/rls.proto \
             envoy/extensions/common/ratelimit/v3/ratelimit.proto \
             envoy/type/v3/ratelimit_unit.proto \
             envoy/config/core/v3/base.proto google/protobuf/duration.proto \
             google/protobuf/wrappers.proto grpc/health/v1/health.proto
RLS_GEN    = $(patsubst %.proto,$(BUILD)/gen/%.pb-c.c,$(RLS_PROTO))
# rl-rls (rls/): every part but main.c is linked into the tests too.
RLS_SRC    = $(filter-out rls/main.c,$(wildcard rls/*.c)) $(RLS_GEN)
RLS_DEPS   = -lprotobuf-c -lnghttp2 -ljansson
RUNNER_SRC = tests/support/with_redis.c tests/support/redis_server.c \
             tests/support/redis_cluster.c

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIB_A   = $(BUILD)/lib/librl.a
LIB_SO  = $(BUILD)/lib/librl.so
SONAME  = librl.so.$(ABI)
HEADER  = $(BUILD)/include/rl.h
RLCTL   = $(BUILD)/bin/rlctl
AGG     = $(BUILD)/bin/rl-aggregator
GATEWAY = $(BUILD)/bin/rl-gateway
RLS     = $(BUILD)/bin/rl-rls
EXAMPLE = $(BUILD)/bin/check-request
TESTS   = $(BUILD)/tests/rl-tests
RUNNER  = $(BUILD)/tests/with-redis
HOLDER  = $(BUILD)/tests/in-flight-holder
BENCH   = $(BUILD)/bench/bench-exact
BENCH_SYNCED = $(BUILD)/bench/bench-synced
BENCH_ACCURACY = $(BUILD)/bench/bench-accuracy
BENCH_CLUSTER = $(BUILD)/bench/bench-cluster
BENCH_ALONE = $(BUILD)/bench/bench-alone
BENCH_OVERRIDES = $(BUILD)/bench/bench-overrides
BENCH_LEASED = $(BUILD)/bench/bench-leased
BENCH_RULE_ASYNC = $(BUILD)/bench/bench-rule-async
BENCH_HOLDS = $(BUILD)/bench/bench-holds
BENCH_IN_FLIGHT = $(BUILD)/bench/bench-in-flight
PROFILE = $(BUILD)/bench/profile
NGINX_MOD = $(BUILD)/nginx/ngx_http_rl_module.so

.PHONY: all deps test test-programs asan tsan bench profile fuzz mutants \
        run run-nginx install install-built clean nginx
.DEFAULT_GOAL := all

all: $(LIB_A) $(LIB_SO) $(HEADER) $(RLCTL) $(AGG) $(GATEWAY) $(RLS) \
     $(EXAMPLE) | deps

deps:
	@sh scripts/deps.sh

$(BUILD)/obj/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

# Every generated header is there before any file that includes one.
$(BUILD)/gen/%.pb-c.c: rls/proto/%.proto | deps
	@mkdir -p $(BUILD)/gen
	cd rls/proto && protoc-c --c_out=$(abspath $(BUILD)/gen) $(RLS_PROTO)

$(call obj,rls/main.c $(RLS_SRC) $(wildcard tests/*/test_rls_*.c)): | $(RLS_GEN)

$(LIB_A): $(call obj,$(LIB_SRC))
	@mkdir -p $(dir $@)
	rm -f $@ && $(LIB_AR) rcs $@ $^

$(LIB_SO): $(call obj,$(LIB_SRC))
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined $(LDFLAGS_ALL) \
	    -o $@ $^ $(LIB_DEPS)

# The name programs linked with -lrl look for at run time.
$(BUILD)/lib/$(SONAME): $(LIB_SO)
	ln -sf librl.so $@

$(HEADER): agent/rl.h
	@mkdir -p $(dir $@)
	cp $< $@

$(RLCTL): $(call obj,$(RLCTL_SRC)) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(AGG): $(call obj,$(AGG_SRC)) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS) -lsystemd

$(GATEWAY): $(call obj,$(GW_SRC)) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS) -lhttp_parser

$(RLS): $(call obj,rls/main.c $(RLS_SRC)) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS) $(RLS_DEPS)

# The example is built against the installed header and the shared
# library, as a gateway would be.
$(EXAMPLE): examples/check_request.c $(HEADER) $(BUILD)/lib/$(SONAME)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -g $(SAN) -I$(BUILD)/include \
	    -o $@ $< -L$(BUILD)/lib -lrl -Wl,-rpath,$(abspath $(BUILD)/lib)

# ngx_http_rl_module (nginx/), built by nginx's own build against
# nginx-dev's sources and the packaged nginx's flags (see
# scripts/nginx-configure.sh), linking librl.a: no librl.so to find at run
# time, and --exclude-libs keeps librl's rl_ symbols inside the module.
# nginx compiles with -W -Wall -Werror; the warnings asked of our own code
# are added, except -Wunused-parameter: nginx's callback types (directive
# setters, phase handlers, process hooks) hand every handler arguments
# some have no use for, and nginx's own build turns it off for that.
NGINX_SRC ?= /usr/share/nginx/src
NGINX_CC_OPT = -Wall -Wextra -Werror -Wno-unused-parameter $(SAN)
# -z nodelete: a worker's exit destroys its cycle's pool, whose cleanup
# dlclose()s the module while threads of the libraries it pulled in (nng's)
# still run; unmapped, they crash the exiting worker (ASan caught it). Kept
# mapped, they end with the process. The cost: a reload does not load a
# new module file; a binary upgrade or a restart does (docs/nginx.md).
NGINX_LIBS = $(abspath $(LIB_A)) -Wl,--exclude-libs,librl.a -Wl,-z,nodelete \
             $(LIB_DEPS) $(SAN)

nginx: $(NGINX_MOD)

# Configured again when this Makefile changes: the flags above are in it.
$(BUILD)/nginx/objs/Makefile: nginx/config scripts/nginx-configure.sh \
                              $(HEADER) Makefile | deps
	bash scripts/nginx-configure.sh $(NGINX_SRC) $(abspath $(BUILD)/nginx) \
	    $(abspath nginx) $(abspath $(BUILD)/include) "$(NGINX_LIBS)" \
	    "$(NGINX_CC_OPT)"

# nginx's Makefile does not know librl.a: the module is linked again each
# time. It runs without our make's command-line variables (CFLAGS, say),
# which are not its own.
$(NGINX_MOD): $(BUILD)/nginx/objs/Makefile $(wildcard nginx/*.c) $(LIB_A)
	rm -f $(BUILD)/nginx/objs/ngx_http_rl_module.so
	env -u MAKEFLAGS -u MAKEOVERRIDES -u MFLAGS make -s \
	    -f $(abspath $(BUILD)/nginx/objs/Makefile) -C $(BUILD)/nginx/src \
	    modules
	cp $(BUILD)/nginx/objs/ngx_http_rl_module.so $@

$(TESTS): $(call obj,$(TEST_SRC) $(RLS_SRC)) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS) $(TEST_DEPS) $(RLS_DEPS)

$(RUNNER): $(call obj,$(RUNNER_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ -lhiredis

# A process that holds in_flight slots until killed (test_in_flight.c).
$(HOLDER): $(call obj,tests/support/in_flight_holder.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

BENCH_EXACT_SRC = tests/bench/bench_exact.c tests/bench/bench_pipeline.c \
                  tests/bench/bench_capacity.c \
                  tests/bench/bench_peer.c tests/bench/bench_alternatives.c

$(BENCH): $(call obj,$(BENCH_EXACT_SRC)) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

# The benchmarks call librl across a library boundary, as a gateway does
# (librl.so is link-time optimized inside; the installed librl.a is plain
# code): their own objects carry no LTO bytecode, so no check is inlined
# into a benchmark's loop. Inlined there, two threads ran at 65 ns a check
# instead of 43.
$(BUILD)/obj/tests/bench/%.o: LTO =

# Benchmarks are not tests: they report figures (ratios against a ceiling
# measured in the same run), they do not pass or fail on speed.
$(BENCH_SYNCED): $(call obj,tests/bench/bench_synced.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(BENCH_ACCURACY): $(call obj,tests/bench/bench_accuracy.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(BENCH_CLUSTER): $(call obj,tests/bench/bench_cluster.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(BENCH_ALONE): $(call obj,tests/bench/bench_alone.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(BENCH_OVERRIDES): $(call obj,tests/bench/bench_overrides.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(BENCH_LEASED): $(call obj,tests/bench/bench_leased.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(BENCH_RULE_ASYNC): $(call obj,tests/bench/bench_rule_async.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(BENCH_HOLDS): $(call obj,tests/bench/bench_holds.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(BENCH_IN_FLIGHT): $(call obj,tests/bench/bench_in_flight.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

$(PROFILE): $(call obj,tests/bench/profile.c tests/bench/bench_pipeline.c) \
            $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIB_DEPS)

# Not part of `make test`: starts its own redis-server (and a cluster, an
# rl-aggregator, and nginx for tests/bench/bench_nginx.sh), installs the
# Node.js peer into $(BUILD)/bench/node, writes $(BUILD)/bench/report.md
# and $(BUILD)/bench/bench.png.
# RL_BENCH_QUICK=1 for a short try-out run (its figures are not for quoting).
bench: all $(BENCH) $(BENCH_SYNCED) $(BENCH_ACCURACY) $(BENCH_CLUSTER) \
       $(BENCH_ALONE) $(BENCH_OVERRIDES) $(BENCH_LEASED) $(RUNNER) $(TESTS) \
       $(NGINX_MOD) $(RLS) $(BENCH_RULE_ASYNC) $(BENCH_HOLDS) \
       $(BENCH_IN_FLIGHT)
	@sh scripts/bench.sh $(BUILD) $(TEST_ENV)

# Instruction counts with callgrind (valgrind is installed for this target
# only): a synced check, and rl's function against the seed's script inside
# redis-server. Writes $(BUILD)/profile/profile.md. See scripts/profile.sh.
profile: all $(PROFILE) $(RUNNER)
	@sh scripts/deps.sh valgrind
	@sh scripts/profile.sh $(BUILD)

# Installs under $(DESTDIR)$(PREFIX); the example config only if there is
# none yet (an operator's rules are never overwritten). install-built
# installs what $(BUILD) holds without building (the tests use it). The
# nginx module goes where Debian's nginx looks for modules, whatever
# PREFIX is, with the load_module line in modules-available (enabled by a
# link in /etc/nginx/modules-enabled, as Debian's module packages are).
NGINX_MODULES_DIR ?= /usr/lib/nginx/modules
NGINX_AVAILABLE_DIR ?= /usr/share/nginx/modules-available

install: all $(NGINX_MOD)
	$(MAKE) install-built

install-built:
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include \
	    $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(UNITDIR) \
	    $(DESTDIR)$(SYSCONFDIR)/rl
	install -m 755 $(RLCTL) $(AGG) $(GATEWAY) $(RLS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/
	# Plain object code only: the build's LTO bytecode is for this GCC
	# alone, and a gateway built with -flto by another would fail to link.
	objcopy --wildcard -R '.gnu.lto_*' -R '.gnu.debuglto_*' \
	    $(DESTDIR)$(LIBDIR)/librl.a
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/$(SONAME).0.0
	ln -sf $(SONAME).0.0 $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/librl.so
	install -m 644 agent/rl.h $(DESTDIR)$(PREFIX)/include/rl.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	    -e 's|@VERSION@|$(VERSION)|' configs/rl.pc.in \
	    > $(DESTDIR)$(LIBDIR)/pkgconfig/rl.pc
	sed -e 's|/usr/local/bin/|$(PREFIX)/bin/|' \
	    -e 's|/etc/rl/|$(SYSCONFDIR)/rl/|' configs/rl-aggregator.service \
	    > $(DESTDIR)$(UNITDIR)/rl-aggregator.service
	sed -e 's|/usr/local/bin/|$(PREFIX)/bin/|' \
	    -e 's|/etc/rl/|$(SYSCONFDIR)/rl/|' configs/rl-rls.service \
	    > $(DESTDIR)$(UNITDIR)/rl-rls.service
	[ -e $(DESTDIR)$(SYSCONFDIR)/rl/rl.yaml ] || install -m 640 \
	    configs/rules.example.yaml $(DESTDIR)$(SYSCONFDIR)/rl/rl.yaml
	install -d $(DESTDIR)$(NGINX_MODULES_DIR) $(DESTDIR)$(NGINX_AVAILABLE_DIR)
	install -m 644 $(NGINX_MOD) $(DESTDIR)$(NGINX_MODULES_DIR)/
	echo 'load_module $(NGINX_MODULES_DIR)/ngx_http_rl_module.so;' \
	    > $(DESTDIR)$(NGINX_AVAILABLE_DIR)/mod-http-rl.conf
	[ -e $(DESTDIR)$(SYSCONFDIR)/rl/nginx-rl.conf ] || install -m 644 \
	    configs/nginx-rl.conf $(DESTDIR)$(SYSCONFDIR)/rl/nginx-rl.conf

# The seed's ten-gateway scenario over real HTTP: see scripts/demo.sh.
run: all
	@sh scripts/deps.sh gnuplot-nox curl
	@bash scripts/demo.sh $(BUILD)

# The same scenario through five nginx instances of two workers with
# ngx_http_rl_module, beside nginx's own limit_req: see scripts/demo-nginx.sh.
run-nginx: all $(NGINX_MOD)
	@sh scripts/deps.sh curl
	@bash scripts/demo-nginx.sh $(BUILD)

# The runner starts one redis-server and a 3-primary/3-replica cluster on
# free loopback ports, runs the Criterion binary with their addresses in the
# environment, and stops them whatever happens to the tests.
# In a sanitizer build the module needs the sanitizer's runtime, which the
# packaged nginx does not load: the tests preload it (test_nginx.c).
NGINX_PRELOAD = $(if $(findstring address,$(SAN)),$(shell $(CC) \
    -print-file-name=libasan.so),$(if $(findstring thread,$(SAN)),$(shell \
    $(CC) -print-file-name=libtsan.so)))
TEST_ENV = RL_TEST_LIBRL_SO=$(LIB_SO) RL_TEST_RLCTL=$(RLCTL) \
           RL_TEST_NGINX_PRELOAD=$(NGINX_PRELOAD) \
           RL_TEST_AGGREGATOR=$(AGG) RL_TEST_GATEWAY=$(GATEWAY) RL_TEST_RLS=$(RLS) \
           RL_TEST_EXAMPLE=$(EXAMPLE) RL_TEST_NGINX_MODULE=$(abspath $(NGINX_MOD)) \
           RL_TEST_CONFIGS=tests/configs RL_TEST_EXAMPLES=configs \
           RL_TEST_ALONE=tests/run-alone.txt RL_TEST_HOLDER=$(HOLDER) \
           RL_TEST_JOBS=$(TEST_JOBS)
CRITERION_ARGS ?=
# The tests in tests/run-alone.txt run one at a time, before the others,
# which run TEST_JOBS at a time (empty: Criterion's one per core, the TSan
# runner's two).
TEST_JOBS ?=
TEST_COMMAND = $(if $(HARNESS_SRC),$(TESTS),bash scripts/criterion-alone.sh $(TESTS))
# What the runner starts besides one redis-server: a Redis Cluster unless
# told otherwise (make mutants leaves it out for tests that never use one).
RUNNER_ARGS ?= --cluster

# What make test runs, built: .ci/run builds the sanitizers' trees so
# (SAN_GOAL=test-programs) while make test's tests run.
test-programs: all $(TESTS) $(RUNNER) $(HOLDER) $(NGINX_MOD)

# The tests run without make's flags: a `make -j` build's jobserver is
# not theirs (test_install.c runs make).
test: test-programs
	@sh scripts/run-tests.sh $(BUILD)/test.log \
	    env -u MAKEFLAGS -u MFLAGS $(TEST_ENV) \
	    $(RUNNER) $(RUNNER_ARGS) -- $(TEST_COMMAND) $(CRITERION_ARGS)

# Sanitizer builds live in their own trees so that they never mix objects
# with the normal build. SAN_GOAL=test-programs builds what they would
# run, and runs nothing.
SAN_GOAL ?= test

asan:
	UBSAN_OPTIONS=print_stacktrace=1 \
	LSAN_OPTIONS="suppressions=$(abspath tests/lsan.supp)" \
	$(MAKE) BUILD=build/asan OPT=-O1 \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	    $(SAN_GOAL)

tsan:
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(abspath tests/tsan.supp)" \
	$(MAKE) BUILD=build/tsan OPT=-O1 SAN="-fsanitize=thread" \
	    TEST_HARNESS=tsan-runner $(SAN_GOAL)

# Not part of `make test`: every tests/mutants/*.mutant (MUTANTS="a b" for
# some) applied to a copy of the tree in build/mutants, built, and the
# tests it names run: some must fail. MUTANT_JOBS at once (empty: one per
# core), each in its own copy. MUTANT_BASELINE=no: no run of their tests
# on the unmutated copy first (CI: make test has just passed them).
# MUTANT_BUILD_ONLY=yes: the copies built, no mutant tried (.ci/run, while
# make test's tests run). See tests/mutants/README.md.
MUTANTS ?=
MUTANT_JOBS ?=
MUTANT_BASELINE ?=
MUTANT_BUILD_ONLY ?=

mutants:
	@MUTANT_JOBS=$(MUTANT_JOBS) MUTANT_BASELINE=$(MUTANT_BASELINE) \
	    MUTANT_BUILD_ONLY=$(MUTANT_BUILD_ONLY) \
	    bash scripts/mutants.sh $(MUTANTS)

# libFuzzer (clang) on the wire decoder. New inputs go to build/fuzz/corpus;
# tests/fuzz/corpus/wire holds the seeds. FUZZ_SECONDS=600 for a long run.
FUZZ_SECONDS ?= 60
FUZZ_WIRE = build/fuzz/fuzz-wire

$(FUZZ_WIRE): tests/fuzz/fuzz_wire.c common/wire.c common/wire.h
	@sh scripts/deps.sh clang libclang-rt-14-dev
	@mkdir -p $(dir $@) build/fuzz/corpus
	clang -std=c11 -g -O1 -Wall -Wextra -Werror -Icommon \
	    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	    -o $@ tests/fuzz/fuzz_wire.c common/wire.c -lmsgpackc

fuzz: $(FUZZ_WIRE)
	$(FUZZ_WIRE) -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
	    build/fuzz/corpus tests/fuzz/corpus/wire

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
