"""Tests of the roles' parts: orchestrator wiring, the policy step, the oracle, distributed trainers."""
