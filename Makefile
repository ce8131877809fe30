# Setup and the two entry points a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test setup setup-test chromium slurm torch clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# libtpu (the `tpu` extra) lets the tests compile for a TPU slice on this CPU; where it cannot be installed,
# that test is skipped, saying why.
$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[test,slurm]'
	$(BIN)/python -m pip install --quiet -e '.[tpu]' || \
		echo "WARNING: libtpu could not be installed; the TPU planning test will be skipped" >&2
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

# The main job on the embedded default: every strategy side by side on a small ViT and built-in synthetic images,
# 8 simulated CPU devices, each run in its own process with a profiler trace of three steps (which the report reads
# into its Profiles section); ends with the report's path.
demo: $(VENV)/.installed
	$(BIN)/shardbench sweep --preset strategies --base vit-tiny --model.num-heads 8 --data synthetic \
		--data.synthetic-train 4096 --data.synthetic-test 512 --steps 20 --profile \
		--out runs/demo-$$(date +%Y%m%d-%H%M%S)

# The HTML report's browser test drives Debian's chromium (playwright cannot download browsers without internet),
# and the SLURM executor's tests start a one-node SLURM cluster (slurmctld, slurmd, munge; slurmdbd on mariadb for
# job states) from Debian's packages. Where they are missing they are installed with apt-get, which needs root;
# where that fails, or cannot be done, `make test` stops: those tests are never skipped silently. To run without
# them, say so: SHARDBENCH_SKIP_BROWSER=1 or SHARDBENCH_SKIP_SLURM=1, which the tests' summary names.
SLURM_PACKAGES := slurm-wlm munge slurmdbd mariadb-server
# $(call apt_install,WHAT,SKIP_VARIABLE,CHECK,PACKAGES)
define apt_install
	@if [ "$${$(2):-0}" = 1 ]; then \
		echo "$(2)=1: $(1) not installed; its tests will be skipped"; \
	elif { $(3); } >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(4) >/dev/null; } || \
		{ echo "ERROR: apt-get could not install $(4) ($(1)); fix that, or set $(2)=1 to skip its tests" >&2; \
		  exit 1; }; \
	else \
		echo "ERROR: $(1) is missing and only root can install it (apt-get install $(4)); install it, or set" \
			"$(2)=1 to skip its tests" >&2; exit 1; \
	fi
endef

chromium:
	$(call apt_install,chromium,SHARDBENCH_SKIP_BROWSER,command -v chromium,chromium)

slurm:
	$(call apt_install,SLURM,SHARDBENCH_SKIP_SLURM,\
		command -v slurmctld && command -v slurmd && command -v slurmdbd && command -v munged && \
		command -v mysqld_safe,$(SLURM_PACKAGES))

# The PyTorch baseline tests of `shardbench bench` need torch (the `torch` extra; never a dependency). Its CPU build
# installs in about a minute and its tests take seconds, so `make test` installs it; SHARDBENCH_SKIP_TORCH=1 does not.
TORCH_PIN := torch==2.13.0
torch: $(VENV)/.installed-test
	@if [ "$${SHARDBENCH_SKIP_TORCH:-0}" = 1 ]; then \
		echo "SHARDBENCH_SKIP_TORCH=1: torch not installed; its tests will be skipped"; \
	elif $(BIN)/python -c "import torch" >/dev/null 2>&1; then :; \
	else $(BIN)/python -m pip install --quiet '$(TORCH_PIN)' || \
		{ echo "ERROR: pip could not install $(TORCH_PIN); fix that, or set SHARDBENCH_SKIP_TORCH=1 to skip its" \
			"tests" >&2; exit 1; }; \
	fi

# The tests start hundreds of Python processes, each importing shardbench from src/ (an editable install). Where
# PYTHONDONTWRITEBYTECODE is set (some sandboxes and CI images set it), none of them would write its bytecode, and
# each would compile shardbench's modules again: about 0.2 CPU seconds a short command on a 2-core host
# (benchmarks/startup-cpu.md). Writing it once first, as pip does for an installed package, spares that.
test: $(VENV)/.installed-test chromium slurm torch
	$(BIN)/python -m compileall -q src
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) runs .pytest_cache
	find src tests -name __pycache__ -type d -prune -exec rm -rf {} +
