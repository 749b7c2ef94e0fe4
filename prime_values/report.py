"""The old path of prime_values/tools/report.py: `python -m prime_values.report` and imports from here keep working."""
import runpy

if __name__ == "__main__":  # exactly `python -m prime_values.tools.report`
    runpy.run_module("prime_values.tools.report", run_name="__main__", alter_sys=True)
else:
    from prime_values.tools.report import *  # noqa: F401,F403
