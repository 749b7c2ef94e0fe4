"""`python -m prime_values.config > docs/configuration.md`: the configuration reference."""

from prime_values.config.docs import configuration_doc

print(configuration_doc(), end="")
