"""Where generated and derived data (KJV text, tokenizers, encoded splits) are cached."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: Environment variable overriding the default cache directory.
CACHE_ENV_VAR = "DEQJAX_DATA_DIR"


def default_cache_dir() -> Path:
    """The cache directory: ``$DEQJAX_DATA_DIR`` if set, else ``$XDG_CACHE_HOME/deqjax``.

    ``$XDG_CACHE_HOME`` defaults to ``~/.cache``. The directory is not created here.
    """
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "deqjax"


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """``cache_dir`` as a ``Path``, or :func:`default_cache_dir` when it is ``None``."""
    return default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Writes ``data`` to ``path`` through a temporary file and a rename.

    Readers never see a half-written file, and two processes racing to fill the same cache entry
    both end with a complete file (the last rename wins; both wrote the same content).

    Args:
      path: destination; its parent directories are created.
      data: the bytes to write.

    Returns:
      ``path`` as a ``Path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a cache is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
