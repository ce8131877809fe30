#!/bin/bash
# Run from the checkout whose .venv to use; each argument is a source tree (its src/ is imported).
# CPU seconds of importing what a sweep's pre-flight child imports to check a configuration, from two source trees taking turns
# (ROUNDS=15 for fifteen rounds; compile each tree's bytecode first where PYTHONDONTWRITEBYTECODE is set:
#  PYTHONDONTWRITEBYTECODE= .venv/bin/python -m compileall -q TREE/src)
code='from shardbench import startup
startup.begin_program()
with startup.quiet_imports():
    from shardbench.capacity import check_fits
    from shardbench.data.sources import known_train_rows
    from shardbench.flags import setup_devices
    from shardbench.parallel.checks import layout_notes
    from shardbench.preflight import check_batch_fits_data, check_runnable
    from shardbench.sweep import preflight'
for r in $(seq 1 "${ROUNDS:-5}"); do for tree in "$@"; do
  PYTHONPATH=$tree/src JAX_PLATFORMS=cpu /usr/bin/time -f "$tree %U %S" "${PYTHON:-.venv/bin/python}" -c "$code"
done; done
