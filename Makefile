# Setup and the two entry points a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test setup setup-test chromium slurm clean

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
# 8 simulated CPU devices, each run in its own process; ends with the report's path.
demo: $(VENV)/.installed
	$(BIN)/shardbench sweep --preset strategies --base vit-tiny --model.num-heads 8 --data synthetic \
		--data.synthetic-train 4096 --data.synthetic-test 512 --steps 20 --out runs/demo-$$(date +%Y%m%d-%H%M%S)

# The HTML report's browser test drives Debian's chromium (playwright cannot download browsers without internet).
# Where it is missing and apt-get can run (as root), it is installed; otherwise that one test is skipped, saying why.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
		echo "WARNING: chromium could not be installed; the report's browser test will be skipped" >&2

# The SLURM executor's tests start a one-node SLURM cluster (slurmctld, slurmd, munge; slurmdbd on mariadb for job
# states) from Debian's packages. Where they are missing and apt-get can run (as root), they are installed;
# otherwise those tests are skipped, saying why.
SLURM_PACKAGES := slurm-wlm munge slurmdbd mariadb-server
slurm:
	@{ command -v slurmctld && command -v slurmd && command -v slurmdbd && command -v munged && \
		command -v mysqld_safe; } >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES) >/dev/null; } || \
		echo "WARNING: SLURM could not be installed; the SLURM executor's tests will be skipped" >&2

test: $(VENV)/.installed-test chromium slurm
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) runs .pytest_cache
