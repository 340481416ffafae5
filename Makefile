# conduit — the two commands a newcomer needs are `make run` and `make test`.
#
# Targets:
#   make build               debug build of the whole workspace
#   make test                every suite, each run even when another fails, then one summary line
#                            per suite: Rust (nextest if installed, else cargo test; the drills
#                            included), doc tests, the Python example's own tests. No benchmarks.
#   make check               fmt check, clippy with warnings denied, the tests, the benchmarks'
#                            own tests, the API docs, then the in-transaction latency budget gate
#                            on its own
#   make run                 the daemon with the example packages installed, on a state
#                            directory inside the target folder, its log in a file the demo
#                            names; a few commands with their outcomes (Ctrl-C stops it cleanly)
#   make man                 man pages for every command into target/man (`man -l target/man/conduit.1`)
#   make bench-extension     the budget gate in release, both regimes, with its numbers
#   make bench-roundtrip     the session's echo round trip beside this machine's pipe floor
#   make soak                one release daemon with 100 extensions (Rust, Python, Node) for
#                            SOAK_MINUTES (default 10) under ingress, calls, artifacts, crashes,
#                            a hung extension and a restart; RSS, threads, descriptors, CPU and
#                            the state directory's sizes every 10 s; fails when one grows past
#                            its bound (target/soak/report.json, target/soak/soak.svg)
#   make protocol-prototype  the transport comparison: JSON-RPC on stdio against gRPC on a
#                            Unix socket, beside this machine's floors (about a minute)
#   make bench-scale         one daemon with 10 and with 1,000 release echo extensions: install
#                            time, all ready, RSS, threads, idle CPU, echo p50 (a few minutes)
#   make bench-scale-on-demand  1,000 on-demand extensions: daemon start to all idle, RSS, idle
#                            CPU; then 10 started by their first event (cold start vs routing)
#   make bench-views         the operator views at 1,000 extensions and 1,000,000 events: conduit
#                            web's pages and the API lists behind them (p50/p90/p99), conduit
#                            top's CPU; results in target/bench-views/results.json (minutes the
#                            first time: the fixture is kept for the next run)
#   make bench-history       the host loop's store reads at 1,000 / 50,000 / 1,000,000 retained
#                            events (CONDUIT_HISTORY_SIZES=1000,50000 picks sizes), then
#                            bench-retention
#   make bench-retention     the retention sweep at 1,000 / 100,000 / 1,000,000 retained events:
#                            its duration and the longest time it holds the writer
#                            (CONDUIT_RETENTION_SIZES=1000,100000 picks sizes)
#   make bench-ingress       pushes through the management socket with 1, 8 and 64 keep-alive
#                            clients, a fixed 2,000 events/s, list reads idle and beside pushes,
#                            beside a server that only answers (about 2 minutes; writes
#                            target/bench-ingress/results.json; BENCH_INGRESS_ARGS passes options)
#   make drill-backlog       a release daemon restarted onto 10,000 and 20,000 unrouted events
#                            (a tenth as many Work and due timers) made by the daemon itself:
#                            first route, drained, timers fired, peak RSS, pushes meanwhile
#                            (a few minutes; writes target/drill-backlog/results.json)
#   make bench-telemetry     1,000 calls through the API with export (spans, metrics) off, against a collector
#                            that never answers, and against a closed port (7 rounds, medians)
#   make bench-burst-memory  64 concurrent 600 KiB calls to an extension that stopped reading,
#                            against a release daemon with each allocator: RSS before, at peak,
#                            after, and the daemon's CPU per echo call (a few minutes)
#   make drill               the drill suite alone (host/tests/drill_*.rs): misbehaving extensions,
#                            one line per drill with its bound and what it measured
#   make fuzz                each fuzz target in fuzz/ for FUZZ_SECONDS (default 60) seconds, one
#                            after the other, with executions, coverage and anything found
#                            (installs cargo-fuzz when missing; FUZZ_TARGETS picks targets)
#   make fuzz-short          the same for 10 seconds each (part of `make check`)
#   make doc                 API docs for the SDK and the protocol crates, warnings denied
#   make semver              the public API of conduit-protocol, conduit-rpc and conduit-extension
#                            against their last release (cargo-semver-checks; part of `make check`)

CARGO ?= cargo
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
PACKAGES := $(TARGET_DIR)/packages
NEXTEST := $(shell $(CARGO) nextest --version >/dev/null 2>&1 && echo yes)

.PHONY: semver man fuzz fuzz-short drill build test test-bench test-python test-sdks check fmt-check clippy run stage doc bench-roundtrip bench-extension gate bench-history protocol-prototype bench-telemetry bench-scale bench-scale-on-demand bench-views bench-ingress drill-backlog bench-burst-memory bench-retention soak

build:
	$(CARGO) build --workspace --bins

