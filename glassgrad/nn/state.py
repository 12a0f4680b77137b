"""Model state: naming a model's tensors, loading values into them, and safetensors files.

In: any Python object that holds `Tensor`s in its attributes, lists, tuples or dicts (a model), or a
`.safetensors` file. Out:
- `get_state_dict(model)`: `{"layers.0.weight": Tensor, ...}`, the names following the attribute path;
- `get_parameters(model)`: the same tensors as a list, each once;
- `load_state_dict(model, state)`: writes `state`'s values into the model's own tensors (`Tensor.assign`),
  after checking names and shapes (dtypes are cast), and returns them;
- `safe_save(tensors, path)` / `safe_load(path)` / `safe_load_metadata(path)`: the safetensors format
  (https://github.com/huggingface/safetensors), read and written here without that package;
- `torch_load(path)`: a `torch.save` checkpoint, and tinygrad's `zip_extract`, `tar_extract`, `TensorIO`,
  `accept_filename` (from `glassgrad.nn.torch_pickle`);
- `gguf_load(path)`: a GGUF file's metadata and tensors (from `glassgrad.llm.gguf`, tinygrad 0.14's place for it).

A safetensors file is: 8 bytes, little-endian u64 `n`; `n` bytes of a UTF-8 JSON object mapping each name to
`{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}` (plus an optional `"__metadata__"` of
string -> string); then the data, each tensor's bytes little-endian and row-major at `[begin, end)` from the
start of the data. The reader treats a file as hostile: every size in the header is checked against the file
before anything is allocated, and every problem is a `ValueError` that names the file.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np

from glassgrad.dtype import DType, dtypes
from glassgrad.engine.jit import TinyJit
from glassgrad.tensor import Tensor

PathLike = str | os.PathLike[str]

# safetensors' dtype codes for the dtypes glassgrad has
SAFETENSORS_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "U16": dtypes.uint16, "I16": dtypes.int16,
    "U32": dtypes.uint32, "I32": dtypes.int32, "U64": dtypes.uint64, "I64": dtypes.int64, "F16": dtypes.float16,
    "BF16": dtypes.bfloat16, "F32": dtypes.float32, "F64": dtypes.float64,
}
_CODE_OF_DTYPE: dict[DType, str] = {dt: code for code, dt in SAFETENSORS_DTYPES.items()}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors package refuses larger headers too
METADATA_KEY = "__metadata__"


# ---------------------------------------------------------------------------------------------- state dicts
def get_state_dict(obj: Any, prefix: str = "", tensor_type: type | tuple[type, ...] = Tensor) -> dict[str, Any]:
    """Every tensor reachable from `obj` through attributes, lists, tuples and dicts, keyed by its path
    (`"layers.0.weight"`). A tensor reachable by two paths appears under both names; reference cycles are cut.
    `tensor_type` (tinygrad's keyword) is the class of what is collected: `torch.Tensor` walks a PyTorch object
    the same way (a glassgrad Tensor is then a leaf, neither collected nor walked into)."""
    return dict(_walk(obj, prefix, set(), tensor_type))


def _walk(obj: Any, prefix: str, on_path: set[int], tensor_type: type | tuple[type, ...] = Tensor
          ) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, tensor_type):
        yield prefix.rstrip("."), obj
        return
    if isinstance(obj, Tensor) or id(obj) in on_path:  # (on_path: a cycle, a layer that points back to its parent)
        return
    children = _children(obj)
    if not children:
        return
    on_path.add(id(obj))
    for name, child in children:
        yield from _walk(child, f"{prefix}{name}.", on_path, tensor_type)
    on_path.discard(id(obj))


def _children(obj: Any) -> list[tuple[str, Any]]:
    """The named sub-objects the walk descends into (none for leaves such as numbers and strings)."""
    if isinstance(obj, (str, bytes, int, float, bool, type(None), np.ndarray, type, TinyJit)):
        return []  # (a TinyJit attribute, `self.forward_jit = TinyJit(...)`, holds captured outputs, not state)
    if hasattr(obj, "_asdict"):  # namedtuple: use the field names
        return [(str(k), v) for k, v in obj._asdict().items()]
    if isinstance(obj, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        return [(str(k), v) for k, v in obj.items()]
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        return [(str(k), v) for k, v in attrs.items()]
    return []


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of `get_state_dict(obj)`, in order, each object once (tied weights are one parameter)."""
    seen: set[int] = set()
    params: list[Tensor] = []
    for t in get_state_dict(obj).values():
        if id(t) not in seen:
            seen.add(id(t))
            params.append(t)
    return params


def load_state_dict(model: Any, state_dict: Mapping[str, Tensor], strict: bool = True, verbose: bool = True,
                    consume: bool = False, realize: bool = True) -> list[Tensor]:
    """Write each value of `state_dict` into the model tensor of the same name (cast to its dtype, moved to its
    device); returns the model tensors written (tinygrad's signature). `strict` makes missing and unexpected names an
    error; a shape mismatch is always an error, except () against (1,) (tinygrad reshapes those). All problems are
    reported together in one `ValueError`, and nothing is written unless there are none. `consume` deletes the
    loaded entries from `state_dict` (a dict); `verbose` is accepted for tinygrad's callers (no progress bar here)."""
    targets = get_state_dict(model)
    values = {name: _scalar_as(targets[name], v) if name in targets else v for name, v in state_dict.items()}
    problems = _state_dict_problems(targets, values, strict)
    if problems:
        raise ValueError("load_state_dict: the state dict does not fit the model:\n  " + "\n  ".join(problems))
    loaded = [name for name in targets if name in values]
    for name in loaded:
        _copy_into(targets[name], values[name])
    if realize and loaded:
        Tensor.realize_all(*(targets[name] for name in loaded))
    if consume:
        if not isinstance(state_dict, MutableMapping):
            raise TypeError(f"load_state_dict(consume=True) deletes the loaded entries, so it needs a dict, got "
                            f"{type(state_dict).__name__}")
        for name in loaded:
            del state_dict[name]
    return [targets[name] for name in loaded]


def _scalar_as(target: Tensor, value: Any) -> Any:
    """A one-element value of shape () or (1,) reshaped to the target's (1,) or (); anything else unchanged."""
    if isinstance(value, Tensor) and {value.shape, target.shape} == {(), (1,)}:
        return value.reshape(target.shape)
    return value


def _state_dict_problems(targets: Mapping[str, Tensor], state_dict: Mapping[str, Tensor], strict: bool) -> list[str]:
    problems: list[str] = []
    if strict:
        missing = [k for k in targets if k not in state_dict]
        unexpected = [k for k in state_dict if k not in targets]
        if missing:
            problems.append(f"missing keys (in the model, not in the state dict): {', '.join(missing)}")
        if unexpected:
            problems.append(f"unexpected keys (in the state dict, not in the model): {', '.join(unexpected)}")
    for name, target in targets.items():
        value = state_dict.get(name)
        if value is not None and not isinstance(value, Tensor):
            problems.append(f"{name}: expected a Tensor in the state dict, got {type(value).__name__}")
        elif value is not None and value.shape != target.shape:
            problems.append(f"{name}: model has {target.shape}, file has {value.shape}")
    return problems


def _copy_into(target: Tensor, value: Tensor) -> None:
    """The one place a loaded value enters a model tensor: written into the tensor's own storage."""
    target.assign(value.to(target.device).cast(target.dtype))


# ---------------------------------------------------------------------------------------------- safetensors writing
def safe_save(tensors: Mapping[str, Tensor], path: PathLike, metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` to `path` as a safetensors file (atomically: a reader sees the old file or the new one)."""
    arrays = {name: _host_bytes(name, t) for name, t in tensors.items()}
    header = _build_header(tensors, arrays, metadata)
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            for array in arrays.values():
                f.write(array.reshape(-1).view(np.uint8).data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _host_bytes(name: str, t: Tensor) -> np.ndarray:
    """A tensor's values as a contiguous little-endian numpy array (bfloat16 as its raw uint16 bits)."""
    if not isinstance(name, str) or name == METADATA_KEY:
        raise ValueError(f"safe_save: tensor names must be strings other than {METADATA_KEY!r}, got {name!r}")
    if not isinstance(t, Tensor):
        raise TypeError(f"safe_save: {name!r} is a {type(t).__name__}, not a Tensor")
    if t.dtype not in _CODE_OF_DTYPE:
        raise TypeError(f"safe_save: {name!r} has dtype {t.dtype}, which safetensors cannot store")
    array = t.bitcast(dtypes.uint16).numpy() if t.dtype == dtypes.bfloat16 else t.numpy()
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def _build_header(tensors: Mapping[str, Tensor], arrays: Mapping[str, np.ndarray],
                  metadata: Mapping[str, str] | None) -> bytes:
    header: dict[str, Any] = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("safe_save: metadata must map strings to strings")
        header[METADATA_KEY] = dict(metadata)
    offset = 0
    for name, t in tensors.items():
        size = arrays[name].nbytes
        header[name] = {"dtype": _CODE_OF_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)  # pad with spaces so the data starts 8-byte aligned, as safetensors does


# ---------------------------------------------------------------------------------------------- safetensors reading
def safe_load_metadata(path: PathLike | Tensor) -> dict[str, Any]:
    """The validated JSON header of a safetensors file: name -> {dtype, shape, data_offsets}, and
    `"__metadata__"` when the file has one. Reads only the header. `path` may be a 1-d uint8 tensor of the file's
    bytes, as in tinygrad."""
    with _source(path) as f:
        header, _ = _read_header(f, _where(path))
    return header


def safe_load(path: PathLike | Tensor, device: str | None = None) -> dict[str, Tensor]:
    """Every tensor of a safetensors file (or of a 1-d uint8 tensor of its bytes, as in tinygrad:
    `safe_load(Tensor(data))`), by name, on `device`. Raises `ValueError` for a malformed file."""
    where = _where(path)
    with _source(path) as f:
        header, data_start = _read_header(f, where)
        tensors: dict[str, Tensor] = {}
        for name, info in header.items():
            if name != METADATA_KEY:
                tensors[name] = _read_tensor(f, where, name, info, data_start, device)
    return tensors


def _source(path: PathLike | Tensor) -> Any:
    """A binary file over a path, or over the bytes of a 1-d uint8 tensor."""
    from glassgrad.nn.torch_pickle import _open
    return _open(path)


def _where(path: PathLike | Tensor) -> str:
    return f"a uint8 tensor of {path.shape[0]} bytes" if isinstance(path, Tensor) and path.ndim == 1 else \
        "a tensor" if isinstance(path, Tensor) else os.fspath(path)


def _read_header(f: Any, where: str) -> tuple[dict[str, Any], int]:
    """Parse and check the header; returns it and the file offset where the data starts."""
    file_size = f.seek(0, os.SEEK_END)
    f.seek(0)
    if file_size < 8:
        raise ValueError(f"{where}: not a safetensors file: {file_size} bytes, fewer than the 8-byte header length")
    (length,) = struct.unpack("<Q", f.read(8))
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"{where}: header length {length} is absurd (the limit is {MAX_HEADER_BYTES} bytes)")
    if 8 + length > file_size:
        raise ValueError(f"{where}: header length {length} runs past the end of the {file_size}-byte file")
    header = _parse_json(f.read(length), where)
    _check_header(header, where, data_size=file_size - 8 - length)
    return header, 8 + length


def _parse_json(raw: bytes, where: str) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise ValueError(f"duplicate key {_short(key)}")
            result[key] = value
        return result
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{where}: cannot parse the header as JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: the header must be a JSON object, got {type(header).__name__}")
    return header


def _check_header(header: dict[str, Any], where: str, data_size: int) -> None:
    """Check every entry's dtype, shape and offsets against the data section; offsets may not overlap."""
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == METADATA_KEY:
            _check_metadata(info, where)
            continue
        begin, end = _check_entry(name, info, where, data_size)
        spans.append((begin, end, name))
    spans.sort()
    for (_, end_a, name_a), (begin_b, _, name_b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise ValueError(f"{where}: tensors {name_a!r} and {name_b!r} overlap in the data section")


def _check_metadata(info: Any, where: str) -> None:
    if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
        raise ValueError(f"{where}: {METADATA_KEY} must be an object of strings")


def _check_entry(name: str, info: Any, where: str, data_size: int) -> tuple[int, int]:
    """Validate one tensor's entry; returns its (begin, end) in the data section."""
    def bad(problem: str) -> ValueError:
        return ValueError(f"{where}: tensor {_short(name)}: {problem}")
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise bad(f"entry must be an object with dtype, shape and data_offsets, got {info!r:.200}")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
        raise bad(f"unknown dtype {code!r:.50}; glassgrad reads {', '.join(SAFETENSORS_DTYPES)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise bad(f"shape must be a list of non-negative integers, got {shape!r:.200}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets):
        raise bad(f"data_offsets must be [begin, end] integers, got {offsets!r:.200}")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise bad(f"data_offsets {offsets} must satisfy 0 <= begin <= end")
    if end > data_size:
        raise bad(f"data_offsets {offsets} run past the end of the {data_size}-byte data section")
    itemsize = SAFETENSORS_DTYPES[code].itemsize
    numel = _numel_up_to(shape, data_size // itemsize + 1)
    if numel * itemsize > data_size:
        raise bad(f"shape {shape!r:.200} of {code} needs more than the whole {data_size}-byte data section")
    if end - begin != numel * itemsize:
        raise bad(f"data_offsets {offsets} hold {end - begin} bytes, but shape {shape} of {code} needs "
                  f"{numel * itemsize}")
    return begin, end


def _numel_up_to(shape: list[int], limit: int) -> int:
    """prod(shape), or any number above `limit` once the product passes it (a hostile shape of a million huge
    dims must not make us multiply million-digit numbers)."""
    if 0 in shape:
        return 0
    numel = 1
    for d in shape:
        numel *= d
        if numel > limit:
            return numel
    return numel


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _short(name: str) -> str:
    """A name for an error message, cut short if a hostile file made it enormous."""
    return repr(name) if len(name) <= 200 else repr(name[:200]) + "..."


def _read_tensor(f: Any, where: str, name: str, info: dict[str, Any], data_start: int,
                 device: str | None) -> Tensor:
    dtype = SAFETENSORS_DTYPES[info["dtype"]]
    begin, end = info["data_offsets"]
    f.seek(data_start + begin)
    raw = f.read(end - begin)  # size already checked against the file
    if len(raw) != end - begin:
        raise ValueError(f"{where}: tensor {name!r}: file ended early (did it change while being read?)")
    if dtype == dtypes.bool:  # any nonzero byte is True; never hand the kernels a bool byte other than 0 or 1
        array = np.frombuffer(raw, dtype=np.uint8) != 0
    else:
        storage = dtypes.uint16 if dtype == dtypes.bfloat16 else dtype
        array = np.frombuffer(raw, dtype=storage.np.newbyteorder("<")).astype(storage.np, copy=False)
    t = Tensor(array.reshape(info["shape"]), device=device)
    return t.bitcast(dtypes.bfloat16) if dtype == dtypes.bfloat16 else t


# ---------------------------------------------------------------------------------------------- tinygrad's other names
safe_dtypes = SAFETENSORS_DTYPES  # tinygrad's names for the safetensors dtype tables
inverse_safe_dtypes = _CODE_OF_DTYPE
from glassgrad.llm.gguf import ggml_data_to_tensor, gguf_load  # noqa: E402, F401  (older tinygrad had these here)
from glassgrad.nn.torch_pickle import (  # noqa: E402, F401  (tinygrad has these in nn.state)
    TensorIO,
    accept_filename,
    tar_extract,
    torch_load,
    zip_extract,
)
