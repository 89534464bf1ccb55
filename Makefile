# Every target creates .venv from setup.py when it is missing or older than setup.py.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

MODEL ?= digits
STRATEGY ?= none
NUM_DEVICES ?= 0
STEPS ?=
MODEL_DIR ?= runs/$(MODEL)
ARGS ?=
INPUT ?=
OUTPUT ?= $(MODEL_DIR)/predictions.csv
TESTARGS ?=
GPU ?=
WORKERS ?= 2
DISCOVERY ?=
MIN_WORKERS ?=
MAX_WORKERS ?=
PS ?= 0
EVALUATOR ?= 1
BENCH_DIR ?= runs/bench
LAUNCHER ?=
HOROVOD ?= horovod==0.28.1
HOROVOD_STAMP := $(VENV)/.horovod
# GPU=1 builds Horovod's GPU all-reduce too (NCCL, needs the CUDA toolkit's nvcc): without it
# GPU gradients go through host memory and gloo.
HOROVOD_ENV := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=gloo \
  $(if $(GPU),HOROVOD_GPU_OPERATIONS=NCCL)
HVD := $(filter horovod,$(LAUNCHER) $(STRATEGY))

.PHONY: venv horovod train gpu-check test test-fast bench export predict list cluster clean \
  distclean

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	ESTIMATOR_DIST_GPU=$(GPU) $(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Horovod compiles against the TensorFlow already in .venv, so it comes after it and without
# build isolation (needs cmake and g++; about 10 minutes on 2 cores once, then pip's wheel cache).
$(HOROVOD_STAMP): $(STAMP)
	$(HOROVOD_ENV) $(BIN)/python -m pip install -q --no-build-isolation '$(HOROVOD)'
	touch $(HOROVOD_STAMP)

horovod: $(HOROVOD_STAMP)

train: $(STAMP)
	$(BIN)/estimator-dist train --model $(MODEL) --strategy $(STRATEGY) \
	  --num_devices $(NUM_DEVICES) --model_dir $(MODEL_DIR) $(if $(STEPS),--train_steps $(STEPS)) $(ARGS)

# Per strategy: devices used, one step's time, peak GPU memory (docs/gpu.md). Exits 3 without a
# GPU; ARGS=--allow_cpu checks on the CPU. horovod is included when installed (make horovod GPU=1).
gpu-check: $(STAMP)
	$(BIN)/python -m estimator_dist.bench.gpu_check $(if $(STEPS),--steps $(STEPS)) $(ARGS)

# TESTARGS are pytest arguments. When they name a path (tests, tests/x.py, tests/x.py::test_y,
# x.py) only that runs; otherwise (TESTARGS="-k foo -x") they filter the whole tests directory.
TESTPATHS = $(if $(filter tests tests/% %.py,$(TESTARGS))$(findstring .py::,$(TESTARGS)),,tests)

# One pytest worker per core (pytest-xdist; TEST_WORKERS=0: one process). Each test goes to
# the next free worker, the process tests first (tests/conftest.py orders them), so the
# workers finish together; the tests of a file that shares a module fixture stay on one worker
# (--dist loadgroup). --durations: the slowest tests, named in every CI log.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST_WORKERS = -p xdist -n $(TEST_WORKERS) --dist loadgroup

# TEST_CPU: each test's CPU seconds, its processes included (tests/cpu_report.py); the run
# ends with the 25 most costly, the measure of what a test costs a shared machine.
TEST_CPU ?= .pytest_cache/cpu-seconds.tsv

# compileall: the test processes (every CLI run and cluster task imports the project) read
# bytecode instead of each compiling the sources again (PYTHONDONTWRITEBYTECODE=1 keeps
# them from writing it).
#
# The real-Slurm tests (SLURM_TESTS) mostly wait: for Slurm's scheduler, its signals and its
# jobs, whose processes are slurmd's, not a worker's. In a run of the whole suite with workers
# a pytest of their own runs them beside the workers (on a busy worker they held one of the
# two cores idle for minutes); their lines follow the workers'. Exit code: the first failing
# one's (5, no test selected, only if neither selected one).
SLURM_TESTS := tests/test_slurm_jobs.py
SLURM_BESIDE = $(if $(filter tests,$(TESTPATHS)),$(filter-out 0,$(TEST_WORKERS)))
SLURM_LOG := .pytest_cache/slurm-tests.log
test: $(HOROVOD_STAMP)
	rm -f $(TEST_CPU) $(SLURM_LOG)
	mkdir -p .pytest_cache
	$(BIN)/python -m compileall -q estimator_dist model_fns input_fns tests > /dev/null
	$(if $(SLURM_BESIDE),($(BIN)/python -m pytest -q -p no:cacheprovider --durations=5 \
	  $(SLURM_TESTS) $(TESTARGS) > $(SLURM_LOG) 2>&1; \
	  echo $$? >> $(SLURM_LOG)) &) \
	ESTIMATOR_DIST_TEST_CPU=$(TEST_CPU) $(BIN)/python -m pytest -q $(PYTEST_WORKERS) \
	  --durations=25 $(TESTPATHS) $(if $(SLURM_BESIDE),--ignore=$(SLURM_TESTS)) $(TESTARGS); \
	status=$$?; \
	if [ -n "$(SLURM_BESIDE)" ]; then \
	  wait; echo "== $(SLURM_TESTS), run beside the workers:"; sed '$$d' $(SLURM_LOG); \
	  code=$$(tail -n 1 $(SLURM_LOG)); \
	  if [ $$status = 5 ] || { [ "$$code" != 0 ] && [ "$$code" != 5 ]; }; then status=$$code; fi; \
	fi; \
	exit $$status

# The unit tier: no test that starts a process (CLI runs, clusters, Horovod ranks) or trains for
# long; tests/conftest.py marks them `process` and `slow`. Under 2 minutes on 2 cores. No
# Horovod build: no unit test needs it (those that use it skip without it).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS) -m "not process and not slow" $(TESTPATHS) \
	  $(TESTARGS)

bench: $(HOROVOD_STAMP)
	$(BIN)/estimator-dist bench --output_dir $(BENCH_DIR) $(ARGS)

# DISCOVERY=PATH: an elastic cluster (docs/elastic.md) of MIN_WORKERS..MAX_WORKERS workers,
# as many as PATH lists slots; it replaces WORKERS.
cluster: $(STAMP) $(if $(HVD),$(HOROVOD_STAMP))
	$(BIN)/estimator-dist cluster $(if $(LAUNCHER),--launcher $(LAUNCHER)) $(if $(DISCOVERY),\
	  --discovery $(DISCOVERY) $(if $(MIN_WORKERS),--min_workers $(MIN_WORKERS)) \
	  $(if $(MAX_WORKERS),--max_workers $(MAX_WORKERS)),--workers $(WORKERS)) \
	  $(if $(HVD),,--ps $(PS) $(if $(filter 1,$(EVALUATOR)),--evaluator)) \
	  --model $(MODEL) --model_dir $(MODEL_DIR) $(if $(STEPS),--train_steps $(STEPS)) \
	  $(if $(filter-out none,$(STRATEGY)),--strategy $(STRATEGY)) $(ARGS)

# A one-node Slurm for the real-Slurm tests (tests/test_slurm_jobs.py, docs/slurm.md): installs
# Debian's slurmctld, slurmd, slurm-client and munge if missing, starts them, waits for the node
# to be idle. As root; kept running (0.5 s when it is up already).
.PHONY: slurm
slurm:
	.ci/slurm-up

export: $(STAMP)
	$(BIN)/estimator-dist export --model_dir $(MODEL_DIR) $(ARGS)

predict: $(STAMP)
	$(if $(INPUT),,$(error give INPUT=file.csv or INPUT=file.npy))
	$(BIN)/estimator-dist predict --saved_model $(MODEL_DIR) --input $(INPUT) --output $(OUTPUT) $(ARGS)

list: $(STAMP)
	$(BIN)/estimator-dist list $(ARGS)

clean:
	rm -rf runs .pytest_cache build *.egg-info
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
