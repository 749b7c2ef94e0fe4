"""The old path of prime_values/tools/status.py: `python -m prime_values.status` and imports from here keep working."""
import runpy

if __name__ == "__main__":  # exactly `python -m prime_values.tools.status`
    runpy.run_module("prime_values.tools.status", run_name="__main__", alter_sys=True)
else:
    from prime_values.tools.status import *  # noqa: F401,F403
