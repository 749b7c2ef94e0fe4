"""`python -m prime_values +experiment=arith [key=value ...]`: compose, validate, run the experiment's stages
(`stages: [sft, rl, eval]`, prime_values.stages; `rl` is the conductor).

Before Hydra takes over, the command line is composed once with Hydra's compose API and validated, so a
misspelled key, a wrong type, an unknown group option or an impossible topology fails in one line, before
any job is submitted and without a traceback. Every check runs (prime_values.launch.checks registers the ones
that need the code above the config), once per config in this launch (`config.validating_once`: the stages and
the conductor find the command line's config validated). Heavy imports (torch, transformers) happen in the roles.

The stages end with an outcome (prime_values.supervisor.Outcome); this is the one place that turns it into the
exit code (EXIT_CODES):

    0  finished; detached (a conductor job runs it); stopped by the user (`prime_values.tools.status --stop`)
    1  failed (a role or stage failed for good, the pipeline's job ended badly); interrupted (Ctrl-C, SIGTERM)
    2  a config error, before any job started

In a multirun, a point that does not exit 0 ends the sweep with its code.
"""

from __future__ import annotations

import re
import sys

from omegaconf import OmegaConf

from prime_values.config import CONF_DIR, Config, ConfigError, compose, register, validate, validating_once
from prime_values.config.task import unknown_key_hint
from prime_values.launch import checks  # noqa: F401 - registers every config check hook before anything validates
from prime_values.stages import run_stages

# Hydra flags that take a value and are not overrides.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}


def _overrides(argv: list[str]) -> list[str]:
    """The key=value overrides of a command line, one value per sweep (the first) so it can be composed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _FLAGS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-") and not arg.lstrip("+~").startswith("hydra"):
            args.append(arg)
    parsed = OverridesParser.create().parse_overrides(args)
    result = []
    for override in parsed:
        if override.is_sweep_override():
            first = next(iter(override.sweep_string_iterator()))
            result.append(f"{override.get_key_element()}={first}")
        else:
            result.append(override.input_line)
    return result


def _allowed_keys(full_key: str, composed=None) -> list[str]:
    """The keys beside `full_key`: in `composed` (the config without the bad override: its task's keys), else in
    the schema."""
    node = composed if composed is not None else OmegaConf.structured(Config)
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    for part in filter(None, parent.split(".")):
        node = node[part]
    return sorted(str(k) for k in node.keys())


def explain(error: BaseException, composed=None) -> str:
    """One sentence for a composition/validation error: the key, what was wrong, what is allowed (`composed`: the
    config as composed without the override that failed, whose keys are the allowed ones)."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    if isinstance(error, ConfigError):
        return str(error)
    cause = error
    while cause.__cause__ is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    unknown = re.match(r"Could not override '([^']+)'", str(error))
    in_file = re.match(r"In '([^']+)': ConfigKeyError.*full_key: (\S+)", " ".join(str(error).split()))
    if unknown or in_file or (isinstance(cause, ConfigKeyError) and getattr(cause, "full_key", None)):
        key = unknown.group(1) if unknown else in_file.group(2) if in_file else cause.full_key
        allowed = _allowed_keys(key, composed if unknown else None) if not in_file else []
        hint = unknown_key_hint(key, allowed)
        if in_file:  # a config file (an experiment) sets a key the chosen option (a task) does not have
            return f"config key '{key}' set by {in_file.group(1)} is not a key of this config{hint}; choose the " \
                   f"options that file was written for, or drop it"
        section = key.rsplit(".", 1)[0] + "." if "." in key else ""
        return f"unknown config key '{key}'{hint}; allowed keys under '{section or '<root>'}': {', '.join(allowed)}"
    if isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
        msg = str(cause).splitlines()[0]
        return f"config key '{cause.full_key}': {msg}"
    if isinstance(error, MissingConfigException):
        options = getattr(error, "options", None)
        missing = getattr(error, "missing_cfg_file", None) or str(error).splitlines()[0]
        if options:
            return f"no config '{missing}'; available: {', '.join(options)}"
    return " ".join(str(error).split())


def precheck(argv: list[str]) -> str | None:
    """Compose and validate the command line; the one-line error, or None when it is good. With `--cfg`
    (print the composed config) the checks of this machine are left out: they belong to the launch."""

    overrides = []
    try:
        overrides = _overrides(argv)
        cfg = compose(overrides)
        environment = not any(a in ("--cfg", "-c") or a.startswith("--cfg=") for a in argv)
        validate(cfg, environment=environment)
    except Exception as error:  # noqa: BLE001 - every config error becomes the one line explain() prints
        return explain(error, _composed_without(error, overrides))
    return None


def _composed_without(error: BaseException, overrides: list[str]):
    """The config composed without the override an unknown-key error names (its keys are the allowed ones:
    the chosen task's), or None."""

    unknown = re.match(r"Could not override '([^']+)'", str(error))
    if not unknown:
        return None
    rest = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != unknown.group(1)]
    try:
        return compose(rest)
    except Exception:  # noqa: BLE001 - another problem: the schema's keys
        return None


EXIT_CODES = {"finished": 0, "detached": 0, "stopped": 0, "failed": 1, "interrupted": 1, "bad config": 2}


def exit_code(outcome) -> int:
    """The exit code of a run that ended with `outcome` (the module docstring's table)."""
    return EXIT_CODES[outcome.ending.value]


def main() -> None:
    with validating_once():  # the precheck's config, validated here, is not validated again by the stages
        _main(sys.argv[1:])


def _main(argv: list[str]) -> None:
    if not any(a in ("--help", "-h", "--hydra-help") for a in argv):
        problem = precheck(argv)
        if problem:
            print(f"prime_values: config error: {problem}", file=sys.stderr)
            sys.exit(EXIT_CODES["bad config"])

    import hydra

    register()

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def run(cfg) -> dict:
        outcome = run_stages(cfg)
        if exit_code(outcome):
            sys.exit(exit_code(outcome))
        return outcome.result

    run()


if __name__ == "__main__":
    main()
