# `make demo` and `make test` set up .venv first when it is missing or out of date; `make test` also
# installs the Debian packages the multi-node tests need (sshd, ip) when it runs as root.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= output/demo

SYSTEM_TOOLS := /usr/sbin/sshd /usr/sbin/ip

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

$(SYSTEM_TOOLS):
	@if [ "$$(id -u)" = 0 ]; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server iproute2; \
	else echo "not root: $@ is missing, so the multi-node tests will skip"; fi

test: install $(SYSTEM_TOOLS)
	$(PY) -m pytest tests

test-fast: install
	$(PY) -m pytest -m "not slow" tests

clean:
	rm -rf $(VENV) output *.egg-info
