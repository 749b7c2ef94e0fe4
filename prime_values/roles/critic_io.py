"""The old path of prime_values/critic_io.py (library code, not a role), kept for the roles that still import it
from here (policy_trainer, value_trainer, warm_start); new code imports prime_values.critic_io."""
from prime_values.critic_io import *  # noqa: F401,F403
