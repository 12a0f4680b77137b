"""PyTorch checkpoints and the archives they come in, read on the host: `torch_load`, `zip_extract`, `tar_extract`,
and tinygrad's `TensorIO` and `accept_filename` (all re-exported by `glassgrad.nn.state`, where tinygrad has them).

In: a path, or a 1-d uint8 `Tensor` holding the file's bytes (tinygrad passes `Tensor(pathlib.Path(fn))`, a tensor on
its DISK device; glassgrad has no DISK device, so a path is read with `open`). Out: for `torch_load`, what
`torch.save` pickled (usually a dict of name -> tensor, possibly nested in other dicts and lists), every torch tensor
replaced by a realized glassgrad `Tensor` with its values, shape and dtype; for the archives, name -> 1-d uint8 tensor.

`torch.save` writes a zip archive (`<name>/data.pkl`, the pickled object, and `<name>/data/<key>`, the raw
little-endian bytes of each storage); before PyTorch 1.6 it wrote one stream of pickles followed by the storages
(the "legacy" format); both are read. A pickled tensor is `_rebuild_tensor_v2(storage, offset, size, stride, ...)`:
its values are the storage's items at offset + sum(index * stride), which numpy's `as_strided` reads directly, so
transposed and sliced tensors load with their values (tinygrad needs a permutation there).

The unpickler runs no code of the file: torch's and numpy's names that a checkpoint needs map to functions here, the
harmless builtins (`OrderedDict`, `set`, ...) load as themselves, and any other class becomes an inert `Unknown`
object that keeps the arguments it was built with (tinygrad returns a dummy there too).
"""
from __future__ import annotations

import functools
import io
import os
import pickle
import struct
import tarfile
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from typing import IO, Any, BinaryIO, TypeVar

import numpy as np

from glassgrad.dtype import DType, dtypes
from glassgrad.tensor import Tensor

R = TypeVar("R")
Source = Tensor | str | os.PathLike[str]

# torch's storage class names and the dtypes of their items
STORAGE_DTYPES: dict[str, DType] = {
    "DoubleStorage": dtypes.float64, "FloatStorage": dtypes.float32, "HalfStorage": dtypes.float16,
    "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
    "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8, "BoolStorage": dtypes.bool,
}
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _codecs_encode(text: str, encoding: str = "latin1") -> bytes:
    """pickle protocol 2 writes bytes as `_codecs.encode(text, 'latin1')`."""
    return text.encode(encoding)


SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict, ("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice, ("builtins", "complex"): complex, ("_codecs", "encode"): _codecs_encode,
    ("__builtin__", "set"): set,
}


# ---------------------------------------------------------------------------------------------- bytes of a source
class TensorIO(io.RawIOBase, BinaryIO):
    """A read-only, seekable file over the bytes of a 1-d uint8 tensor (tinygrad's). The tensor is read from the
    device once, on the first read."""

    def __init__(self, t: Tensor) -> None:
        if not isinstance(t, Tensor) or t.ndim != 1 or t.dtype != dtypes.uint8:
            raise ValueError(f"TensorIO needs a 1-d uint8 Tensor, got "
                             f"{(t.shape, t.dtype) if isinstance(t, Tensor) else type(t).__name__}")
        self._tensor, self._position = t, 0
        self._bytes: bytes | None = None

    def _data(self) -> bytes:
        if self._bytes is None:
            self._bytes = self._tensor.numpy().tobytes()
        return self._bytes

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._data()[self._position:self._position + len(buffer)]
        buffer[:len(data)] = data
        self._position += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        end = len(self._data()) if size is None or size < 0 else self._position + size
        data = self._data()[self._position:end]
        self._position += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = [0, self._position, self._tensor.shape[0]][whence]
        self._position = min(int(self._tensor.shape[0]), max(0, base + offset))
        return self._position

    def tell(self) -> int:
        return self._position

    def __enter__(self) -> TensorIO:
        return self

    def write(self, s: Any) -> int:
        raise io.UnsupportedOperation("TensorIO is read-only")

    def writelines(self, lines: Any) -> None:
        raise io.UnsupportedOperation("TensorIO is read-only")


def accept_filename(func: Callable[[Tensor], R]) -> Callable[[Source], R]:
    """tinygrad's decorator: the function takes a uint8 tensor of a file's bytes, and now a path too."""
    @functools.wraps(func)
    def wrapper(fn: Source) -> R:
        return func(fn if isinstance(fn, Tensor) else _file_tensor(fn))
    return wrapper


def _file_tensor(path: str | os.PathLike[str]) -> Tensor:
    return Tensor(np.fromfile(os.fspath(path), dtype=np.uint8))


def _open(source: Source) -> BinaryIO:
    """A binary file over the source: the file itself for a path, a TensorIO for a tensor."""
    if isinstance(source, Tensor):
        return TensorIO(source)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"expected a path or a 1-d uint8 Tensor, got {type(source).__name__}")
    return open(source, "rb")


# ---------------------------------------------------------------------------------------------- archives
@accept_filename
def zip_extract(t: Tensor) -> dict[str, Tensor]:
    """Every file of a zip archive as a 1-d uint8 tensor, by name (stored and deflated members)."""
    with zipfile.ZipFile(TensorIO(t)) as archive:
        return {info.filename: _bytes_tensor(archive.read(info)) for info in archive.infolist() if not info.is_dir()}


@accept_filename
def tar_extract(t: Tensor) -> dict[str, Tensor]:
    """Every regular file of a tar archive as a 1-d uint8 tensor, by name."""
    with tarfile.open(fileobj=TensorIO(t), mode="r") as archive:
        out = {}
        for member in archive:
            f = archive.extractfile(member) if member.isreg() else None
            if f is not None:
                out[member.name] = _bytes_tensor(f.read())
        return out


