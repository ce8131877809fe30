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

# The main job on the embedded default: every strategy side by side on a small ViT and built-in synthetic images,
# 8 simulated CPU devices, each run in its own process; ends with the report's path.
demo: $(VENV)/.installed
	$(BIN)/shardbench sweep --preset strategies --base vit-tiny --model.num-heads 8 --data synthetic \
		--data.synthetic-train 4096 --data.synthetic-test 512 --steps 20 --out runs/demo-$$(date +%Y%m%d-%H%M%S)

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
