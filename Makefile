# The two set-up commands: `make demo` and `make test`. Both create or reuse
# .venv/ at the repo root and install tfopt with its test extras into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast venv clean

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# keras-hub without its tensorflow-text dependency, which would replace
	# tensorflow-cpu with the full tensorflow wheel (setup.py, extra "hub").
	$(PY) -m pip install --quiet --no-deps 'keras-hub>=0.32,<0.33'
	# TF Serving's request/response protos and gRPC stubs, without their
	# `tensorflow` requirement (it would replace tensorflow-cpu); grpcio and
	# protobuf come with TensorFlow. Used by tfopt.export's local check.
	$(PY) -m pip install --quiet --no-deps 'tensorflow-serving-api>=2.16,<2.22'
	touch $(STAMP)

demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m experiments.run_placed \
	    --config=experiments/configs/run_placed_small_cnn.py --out_dir=.demo --overwrite
	@echo "Gantt chart of the placed step: .demo/gantt.png; SavedModel: .demo/saved_model"

test: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q

test-fast: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) build *.egg-info
