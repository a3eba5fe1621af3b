#!/usr/bin/env python3
"""Packs a payload tree (made by stage_payload.py) into a self-extracting .run file.

The .run is run_header.sh with its @...@ values filled in, followed by the payload as a gzip'd tar.
The header checks the payload's sha256 before it unpacks or installs anything. Our own packer, not
makeself: the format is small enough to own, and owning it lets the checksum check come first.
Python stdlib only.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tarfile
import tempfile
from pathlib import Path

HEADER = Path(__file__).resolve().parent / "run_header.sh"
HELP_END = "END_OF_HELP"  # the heredoc delimiter in run_header.sh


def package_label(payload: Path) -> str:
    """The `package=` line of the payload's package.info (one vendor tree per payload)."""
    infos = sorted(payload.glob("packages/vendors/*/scripts/package.info"))
    if len(infos) != 1:
        sys.exit(f"make_run.py: error: {payload} is not a payload: expected one "
                 f"packages/vendors/<vendor>/scripts/package.info, found {len(infos)}")
    for line in infos[0].read_text().splitlines():
        if line.startswith("package="):
            return line[len("package="):]
    sys.exit(f"make_run.py: error: {infos[0]} has no package= line")


def normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Files belong to whoever installs them, not to the build user."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_payload(payload: Path, archive: Path):
    # Members are added one by one (not the root itself): extracting a "." entry would change the
    # mode of the directory it is extracted into.
    with tarfile.open(archive, "w:gz", compresslevel=6) as tar:
        for child in sorted(payload.iterdir()):
            tar.add(child, arcname=child.name, filter=normalized)


def header_text(payload: Path, sha256: str) -> str:
    help_text = (payload / "help.info").read_text().rstrip("\n")
    if HELP_END in help_text.splitlines():
        sys.exit(f"make_run.py: error: help.info may not contain a line {HELP_END!r}")
    label = package_label(payload)
    if "'" in label:
        sys.exit(f"make_run.py: error: the package label may not contain a quote: {label!r}")
    template = HEADER.read_text()
    first_line = template.count("\n") + help_text.count("\n") + 1
    values = {"PAYLOAD_SHA256": sha256, "PAYLOAD_FIRST_LINE": str(first_line),
              "PACKAGE": label, "HELP_TEXT": help_text}
    text = re.sub(r"@([A-Z0-9_]+)@", lambda match: values[match.group(1)], template)
    assert text.count("\n") + 1 == first_line, "the payload must start right after the header"
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("payload", type=Path, help="payload directory from stage_payload.py")
    parser.add_argument("output", type=Path, help="the .run file to write")
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    # Write next to the output and rename at the end: a failed build leaves no half .run behind.
    with tempfile.TemporaryDirectory(dir=args.output.parent) as scratch:
        archive = Path(scratch) / "payload.tar.gz"
        write_payload(args.payload, archive)
        digest = hashlib.sha256()
        with archive.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        packed = Path(scratch) / args.output.name
        with packed.open("wb") as out, archive.open("rb") as stream:
            out.write(header_text(args.payload, digest.hexdigest()).encode())
            for block in iter(lambda: stream.read(1 << 20), b""):
                out.write(block)
        packed.chmod(0o755)
        os.replace(packed, args.output)
    print(f"make_run.py: wrote {args.output} (payload sha256 {digest.hexdigest()})")


if __name__ == "__main__":
    main()
