"""The entrypoint: composition, one-line config errors before any job starts, docs from docstrings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prime_values.config import Config, ConfigError, markdown_reference, validate

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path = REPO, env: dict | None = None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "prime_values", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cfg_job_prints_the_composed_config():
    result = cli("+experiment=arith", "policy.lr=3e-4", "topology=colocated", "--cfg", "job")
    assert result.returncode == 0, result.stderr
    for line in ("  lr: 0.0003", "  evaluator: colocated", "  group_size: 2", "  prompts_per_step: 64",
                 "  min_digits: 1", "  estimator: gae", "steps: 200"):
        assert line in result.stdout.splitlines(), line


@pytest.mark.parametrize("override, expected", [
    ("policy.lrr=3", "unknown config key 'policy.lrr' (did you mean 'lr'?)"),
    ("stepz=3", "unknown config key 'stepz' (did you mean 'steps'?)"),
    ("policy.lr=fast", "config key 'policy.lr'"),
    ("inference.group_size=1.5", "config key 'inference.group_size'"),
    ("topology=ring", "no config 'topology/ring'; available: colocated, cpu, dedicated"),
    ("topology.policy_trainer_device=cuda:3",
     "topology.policy_trainer_device=cuda:3 asks for a GPU that does not exist"),
    ("advantage.estimator=ppo", "advantage.estimator='ppo' is not allowed; choose one of gae, grpo"),
    ("topology.inference_workers=3", "must be divisible by topology.inference_workers=3"),
])
def test_config_errors_are_one_line_before_any_job(tmp_path, override, expected):
    result = cli("+experiment=arith", override, f"hydra.run.dir={tmp_path / 'run'}",
                 env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prime_values: config error: "), result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_allowed_keys_are_listed_for_a_typo():
    result = cli("+experiment=arith", "replay.capasity=3")
    assert "allowed keys under 'replay.': capacity, max_age, max_reuse, min_rollouts" in result.stderr


def test_validate_rejects_impossible_sizes():
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(Config)
    validate(cfg, cuda_count=0)
    cfg.replay.min_rollouts = cfg.replay.capacity + 1
    with pytest.raises(ConfigError, match="replay.min_rollouts"):
        validate(cfg, cuda_count=0)
    cfg = OmegaConf.structured(Config)
    cfg.topology.value_trainer_device = "cuda:1"
    validate(cfg, cuda_count=2)
    with pytest.raises(ConfigError, match="cuda:0..cuda:0"):
        validate(cfg, cuda_count=1)


def test_every_field_is_documented():
    rows = markdown_reference()
    undocumented = [row for row in rows if row.endswith("|  |")]
    assert not undocumented, undocumented
    assert any(row.startswith("| `advantage.lambda_value` | `1.0` |") for row in rows)


@pytest.mark.slow  # 6-11 s on 2 cores (processes or model files): out of the fast tier
def test_conf_is_found_from_an_installed_package(tmp_path):
    """A non-editable install (wheel contents, no source tree on the path) composes the same config."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(REPO)], check=True, capture_output=True, timeout=300)
    assert (site / "prime_values" / "conf" / "experiment" / "arith.yaml").is_file()
    assert not (site / "prime_values" / "conf").is_symlink()
    env = {"PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import prime_values; print(prime_values.__file__)"],
                           cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True)
    assert where.stdout.startswith(str(site))
    result = cli("+experiment=arith", "--cfg", "job", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "  evaluator: dedicated" in result.stdout


def test_configuration_doc_is_current():
    from prime_values.config import configuration_doc

    assert (REPO / "docs" / "configuration.md").read_text() == configuration_doc(), \
        "regenerate: python -m prime_values.config > docs/configuration.md"


def test_inference_vllm_without_vllm_is_one_line_before_any_job(tmp_path):
    """vLLM is an optional extra: choosing it where it is not installed fails at config time, saying how to
    install it. The child process hides vLLM whether or not this venv has it (sys.modules[name] = None)."""
    code = "import sys; sys.modules['vllm'] = None; from prime_values.__main__ import main; main()"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", code, "+experiment=arith", "inference=vllm",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prime_values: config error: inference=vllm needs vLLM"), \
        result.stderr
    assert "pip install 'prime_values[vllm]'" in lines[0]
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_inference_backend_checks(monkeypatch):
    from prime_values.__main__ import precheck
    from prime_values.config import inference

    monkeypatch.setattr(inference, "vllm_installed", lambda: False)
    assert precheck(["+experiment=arith", "inference=vllm"]) == inference.VLLM_INSTALL_HINT
    assert precheck(["+experiment=arith"]) is None  # hf needs nothing optional
    monkeypatch.setattr(inference, "vllm_installed", lambda: True)
    assert precheck(["+experiment=arith", "inference=vllm", "topology.inference_tp=2",
                     "+inference.vllm_args.max_model_len=64"]) is None
    assert "only with inference=vllm" in precheck(["+experiment=arith", "topology.inference_tp=2"])
    assert "must be >= 1" in precheck(["+experiment=arith", "inference=vllm", "topology.inference_tp=0"])
    assert "use inference=hf" in precheck(["+experiment=embedded", "inference=vllm", "task=verifiers",
                                           "task.env_id=reverse-text"])
    assert "inference.dtype='fp8' is not allowed" in precheck(["+experiment=arith", "inference=vllm",
                                                               "inference.dtype=fp8"])
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(Config)
    cfg.inference.backend, cfg.topology.inference_tp, cfg.topology.inference_device = "vllm", 2, "cuda:1"
    validate(cfg, cuda_count=3)
    with pytest.raises(ConfigError, match=r"topology.inference_tp=2 needs one GPU per process \(rank\), "
                                          r"cuda:1..cuda:2"):
        validate(cfg, cuda_count=2)


