"""Every config check, registered: importing this module imports each module that registers a check hook with
prime_values.config.checks (`REGISTRARS`: the tasks' checks and the sft stage's data, the embedded model's token
budgets, a GGUF policy.model, the SLURM layout and fit), then requires that every hook config declares has its
check, so `config.validate` (and `config.prepare`, `config.compose(prepared=True)`) runs all of them.
`python -m prime_values` and the conductor import it: the same checks run before any job starts, wherever a
launch begins."""

from __future__ import annotations

from prime_values import budget, gguf
from prime_values.config.checks import require_all
from prime_values.launch import slurm
from prime_values.tasks import checks as task_checks

REGISTRARS = (task_checks, budget, gguf, slurm)
"""the modules whose import registers the hooks config declares (each hook names its module: config/checks.py)"""

require_all()  # a hook no module registers would be skipped silently: a RuntimeError naming it instead
