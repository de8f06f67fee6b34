# `make demo` and `make test` set up .venv first when it is missing or out of date.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= output/demo

.PHONY: install demo test test-fast clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-test.txt setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: install
	$(PY) applications/demo/run_demo.py --out $(DEMO_OUT)

test: install
	$(PY) -m pytest tests

test-fast: install
	$(PY) -m pytest -m "not slow" tests

clean:
	rm -rf $(VENV) output *.egg-info
