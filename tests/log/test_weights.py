"""Versioned weights: publish complete dirs, adopt only complete versions, survive pruning."""

import errno
import os
import threading

import pytest

from prime_values.weights import Adopter, latest_version, prune, publish, version_dir, versions


def save_text(text):
    def save(d):
        (d / "weights.txt").write_text(text)
        (d / "config.json").write_text("{}")
    return save


def load_text(d):
    return (d / "weights.txt").read_text()


def test_publish_and_adopt_a_real_tiny_model(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(hidden_size=32, num_hidden_layers=1, vocab_size=32, intermediate_size=64,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    root = tmp_path / "weights" / "policy"
    adopter = Adopter(root, AutoModelForCausalLM.from_pretrained)
    assert not adopter.poll() and adopter.version is None
    path = publish(root, 0, model.save_pretrained)
    assert path == version_dir(root, 0) and (path / "model.safetensors").exists() and (path / "config.json").exists()
    assert latest_version(root) == 0 and (root / "LATEST").read_text().strip() == "0"
    assert adopter.poll() and adopter.version == 0
    for (name, p), q in zip(model.state_dict().items(), adopter.value.state_dict().values()):
        assert torch.equal(p, q), name
    assert sorted(os.listdir(root)) == ["0", "LATEST"]  # no temp dirs left behind


def test_versions_are_monotonic_across_restarts(tmp_path):
    publish(tmp_path, 3, save_text("v3"))
    for v in (3, 2):  # a fresh process knows nothing but the disk
        with pytest.raises(ValueError, match=f"refusing to publish version {v} to {tmp_path}: LATEST is already 3"):
            publish(tmp_path, v, save_text("again"))
    assert load_text(version_dir(tmp_path, 3)) == "v3"
    publish(tmp_path, 4, save_text("v4"))
    assert latest_version(tmp_path) == 4 and versions(tmp_path) == [3, 4]


def test_crash_in_save_never_exposes_an_incomplete_version(tmp_path):
    publish(tmp_path, 1, save_text("v1"))

    def half_save(d):
        (d / "model.safetensors").write_bytes(b"\0" * 100)
        raise RuntimeError("killed mid-save")

    with pytest.raises(RuntimeError, match="killed mid-save"):
        publish(tmp_path, 2, half_save)
    assert latest_version(tmp_path) == 1 and sorted(os.listdir(tmp_path)) == ["1", "LATEST"]

    def full_disk(d):
        (d / "model.safetensors").write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=r"publish weights .*2 \(No space left on device\); free disk space") as e:
        publish(tmp_path, 2, full_disk)
    assert e.value.errno == errno.ENOSPC
    assert latest_version(tmp_path) == 1 and sorted(os.listdir(tmp_path)) == ["1", "LATEST"]
    # a dead publisher's temp dir and a renamed-but-never-pointed-to version are cleaned up by the next publish
    (tmp_path / ".tmp-2-999999999").mkdir()
    (tmp_path / ".del-1-999999999").mkdir()
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "junk").write_text("x")
    publish(tmp_path, 2, save_text("v2"))
    assert sorted(os.listdir(tmp_path)) == ["1", "2", "LATEST"]
    assert sorted(os.listdir(tmp_path / "2")) == ["config.json", "weights.txt"]


def test_prune_keeps_newest_latest_and_protected(tmp_path):
    for v in range(6):
        publish(tmp_path, v, save_text(f"v{v}"))
    assert prune(tmp_path, keep=2) == [1, 2, 3]
    assert versions(tmp_path) == [0, 4, 5]
    assert prune(tmp_path, keep=1, protect=()) == [0, 4]
    assert versions(tmp_path) == [5] and latest_version(tmp_path) == 5
    (tmp_path / "LATEST").write_text("5\n")
    (tmp_path / "9").mkdir()  # a newer dir LATEST does not point to (crashed publisher): LATEST's is still kept
    assert prune(tmp_path, keep=1, protect=()) == [] and versions(tmp_path) == [5, 9]


def test_adopter_adopts_only_newer_versions(tmp_path):
    loads = []
    adopter = Adopter(tmp_path, lambda d: loads.append(d.name) or load_text(d))
    assert adopter.poll() is False and adopter.value is None
    publish(tmp_path, 1, save_text("one"))
    assert adopter.poll() and (adopter.version, adopter.value) == (1, "one")
    assert adopter.poll() is False and loads == ["1"]
    publish(tmp_path, 2, save_text("two"))
    publish(tmp_path, 3, save_text("three"))
    assert adopter.poll() and (adopter.version, adopter.value) == (3, "three") and loads == ["1", "3"]


def test_adopter_survives_a_version_pruned_while_loading(tmp_path):
    publish(tmp_path, 1, save_text("one"))

    def racing_load(d):
        if d.name == "1":  # the trainer publishes 2 and prunes 1 while we are reading it
            publish(tmp_path, 2, save_text("two"))
            prune(tmp_path, keep=1, protect=())
        return load_text(d)

    adopter = Adopter(tmp_path, racing_load)
    assert adopter.poll() and (adopter.version, adopter.value) == (2, "two")



def test_adopter_skips_a_version_that_does_not_load(tmp_path, caplog):
    publish(tmp_path, 1, save_text("one"))
    adopter = Adopter(tmp_path, load_text)
    assert adopter.poll() and adopter.value == "one"
    publish(tmp_path, 2, save_text("two"))
    (tmp_path / "2" / "weights.txt").unlink()  # a weights directory without its files
    assert adopter.poll() is False and (adopter.version, adopter.value) == (1, "one")  # keeps what it has
    assert adopter.skipped == {2} and "skipping version 2" in caplog.text
    assert adopter.poll() is False and caplog.text.count("skipping version 2") == 1  # one line, not one per poll
    publish(tmp_path, 3, save_text("three"))
    assert adopter.poll() and (adopter.version, adopter.value) == (3, "three")