def test_a_tensor_parallel_inference_job_gets_its_gpus(tmp_path):
    from omegaconf import OmegaConf

    from prime_values.launch import make_executor, resolve_devices, role_gpus

    cfg = OmegaConf.structured(Config)
    cfg.topology.inference_tp = 2
    assert role_gpus(cfg.topology, "inference") == 2 and role_gpus(cfg.topology, "evaluator") == 1
    for key in ("inference_device", "evaluator_device", "policy_trainer_device", "value_trainer_device"):
        cfg.topology[key] = "auto"
    resolve_devices(cfg.topology, cuda_count=4)
    assert (cfg.topology.inference_device, cfg.topology.evaluator_device) == ("cuda:0", "cuda:2")
    executor = make_executor(cfg.launcher, tmp_path, "inference0", "cuda:2", tasks=1, gpus=2)
    assert executor.parameters["visible_gpus"] == [2, 3] and executor.parameters["tasks_per_node"] == 1


def test_load_saved_gives_an_old_run_the_keys_added_since(tmp_path):
    from omegaconf import OmegaConf

    from prime_values.config import load_saved

    old = OmegaConf.to_container(OmegaConf.structured(Config))
    del old["critic"]["placement"]  # a run saved before critic.placement existed
    old["critic"]["template"] = "{privileged}|"
    OmegaConf.save(OmegaConf.create(old), tmp_path / "config.yaml")
    cfg = load_saved(tmp_path / "config.yaml")
    assert cfg.critic.placement == "start" and cfg.critic.template == "{privileged}|"
    old["critic"]["a_key_removed_since"] = 1
    OmegaConf.save(OmegaConf.create(old), tmp_path / "config.yaml")
    assert load_saved(tmp_path / "config.yaml").critic.a_key_removed_since == 1  # kept as written


def test_roles_of_a_run_saved_by_older_code_read_keys_added_since(tmp_path):
    """A run resumed by newer code: its roles read config.yaml through load_saved, so a key the run's file lacks
    (here policy.lr_decay_steps, which the policy trainer reads every step) has its default, not a crash."""
    from omegaconf import OmegaConf

    from prime_values.roles.common import RoleContext

    old = OmegaConf.to_container(OmegaConf.structured(Config))
    del old["policy"]["lr_decay_steps"]
    old["policy"]["lr"] = 3e-4
    OmegaConf.save(OmegaConf.create(old), tmp_path / "config.yaml")
    assert "lr_decay_steps" not in OmegaConf.load(tmp_path / "config.yaml").policy
    import torch

    threads = torch.get_num_threads()
    try:
        ctx = RoleContext(tmp_path, "policy_trainer")  # sets torch's thread count, as a role process does
    finally:
        torch.set_num_threads(threads)
    assert ctx.cfg.policy.lr_decay_steps == 0 and ctx.cfg.policy.lr == 3e-4


