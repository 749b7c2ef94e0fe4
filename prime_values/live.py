"""The old path of prime_values/tools/live.py, kept so that imports from `prime_values.live` keep working."""
from prime_values.tools.live import *  # noqa: F401,F403
