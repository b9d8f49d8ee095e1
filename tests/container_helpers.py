"""Container runtimes and images for the tests, with nothing pulled from a registry: a tiny
rootfs assembled from this machine's own binaries (`build_rootfs_tar`, with `more` content
such as a Python and a repository), imported into docker (a private dockerd when none runs)
or podman (storage in a temp dir). Used by test_sandbox_container.py and test_swe_container.py.

`missing(runtime, why)` is the caller's policy for a runtime that cannot run here: skip it
(one of docker/podman is enough) or, under CI=true, fail (conftest's `require`); it raises.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

Missing = Callable[[str, str], None]
AddMore = Callable[[tarfile.TarFile, set[str]], None]

# what the tests (and the base class's shell file path) use inside the container
TOOLS = [
    *("bash", "sh", "cat", "ls", "mkdir", "rm", "cp", "mv", "ln", "base64", "tar", "gzip", "sleep"),
    *("echo", "env", "dirname", "basename", "head", "tail", "chmod", "stat", "id", "true", "false"),
    *("printf", "wc", "timeout", "grep", "sed", "find", "touch", "pwd", "sha256sum", "readlink"),
    *("uname", "seq", "kill", "ps", "dd", "sort", "tr", "cmp", "mktemp", "rmdir", "du"),
]


# -- the image: host binaries + their libraries, symlinks kept as on the host ---------------
def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    paths = []
    for line in out.splitlines():
        token = line.split("=>")[-1].strip().split(" (")[0].strip()
        if token.startswith("/"):
            paths.append(token)
    return paths


def add_host_path(tar: tarfile.TarFile, path: str, seen: set[str]) -> None:
    """Add `path` and every directory and symlink on the way to it (usr-merged /lib64 ->
    usr/lib64 -> /lib/x86_64-linux-gnu/...), so the loader finds its libraries."""
    parts = Path(path).parts
    cur = Path("/")
    for i, part in enumerate(parts[1:], start=1):
        cur = cur / part
        rel = str(cur.relative_to("/"))
        if rel not in seen:
            seen.add(rel)
            tar.add(str(cur), arcname=rel, recursive=False)
        if cur.is_symlink():
            target = os.path.normpath(os.path.join(str(cur.parent), os.readlink(cur)))
            add_host_path(tar, os.path.join(target, *parts[i + 1 :]), seen)
            return


def add_binary(tar: tarfile.TarFile, path: str, seen: set[str]) -> None:
    """An executable or shared object, and every library it loads."""
    add_host_path(tar, path, seen)
    for lib in _libraries(os.path.realpath(path)):
        add_host_path(tar, lib, seen)


PYTEST_DISTS = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")
STDLIB_SKIP = {
    *("site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"),
    *("pydoc_data", "__pycache__", "distutils", "lib-dynload"),  # lib-dynload: with its libraries
}


def _skipped(name: str) -> bool:
    return name in STDLIB_SKIP or name.startswith(("config-", "_tkinter"))


def add_python(tar: tarfile.TarFile, seen: set[str]) -> None:
    """This interpreter with its standard library (no tests, no GUI) and pytest with its
    dependencies, `python`/`python3` on PATH: what a task's Python tests need in an image."""
    import pytest

    exe = os.path.realpath(sys.executable)
    stdlib = Path(os.__file__).parent
    site = Path(pytest.__file__).parents[1]

    def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if _skipped(Path(info.name).name) else info

    add_binary(tar, exe, seen)
    add_host_path(tar, str(stdlib), seen)
    for entry in sorted(stdlib.iterdir()):
        if not _skipped(entry.name):
            tar.add(str(entry), arcname=str(entry.relative_to("/")), filter=skip)
    for so in sorted((stdlib / "lib-dynload").glob("*.so")):
        if not _skipped(so.name):
            add_binary(tar, str(so), seen)
    dest = stdlib / "site-packages"
    names = [
        *PYTEST_DISTS,
        *(p.name for p in site.glob("*.dist-info") if p.name.split("-")[0] in PYTEST_DISTS),
    ]
    for name in names:
        tar.add(str(site / name), arcname=str((dest / name).relative_to("/")), filter=skip)
    for link in ("python", "python3"):
        info = tarfile.TarInfo(f"usr/local/bin/{link}")
        info.type, info.linkname = tarfile.SYMTYPE, exe
        tar.addfile(info)


def build_rootfs_tar(tools: list[str] = TOOLS, more: AddMore | None = None) -> bytes:
    """The image's rootfs as a tar: `tools` with their libraries, then what `more` adds."""
    bio = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=bio, mode="w") as tar:
        for tool in tools:
            found = shutil.which(tool)
            if found is None:
                raise RuntimeError(f"{tool} is not installed on this machine")
            add_binary(tar, found, seen)
        if more is not None:
            more(tar, seen)
        for path in ("/bin/sh", "/bin/bash", "/sbin", "/lib", "/lib64"):  # `#!/bin/sh` must work
            if os.path.lexists(path):
                add_host_path(tar, path, seen)
        for d, mode in [("tmp", 0o1777), ("proc", 0o755), ("sys", 0o755), ("dev", 0o755), ("root", 0o700)]:
            if d not in seen:
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, mode
                tar.addfile(info)
        for name, text in [("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"), ("etc/group", "root:x:0:\n")]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return bio.getvalue()


