# The two set-up commands: `make demo` and `make test`. Both create or reuse
# .venv/ at the repo root and install tfopt with its cpu and test extras
# into it. `make docs` builds the API reference into build/docs/;
# `make wheel-check` builds the wheel and runs it from a fresh environment.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-cnn test test-fast lint docs wheel-check venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,test]'
	# keras-hub without its tensorflow-text dependency, which would install
	# the full tensorflow wheel beside tensorflow-cpu (pyproject.toml, "hub").
	$(PY) -m pip install --quiet --no-deps 'keras-hub>=0.32,<0.33'
	# keras-hub's tokenizers and preprocessors need tensorflow-text; it too
	# requires the full tensorflow wheel, hence --no-deps (the compatibility
	# suite trains keras-hub task models with their preprocessors).
	$(PY) -m pip install --quiet --no-deps 'tensorflow-text>=2.18,<2.22'
	# TF Serving's request/response protos and gRPC stubs, without their
	# `tensorflow` requirement (it would replace tensorflow-cpu); grpcio and
	# protobuf come with TensorFlow. Used by tfopt.export's local check.
	$(PY) -m pip install --quiet --no-deps 'tensorflow-serving-api>=2.18,<2.22'
	touch $(STAMP)

# The all-five job on a keras-hub MoE LM (tfopt.demo): search, train placed
# with a fault, prune, serve; report in .demo/report.html.
demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/tfopt-demo --out_dir=.demo --overwrite

# The placement pipeline alone on a small CNN (the earlier demo).
demo-cnn: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/tfopt-run-placed \
	    --config=experiments/configs/run_placed_small_cnn.py --out_dir=.demo-cnn --overwrite
	@echo "Gantt chart of the placed step: .demo-cnn/gantt.png; SavedModel: .demo-cnn/saved_model"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# --strict-skips: a test skipped for a reason not allowed in
# tests/strict_skips.py fails the run (CI must run every test). Two passes:
# the suite in TEST_WORKERS processes side by side (most of a test's time
# is single-threaded Python: tracing, rewriting, checking), the tests
# marked `serial` (measured times, pinned cores, heartbeat timeouts of
# seconds) afterwards, alone. A family's compatibility cells and the tests
# sharing one expensive fixture form xdist groups (--dist loadgroup).
# --durations: the slowest tests of each pass, to keep the suite's time
# in view. The serial pass runs also after a first pass with failing
# tests (so one run shows every failure), not after one interrupted or
# misused (pytest's 2-4); make fails if either pass failed.
TEST_WORKERS ?= 2
test: $(STAMP) lint
	first=0; second=0; \
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q --strict-skips \
	    -n $(TEST_WORKERS) --dist loadgroup -m "not serial" --durations=15 \
	    || first=$$?; \
	case $$first in 2|3|4) exit $$first;; esac; \
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q --strict-skips -m serial \
	    --durations=10 || second=$$?; \
	if [ $$first -ne 0 ]; then exit $$first; fi; exit $$second

docs: $(STAMP)
	$(PY) tools/build_docs.py --out=build/docs

wheel-check: $(STAMP)
	bash tools/wheel_check.sh

test-fast: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q -n $(TEST_WORKERS) \
	    --dist loadgroup -m "not slow" tests

clean:
	rm -rf $(VENV) build dist *.egg-info
