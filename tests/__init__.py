"""The suite, one folder per layer of the package (docs/development.md, "Tests"): algo, config, log, models, tasks,
roles, launch, tools, whole pipelines (e2e), bench, and rules over the whole repository (project). Modules shared by
several folders sit here: e2e_helpers (version 0 and the learning checks), log_rows, reference_gae,
reference_scoring, role_context; fixtures shared by the suite are in conftest.py."""
