"""What every family shares: the outer loop, typed-hyperparameter helpers, validation, segment
sums, seeds x grids, I/O and checkpoints, networks, episode buffers, and the max-ent LQR solvers."""