# The end-to-end tests run the example packages' binaries, so every binary is built first.
test: build
	CARGO="$(CARGO)" CARGO_TARGET_DIR="$(TARGET_DIR)" scripts/test-all.sh

# The benchmarks' own tests: the budget gate passes `notes` and fails its negative controls,
# and each benchmark's JSON has its shape. They time things, so they are not in `make test`.
test-bench: build
ifeq ($(NEXTEST),yes)
	$(CARGO) nextest run -p conduit-bench --features grpc --no-fail-fast --hide-progress-bar --failure-output immediate-final
else
	$(CARGO) test -p conduit-bench --features grpc --no-fail-fast
endif

# What OTLP export costs the daemon (docs/performance.md, "Telemetry export"). A debug build,
# like the daemon the tests run; it prints, it asserts only that every call was answered.
bench-telemetry: build
	$(CARGO) test -p conduit-host --test telemetry -- --ignored --nocapture bench_export_cost

# The SDK examples run as staged (scripts/stage-examples.sh puts their SDK beside them), so
# their tests run in the staged folders.
test-python:
	scripts/stage-examples.sh dev $(PACKAGES) python-echo
	python3 -B -m unittest discover -s $(PACKAGES)/python-echo -p 'test_*.py'

# The SDKs' own tests (extensions/python, extensions/node, their test kits among them) and the
# Node examples' tests (written with the kit).
test-sdks:
	scripts/stage-examples.sh dev $(PACKAGES) node-notes
	python3 -m unittest discover -s extensions/python/tests -p 'test_*.py'
	scripts/stage-examples.sh dev $(PACKAGES) node-echo
	node --test extensions/node/test/sdk.test.mjs extensions/node/test/testing.test.mjs $(PACKAGES)/node-notes/test.mjs $(PACKAGES)/node-notes/kit.test.mjs $(PACKAGES)/node-echo/echo.test.mjs

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p conduit-bench --features grpc --all-targets -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -p conduit-protocol -p conduit-rpc -p conduit-extension

# The fuzz run and the gate run in the recipe, after every prerequisite, so even `make -j check`
# runs them alone.
check: fmt-check clippy test doc semver
	$(MAKE) test-bench
	$(MAKE) fuzz-short
	$(MAKE) gate

# The crates extension authors build on, against their last release: the newest tag `sdk-v*`
# (tag each release so), or, until the first is made, SEMVER_BASELINE_COMMIT, the commit that
# made their params and results `#[non_exhaustive]` with builders (extensions/sdk/CHANGELOG.md).
# cargo-semver-checks fails on a breaking change the workspace version does not announce.
# SEMVER_BASELINE=<rev> compares against another revision.
SEMVER_BASELINE_COMMIT := 3a7d4162c94e70c3950bfdc51784c841e530f51b
SEMVER_BASELINE ?= $(or $(shell git describe --tags --abbrev=0 --match 'sdk-v*' 2>/dev/null),$(SEMVER_BASELINE_COMMIT))
semver:
	@$(CARGO) semver-checks --version >/dev/null 2>&1 || { echo "make semver: cargo-semver-checks is missing; install it with: cargo install cargo-semver-checks --locked"; exit 2; }
	$(CARGO) semver-checks check-release -p conduit-protocol -p conduit-rpc -p conduit-extension --baseline-rev $(SEMVER_BASELINE)

gate:
	$(CARGO) build -p conduit-example-notes -p conduit-bench
	$(TARGET_DIR)/debug/bench-extension --json $(TARGET_DIR)/bench-extension/results.json

stage: build
	scripts/stage-examples.sh debug $(PACKAGES)

run: build
	scripts/run-demo.sh $(TARGET_DIR)

# Generated from the clap tree the binary parses (`conduit man`, a hidden command).
man:
	$(CARGO) build -p conduit-host --bin conduit
	$(TARGET_DIR)/debug/conduit man --out $(TARGET_DIR)/man

bench-extension:
	$(CARGO) build --release -p conduit-example-notes -p conduit-bench
	$(TARGET_DIR)/release/bench-extension --regime idle --json $(TARGET_DIR)/bench-extension/results-idle.json
	$(TARGET_DIR)/release/bench-extension --regime awake --json $(TARGET_DIR)/bench-extension/results.json

# The gRPC side is behind conduit-bench's `grpc` feature, so `make build` never compiles tonic.
protocol-prototype:
	$(CARGO) build --release -p conduit-bench --features grpc -p conduit-host --bins
	$(TARGET_DIR)/release/protocol-prototype --json $(TARGET_DIR)/protocol-prototype/results.json

