"""Planning for hardware you do not have (issue 15): the target, the candidate layouts, and (to come) their
compiled memory and communication, predicted step times and a recommendation."""
