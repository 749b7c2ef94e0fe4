"""Tests of the estimators' formulas (GAE, losses, EV, baselines), each worked by hand."""