@pytest.mark.parametrize("latest", ["7\n", "garbage", ""])
def test_a_damaged_latest_falls_back_to_the_newest_complete_version(tmp_path, latest, caplog):
    publish(tmp_path, 1, save_text("one"))
    publish(tmp_path, 2, save_text("two"))
    (tmp_path / "LATEST").write_text(latest)  # points nowhere / not a number
    assert latest_version(tmp_path) == 2 and "names no version directory" in caplog.text
    assert Adopter(tmp_path, load_text).poll()
    publish(tmp_path, 3, save_text("three"))  # publishing goes on and repairs LATEST
    assert (tmp_path / "LATEST").read_text().strip() == "3"


def test_resume_moves_a_damaged_newest_version_aside(tmp_path):
    from prime_values.weights import resume

    publish(tmp_path, 0, save_text("zero"))
    publish(tmp_path, 1, save_text("one"))
    publish(tmp_path, 2, save_text("two"))
    (tmp_path / "2" / "weights.txt").unlink()
    assert resume(tmp_path, load_text) == (1, "one")
    assert latest_version(tmp_path) == 1 and versions(tmp_path) == [0, 1]
    assert len(list(tmp_path.glob(".damaged-2-*"))) == 1  # kept for inspection, invisible as a version
    publish(tmp_path, 2, save_text("two again"))  # the trainer redoes version 2
    assert resume(tmp_path, load_text) == (2, "two again")


def test_adopter_wait(tmp_path):
    adopter = Adopter(tmp_path, load_text)
    with pytest.raises(TimeoutError, match=f"no weights published under {tmp_path}"):
        adopter.wait(timeout_s=0.05, interval_s=0.01)
    assert adopter.wait(timeout_s=5, stop=lambda: True) is False
    t = threading.Timer(0.05, publish, (tmp_path, 0, save_text("zero")))
    t.start()
    assert adopter.wait(timeout_s=5, interval_s=0.01) and adopter.value == "zero"
    t.join()



def _trainer(tmp_path, keep: int = 3):
    """A single-process policy `trainer.Trainer` over a real tiny model, with the parts of a role it uses."""
    import types

    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, Qwen3Config

    from prime_values.models.tokenizer import build_char_tokenizer
    from prime_values.monitor import Timers
    from prime_values.rundir import RunDir
    from prime_values.trainer import Trainer

    cfg = Qwen3Config(hidden_size=32, num_hidden_layers=1, vocab_size=128, intermediate_size=64,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = AutoModelForCausalLM.from_config(cfg)
    ctx = types.SimpleNamespace(run=RunDir(tmp_path / "run"), cfg=OmegaConf.create(
        {"log": {"optimizer_state_every": 0, "keep_weights": keep}}))
    return Trainer(ctx, "policy", OmegaConf.create({"lora": {"enabled": False}}), types.SimpleNamespace(main=True),
                   model, torch.optim.AdamW(model.parameters(), lr=1e-3), build_char_tokenizer(), 0, Timers())


def test_a_version_published_in_the_background_is_visible_after_settle_with_its_batch_committed_as_it_was(
        tmp_path):
    """log.publish_in_background: the fsync, rename, commit and prune run on a thread; `settle` waits for them.
    The commit is of the reader's position when the version was published, not of a later poll's."""
    from prime_values.log import LogReader, SegmentWriter, load_cursor

    trainer = _trainer(tmp_path, keep=1)
    batches = trainer.ctx.run.stream("batches")
    reader = LogReader(batches, "policy_trainer", trainer.ctx.run.cursors, "batches")
    with SegmentWriter(batches, "main", "batches") as writer:
        for step in (1, 2):
            writer.append([{"step": step, "rollout_id": "r", "policy_version": 0, "critic_version": 0,
                            "token_ids": [1, 2], "policy_mask": [0, 1], "sampling_logprobs": [0.0, -1.0],
                            "advantages": [0.0, 1.0], "reward": 1.0}])
    assert len(reader.poll(max_segments=1)) == 1  # batch 1
    trainer.publish(published=reader.committer(), background=True)
    assert len(reader.poll(max_segments=1)) == 1  # batch 2 read before version 1 is out: must stay uncommitted
    trainer.settle()
    assert latest_version(trainer.root) == 1
    assert load_cursor(trainer.ctx.run.cursors / "policy_trainer.json")["batches"] == {"main": 1}
    trainer.publish(published=reader.committer(), background=True)
    trainer.close()  # settles too
    assert latest_version(trainer.root) == 2 and versions(trainer.root) == [2]  # version 1 pruned (keep 1)
    assert load_cursor(trainer.ctx.run.cursors / "policy_trainer.json")["batches"] == {"main": 2}
    assert not list(trainer.root.glob(".tmp-*"))


def test_a_background_publication_that_fails_raises_in_the_trainer(tmp_path, monkeypatch):
    from prime_values import weights

    trainer = _trainer(tmp_path)

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(weights, "fsync_tree", full_disk)
    trainer.publish(background=True)  # the files are written; the fsync fails on the thread
    with pytest.raises(OSError, match=r"publish weights .*1 \(No space left on device\); free disk space"):
        trainer.settle()
    assert latest_version(trainer.root) is None and not list(trainer.root.glob(".tmp-*"))  # nothing half visible
