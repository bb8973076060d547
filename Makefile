# spanhead - the two commands of the README:
#   make demo   set up, build (progress only), and tell the main job on an embedded default
#   make test   set up, build, and pass every test (plus one run under ASan + UBSan, and a few
#               seconds of each fuzzer)
# Other targets: build, bench (the CLI's benchmark with its table and picture), fuzz (longer
# fuzzing), python-test, test-asan, test-fuzz, mutants (slow: tests/mutants.txt), install
# (PREFIX), clean.

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
PYTHON     ?= python3
# the Python tests' interpreter: the virtual environment scripts/setup.sh makes (PyPI torch +
# transformers), else $(PYTHON)
VENV       ?= build-venv
PYTEST_PY   = $$(if [ -x $(VENV)/bin/python ]; then echo $(VENV)/bin/python; else echo $(PYTHON); fi)
WERROR     ?= $(if $(CI),ON,OFF)
CMAKE_ARGS ?=

PREFIX     ?= /usr/local
FUZZ_BUILD ?= build-fuzz

.PHONY: all setup build demo test test-main test-asan test-fuzz python-test bench fuzz mutants install \
        clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSPH_WERROR=$(WERROR) $(CMAKE_ARGS)

# MAKEFLAGS: no "make[n]: Entering directory" lines from CMake's recursive makefiles
build: setup $(BUILD)/CMakeCache.txt
	MAKEFLAGS=--no-print-directory cmake --build $(BUILD) -j $(JOBS)

# The demo needs no torch: the setup skips the Python tests' virtual environment.
demo:
	@SPH_VENV=none bash scripts/setup.sh
	@bash scripts/build_quiet.sh $(BUILD) $(JOBS) -DCMAKE_BUILD_TYPE=Release -DSPH_WERROR=$(WERROR) \
	  $(CMAKE_ARGS)
	@echo
	@bash scripts/demo.sh $(BUILD)/spanhead

test: build
	$(MAKE) --no-print-directory test-main test-asan python-test test-fuzz

test-main:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The host code once more under AddressSanitizer + UndefinedBehaviorSanitizer (CUDA off:
# the sanitizers do not cover device code; compute-sanitizer does that on the GPU machine).
test-asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSPH_SANITIZE=ON -DSPH_CUDA=OFF \
	  -DSPH_BUILD_BENCH=OFF -DSPH_WERROR=$(WERROR) $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -LE 'slow|mpi'

# The Python package in place: the extension (stable ABI, no setuptools needed) compiled next
# to its sources, the library taken from $(BUILD), the CLI's JSON compared with the binding's.
PY_INCLUDE = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
PY_EXT     = python/spanhead/_spanhead.abi3.so
PY_CFLAGS  = -std=gnu11 -O2 -fPIC -shared -DPy_LIMITED_API=0x03090000 -Wall -Wextra \
             -Wno-unused-parameter -Wno-missing-field-initializers $(if $(filter ON,$(WERROR)),-Werror)

PY_SRC     = $(wildcard python/csrc/*.c)

$(PY_EXT): $(PY_SRC) python/csrc/_spanhead.h include/spanhead.h
	$(CC) $(PY_CFLAGS) -Iinclude -I$(PY_INCLUDE) $(PY_SRC) -o $@ -ldl

python-test: build $(PY_EXT)
	SPANHEAD_LIB=$(CURDIR)/$(BUILD)/libspanhead.so PYTHONPATH=$(CURDIR)/python \
	  SPANHEAD_CLI=$(CURDIR)/$(BUILD)/spanhead SPANHEAD_BUILD_DIR=$(CURDIR)/$(BUILD) \
	  SPANHEAD_INTEGRATIONS_DIR=$(CURDIR)/build-integrations \
	  $(PYTEST_PY) -m pytest -q -rs python/tests

# The CLI's benchmark with its defaults (on a GPU the model shapes, on the CPU a small shape that
# takes seconds), its records and its picture in $(BUILD)/bench-results/; the micro-benchmark
# programs are in $(BUILD)/bench/ (bench/README.md).
BENCH_OUT  = $(BUILD)/bench-results
bench: build
	@mkdir -p $(BENCH_OUT) && rm -f $(BENCH_OUT)/bench.jsonl
	$(BUILD)/spanhead bench --json $(BENCH_OUT)/bench.jsonl --plot $(BENCH_OUT)/bench.png \
	  $(BENCH_ARGS) | tee $(BENCH_OUT)/bench.md
	@echo "bench: table $(BENCH_OUT)/bench.md, records $(BENCH_OUT)/bench.jsonl, picture" \
	  "$(BENCH_OUT)/bench.png; micro-benchmarks: $(BUILD)/bench/ (see bench/README.md)"

# libFuzzer over the .npy reader, the argument parser, the JSON readers and the packers (clang
# and its libFuzzer runtime: scripts/setup.sh). make fuzz: FUZZ_SECONDS (60) per target;
# make test: 5 s each.
$(FUZZ_BUILD)/CMakeCache.txt:
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DSPH_FUZZ=ON -DSPH_CUDA=OFF -DSPH_BUILD_BENCH=OFF \
	  -DSPH_BUILD_CLI=OFF -DCMAKE_BUILD_TYPE=Debug >$(FUZZ_BUILD).log 2>&1 || \
	  { tail -20 $(FUZZ_BUILD).log; exit 1; }

fuzz: setup $(FUZZ_BUILD)/CMakeCache.txt
	MAKEFLAGS=--no-print-directory cmake --build $(FUZZ_BUILD) --target fuzzers -j $(JOBS)
	@bash scripts/fuzz.sh $(FUZZ_BUILD) $${FUZZ_SECONDS:-60}

test-fuzz: $(FUZZ_BUILD)/CMakeCache.txt
	MAKEFLAGS=--no-print-directory cmake --build $(FUZZ_BUILD) --target fuzzers -j $(JOBS)
	@bash scripts/fuzz.sh $(FUZZ_BUILD) $${FUZZ_SECONDS:-5}

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# Mutation check (slow, not part of `make test`): each bug of tests/mutants.txt planted alone in
# a scratch copy, CPU build, the ctest suite and pytest (python/tests with $(VENV)'s interpreter);
# every mutant must make a test fail.
mutants: setup
	$(PYTHON) scripts/mutants.py --jobs $(JOBS) --python $(PYTEST_PY)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(FUZZ_BUILD).log
