"""Tests of rules over the whole repository: docs, lint, layering, product words."""
