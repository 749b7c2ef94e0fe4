"""The roles: each a job started by the conductor, each a loop `while not stopping: read -> compute -> publish`.

The conductor knows them only by name and entry function (`ENTRYPOINTS`)."""

ENTRYPOINTS = {
    "warm_start": "prime_values.roles.warm_start:main",
    "inference": "prime_values.roles.inference:main",
    "evaluator": "prime_values.roles.evaluator:main",
    "orchestrator": "prime_values.roles.orchestrator:main",
    "policy_trainer": "prime_values.roles.policy_trainer:main",
    "value_trainer": "prime_values.roles.value_trainer:main",
}
