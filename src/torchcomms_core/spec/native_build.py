"""C sources built at run time with the system's compiler, for backends and the core alike.

A :class:`NativeBuild` names one C source. :meth:`NativeBuild.path` compiles it on first use
into a private cache directory (``$TORCHCOMM_CACHE_DIR/native``, default
``~/.cache/torchcomms/native``), one library per source, compiler, flags and machine, and
returns the library's path, or ``None`` where it cannot be had: no compiler, a failed
build, no cache directory, a library someone else could have written, or the build switched
off by its environment variable. Each reason is said once in the log, and the caller keeps
its Python path. The shm backend's small all-reduce and the device windows' native proxy
are built this way.

May import: the standard library only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

_log = logging.getLogger(__name__)

#: What the compiler is given unless a build says otherwise: no contraction (``a*b+c``
#: stays two roundings), no fast math, position-independent, a shared library.
DEFAULT_CFLAGS = ("-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
#: Seconds a build may take.
BUILD_TIMEOUT_S = 120
_OFF = ("0", "false", "no", "off")


def cache_dir() -> Path:
    """Where built libraries are kept (``$TORCHCOMM_CACHE_DIR/native``)."""
    root = os.environ.get("TORCHCOMM_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "torchcomms"
    return base / "native"


def compiler() -> str | None:
    """The C compiler to use: ``$CC``, else the first of ``cc``, ``gcc``, ``clang`` found."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def unsafe(target: Path) -> str:
    """Why the library at ``target`` must not be loaded ("" when it may): it and its
    directory must belong to this user and be writable by no one else, or another user
    could have put code there."""
    uid = os.getuid()
    for path in (target.parent, target):
        st = path.stat()
        if st.st_uid != uid:
            return f"{path} belongs to user {st.st_uid}, not to this one ({uid})"
        if st.st_mode & 0o022:
            return f"{path} is writable by other users (mode {st.st_mode & 0o777:o})"
    return ""


class NativeBuild:
    """One C source, built once per process on first use.

    Args:
        name: the library's file name stem (``shm_small``, ``device_proxy``).
        source: the C file.
        disable_env: an environment variable that, set to ``0``/``false``/``no``/``off``,
            keeps the caller on its Python path.
        fallback: what runs instead, for the log (``"small all-reduces run in Python"``).
        cflags: the compiler flags (``DEFAULT_CFLAGS``), plus ``extra`` libraries to link.
        depends: other files the source includes (their bytes are part of the library's
            name, so a change to any of them builds it again).
    """

    def __init__(
        self,
        name: str,
        source: Path,
        disable_env: str,
        fallback: str,
        cflags: tuple[str, ...] = DEFAULT_CFLAGS,
        extra: tuple[str, ...] = (),
        depends: tuple[Path, ...] = (),
    ) -> None:
        self.name, self.source, self.disable_env = name, source, disable_env
        self.depends = depends
        self.fallback, self.cflags, self.extra = fallback, cflags, extra
        self._lock = threading.Lock()
        self._tried = False
        self._path: Path | None = None

    def disabled(self) -> bool:
        """Whether the environment keeps the caller on its Python path."""
        return os.environ.get(self.disable_env, "1").strip().lower() in _OFF

    def target(self, cc: str, source: bytes) -> Path:
        """The library's path: one per source, compiler, flags and machine."""
        key = hashlib.sha256()
        for part in (
            source,
            cc.encode(),
            " ".join(self.cflags + self.extra).encode(),
            platform.machine().encode(),
        ):
            key.update(part)
            key.update(b"\0")
        tag = sys.implementation.cache_tag
        return cache_dir() / f"{self.name}-{key.hexdigest()[:16]}-{tag}.so"

    def path(self) -> Path | None:
        """The built library (built now if it is not yet), or ``None`` (said in the log)."""
        if self._tried:
            return self._path
        with self._lock:
            if not self._tried:
                try:
                    self._path = self._find()
                finally:
                    self._tried = True
        return self._path

    def _find(self) -> Path | None:
        if self.disabled():
            return None
        who = f"torchcomms ({self.name})"
        cc = compiler()
        if cc is None:
            _log.info("%s: no C compiler found; %s", who, self.fallback)
            return None
        try:
            source = b"".join(p.read_bytes() for p in (self.source, *self.depends))
            target = self.target(cc, source)
        except RuntimeError as exc:  # no home directory and no TORCHCOMM_CACHE_DIR
            _log.info("%s: no cache directory (%s); %s", who, exc, self.fallback)
            return None
        try:
            if not target.exists():
                self._build(cc, target)
            reason = unsafe(target)
            if reason:
                _log.warning("%s: not loading %s: %s; %s", who, target, reason, self.fallback)
                return None
            return target
        except (OSError, subprocess.SubprocessError) as exc:
            _log.warning("%s: building %s failed, %s: %s", who, target, self.fallback, exc)
            return None

    def _build(self, cc: str, target: Path) -> None:
        """Compile into ``target`` atomically (ranks that build at once each write their own
        file and rename it; the last rename wins and every file is whole)."""
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".build-", suffix=".so")
        os.close(fd)
        try:
            done = subprocess.run(
                [cc, *self.cflags, "-o", tmp, str(self.source), *self.extra],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                raise OSError(f"{cc} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
            os.chmod(tmp, 0o700)  # whatever the umask: writable by this user only
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
