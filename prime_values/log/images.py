"""The images of the rollout log: each stored once, content-addressed, inside the run directory.

``<run>/log/images/<h[:2]>/<h>.png`` holds the PNG whose SHA-256 is ``h`` (64 hex digits); rollout rows refer to
their images by ``h`` (the ``images`` column, log/records.py), so a group's G rollouts of one prompt, and every
later read of them, share one file. A file is written as the segments are (docs/design.md §2.1, "Whole or not at
all"): under a dot-prefixed temporary name, flushed, fsync'd and renamed, so a reader sees the whole image or
none; an image already there is not written again (same hash, same bytes). Reading checks the hash, so a damaged
file is one clear error naming it, never pixels of another image. Plain files: ``PIL.Image.open`` or any image
viewer reads them beside ``pyarrow`` reading the rows.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .fsutil import write_atomic

IMAGES_DIR = "images"
"""the store's directory under `<run>/log`"""


class ImageError(ValueError):
    """An image a row refers to is missing or damaged: one sentence naming the file and the fix."""


def image_digest(png: bytes) -> str:
    """The content address of an image: SHA-256 of its PNG bytes, 64 hex digits."""
    return hashlib.sha256(png).hexdigest()


class ImageStore:
    """Content-addressed PNG files under `root` (`<run>/log/images`)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        return self.root / digest[:2] / f"{digest}.png"

    def put(self, png: bytes) -> str:
        """Store `png` once (atomically; nothing is written when it is there already) and return its digest."""
        digest = image_digest(png)
        path = self.path(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, png)
        return digest

    def get(self, digest: str) -> bytes:
        """The PNG bytes of `digest`, checked against it; ImageError naming the file otherwise."""
        path = self.path(digest)
        try:
            png = path.read_bytes()
        except FileNotFoundError:
            raise ImageError(f"image {path} is missing (a rollout refers to it); the run directory lost it: copy "
                             "the run's log/images back, or drop the rollouts that refer to it") from None
        if image_digest(png) != digest:
            raise ImageError(f"image {path} is corrupt: its bytes hash to {image_digest(png)[:16]}..., not to its "
                             "name; delete it and drop (or regenerate) the rollouts that refer to it")
        return png


def run_of_weights(path: str | os.PathLike) -> Path | None:
    """The run directory of a published version `<run>/weights/<kind>/<version>` (None for any other path)."""
    path = Path(path).resolve()
    if len(path.parts) >= 4 and path.parent.parent.name == "weights":
        return path.parent.parent.parent
    return None
