"""Remake the end-to-end tests' version 0 (tests/data/version0): policy and critic weights made by the real
warm-start role on tests/e2e_helpers.py's CHECKPOINT config, and made.json saying when, where and how.

    python tests/make_version0.py            # remake it (~10-30 s on 2 cores), then commit tests/data/version0

Remake it when tests/models/test_version0.py says the committed weights no longer fit the code (another model
architecture or tokenizer), then remeasure the bounds that rest on it (CRITIC_EV_BOUND and the others that
tests/e2e_helpers.py and tests/e2e/test_pipeline.py argue) and commit both together.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_helpers import CHECKPOINT, REPO, VERSION0, make_version0


def main() -> int:
    from prime_values.models.build import cpu_flags, cpu_model

    with tempfile.TemporaryDirectory(prefix="pv-version0-") as tmp:
        accuracy = make_version0(Path(tmp))
        shutil.rmtree(VERSION0, ignore_errors=True)
        for name in ("policy", "critic"):
            shutil.copytree(Path(tmp) / "weights" / name / "0", VERSION0 / name)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    flags = sorted(f for f in (cpu_flags() or ()) if f.startswith(("avx", "amx")))
    made = {"command": "python tests/make_version0.py", "commit": commit,
            "date": datetime.date.today().isoformat(), "cpu": cpu_model(), "cpu_flags": flags,
            "torch": torch.__version__, "kernels": torch.backends.cpu.get_cpu_capability(),
            "heldout_accuracy": accuracy, "overrides": CHECKPOINT}
    (VERSION0 / "made.json").write_text(json.dumps(made, indent=1) + "\n")
    print(f"version 0 written to {VERSION0} (held-out accuracy {accuracy}); commit it with the bounds it carries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
