"""The old path of prime_values/tools/show.py: `python -m prime_values.show` and imports from here keep working."""
import runpy

if __name__ == "__main__":  # exactly `python -m prime_values.tools.show`
    runpy.run_module("prime_values.tools.show", run_name="__main__", alter_sys=True)
else:
    from prime_values.tools.show import *  # noqa: F401,F403
