"""Run the conformance suite in a fresh Python process, as a vendor runs it.

:func:`run_conformance` is the one way the project's own tests, and a vendor's CI, start
``pytest --pyargs torchcomms_core.testing --torchcomms-backend NAME``: a new interpreter,
an environment without any launcher's rank variables (so the suite starts its own ranks),
and the output captured for assertions::

    from torchcomms_core.testing import run_conformance

    def test_my_backend_conforms() -> None:
        res = run_conformance("myvendor", 2)
        assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-2000:]

Imports nothing of torchcomms (the suite runs in the child process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = [
    "LAUNCHER_PREFIXES",
    "LAUNCHER_VARIABLES",
    "conformance_command",
    "conformance_env",
    "run_conformance",
]

#: Variables a launcher (torchrun, mpiexec, a scheduler) sets per rank: the suite starts
#: its own ranks, so a run never inherits them.
LAUNCHER_VARIABLES: tuple[str, ...] = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
#: Prefixes of further such variables (and of torchcomms' own settings).
LAUNCHER_PREFIXES: tuple[str, ...] = ("TORCHCOMM_", "MASTER_", "TORCHELASTIC_", "PMI_")


def conformance_env(
    env: Mapping[str, str | None] | None = None,
    *,
    pythonpath: Sequence[str | os.PathLike[str]] = (),
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a conformance run.

    ``base`` (default ``os.environ``) without the launcher's variables
    (:data:`LAUNCHER_VARIABLES`, and ``TORCHCOMM_*``, ``MASTER_*``, ``TORCHELASTIC_*``,
    ``PMI_*``), then ``env`` on top (a value of ``None`` removes the variable), with
    ``pythonpath`` put in front of ``PYTHONPATH``.
    """
    source = os.environ if base is None else base
    out = {
        k: v
        for k, v in source.items()
        if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_VARIABLES
    }
    for key, value in (env or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    if pythonpath:
        paths = [os.fspath(p) for p in pythonpath]
        out["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, out.get("PYTHONPATH")]))
    return out


def conformance_command(
    backend: str | None,
    nproc: int | None = None,
    extra_args: Sequence[str] = (),
    *,
    python: str | os.PathLike[str] | None = None,
    quiet: bool = True,
) -> list[str]:
    """The command line of a conformance run: ``python -m pytest -p no:cacheprovider
    --pyargs torchcomms_core.testing --torchcomms-backend BACKEND
    --torchcomms-world-size NPROC EXTRA_ARGS...`` (``-q`` when ``quiet``).

    ``backend`` ``None`` runs the suite without a backend (every contract skips);
    ``nproc`` ``None`` keeps the suite's default world size.
    """
    cmd = [os.fspath(python or sys.executable), "-m", "pytest"]
    if quiet:
        cmd.append("-q")
    cmd += ["-p", "no:cacheprovider", "--pyargs", "torchcomms_core.testing"]
    if backend is not None:
        cmd += ["--torchcomms-backend", backend]
    if nproc is not None:
        cmd += ["--torchcomms-world-size", str(nproc)]
    return [*cmd, *extra_args]


def run_conformance(
    backend: str | None,
    nproc: int | None = None,
    *,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str | None] | None = None,
    pythonpath: Sequence[str | os.PathLike[str]] = (),
    python: str | os.PathLike[str] | None = None,
    timeout: float = 600.0,
    quiet: bool = True,
    cwd: str | os.PathLike[str] = "/",
) -> subprocess.CompletedProcess[str]:
    """Run the conformance suite against ``backend`` at ``nproc`` ranks in a new process.

    Args:
        backend: the backend name (as ``new_comm`` takes it); ``None`` runs the suite
            without one.
        nproc: the world size (``--torchcomms-world-size``); ``None``: the suite's default.
        extra_args: further pytest or suite options (``-x``, ``-k EXPR``,
            ``--torchcomms-timeout 30``, ``--torchcomms-launcher mpiexec``,
            ``--torchcomms-rank-env RANKS:KEY=VALUE``).
        env: variables to set in the child (``None`` as a value removes one), on top of
            this process's environment less any launcher's rank variables
            (:func:`conformance_env`).
        pythonpath: folders put in front of the child's ``PYTHONPATH`` (an uninstalled
            plugin, a test's dist-info).
        python: the interpreter (default: this one); e.g. a fresh virtual environment's.
        timeout: seconds before the run is killed (``subprocess.TimeoutExpired``).
        quiet: pass ``-q`` to pytest.
        cwd: the child's working directory; the default ``/`` keeps a checkout's
            ``conftest.py`` and source tree out of the run.

    Returns:
        The finished process, with ``stdout`` and ``stderr`` as text: ``returncode`` is
        pytest's exit code (0: every contract passed; 1: some failed).
    """
    return subprocess.run(
        conformance_command(backend, nproc, extra_args, python=python, quiet=quiet),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=conformance_env(env, pythonpath=pythonpath),
        cwd=cwd,
    )
