"""A real RoleContext on a bare run directory (the default config), for tests of what a role writes itself."""

from __future__ import annotations

from pathlib import Path


def bare_role_context(root: Path, name: str):
    """RoleContext(root, name) over a run directory holding only the default config; the caller's torch thread
    count is kept (a role sets its own)."""
    import torch
    from omegaconf import OmegaConf

    from prime_values.config import Config
    from prime_values.roles.common import RoleContext
    from prime_values.rundir import RunDir

    run = RunDir(root)
    run.mkdirs()
    OmegaConf.save(OmegaConf.structured(Config), run.config)
    threads = torch.get_num_threads()
    try:
        return RoleContext(root, name)
    finally:
        torch.set_num_threads(threads)
