"""The old path of prime_values/tools/chaos.py: `python -m prime_values.chaos` and imports from here keep working."""
import runpy

if __name__ == "__main__":  # exactly `python -m prime_values.tools.chaos`
    runpy.run_module("prime_values.tools.chaos", run_name="__main__", alter_sys=True)
else:
    from prime_values.tools.chaos import *  # noqa: F401,F403
