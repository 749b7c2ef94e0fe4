"""The old path of prime_values/tools/plots.py, kept so that imports from `prime_values.plots` keep working."""
from prime_values.tools.plots import *  # noqa: F401,F403
