"""Tests of the tasks, their verifiers and environments, hostile input, and a user's own task."""
