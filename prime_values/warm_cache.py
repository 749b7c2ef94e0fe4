"""The warm-start cache (`policy.warm_start.cache`): a run whose version 0 would be the one an earlier run made
takes that one instead of repeating the SFT and the critic's pretraining (about half the wait of the embedded run
on 2 cores: docs/benchmarks.md, "Versus TRL").

An entry is keyed by everything version 0 depends on: the config sections `policy`, `critic`, `task` and
`inference` (the RL `seed` is not among them: `policy.warm_start.seed` is), whether the run has a critic, the
source of the package, the torch and transformers versions, and the CPU's kernels (its flags and the kernel
variables ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA): the same key, the same version 0 up to
the thread count the warm start picked. It lives in `<policy.cache_dir or $PRIME_VALUES_CACHE or
~/.cache/prime_values>/warm_start/<key>/`: `policy/`, `critic/`, the warm start's metrics and `made.json` (the run
that made it and when). Entries appear by an atomic rename; the newest `KEEP` are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from omegaconf import OmegaConf

from prime_values.gguf import cache_root
from prime_values.rundir import RunDir, write_atomic
from prime_values.weights import latest_version, publish, version_dir

KEEP = 4  # entries kept (each about twice the policy's size)
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def source_digest() -> str:
    """sha256 of the package's Python source (any edit makes new entries)."""
    digest = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(cfg, environ=os.environ) -> str:
    import torch
    import transformers

    from prime_values.models.build import cpu_flags

    parts = {section: OmegaConf.to_container(cfg[section], resolve=True)
             for section in ("policy", "critic", "task", "inference")}
    parts.update(uses_critic=bool(cfg.resolved.uses_critic), source=source_digest(), torch=torch.__version__,
                 transformers=transformers.__version__, cpu_flags=sorted(cpu_flags() or ()),
                 kernels={k: environ.get(k, "") for k in KERNEL_VARIABLES})
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


class WarmStartCache:
    def __init__(self, cfg, environ=os.environ) -> None:
        self.root = cache_root(cfg.policy.cache_dir) / "warm_start"
        self.entry = self.root / cache_key(cfg, environ)

    @classmethod
    def of(cls, cfg) -> "WarmStartCache | None":
        """The run's cache, or None with policy.warm_start.cache off or for a model read from elsewhere on each
        run (only the embedded model's version 0 is cached: a real model's is too large to copy for little)."""
        if not cfg.policy.warm_start.get("cache", False) or cfg.policy.model != "tiny":
            return None
        return cls(cfg)

    def restore(self, run: RunDir) -> bool:
        """Publish the cached policy and critic as the run's version 0 (True), unless the run already has them
        or the cache has no entry."""
        if not (self.entry / "made.json").exists():
            return False
        policy, critic = run.weights("policy"), run.weights("critic")
        if latest_version(policy) is not None or latest_version(critic) is not None:
            return False
        for name, root in (("policy", policy), ("critic", critic)):
            publish(root, 0, lambda path, name=name: _copy_into(self.entry / name, path))
        metrics = self.entry / "warm_start.jsonl"
        if metrics.exists():  # the figures of the warm start that made it (accuracy, charged tokens), marked
            lines = [json.dumps({**json.loads(line), "cached_from": str(self.entry)})
                     for line in metrics.read_text().splitlines() if line.strip()]
            run.metrics("warm_start").parent.mkdir(parents=True, exist_ok=True)
            write_atomic(run.metrics("warm_start"), "".join(line + "\n" for line in lines))
        os.utime(self.entry)  # the newest used entries are the ones kept
        return True

    def store(self, run: RunDir) -> None:
        """Keep the run's version 0 (after its warm start ended) as this key's entry, if there is none yet."""
        if self.entry.exists():
            return
        tmp = self.root / f".tmp-{self.entry.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            for name in ("policy", "critic"):
                shutil.copytree(version_dir(run.weights(name), 0), tmp / name)
            if run.metrics("warm_start").exists():
                shutil.copy2(run.metrics("warm_start"), tmp / "warm_start.jsonl")
            write_atomic(tmp / "made.json", json.dumps({"run": str(run.root.resolve()), "at": time.time()}))
            os.rename(tmp, self.entry)
        except OSError:  # a full disk or a racing run: the cache is a convenience, the run goes on
            shutil.rmtree(tmp, ignore_errors=True)
            return
        entries = sorted((p for p in self.root.iterdir() if not p.name.startswith(".")),
                         key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)


def _copy_into(source: Path, target: Path) -> None:
    for item in source.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, target / item.name)
