"""Where the data release lives and how its manifest is read and written (``release/manifest.json``).

Apart from :mod:`bnstudy.study.release` (which computes and verifies the release and imports :mod:`bnstudy.study.book` to
execute chapters) so that the book runner can read the manifest without importing the release machinery: no
import cycle.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RELEASE_DIR = REPO / "release"
MANIFEST = "manifest.json"


def read_manifest(release_dir=RELEASE_DIR) -> dict:
    """The release's manifest as a dict (keys ``release``, ``chapters``, ``tables``, ``units``); an empty one of
    that shape if ``release_dir`` has none yet. Raises ``json.JSONDecodeError`` for a corrupt manifest."""
    p = Path(release_dir) / MANIFEST
    if not p.exists():
        return {"release": {}, "chapters": {}, "tables": {}, "units": {}}
    return json.loads(p.read_text())


def write_manifest(manifest: dict, release_dir=RELEASE_DIR) -> Path:
    """Write ``manifest`` to ``release_dir/manifest.json`` atomically (sorted keys, 2-space indent); its path."""
    from .sweep import atomic_write_bytes
    p = Path(release_dir) / MANIFEST
    atomic_write_bytes(p, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return p