def _bytes_tensor(data: bytes) -> Tensor:
    return Tensor(np.frombuffer(data, dtype=np.uint8).copy())


# ---------------------------------------------------------------------------------------------- torch checkpoints
def torch_load(source: Source) -> Any:
    """What `torch.save` wrote to `source` (a path or a uint8 tensor of its bytes), torch tensors as glassgrad
    tensors. Zip checkpoints (PyTorch >= 1.6) and the legacy format are read; a malformed file raises ValueError."""
    with _open(source) as f:
        if zipfile.is_zipfile(f):
            f.seek(0)
            return _load_zip(f)
        f.seek(0)
        if tarfile.is_tarfile(f):
            raise ValueError("torch_load: this is a tar checkpoint (PyTorch before 0.4), which is not supported; "
                             "load it with torch and save it again")
        f.seek(0)
        return _load_legacy(f)


class Unknown:
    """A class of the checkpoint that is not loaded (an argparse Namespace, a training-script object): the args it
    was made with and its pickled state are kept for inspection, nothing of it runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs, self.state = args, kwargs, None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _Storage:
    """A storage's dtype and raw bytes (filled in once read)."""

    def __init__(self, dtype: DType, data: bytes | None) -> None:
        self.dtype, self.data = dtype, data


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *_: Any) -> Any:
    """The tensor `size` at `offset` with `stride` (in items) in the storage, as a glassgrad Tensor."""
    if storage.data is None:  # the legacy format's first pass: storages come after the pickle
        return None
    storage_np = np.dtype("<u2") if storage.dtype == dtypes.bfloat16 else np.dtype(storage.dtype.np).newbyteorder("<")
    items = np.frombuffer(storage.data, dtype=storage_np)
    last = offset + sum((s - 1) * st for s, st in zip(size, stride)) if all(s > 0 for s in size) else offset - 1
    if offset < 0 or any(st < 0 for st in stride) or last >= len(items):
        raise ValueError(f"torch_load: a tensor of size {tuple(size)}, stride {tuple(stride)} at offset {offset} "
                         f"reaches past its storage of {len(items)} items")
    view = np.lib.stride_tricks.as_strided(items[offset:], shape=tuple(size),
                                           strides=tuple(st * items.itemsize for st in stride))
    array = view.astype(storage_np.newbyteorder("="), order="C", copy=True)  # (ascontiguousarray makes 0-d 1-d)
    t = Tensor(array)
    return t.bitcast(dtypes.bfloat16) if storage.dtype == dtypes.bfloat16 else t


def _rebuild_parameter(data: Any, requires_grad: bool = False, *_: Any) -> Any:
    return data


class _TorchUnpickler(pickle.Unpickler):
    """Maps the names a checkpoint refers to onto the functions above; `storages` gives each storage key's bytes."""

    def __init__(self, f: IO[bytes], storages: Callable[[str, DType, int], bytes | None]) -> None:
        super().__init__(f)
        self.storages = storages
        self.seen: list[tuple[str, DType, int]] = []

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in STORAGE_DTYPES:
            return STORAGE_DTYPES[name]
        if (module, name) in SAFE_GLOBALS:
            return SAFE_GLOBALS[(module, name)]
        return Unknown

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage" or not isinstance(pid[1], DType):
            raise ValueError(f"torch_load: unsupported persistent id {pid!r:.200} (not a typed storage)")
        _, dtype, key, _location, numel = pid[:5]
        self.seen.append((str(key), dtype, int(numel)))
        return _Storage(dtype, self.storages(str(key), dtype, int(numel)))


def _load_zip(f: BinaryIO) -> Any:
    with zipfile.ZipFile(f) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pickles) != 1:
            raise ValueError(f"torch_load: a zip checkpoint holds one data.pkl, found {len(pickles)}")
        base = pickles[0][:-len("data.pkl")]

        def storage(key: str, dtype: DType, numel: int) -> bytes:
            data = archive.read(f"{base}data/{key}")
            if len(data) < numel * dtype.itemsize:
                raise ValueError(f"torch_load: storage {key} holds {len(data)} bytes, its {numel} items need "
                                 f"{numel * dtype.itemsize}")
            return data
        with archive.open(pickles[0]) as pkl:
            return _TorchUnpickler(pkl, storage).load()


def _load_legacy(f: BinaryIO) -> Any:
    """The pre-1.6 format: magic, protocol and system-info pickles, the object's pickle, the storage keys' pickle,
    then each storage as an int64 item count and its bytes. The object's pickle is read twice: once to find where
    the storages start, once with their bytes."""
    try:
        magic = _TorchUnpickler(f, lambda *_: None).load()
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError, TypeError) as e:
        raise ValueError(f"torch_load: not a PyTorch checkpoint ({e})") from e
    if magic != LEGACY_MAGIC:
        raise ValueError("torch_load: not a PyTorch checkpoint (no zip archive, no legacy magic number)")
    for _ in range(2):  # protocol version and sys_info
        _TorchUnpickler(f, lambda *_: None).load()
    start = f.tell()
    first = _TorchUnpickler(f, lambda *_: None)
    first.load()
    keys = _TorchUnpickler(f, lambda *_: None).load()
    sizes = {key: (dtype, numel) for key, dtype, numel in first.seen}
    datas: dict[str, bytes] = {}
    for key in keys:
        (count,) = struct.unpack("<q", f.read(8))
        dtype = sizes[str(key)][0]
        datas[str(key)] = f.read(count * dtype.itemsize)
    f.seek(start)
    return _TorchUnpickler(f, lambda key, *_: datas[key]).load()

