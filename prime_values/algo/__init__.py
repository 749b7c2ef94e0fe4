"""Pure math on tensors: advantages, losses, privileged critic layout, explained variance (docs/design.md §3).
Imports only torch (and numpy, the standard library).

The modules: `gae` (GAE, GRPO, tether, linear-mix and batch-mean advantages, value targets), `estimators` (the
`Estimator` protocol and the registry of estimators by name, which the config reads without torch), `losses` (PPO
clip, prob-diff mask, value losses, token logprobs), `privileged` (the critic's layout with the privileged block),
`ev` (pooled explained variance), `ema` (weight averaging). Import from the module (`from prime_values.algo.gae
import gae`): the package itself imports nothing, so a tool that needs only `ev.ev_from_sums` (the run summary) does
not pay torch's import.
"""
