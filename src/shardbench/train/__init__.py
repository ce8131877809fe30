"""Training: sharded state, the jitted step, checkpoints, scalar logs and the loop that ties them."""
