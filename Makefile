# Armada: the two commands a new user needs are `make run` and `make test`.
SHELL      := /bin/bash
BUILD      ?= build
JOBS       ?= 2
CACHE      ?= $(or $(ARMADA_CACHE),$(HOME)/.cache/armada)
LLAMA_DIR  ?= $(CACHE)/llama.cpp-v0.4.0$(if $(filter 1,$(ARMADA_PORTABLE)),-portable,)
MODEL_DIR  ?= $(CACHE)/models
HOST       ?= 127.0.0.1
PORT       ?= 8080
CMAKE_ARGS ?=
CTEST_ARGS ?=

.PHONY: setup build run cluster test test-asan test-tsan test-arm fuzz lint bench models clean sim-sweep chaos

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja $(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DLLAMA_DIR=$(LLAMA_DIR) $(CMAKE_ARGS)

build: setup
	@cmake -S . -B $(BUILD) -DLLAMA_DIR=$(LLAMA_DIR) $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

models: build
	@bash scripts/models.sh $(BUILD)/armada $(MODEL_DIR)

run: build models
	@bash scripts/run.sh $(BUILD)/armada "$(MODEL)" $(MODEL_DIR) $(HOST) $(PORT)

# A whole cluster on this machine (PostgreSQL, etcd, NATS, Redis, brains, nodes, a gateway on
# PORT). CELLS and NODES set its size; the data and every log go to CLUSTER_DIR.
CELLS       ?= 1
NODES       ?= 3
CLUSTER_DIR ?= /tmp/armada-cluster
cluster: build models
	@mkdir -p $(CLUSTER_DIR) && chmod o+x $(CLUSTER_DIR)
	$(BUILD)/armada cluster up --cells $(CELLS) --nodes $(NODES) -m "$(or $(MODEL),$(MODEL_DIR)/armada-tiny-q8_0.gguf)" \
	  --data-dir $(CLUSTER_DIR) --port $(PORT) --node-arg=-np --node-arg=8

test: build models
	cd $(BUILD) && ARMADA_MODEL_DIR=$(MODEL_DIR) ctest --output-on-failure -j 1 --timeout 900 $(CTEST_ARGS)

# The sanitizer runs skip the tests labelled `rss`: they bound the resident set, which the
# sanitizers' shadow memory inflates by design. ARMADA_TIMING=0 turns off latency bounds in
# the black-box tests (the overload test's p95 and 429 times); everything else is checked.
SAN_CTEST_ARGS := -LE rss
test-asan:
	ARMADA_TIMING=0 $(MAKE) test BUILD=build-asan \
	  CMAKE_ARGS="-DARMADA_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug" CTEST_ARGS="$(SAN_CTEST_ARGS)"

# llama.cpp is not instrumented; tests/sanitizers/tsan.supp says what is suppressed and why.
test-tsan:
	ARMADA_TIMING=0 \
	  TSAN_OPTIONS="suppressions=$(CURDIR)/tests/sanitizers/tsan.supp ignore_noninstrumented_modules=1 $(TSAN_OPTIONS)" \
	  $(MAKE) test BUILD=build-tsan \
	  CMAKE_ARGS="-DARMADA_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug" CTEST_ARGS="$(SAN_CTEST_ARGS)"

# aarch64 (Kunpeng 920 class, armv8.2-a+dotprod): cross-build llama.cpp and Armada, then run the
# unit tests and a tiny-model generation test under qemu-aarch64. See scripts/test-arm.sh.
test-arm: setup models
	@JOBS=$(JOBS) MODEL_DIR=$(MODEL_DIR) bash scripts/test-arm.sh

# libFuzzer (clang) on every parser target for FUZZ_SECONDS each; see docs/SECURITY.md.
FUZZ_SECONDS ?= 60
fuzz: setup models
	@bash scripts/fuzz.sh build-fuzz $(LLAMA_DIR) $(MODEL_DIR) $(FUZZ_SECONDS) $(JOBS)

# The simulator's longer sweep: 2,000 seeds of the small scenario and 20 of the 4,096-node one
# (each failing seed prints the command that replays it), and 2,000 of the runner world (the
# cluster's own runners under a nemesis); docs/SCALE.md.
SIM_SEEDS ?= 2000
sim-sweep: build
	$(BUILD)/armada sim sim/small.yaml --seed 1000 --seeds $(SIM_SEEDS)
	$(BUILD)/armada sim sim/deps.yaml --seed 1000 --seeds $(SIM_SEEDS)
	$(BUILD)/armada sim sim/overlap.yaml --seed 1000 --seeds $(SIM_SEEDS)
	$(BUILD)/armada sim sim/reduced.yaml --seed 1000 --seeds 20
	ARMADA_SIM_SEEDS=$(SIM_SEEDS) $(BUILD)/tests/armada_unit --gtest_filter='SimRunners.*'

# The nemesis on the real cluster for 10 minutes, 300 sessions of 3 tool steps (the short one is in
# `make test`); CHAOS_SEED replays a run's faults. The report: CHAOS_REPORT.
CHAOS_S ?= 600
CHAOS_REPORT ?= $(CURDIR)/chaos-report.json
chaos: build models
	cd $(BUILD) && ARMADA_BIN=$(CURDIR)/$(BUILD)/armada ARMADA_MODEL_DIR=$(MODEL_DIR) ARMADA_CHAOS_S=$(CHAOS_S) \
	  ARMADA_CHAOS_SESSIONS=300 ARMADA_CHAOS_REPORT=$(CHAOS_REPORT) $(if $(CHAOS_SEED),ARMADA_CHAOS_SEED=$(CHAOS_SEED)) \
	  node --test --test-concurrency=1 $(CURDIR)/tests/node/chaos.test.mjs

lint: build
	@bash scripts/lint.sh $(BUILD)

bench: build models
	@bash bench/engine.sh $(BUILD)/armada $(MODEL_DIR) $(LLAMA_DIR)
	@bash bench/kv.sh $(BUILD)/armada $(MODEL_DIR)
	@ARMADA=$(BUILD)/armada bash bench/compare.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz build-arm
