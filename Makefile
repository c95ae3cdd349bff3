# spmd: `make test` on a fresh machine installs what it needs, builds, and runs
# every test; `make demo` builds and runs the pipeline on a sample on CPU.
BUILD   ?= build
PYTHON  ?= /usr/bin/python3
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEPS    := cmake g++ make ninja-build libtorch-dev python3-torch libgloo-dev libcli11-dev \
           nlohmann-json3-dev catch2 graphviz python3-jsonschema procps llvm-15-tools \
           python3-torchvision
INSPECT := $(BUILD)/spmd-inspect
EXPAND  := $(BUILD)/spmd-expand

.PHONY: all deps build test demo golden samples clean

all: build

# Idempotent: installs only the Debian packages that are missing.
deps:
	@missing="$$(for p in $(DEPS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done)"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) apt-get update && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends $$missing; \
	fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(GENERATOR) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@echo "== spmd-inspect: the seeds' MLP imported from TorchScript"
	$(INSPECT) samples/mlp.pt $$(cat samples/mlp.inputs)
	@echo "== verify and stats of the CNN (BatchNorm running stats become state updates)"
	$(INSPECT) samples/cnn.pt $$(cat samples/cnn.inputs) --verify
	$(INSPECT) samples/cnn.pt $$(cat samples/cnn.inputs) --stats
	@echo "== the LM as a JSON graph dump, read back from stdin"
	$(INSPECT) samples/lm.pt $$(cat samples/lm.inputs) --json | $(INSPECT) - --stats
	@echo "== spmd-expand: the MLP's data-parallel train step with Adam (forward, backward, all-reduce, update)"
	$(EXPAND) samples/mlp.pt $$(cat samples/mlp.inputs) --optimizer adam --lr 1e-2 | $(INSPECT) - --stats
	@echo "== the pipeline: expand | split | lower, then 20 steps on 2 local ranks (Gloo, CPU)"
	$(EXPAND) samples/cnn.pt $$(cat samples/cnn.inputs) --optimizer sgd --lr 0.05 --momentum 0.9 \
	  | $(BUILD)/spmd-split --bucket-cap-mb 0.002 | $(BUILD)/spmd-lower -o $(BUILD)/cnn.spmd
	$(INSPECT) $(BUILD)/cnn.spmd --buckets
	$(BUILD)/spmd-run $(BUILD)/cnn.spmd --nproc 2 --steps 20

# Rewrites every golden file from the current build; review `git diff` after.
golden: build
	$(PYTHON) tests/golden/run_golden.py --bin-dir $(BUILD) --update

# Regenerates the sample models (needs python3-torch).
samples:
	$(PYTHON) samples/generate.py

clean:
	rm -rf $(BUILD)