def test_load_saved_reads_a_config_saved_before_the_package_and_derives_the_facts(tmp_path):
    """tests/data/old_run_config.yaml: a real run's config.yaml from before prime_values/config/ (every task's keys
    under task, no resolved.*). load_saved keeps the run's own task keys, drops the other tasks', and derives
    resolved.* from the keys (a roles' reader resumes the run with the same schedule)."""
    from omegaconf import OmegaConf

    from prime_values.config import ArithTaskConfig, load_saved

    old = REPO / "tests" / "data" / "old_run_config.yaml"
    assert "resolved" not in OmegaConf.load(old) and "dataset" in OmegaConf.load(old).task
    cfg = load_saved(old)
    assert OmegaConf.get_type(cfg.task) is ArithTaskConfig and "dataset" not in cfg.task
    assert cfg.task.digits == 1 and cfg.steps == OmegaConf.load(old).steps
    assert dict(cfg.resolved) == {"uses_critic": True, "lockstep": False, "max_off_policy": 1, "cpu_processes": 4}
    validate(cfg, cuda_count=0, environment=False)
    for overrides, facts in ((["advantage.estimator=grpo"], (False, False, 1)),
                             (["schedule.mode=lockstep", "schedule.max_off_policy=3"], (True, True, 0))):
        changed = OmegaConf.merge(OmegaConf.load(old), OmegaConf.from_dotlist(overrides))
        OmegaConf.save(changed, tmp_path / "config.yaml")
        got = load_saved(tmp_path / "config.yaml").resolved
        assert (got.uses_critic, got.lockstep, got.max_off_policy) == facts, overrides
    saved = OmegaConf.merge(OmegaConf.load(old), {"resolved": {"uses_critic": True, "lockstep": False,
                                                               "max_off_policy": 1}})
    OmegaConf.save(saved, tmp_path / "config.yaml")
    assert load_saved(tmp_path / "config.yaml").resolved.max_off_policy == 1  # a saved fact is kept as saved


def test_a_prepared_config_carries_the_derived_facts():
    from tests.e2e_helpers import compose

    cfg = compose(["+experiment=arith", "schedule.mode=lockstep", "advantage=grpo"])
    assert dict(cfg.resolved) == {"uses_critic": False, "lockstep": True, "max_off_policy": 0, "cpu_processes": 2}


def test_role_threads_split_the_cores_among_the_cpu_processes(monkeypatch):
    """topology.threads_per_role=0 (auto), worked by hand: cores // CPU processes, at least 1; an explicit value,
    OMP_NUM_THREADS or a SLURM step's CPUs win. The embedded run's 4 processes (inference, evaluator, both trainers)
    on 2 cores get 1 each; GPU roles are not counted."""
    import os

    from omegaconf import OmegaConf

    from prime_values.config.derived import derive
    from prime_values.launch import role_threads

    def cfg(threads=0, processes=4):
        return OmegaConf.create({"topology": {"threads_per_role": threads}, "resolved": {"cpu_processes": processes}})

    for cores, processes, want in ((2, 4, 1), (16, 4, 4), (7, 3, 2), (1, 1, 1)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert role_threads(cfg(processes=processes), environ={}) == want, (cores, processes)
    assert role_threads(cfg(threads=3), environ={"OMP_NUM_THREADS": "1"}) == 3
    assert role_threads(cfg(), environ={"OMP_NUM_THREADS": "2"}) == 2
    assert role_threads(cfg(), environ={"SLURM_CPUS_PER_TASK": "5"}) == 5
    trainer_two = cfg(processes=4)
    trainer_two.topology.policy_trainer_threads = 2  # the policy trainer's own budget; the other roles keep theirs
    assert role_threads(trainer_two, environ={}, role="policy_trainer") == 2
    assert role_threads(trainer_two, environ={}, role="inference0") == role_threads(cfg(processes=4), environ={})
    from tests.e2e_helpers import compose

    two_ranks = compose(["+experiment=arith", "topology.policy_trainer_procs=2"])
    assert two_ranks.resolved.cpu_processes == 5
    two_ranks.topology.policy_trainer_device = "cuda:0"
    assert derive(two_ranks)["cpu_processes"] == 3  # inference, evaluator, value trainer: the ranks are on GPUs


def test_every_config_check_hook_is_registered_by_the_module_it_names():
    """prime_values.launch.checks (what `python -m prime_values` and the conductor import) registers a check for
    every hook the config declares, each from the module the declaration names."""
    import inspect

    from prime_values.config.checks import HOOKS, unregistered
    from prime_values.launch import checks

    assert unregistered() == [] and len(HOOKS) >= 15, [hook.name for hook in unregistered()]
    for hook in HOOKS.values():
        assert inspect.getsourcefile(hook.check).endswith(hook.where), (hook.name, hook.where)
    assert {module.__name__ for module in checks.REGISTRARS} == \
        {hook.where.removesuffix(".py").replace("/", ".") for hook in HOOKS.values()}


def test_a_hook_name_is_declared_once_and_registered_once():
    from prime_values.config.checks import HOOKS, declare, register_check, require_all, run_check

    name = declare("test.example", "an example", "tests/config/test_config.py")
    try:
        with pytest.raises(ValueError, match="no config check hook 'test.exmaple' is declared"):
            register_check("test.exmaple")(lambda cfg, environment: None)
        with pytest.raises(RuntimeError, match=r"test.example \(an example\): tests/config/test_config.py"):
            require_all()
        HOOKS[name].where = "prime_values/config/base.py"  # a module that registers nothing: imported, then named
        with pytest.raises(RuntimeError, match="prime_values/config/base.py does not register it"):
            run_check(name, None, True)
        seen = []

        @register_check(name)
        def check(cfg, environment):
            seen.append((cfg, environment))

        register_check(name)(check)  # the same function again (a reloaded module): fine
        with pytest.raises(ValueError, match="registered twice"):
            register_check(name)(lambda cfg, environment: None)
        run_check(name, "cfg", False)
        assert seen == [("cfg", False)]
    finally:
        del HOOKS[name]


def test_importing_the_config_imports_nothing_of_prime_values_above_it():
    """What tests/project/test_layering.py reads from the source, in a fresh interpreter: importing
    prime_values.config (and composing a config) loads no task, backend, launch or model module;
    prime_values.launch.checks loads those that register the hooks."""
    code = ("import sys; import prime_values.config as c; c.compose(['+experiment=arith']); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('prime_values'))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    above = [m for m in loaded if m != "prime_values" and not m.startswith(
        ("prime_values.config", "prime_values.algo", "prime_values.importpath"))]
    assert above == [], above
    assert "prime_values.config.checks" in loaded


