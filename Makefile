# AICF developer targets. `make install demo` sets everything up and shows the compiler at work;
# `make test` runs the test suite (GPU tests skip without a GPU).
PYTHON ?= python3

EXAMPLES := examples/mlp.onnx examples/block.onnx examples/encoder.onnx examples/decoder.onnx \
	examples/mlp_x.npy examples/block_x.npy examples/encoder_x.npy examples/decoder_x.npy

.PHONY: install examples demo test gpu-test gpu-compile test-every fuzz golden readme-ops clean

install:
	$(PYTHON) -m pip install -e '.[dev]'

examples:
	$(PYTHON) examples/build_examples.py --out-dir examples

# Compile and explain the examples; run them (checked against onnxruntime) only when
# nvidia-smi exists and works.
demo: examples
	mkdir -p out
	$(PYTHON) -m aicfc compile examples/mlp.onnx -o out/mlp.aicf
	$(PYTHON) -m aicfc explain out/mlp.aicf
	$(PYTHON) -m aicfc compile examples/block.onnx -o out/block.aicf
	$(PYTHON) -m aicfc explain out/block.aicf
	$(PYTHON) -m aicfc compile examples/encoder.onnx -o out/encoder.aicf --precision fp16
	$(PYTHON) -m aicfc explain out/encoder.aicf
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		set -e; \
		echo "$(PYTHON) -m aicf_run out/block.aicf --input examples/block_x.npy --output-dir out/block --check examples/block.onnx"; \
		$(PYTHON) -m aicf_run out/block.aicf --input examples/block_x.npy --output-dir out/block --check examples/block.onnx; \
		echo "$(PYTHON) -m aicf_run out/mlp.aicf --input examples/mlp_x.npy --output-dir out/mlp --check examples/mlp.onnx"; \
		$(PYTHON) -m aicf_run out/mlp.aicf --input examples/mlp_x.npy --output-dir out/mlp --check examples/mlp.onnx; \
		echo "$(PYTHON) -m aicf_run out/encoder.aicf --input examples/encoder_x.npy --output-dir out/encoder --check examples/encoder.onnx --bench 100"; \
		$(PYTHON) -m aicf_run out/encoder.aicf --input examples/encoder_x.npy --output-dir out/encoder --check examples/encoder.onnx --bench 100; \
	else \
		echo "no working nvidia-smi: skipping aicf_run (the bundles are in out/)"; \
	fi

# One pytest worker per CPU (pytest-xdist), each test file on one worker so that its module-scoped
# fixtures and its cubin cache are built once.
test:
	$(PYTHON) -m pytest -q -n auto --dist loadfile

gpu-test:
	$(PYTHON) -m pytest -m gpu -q

# The GPU tests up to the GPU, on a machine without one: each compiles its plans and skips as "compile-only" where it
# would first touch the device, so a plan the compiler cannot build fails here ([Note: GPU tests compiled without a
# GPU] in tests/conftest.py). FILES: the test files (all of them by default; 631 GPU tests took 10 minutes on two CPUs).
FILES ?= tests
gpu-compile:
	AICF_GPU_COMPILE_ONLY=1 $(PYTHON) -m pytest -m gpu -q -n auto --dist loadfile -rf $(FILES)

# The build sweeps with every candidate of their spaces, not the covering subset `make test` compiles
# ([Note: candidate sweeps] in tests/sweep.py); run after changing a kernel template.
test-every:
	AICF_EVERY_CANDIDATE=1 $(PYTHON) -m pytest -q -n auto --dist loadfile -k "spills or both_halves"

# Fuzz the bundle and ONNX readers (tests/fuzz_harness.py): each target in turn until
# FUZZ_EXECS executions or FUZZ_SECONDS, whichever comes first; prints executions, seconds and
# distinct failures per target (also to fuzz-out/report.txt), reproducers in
# fuzz-out/<target>/. `make test` runs the same targets briefly.
FUZZ_EXECS ?= 100000
FUZZ_SECONDS ?= 3600
FUZZ_SEED ?= 0
fuzz:
	$(PYTHON) -m tests.fuzz_harness --execs $(FUZZ_EXECS) --seconds $(FUZZ_SECONDS) --seed $(FUZZ_SEED) --out fuzz-out

# Rewrite the README's support table from aicfc/ir/support.py.
readme-ops:
	$(PYTHON) -c "import pathlib; from aicfc.ir.support import with_table; p = pathlib.Path('README.md'); p.write_text(with_table(p.read_text()))"

# Rewrite the golden IR texts (tests/golden/) from the current compiler; review the diff.
golden:
	AICF_UPDATE_GOLDEN=1 $(PYTHON) -m pytest -q -k golden

clean:
	rm -rf out build dist .pytest_cache *.egg-info fuzz-out $(EXAMPLES)
	find . -name __pycache__ -type d -not -path './.venv/*' -prune -exec rm -rf {} +
