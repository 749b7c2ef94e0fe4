"""The old path of prime_values/tools/check.py: `python -m prime_values.check` and imports from here keep working."""
import runpy

if __name__ == "__main__":  # exactly `python -m prime_values.tools.check`
    runpy.run_module("prime_values.tools.check", run_name="__main__", alter_sys=True)
else:
    from prime_values.tools.check import *  # noqa: F401,F403
