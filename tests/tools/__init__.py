"""Tests of the run tools: check, show, the live view, wandb."""