def test_a_prepared_config_runs_every_hook_without_the_launch_s_imports():
    """A library user's compose(prepared=True) in a fresh interpreter (no python -m prime_values, no
    prime_values.launch.checks): the GGUF hook's module is imported by its name and its check refuses the file."""
    code = ("import prime_values.config as c\n"
            "try:\n    c.compose(['+experiment=arith', 'policy.model=/nonexistent/policy.gguf'], prepared=True)\n"
            "except c.ConfigError as e:\n    print('refused:', e)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert "refused: policy.model='/nonexistent/policy.gguf': no such file" in result.stdout, result.stdout


def test_one_launch_validates_a_config_once(monkeypatch):
    """Inside validating_once (python -m prime_values), validate passes at once a config it has validated (the
    stages and the conductor validate the command line's config again); a changed config is validated again, and
    outside it every call validates."""
    from omegaconf import OmegaConf

    from prime_values.config import root, validating_once

    calls = []
    monkeypatch.setattr(root, "CHECKS", (lambda cfg, environment: calls.append(cfg.steps),))
    cfg = OmegaConf.structured(Config)
    with validating_once():
        validate(cfg, cuda_count=0)
        validate(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)), cuda_count=0)  # the conductor's copy
        assert calls == [200]
        validate(cfg, cuda_count=0, environment=False)  # other checks: validated again
        changed = OmegaConf.merge(cfg, {"steps": 7})
        validate(changed, cuda_count=0)
        assert calls == [200, 200, 7]
        cfg.policy.lr = -1.0  # a field rule broken after it passed: a different config, refused
        with pytest.raises(ConfigError, match="policy.lr=-1.0 must be > 0"):
            validate(cfg, cuda_count=0)
    cfg.policy.lr = 1e-4
    validate(cfg, cuda_count=0)
    assert calls == [200, 200, 7, 200]


def test_the_data_config_keeps_for_the_code_above_it_agrees_with_that_code():
    """Names the config holds so it needs nothing above it: the custom task's option and the reasoning_gym answer
    formats are the tasks' own."""
    from prime_values import tasks
    from prime_values.config import task as task_config
    from prime_values.tasks import reasoning_gym

    assert task_config.CUSTOM == tasks.CUSTOM
    assert task_config.ANSWER_FORMATS == tuple(reasoning_gym.ANSWER_FORMATS)
    assert set(task_config.TASK_NAMES) == set(tasks.TASKS) | {tasks.CUSTOM}
