# opendpu: `make demo` runs the main job, `make test` the whole suite. Both build .venv first.
PY      := .venv/bin/python
SHARED  ?= ../shared
MODELS  := $(SHARED)/models
export NUMBA_CACHE_DIR ?= $(CURDIR)/.venv/numba-cache

.PHONY: all venv demo test test-slow bench proto clean

all: test

.venv/.installed: requirements.txt pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

venv: .venv/.installed

demo: venv
	$(PY) -m runtime.demo --models $(MODELS)

test: venv
	$(PY) -m pytest -q

test-slow: venv
	$(PY) -m pytest -q -m slow

bench: venv
	$(PY) benchmarks/bench_executor.py --models $(MODELS)
	$(PY) benchmarks/bench_timing.py --models $(MODELS)

# Regenerate compiler/xir/xir_pb2.py from xir.proto (needs grpcio-tools; the output is committed).
proto:
	$(PY) -m pip install -q grpcio-tools==1.85.1
	cd compiler/xir && ../../$(PY) -m grpc_tools.protoc -I. --python_out=. xir.proto

clean:
	rm -rf .venv .pytest_cache .hypothesis build *.egg-info
