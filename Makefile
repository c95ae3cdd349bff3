# spmd: `make test` on a fresh machine installs what it needs, builds, and runs
# every test; `make demo` installs and builds the same way and runs the whole
# pipeline (expand | split | unroll | lower | run) on a sample on CPU.
#
# spmd needs LibTorch 2.6 or later. On a Debian whose apt offers it (trixie
# and newer) the packages are installed natively; on an older Debian (bookworm)
# `make deps` makes a Debian trixie root once with mmdebstrap
# (tools/platform.sh; SPMD_ROOTFS, default /var/lib/spmd/trixie) and every
# other target re-runs itself inside that root, with this folder mounted at
# the same path, so the build folder is the same either way.
BUILD   ?= build
PYTHON  ?= /usr/bin/python3
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=
TESTS   ?=
SPMD_ROOTFS ?= /var/lib/spmd/trixie
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEPS    := cmake g++ make ninja-build libtorch-dev python3-torch libgloo-dev zlib1g-dev libcli11-dev \
           nlohmann-json3-dev libcatch2-dev graphviz python3-jsonschema procps llvm-19-tools \
           python3-torchvision strace libtomlplusplus-dev
INSPECT := $(BUILD)/spmd-inspect
EXPAND  := $(BUILD)/spmd-expand
PLATFORM := $(shell tools/platform.sh mode)

.PHONY: all deps configure build test test-long test-all demo golden samples clean

# Idempotent: installs only the Debian packages that are missing (natively,
# or into the trixie root, which it makes first when there is none).
deps:
	@$(SUDO) env SPMD_ROOTFS='$(SPMD_ROOTFS)' tools/platform.sh deps $(DEPS)

ifeq ($(PLATFORM),root)
# Every target but deps runs inside the trixie root (after deps).
all build configure test test-long test-all demo golden samples: deps
	@$(SUDO) env SPMD_ROOTFS='$(SPMD_ROOTFS)' tools/platform.sh run $(MAKE) --no-print-directory $@ BUILD='$(BUILD)' PYTHON='$(PYTHON)' \
	  JOBS='$(JOBS)' CMAKE_FLAGS='$(CMAKE_FLAGS)' TESTS='$(TESTS)'
else
all: build


# Configures when the build folder has no build files yet. A cache left by a
# configure that failed (no build.ninja or Makefile beside it) is removed
# first: it may name another generator or source folder, which cmake refuses.
# Ninja is looked for here, after `deps` may have installed it.
configure:
	@if [ ! -f $(BUILD)/build.ninja ] && [ ! -f $(BUILD)/Makefile ]; then \
	  rm -rf $(BUILD)/CMakeCache.txt $(BUILD)/CMakeFiles; \
	  cmake -S . -B $(BUILD) $$(command -v ninja >/dev/null 2>&1 && echo "-G Ninja") $(CMAKE_FLAGS); \
	fi

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# TESTS: a CTest regular expression to run only some tests. `make test` runs
# every capability (the tests without the label "long"); `make test-long` the
# long tier (the rest of the model zoo and parity cases, the model sweep);
# `make test-all` both at once. Each prints its time at the end.
# $(call ctest,LABEL FLAGS): ctest with the time it took, printed also when a test fails.
ctest = cd $(BUILD) && start=$$(date +%s); ctest --output-on-failure -j $(JOBS) $(if $(TESTS),-R '$(TESTS)') $(1); \
	rc=$$?; echo "make $@: $$(( $$(date +%s) - start )) s of tests"; exit $$rc
test: deps build
	@$(call ctest,-LE long)

test-long: deps build
	@$(call ctest,-L long)

test-all: deps build
	@$(call ctest,)

demo: deps build
	@echo "== spmd-inspect: the seeds' MLP, a torch.export program (shapes and source lines come with it)"
	$(INSPECT) samples/mlp.pt2 --verify
	$(INSPECT) samples/cnn.pt2 --stats
	@echo "== spmd-inspect: the seeds' MLP imported from TorchScript"
	$(INSPECT) samples/mlp.pt $$(cat samples/mlp.inputs)
	@echo "== verify and stats of the CNN (BatchNorm running stats become state updates)"
	$(INSPECT) samples/cnn.pt $$(cat samples/cnn.inputs) --verify
	$(INSPECT) samples/cnn.pt $$(cat samples/cnn.inputs) --stats
	@echo "== the LM as a JSON graph dump, read back from stdin"
	$(INSPECT) samples/lm.pt $$(cat samples/lm.inputs) --json | $(INSPECT) - --stats
	@echo "== spmd-expand: the MLP's data-parallel train step with Adam (forward, backward, all-reduce, update)"
	$(EXPAND) samples/mlp.pt $$(cat samples/mlp.inputs) --optimizer adam --lr 1e-2 | $(INSPECT) - --stats
	@echo "== the pipeline: expand | split | unroll | lower, then 20 steps on 2 local ranks (Gloo, CPU),"
	@echo "   every step on the same batch (--data), so the loss falls"
	$(PYTHON) samples/demo_data.py $(BUILD)
	$(EXPAND) samples/cnn.pt $$(cat samples/cnn.inputs) --optimizer sgd --lr 0.05 --momentum 0.9 \
	  | $(BUILD)/spmd-split --bucket-cap-mb 0.002 | $(BUILD)/spmd-unroll --iters 20 | $(BUILD)/spmd-lower -o $(BUILD)/cnn.spmd
	$(INSPECT) $(BUILD)/cnn.spmd --buckets
	$(BUILD)/spmd-run $(BUILD)/cnn.spmd --nproc 2 --steps 20 --data $(BUILD)/cnn_data.pt
	@echo "== a nanoGPT-like step: AdamW, cosine schedule after warmup, clipping, 4 micro-batches"
	$(EXPAND) samples/lm.pt --input tokens:i64[4,16] --input targets:i64[4,16] --optimizer adamw --lr 6e-4 \
	  --weight-decay 0.1 --betas 0.9,0.95 --lr-schedule cosine --warmup-steps 2 --decay-steps 8 --min-lr 6e-5 \
	  --clip-grad-norm 1.0 --micro-batches 4 | $(BUILD)/spmd-split | $(BUILD)/spmd-unroll --iters 10 \
	  | $(BUILD)/spmd-lower -o $(BUILD)/nano.spmd
	$(BUILD)/spmd-run $(BUILD)/nano.spmd --nproc 2 --data $(BUILD)/lm_data.pt

# Rewrites every golden file from the current build; review `git diff` after.
golden: build
	$(PYTHON) tests/golden/run_golden.py --bin-dir $(BUILD) --update

# Regenerates the sample models (needs python3-torch).
samples:
	$(PYTHON) samples/generate.py

endif

clean:
	rm -rf $(BUILD)
