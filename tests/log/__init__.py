"""Tests of the rollout log, replay, weights versions, the warm-start cache and the rollouts dataset."""
