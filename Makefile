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
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p .demo
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m experiments.profile --model=small_cnn --batch_size=32 \
	    --measure_comm --out=.demo/small_cnn.json --overwrite
	$(PY) -m experiments.place --costgraph=.demo/small_cnn.json --devices=4 \
	    --memory_fraction=0.35 --gantt=.demo/small_cnn_gantt.png --overwrite
	@echo "Gantt chart of the placed step: .demo/small_cnn_gantt.png"

test: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q

test-fast: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) build *.egg-info