# One daemon with 10 and with 1,000 release echo extensions: install, ready, RSS, threads, idle
# CPU, echo (docs/performance.md, "Scale"). BENCH_SCALE_ARGS passes options (e.g. --extensions 100).
bench-scale:
	$(CARGO) build --release -p conduit-host -p conduit-example-echo -p conduit-bench --bin conduit --bin conduit-echo --bin bench-scale
	$(TARGET_DIR)/release/bench-scale --json $(TARGET_DIR)/bench-scale/results.json $(BENCH_SCALE_ARGS)

# 1,000 extensions started on demand: the daemon with all of them idle, then 10 started by their
# first event (docs/perf-log/2026-12-04-on-demand.md). BENCH_SCALE_ARGS passes options.
bench-scale-on-demand:
	$(CARGO) build --release -p conduit-host -p conduit-bench --bin conduit --bin ondemand-ext --bin bench-scale
	$(TARGET_DIR)/release/bench-scale --on-demand --json $(TARGET_DIR)/bench-scale/on-demand.json $(BENCH_SCALE_ARGS)

# The burst of issue 30 and what each allocator costs per call (docs/perf-log/
# 2026-12-04-burst-memory.md); jemalloc and mimalloc are Debian's libraries, through LD_PRELOAD,
# skipped when not installed. BENCH_BURST_ARGS passes options (e.g. --allocators glibc).
bench-burst-memory:
	$(CARGO) build --release -p conduit-host --bin conduit
	scripts/bench-burst-memory.py --conduit $(TARGET_DIR)/release/conduit --json $(TARGET_DIR)/bench-burst-memory/results.json $(BENCH_BURST_ARGS)

bench-history:
	$(CARGO) bench -p conduit-store --bench history
	$(MAKE) bench-retention

bench-retention:
	$(CARGO) bench -p conduit-host --bench retention

# Ingress throughput, acknowledgement latency, acknowledgement-to-routing, the writer's wait and
# hold, and list reads beside pushes, on a release daemon with notes (docs/performance.md).
bench-ingress:
	$(CARGO) build --release -p conduit-host -p conduit-example-notes -p conduit-bench --bin conduit --bin conduit-notes --bin bench-ingress
	$(TARGET_DIR)/release/bench-ingress --json $(TARGET_DIR)/bench-ingress/results.json $(BENCH_INGRESS_ARGS)

# A restart onto a large backlog (docs/reliability.md). DRILL_BACKLOG_ARGS passes options
# (e.g. --sizes 1000,2000 or --push-rate 500).
drill-backlog:
	$(CARGO) build --release -p conduit-host -p conduit-example-notes -p conduit-bench --bin conduit --bin conduit-notes --bin drill-backlog
	$(TARGET_DIR)/release/drill-backlog --json $(TARGET_DIR)/drill-backlog/results.json $(DRILL_BACKLOG_ARGS)

# The operator views at scale (docs/perf-log/2026-12-04-views.md). BENCH_VIEWS_ARGS passes
# options (e.g. --extensions 100 --events 100000, or --fresh to make the fixture anew).
bench-views:
	$(CARGO) build --release -p conduit-host -p conduit-example-echo -p conduit-bench --bin conduit --bin conduit-echo --bin bench-views
	$(TARGET_DIR)/release/bench-views --json $(TARGET_DIR)/bench-views/results.json $(BENCH_VIEWS_ARGS)

bench-roundtrip:
	$(CARGO) run --release -p conduit-bench --bin roundtrip -- --regime both

# The fuzz targets are their own workspace (fuzz/), built by cargo-fuzz without a sanitizer so the
# stable toolchain builds them; docs/fuzzing.md says what each checks.
FUZZ_SECONDS ?= 60
FUZZ_DIR ?= $(TARGET_DIR)/fuzz
FUZZ_TARGETS ?=

fuzz:
	CARGO="$(CARGO)" scripts/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_DIR) $(FUZZ_TARGETS)

fuzz-short:
	CARGO="$(CARGO)" scripts/fuzz.sh 10 $(FUZZ_DIR) $(FUZZ_TARGETS)

# Drills are ordinary integration tests (host/tests/drill_*.rs); each records a line that
# scripts/drill-report.sh prints as a table.
drill: build
	rm -rf $(TARGET_DIR)/tmp/drills
	CONDUIT_DRILL_ROUNDS=20 $(CARGO) test -p conduit-host --test 'drill_*' -- --test-threads 2
	scripts/drill-report.sh $(TARGET_DIR)

# Not part of `make test`: it takes SOAK_MINUTES. bench/src/bin/soak.rs says what runs and what
# fails it; SOAK_ARGS passes options (e.g. --rate 100 --extensions 30).
SOAK_MINUTES ?= 10
soak:
	$(CARGO) build --release -p conduit-host -p conduit-example-echo -p conduit-example-notes -p conduit-bench --bin conduit --bin conduit-echo --bin conduit-notes --bin soak
	$(TARGET_DIR)/release/soak --minutes $(SOAK_MINUTES) --out $(TARGET_DIR)/soak $(SOAK_ARGS)
