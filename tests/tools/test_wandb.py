"""W&B forwarding (prime_values/wandb_sink.py), for real: wandb in offline mode writes its run file into a tmp
run directory, and the test reads that file back (W&B's record log: 7-byte header, 32 KiB blocks of
checksummed chunks, each record a `wandb_internal_pb2.Record` protobuf) to find the forwarded metrics."""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from prime_values.config import Config, ConfigError, check_wandb
from prime_values.monitor import MetricsWriter
from prime_values.rundir import RunDir
from prime_values.wandb_sink import (
    WandbForwarder,
    has_api_key,
    record_to_row,
    resolve_mode,
    sweep_group,
    sweep_point_name,
)


def config(**wandb_keys):
    cfg = OmegaConf.structured(Config)
    for key, value in wandb_keys.items():
        cfg.wandb[key] = value
    return cfg


def read_wandb_records(path: Path) -> list:
    """Every record of a W&B `.wandb` file (LevelDB-log framing)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, _magic, _version = struct.unpack_from("<4sHB", data, 0)
    assert ident == b":W&B", f"{path} is not a W&B run file"
    pos, block, pending, raw = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # full
            raw.append(chunk)
        elif kind == 2:  # first
            pending = chunk
        elif kind == 3:  # middle
            pending += chunk
        elif kind == 4:  # last
            raw.append(pending + chunk)
    records = []
    for item in raw:
        record = pb.Record()
        record.ParseFromString(item)
        records.append(record)
    return records


def offline_run(run_dir: Path) -> dict:
    """{'run': the run record, 'history': [dict], 'config': {key: value}} of the offline runs under run_dir."""
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, f"no offline W&B run under {run_dir / 'wandb'}"
    out = {"history": [], "config": {}, "runs": [], "summary": {}}
    for path in files:
        for record in read_wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                out["history"].append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                       for item in record.history.item})
            elif kind == "run":
                out["runs"].append(record.run)
                out["config"].update({item.key: json.loads(item.value_json) for item in record.run.config.update})
            elif kind == "summary":
                out["summary"].update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                       for item in record.summary.update})
            elif kind == "config":
                out["config"].update({item.key: json.loads(item.value_json) for item in record.config.update})
    return out


def test_check_wandb():
    check_wandb(config())  # disabled: nothing needed
    check_wandb(config(mode="offline"))
    with pytest.raises(ConfigError, match="wandb.mode='cloud' is not allowed; choose one of disabled, offline, "):
        check_wandb(config(mode="cloud"))


def test_check_wandb_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without wandb looks like to find_spec
    check_wandb(config())
    for mode in ("offline", "online"):
        with pytest.raises(ConfigError) as error:
            check_wandb(config(mode=mode))
        assert str(error.value).startswith(f"wandb.mode={mode} needs the wandb package: pip install "
                                           "'prime_values[wandb]'") and "\n" not in str(error.value)


def test_record_to_row_prefixes_and_policy_step():
    assert record_to_row("policy_trainer", {"time": 1.0, "role": "policy_trainer", "step": 3, "loss": 0.5,
                                            "note": "text", "ev": None}, 2) == \
        {"policy_trainer/step": 3, "policy_trainer/loss": 0.5, "policy_step": 3}
    assert record_to_row("inference1", {"for_step": 7, "warmup": False, "tokens_per_s": 9.0}, 5) == \
        {"inference1/for_step": 7, "inference1/warmup": 0, "inference1/tokens_per_s": 9.0, "policy_step": 7}
    assert record_to_row("value_trainer", {"critic_step": 4, "value_loss": 0.1}, 5)["policy_step"] == 5
    assert "policy_step" not in record_to_row("value_trainer", {"value_loss": 0.1}, None)
    assert record_to_row("warm_start", {"step": 10, "loss": 2.0}, None)["policy_step"] == 0  # an SFT step
    assert sweep_point_name(["-m", "+experiment=arith", "advantage=gae,tether", "seed=0,1", "steps=5",
                             "hydra.sweep.dir=sweeps/critic"],
                            ["+experiment=arith", "advantage=tether", "seed=1", "steps=5"]) == "advantage=tether,seed=1"
    assert sweep_point_name(["+experiment=arith"], ["+experiment=arith"]) == ""
    assert sweep_group("sweeps/critic") == "critic"
    assert sweep_group("multirun/2026-11-30/12-28-45") == "2026-11-30/12-28-45"


@pytest.mark.slow  # 6-11 s on 2 cores (processes or model files): out of the fast tier
def test_forwards_every_role_to_one_offline_run(tmp_path):
    run = RunDir(tmp_path / "run")
    run.mkdirs()
    warm, policy, critic = (MetricsWriter(run.metrics(r), r) for r in ("warm_start", "policy_trainer",
                                                                          "value_trainer"))
    warm.log(sft_step=5, step=5, loss=3.0)
    policy.log(step=1, loss=0.25, reward_mean=0.5)
    critic.log(critic_step=1, critic_version=1, value_loss=0.125)
    cfg = config(mode="offline", poll_s=0.05, tags=["test"])
    cfg.advantage.estimator = "tether"
    forwarder = WandbForwarder(run, cfg, group="sweep-a", name="point-1").start()
    assert forwarder.enabled and forwarder.mode == "offline"
    policy.log(step=2, loss=0.125, reward_mean=0.75)  # while the thread polls; a role that appears late:
    MetricsWriter(run.metrics("orchestrator"), "orchestrator").log(step=3, advantage_mean=-0.5)
    forwarder.close(summary={"status": "finished", "final_accuracy": 0.5, "run_dir": "/x", "written_at": 1.0})
    got = offline_run(run.root)
    rows = got["history"]
    assert [(r["policy_step"], r["policy_trainer/loss"]) for r in rows if "policy_trainer/loss" in r] == \
        [(1, 0.25), (2, 0.125)]
    assert [(r["policy_step"], r["value_trainer/value_loss"]) for r in rows if "value_trainer/value_loss" in r] == \
        [(1, 0.125)]  # no step of its own: the policy step reached when it was written
    assert [(r["policy_step"], r["orchestrator/advantage_mean"]) for r in rows if "orchestrator/advantage_mean" in r] \
        == [(3, -0.5)]
    assert [(r["policy_step"], r["warm_start/sft_step"], r["warm_start/loss"]) for r in rows
            if "warm_start/loss" in r] == [(0, 5, 3.0)]
    assert len(got["runs"]) == 1
    assert (got["runs"][0].run_group, got["runs"][0].display_name, got["runs"][0].project) == \
        ("sweep-a", "point-1", "prime_values")
    assert got["config"]["advantage"]["estimator"] == "tether"  # the composed config travels with the run
    assert got["config"]["wandb"]["mode"] == "offline"
    assert got["summary"]["summary/final_accuracy"] == 0.5 and got["summary"]["summary/status"] == "finished"
    assert "summary/run_dir" not in got["summary"] and "summary/written_at" not in got["summary"]

    # a rerun in the same directory resumes: same W&B run id, only the new records
    policy.log(step=3, loss=0.0625, reward_mean=1.0)
    time.sleep(1.1)  # W&B names an offline run's directory by the second it started
    with WandbForwarder(run, cfg) as again:
        assert again.poll() == 1
    ids = {p.name.split("-")[-1] for p in (run.root / "wandb").glob("offline-run-*")}
    assert len(ids) == 1, ids
    losses = [r["policy_trainer/loss"] for r in offline_run(run.root)["history"] if "policy_trainer/loss" in r]
    assert losses == [0.25, 0.125, 0.0625]


def test_online_without_api_key_falls_back_to_offline(tmp_path, monkeypatch, capsys):
    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "netrc").write_text("machine example.org login me password secret\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert not has_api_key()
    assert resolve_mode("online") == "offline"
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "no W&B API key" in lines[0] and "offline" in lines[0]
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password " + "x" * 40 + "\n")
    assert has_api_key() and resolve_mode("online") == "online"
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    monkeypatch.setenv("WANDB_API_KEY", "y" * 40)
    assert resolve_mode("online") == "online"


def test_disabled_does_nothing(tmp_path):
    run = RunDir(tmp_path / "run")
    run.mkdirs()
    MetricsWriter(run.metrics("policy_trainer"), "policy_trainer").log(step=1, loss=1.0)
    with WandbForwarder(run, config()) as forwarder:
        assert not forwarder.enabled and forwarder.poll() == 0
    assert not (run.root / "wandb").exists()
