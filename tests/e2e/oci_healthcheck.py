"""Set an image's HEALTHCHECK in an OCI layout (provision.sh: umoci has no option for it).

usage: oci_healthcheck.py LAYOUT TAG JSON, JSON as Docker stores it in an image config
({"Test": ["CMD", ...], "Interval": ns, ...}). The config blob is rewritten with it under
`config.Healthcheck`, and the manifest and the index entry of TAG point to the new blobs.
"""
import hashlib
import json
import sys
from pathlib import Path


def blob(layout: Path, digest: str) -> Path:
    algorithm, value = digest.split(":", 1)
    return layout / "blobs" / algorithm / value


def store(layout: Path, data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blob(layout, digest).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def main(layout: Path, tag: str, healthcheck: dict) -> None:
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    entry = next(m for m in index["manifests"]
                 if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    manifest = json.loads(blob(layout, entry["digest"]).read_text())
    config = json.loads(blob(layout, manifest["config"]["digest"]).read_text())
    config.setdefault("config", {})["Healthcheck"] = healthcheck
    manifest["config"].update(store(layout, json.dumps(config).encode()))
    entry.update(store(layout, json.dumps(manifest).encode()))
    index_path.write_text(json.dumps(index))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]))
