"""Tests of composing, validating and documenting a run's config; every bad config's one-line refusal."""
