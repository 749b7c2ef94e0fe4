"""`python -m bench`: every benchmark, one table (bench/run_all.py)."""

from bench.run_all import main

main()
