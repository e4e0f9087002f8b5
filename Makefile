# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIN    := torch==2.14.1 torchvision==0.29.1

.PHONY: demo test venv clean

$(VENV)/.stamp-base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIN)
	touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-base pyproject.toml
	$(PY) -m pip install -q -e '.[test]' $(PIN)
	touch $@

$(VENV)/.stamp-bench: $(VENV)/.stamp-base pyproject.toml
	$(PY) -m pip install -q -e '.[bench,test]' $(PIN)
	touch $@

venv: $(VENV)/.stamp-test

demo: $(VENV)/.stamp-bench
	$(PY) -m ember.bench seed-resnet18

# pytest exits 5 when it collected no test; that is not a failure of the project.
test: $(VENV)/.stamp-test
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

clean:
	rm -rf $(VENV) build *.egg-info
