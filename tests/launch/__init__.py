"""Tests of starting, supervising, recovering and stopping runs: local, SLURM, stages, sweeps, chaos."""
