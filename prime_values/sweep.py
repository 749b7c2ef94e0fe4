"""The old path of prime_values/tools/sweep.py, kept so that imports from `prime_values.sweep` keep working."""
from prime_values.tools.sweep import *  # noqa: F401,F403
