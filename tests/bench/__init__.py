"""Tests of the bench scripts' parsing, statistics and smoke runs."""
