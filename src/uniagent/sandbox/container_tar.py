"""The tar streams `docker cp` / `podman cp` read and write: a host directory packed for an upload, and
a download unpacked to a host path. Apart from the sandbox so its file moves can be read on their own."""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path
from typing import IO

from uniagent.errors import SandboxError


def tar_dir(src: Path, out: IO[bytes]) -> None:
    """Write `src`'s contents (not `src` itself) as a tar stream."""
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for child in sorted(src.iterdir()):
            tar.add(child, arcname=child.name)


def untar_to(stream: IO[bytes], dest: Path) -> None:
    """Unpack a `cp` stream into `dest`. `cp` names its top entry after the source (or,
    podman, after a link's target): that entry becomes `dest` itself."""
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        top: str | None = None
        for member in tar:
            name = member.name.removeprefix("./").rstrip("/")
            if top is None:
                top = name
                if member.isfile():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    f = tar.extractfile(member)
                    assert f is not None
                    with open(dest, "wb") as out:
                        shutil.copyfileobj(f, out)
                    os.chmod(dest, member.mode & 0o777)
                    return
                if not member.isdir():
                    raise SandboxError(f"cannot download {member.name}: not a file or directory")
                dest.mkdir(parents=True, exist_ok=True)
                continue
            if name == top or not name.startswith(top + "/"):
                continue
            member.name = name[len(top) + 1 :]
            if member.islnk():  # hard links name their target by its path in the stream
                link = member.linkname.removeprefix("./")
                if not link.startswith(top + "/"):
                    continue
                member.linkname = link[len(top) + 1 :]
            tar.extract(member, dest, filter="data")
