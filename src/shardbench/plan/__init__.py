"""Planning for hardware you do not have: the target, the candidate layouts, their compiled memory and
communication, the predicted step times (one model, `steptime.py`) and a recommendation."""
