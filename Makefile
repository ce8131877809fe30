# Setup and the two entry points a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test setup setup-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

# The main job on the embedded default: a small ViT on built-in synthetic images, 8 simulated CPU devices, FSDP.
demo: $(VENV)/.installed
	$(BIN)/shardbench train --preset vit-tiny --data synthetic --data.synthetic-train 8192 \
		--data.synthetic-test 2048 --epochs 2 --devices 8 --strategy fsdp --out runs/demo-$$(date +%Y%m%d-%H%M%S)

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
