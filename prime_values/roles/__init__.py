"""The roles: each a job started by the conductor, each a loop `while not stopping: read -> compute -> publish`.

The conductor knows them only by name and entry function (`ENTRYPOINTS`), and imports none of them."""

ENTRYPOINTS = {
    "warm_start": "prime_values.roles.warm_start:main",
    "inference": "prime_values.roles.inference:main",
    "evaluator": "prime_values.roles.evaluator:main",
    "orchestrator": "prime_values.roles.orchestrator:main",
    "policy_trainer": "prime_values.roles.policy_trainer:main",
    "value_trainer": "prime_values.roles.value_trainer:main",
}


def evaluator_name(index: int) -> str:
    """Role (job, metrics, cursor) name of evaluator `index`: 'evaluator', then 'evaluator1', 'evaluator2'..."""
    return f"evaluator{index}" if index else "evaluator"
