"""Processes of one test run together, e.g. the processes of a ``jax.distributed`` run."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Sequence


def free_port() -> int:
    """A TCP port free on this machine now (for ``jax.distributed``'s coordinator)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_together(
    commands: Sequence[Sequence[str | os.PathLike]],
    *,
    env: dict,
    cwd: str | os.PathLike | None = None,
    timeout: float = 240,
) -> None:
    """Starts every command at once and waits for all of them.

    Raises:
      AssertionError: a command exited with a non-zero status (its stderr's end in the message);
        the commands still running are killed.
    """
    procs = [
        subprocess.Popen(
            [str(a) for a in command],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    try:
        for p in procs:
            _, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err[-4000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
