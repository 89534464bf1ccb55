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
PS ?= 0
EVALUATOR ?= 1
BENCH_DIR ?= runs/bench

.PHONY: venv train test bench export predict list cluster clean distclean

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	ESTIMATOR_DIST_GPU=$(GPU) $(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

train: $(STAMP)
	$(BIN)/estimator-dist train --model $(MODEL) --strategy $(STRATEGY) \
	  --num_devices $(NUM_DEVICES) --model_dir $(MODEL_DIR) $(if $(STEPS),--train_steps $(STEPS)) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests $(TESTARGS)

bench: $(STAMP)
	$(BIN)/estimator-dist bench --output_dir $(BENCH_DIR) $(ARGS)

cluster: $(STAMP)
	$(BIN)/estimator-dist cluster --workers $(WORKERS) --ps $(PS) $(if $(filter 1,$(EVALUATOR)),--evaluator) \
	  --model $(MODEL) --model_dir $(MODEL_DIR) $(if $(STEPS),--train_steps $(STEPS)) \
	  $(if $(filter-out none,$(STRATEGY)),--strategy $(STRATEGY)) $(ARGS)

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
