"""The train step, its loop, checkpoints and a run's workdir."""
