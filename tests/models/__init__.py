"""Tests of building, loading and running the policy and critic models: attention, packing, precision, LoRA,
version 0, the real model."""