@dataclass
class Runtime:
    name: str
    cli: str

    def run(self, *args: str, check: bool = False, **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.cli, *args], capture_output=True, text=True, check=check, **kw)  # type: ignore[call-overload]

    def exists(self, container: str) -> bool:
        return self.run("inspect", container).returncode == 0


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _docker_usable() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=30).returncode == 0


@contextlib.contextmanager
def docker_runtime(missing: Missing) -> Iterator[Runtime]:
    """The docker daemon that runs, or a private dockerd (vfs storage, no iptables, no
    bridge) on its own socket and state directories, stopped and wiped afterwards."""
    if shutil.which("docker") is None:
        missing("docker", "docker CLI not installed (Debian package docker.io)")
    if _docker_usable():
        yield Runtime("docker", "docker")
        return
    if shutil.which("dockerd") is None:
        missing("docker", "no docker daemon reachable and no dockerd (Debian package docker.io)")
    if os.geteuid() != 0:
        missing("docker", "no docker daemon reachable, and starting dockerd needs root")
    home = tempfile.mkdtemp(prefix="uad-", dir="/tmp")  # short: unix socket paths are limited
    sock = f"unix://{home}/docker.sock"
    logf = open(f"{home}/dockerd.log", "wb")  # noqa: SIM115 - closed below
    argv = [
        "dockerd", f"--host={sock}", f"--data-root={home}/root", f"--exec-root={home}/exec",
        f"--pidfile={home}/dockerd.pid", "--storage-driver=vfs", "--iptables=false",
        "--ip6tables=false", "--bridge=none",
    ]  # fmt: skip
    daemon = subprocess.Popen(
        argv,
        stdout=logf,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with _env(DOCKER_HOST=sock):
            deadline = time.monotonic() + 40
            while not _docker_usable():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    tail = Path(f"{home}/dockerd.log").read_text(errors="replace")[-1500:]
                    missing("docker", f"dockerd could not start here: {tail}")
                time.sleep(0.3)
            yield Runtime("docker", "docker")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        logf.close()
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def podman_runtime(missing: Missing) -> Iterator[Runtime]:
    """podman with its storage in a temp dir (CONTAINERS_STORAGE_CONF), so the machine's own
    images and containers are neither touched nor needed."""
    if shutil.which("podman") is None:
        missing("podman", "podman not installed (Debian package podman)")
    home = tempfile.mkdtemp(prefix="uap-", dir="/tmp")
    conf = Path(home, "storage.conf")

    def info(driver: str) -> subprocess.CompletedProcess[str]:
        conf.write_text(f'[storage]\ndriver = "{driver}"\ngraphroot = "{home}/g"\nrunroot = "{home}/r"\n')
        return subprocess.run(["podman", "info"], capture_output=True, text=True, check=False, timeout=60)

    try:
        with _env(CONTAINERS_STORAGE_CONF=str(conf)):
            res = info("overlay")
            if res.returncode != 0:
                res = info("vfs")  # no overlay support (e.g. inside another container)
            if res.returncode != 0:
                missing("podman", f"podman cannot run here: {res.stderr.strip()[-1500:]}")
            root = subprocess.run(
                ["podman", "info", "--format", "{{.Store.GraphRoot}}"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if root != f"{home}/g":  # the cleanup below must never reach the machine's own storage
                missing("podman", f"podman ignored CONTAINERS_STORAGE_CONF (storage at {root!r})")
            yield Runtime("podman", "podman")
            subprocess.run(["podman", "rm", "-a", "-f", "-t", "0"], capture_output=True, check=False)
            subprocess.run(["podman", "rmi", "-a", "-f"], capture_output=True, check=False)
    finally:
        # overlay may have left its own mounts inside the temp root
        subprocess.run(
            f"grep -o ' {home}[^ ]*' /proc/self/mounts | sort -r | xargs -r umount -l",
            shell=True,
            capture_output=True,
            check=False,
        )
        shutil.rmtree(home, ignore_errors=True)


def open_runtime(name: str, missing: Missing) -> contextlib.AbstractContextManager[Runtime]:
    return docker_runtime(missing) if name == "docker" else podman_runtime(missing)


def import_image(rt: Runtime, tar: bytes, tag: str, missing: Missing) -> None:
    res = subprocess.run([rt.cli, "import", "-", tag], input=tar, capture_output=True, check=False)
    if res.returncode != 0:
        missing(rt.name, f"image import failed: {res.stderr.decode(errors='replace')[-1000:]}")
