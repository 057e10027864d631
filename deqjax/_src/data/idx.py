"""Reader for the idx format of MNIST and Fashion-MNIST (LeCun et al. 1998; Xiao et al. 2017).

An idx file is a 4-byte magic number ``0x00 0x00 <dtype code> <ndim>``, then ``ndim`` big-endian
uint32 dimensions, then the row-major data (big-endian for multi-byte types). The upstream files are
gzip-compressed (``*.gz``); the Debian package ``dataset-fashion-mnist`` installs them to
``/usr/share/datasets/fashion-mnist/``. Compression is detected from the content, not the name.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
import zlib

import numpy as np

from deqjax._src.data.errors import DataFormatError, DataNotFoundError, missing_data_message

_LOG = logging.getLogger(__name__)

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist/"
FASHION_MNIST_HINT = (
    "Fashion-MNIST is packaged by Debian/Ubuntu: `sudo apt-get install dataset-fashion-mnist` "
    f"installs it to {DEFAULT_FASHION_MNIST_DIR}; otherwise download the four upstream "
    "*-ubyte.gz files from https://github.com/zalandoresearch/fashion-mnist and pass --data_dir."
)
MNIST_HINT = (
    "Download the four upstream MNIST files (train-images-idx3-ubyte.gz, "
    "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) and "
    "pass their folder as --data_dir."
)

# idx dtype codes -> big-endian numpy dtypes.
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"
_SPLIT_PREFIXES = {"train": "train", "test": "t10k"}


def _read_bytes(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataFormatError(
                f"{os.fspath(path)}: corrupt or truncated gzip data ({type(e).__name__}: {e}); "
                f"re-download or reinstall the file."
            ) from e
    return raw


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads one idx file (gzip-compressed or not) into a numpy array in native byte order.

    Args:
      path: the file; gzip compression is detected from its first two bytes.

    Returns:
      An array of the dtype and shape stored in the header (``uint8`` for MNIST images and labels).

    Raises:
      FileNotFoundError: if ``path`` does not exist.
      DataFormatError: (a ``ValueError``) naming the file if it is not gzip/idx, is corrupt or
        is truncated.

    Example:
      >>> images = read_idx("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
      >>> images.shape
      (10000, 28, 28)
    """
    raw = _read_bytes(path)
    name = os.fspath(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataFormatError(f"{name} is not an idx file (bad magic number {raw[:4]!r}).")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise DataFormatError(f"{name}: unknown idx dtype code 0x{code:02x}.")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataFormatError(f"{name}: truncated header ({len(raw)} bytes for {ndim} dimensions).")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataFormatError(
            f"{name}: payload has {len(raw) - header} bytes, header {shape} of {dtype} needs "
            f"{expected} (truncated or corrupt file)."
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray, *, compress: bool | None = None) -> None:
    """Writes ``array`` as an idx file (gzip-compressed if ``compress``, default: name ends .gz).

    The inverse of :func:`read_idx`; used to build small test files in the upstream format.
    """
    array = np.asarray(array)
    codes = {dt.newbyteorder("="): c for c, dt in _IDX_DTYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        raise ValueError(f"array dtype {array.dtype} has no idx code; use one of {list(codes)}.")
    header = bytes([0, 0, codes[native], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + np.ascontiguousarray(array, dtype=native.newbyteorder(">")).tobytes()
    if compress is None:
        compress = os.fspath(path).endswith(".gz")
    if compress:
        payload = gzip.compress(payload, mtime=0)
    with open(path, "wb") as f:
        f.write(payload)


def _candidates(data_dir: str, prefix: str, kind: str) -> list[str]:
    # Upstream names use '-idx3-ubyte'; some mirrors use '.idx3-ubyte'. Gzipped first (upstream).
    ndim = 3 if kind == "images" else 1
    stems = [f"{prefix}-{kind}-idx{ndim}-ubyte", f"{prefix}-{kind}.idx{ndim}-ubyte"]
    return [os.path.join(data_dir, s + ext) for s in stems for ext in (".gz", "")]


def find_idx_files(data_dir: str | os.PathLike, *, split: str, hint: str = "") -> tuple[str, str]:
    """Locates the images and labels files of ``split`` in ``data_dir``.

    Returns:
      ``(images_path, labels_path)``.

    Raises:
      ValueError: if ``split`` is not ``"train"`` or ``"test"``.
      DataNotFoundError: (a ``FileNotFoundError``) naming every path tried and how to get the
        files (``hint``).
    """
    if split not in _SPLIT_PREFIXES:
        raise ValueError(f"split must be one of {sorted(_SPLIT_PREFIXES)}, got {split!r}.")
    data_dir = os.fspath(data_dir)
    prefix = _SPLIT_PREFIXES[split]
    found, tried = [], []
    for kind in ("images", "labels"):
        paths = _candidates(data_dir, prefix, kind)
        hit = next((p for p in paths if os.path.isfile(p)), None)
        tried.extend(paths)
        found.append(hit)
    if None in found:
        what = f"idx files of split {split!r} in {data_dir!r}"
        raise DataNotFoundError(missing_data_message(what, tried, hint))
    return found[0], found[1]


def load_idx_dataset(
    data_dir: str | os.PathLike, *, split: str = "train", hint: str = ""
) -> dict[str, np.ndarray]:
    """Loads an MNIST-layout data set (``train-*``/``t10k-*`` images and labels) from ``data_dir``.

    Returns:
      ``{"image": uint8[N, H, W], "label": int32[N]}``.

    Raises:
      FileNotFoundError: naming the paths tried (never waits or downloads).
      ValueError: if the files are corrupt or the image and label counts differ.
    """
    images_path, labels_path = find_idx_files(data_dir, split=split, hint=hint)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{images_path} holds {images.shape[0]} images but {labels_path} holds "
            f"{labels.shape[0]} labels."
        )
    _LOG.info("loaded %s split from %s and %s", split, images_path, labels_path)
    return {"image": images, "label": labels.astype(np.int32)}


def load_fashion_mnist(
    data_dir: str | os.PathLike | None = None, *, split: str = "train"
) -> dict[str, np.ndarray]:
    """Fashion-MNIST (Xiao et al. 2017): 60k train / 10k test 28×28 grey images, 10 classes.

    Args:
      data_dir: folder holding the idx files; default :data:`DEFAULT_FASHION_MNIST_DIR`.
      split: ``"train"`` or ``"test"``.

    Returns:
      ``{"image": uint8[N, 28, 28], "label": int32[N]}``.

    Raises:
      FileNotFoundError: naming the paths tried and ``apt-get install dataset-fashion-mnist``.
    """
    return load_idx_dataset(
        DEFAULT_FASHION_MNIST_DIR if data_dir is None else data_dir,
        split=split,
        hint=FASHION_MNIST_HINT,
    )


def load_mnist(data_dir: str | os.PathLike, *, split: str = "train") -> dict[str, np.ndarray]:
    """MNIST (LeCun et al. 1998) from the four upstream idx files in ``data_dir``.

    Same layout and return value as :func:`load_fashion_mnist`; there is no offline default.
    """
    return load_idx_dataset(data_dir, split=split, hint=MNIST_HINT)
