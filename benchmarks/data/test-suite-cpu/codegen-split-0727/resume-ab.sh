#!/bin/bash
# test_resume.py from two checkouts taking turns: ab-base (the tests' flags before the split count), ab-split (with it)
# Usage: two clones of the checkout at /tmp/ab-base (commit 8099307) and /tmp/ab-split (246d681); OUT=<folder>
OUT=${OUT:-/tmp/ab}
run() { cd /tmp/$1 && PYTHONPATH=/tmp/$1/src /usr/bin/time -f "$1 user %U sys %S wall %e" "${PYTHON:-.venv/bin/python}" -m pytest -q -p no:cacheprovider tests/test_resume.py > $OUT/r-$1-$2 2>&1; tail -2 $OUT/r-$1-$2; }
for r in 1 2; do run ab-base $r; run ab-split $r; done
