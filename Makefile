# conduit — the two commands a newcomer needs are `make run` and `make test`.
#
# Targets:
#   make build               debug build of the whole workspace
#   make test                every test: Rust (nextest if installed, else cargo test), doc tests,
#                            and the Python example's own tests
#   make check               fmt check, clippy with warnings denied, the tests, then the
#                            latency budget gate on its own (once it exists)
#   make run                 build, stage the example packages, and run them through conduit
#   make bench-roundtrip     the session's echo round trip beside this machine's pipe floor
#   make doc                 API docs for the SDK and the protocol crates, warnings denied

CARGO ?= cargo
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
PACKAGES := $(TARGET_DIR)/packages
NEXTEST := $(shell $(CARGO) nextest --version >/dev/null 2>&1 && echo yes)

.PHONY: build test test-rust test-python check fmt-check clippy run stage doc bench-roundtrip

build:
	$(CARGO) build --workspace --bins

test: test-rust test-python

test-rust:
ifeq ($(NEXTEST),yes)
	$(CARGO) nextest run --workspace --no-fail-fast
	$(CARGO) test --workspace --doc
else
	$(CARGO) test --workspace --no-fail-fast
endif

test-python:
	python3 -m unittest discover -s examples/python-echo -p 'test_*.py'

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -p conduit-protocol -p conduit-rpc -p conduit-extension

check: fmt-check clippy test doc

stage: build
	scripts/stage-examples.sh debug $(PACKAGES)

run: stage
	@for p in $(PACKAGES)/*/; do \
		echo "== conduit ext check $$p"; \
		$(TARGET_DIR)/debug/conduit ext check "$$p" || exit 1; \
	done

bench-roundtrip:
	$(CARGO) run --release -p conduit-bench --bin roundtrip -- --regime both
