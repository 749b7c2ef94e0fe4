"""The command-line tools over a run directory (docs/design.md §6): check, show, live, status, summary, report, plots,
sweep, chaos. Each runs as `python -m prime_values.tools.<tool>`; they read what the roles wrote and sit above every
other layer: nothing in roles, algo, log, weights, models or tasks imports them."""
