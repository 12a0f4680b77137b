"""GGUF files (llama.cpp's model format): `gguf_load(path)` -> `(kv_data, state_dict)`, as tinygrad 0.14's
`tinygrad.llm.gguf` (older tinygrad had it in `nn.state`, where glassgrad exports it too).

In: a `.gguf` file (a path, or a uint8 tensor of its bytes). Out: its key/value metadata as a dict, and each tensor
by name, with its shape (the file lists dims innermost first; the shape here is the usual outermost first) and
dequantized to float32 when the file stores it quantized.

The format, little-endian throughout: `b"GGUF"`, version (int32: 2 or 3), tensor count and key/value count (int64);
the key/value pairs (a string key, an int32 value type, the value); for each tensor its name, dim count (uint32),
dims (uint64 each), ggml type (int32) and data offset (uint64); the data, starting at the next multiple of
`general.alignment` (32 unless set). A string is a uint64 length and UTF-8 bytes; an array an int32 item type, a
uint64 count and the items.

Quantized types store blocks of values with their scales (ggml's `ggml-common.h`); each is decoded here on the host
with numpy, the formulas in the order ggml's reference dequantizers use, so the values are exactly theirs. Supported:
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4 and Q1_0; the IQ2/IQ3 grid types raise
NotImplementedError, an unknown type ValueError. Every size read from the file is checked against the file before
data is read, so a truncated or corrupt file raises ValueError (never wrong values).
"""
from __future__ import annotations

import math
import os
import pathlib
import re
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from glassgrad.dtype import DType, dtypes
from glassgrad.tensor import Tensor

# ggml's native (unquantized) types
GGML_NATIVE: dict[int, DType] = {0: dtypes.float32, 1: dtypes.float16, 24: dtypes.int8, 25: dtypes.int16,
                                 26: dtypes.int32, 27: dtypes.int64, 28: dtypes.float64, 30: dtypes.bfloat16}
# quantized types: ggml type -> (values per block, bytes per block)
GGML_BLOCKS: dict[int, tuple[int, int]] = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
                                           12: (256, 144), 13: (256, 176), 14: (256, 210), 23: (256, 136),
                                           39: (32, 17), 41: (128, 18)}
_GRID_TYPES = {16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
               29: "IQ1_M", 10: "Q2_K", 11: "Q3_K", 15: "Q8_K"}
# IQ4_XS's 16 non-linear levels; MXFP4's e2m1 values doubled (its scale is 2^(e - 128), half of e8m0's)
_IQ4NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
_FP4_LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian float16 fields (2 bytes each, the last axis) as float32, one per block."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes (..., k) -> (..., 2k) values: the k low nibbles, then the k high nibbles (ggml's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(b: np.ndarray, width: int) -> np.ndarray:
    """Bytes (..., k) -> (..., 8 // width, k): field i of every byte (`width` bits at bit i * width)."""
    shifts = np.arange(0, 8, width, dtype=np.uint8).reshape(-1, 1)
    return (b[..., None, :] >> shifts) & ((1 << width) - 1)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit scales and mins for 8 sub-blocks (ggml's get_scale_min_k4), as float32."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * (_nibbles(b[:, 2:18]).astype(np.float32) - 8)


def _q4_1(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * _nibbles(b[:, 4:20]).astype(np.float32) + _f16(b[:, 2:4])


def _q5(b: np.ndarray, off: int) -> np.ndarray:
    """Q5_0/Q5_1's 5-bit values: 4 low bits as Q4's, the fifth bit j of a little-endian uint32 for value j."""
    high = np.ascontiguousarray(b[:, off:off + 4]).view("<u4")[:, :1] >> np.arange(32, dtype=np.uint32)
    return (_nibbles(b[:, off + 4:off + 20]) | ((high & 1).astype(np.uint8) << 4)).astype(np.float32)


def _q5_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * (_q5(b, 2) - 16)


def _q5_1(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * _q5(b, 4) + _f16(b[:, 2:4])


def _q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * b[:, 2:34].view(np.int8).astype(np.float32)


def _qk(b: np.ndarray, five_bit: bool) -> np.ndarray:
    """Q4_K (and Q5_K, with 32 bytes of fifth bits): 8 sub-blocks of 32, each d * scale * q - dmin * min."""
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    qs = b[:, 48:176] if five_bit else b[:, 16:144]
    q = _nibbles(qs.reshape(n, 4, 32)).reshape(n, 8, 32)  # chunk c of 32 bytes: sub-blocks 2c (low), 2c+1 (high)
    if five_bit:
        q = q | (_bits(b[:, 16:48], 1) << 4)  # bit i of qh[l]: value l of sub-block i
    scale = (_f16(b[:, 0:2]) * sc)[:, :, None]
    offset = (_f16(b[:, 2:4]) * mn)[:, :, None]
    return (scale * q.astype(np.float32) - offset).reshape(n, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    """Q6_K: ql (128 bytes: 4 low bits), qh (64 bytes: 2 high bits), 16 int8 scales, d; 16 groups of 16."""
    n = b.shape[0]
    low = _nibbles(b[:, 0:128].reshape(n, 2, 64)).reshape(n, 2, 4, 32)  # half h: values 128h + 32k + l
    high = _bits(b[:, 128:192].reshape(n, 2, 32), 2)                    # (n, 2, 4, 32)
    q = ((low | (high << 4)).astype(np.int8) - 32).reshape(n, 16, 16).astype(np.float32)
    scale = (_f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]
    return (scale * q).reshape(n, 256)


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    """IQ4_XS: d, 6-bit scales (4 low bits in 4 bytes, 2 high bits in a uint16) of 8 sub-blocks of 32 levels."""
    n = b.shape[0]
    low = _nibbles(b[:, 4:8][:, :, None]).reshape(n, 8)  # sub-block 2k: byte k's low nibble, 2k+1: its high one
    high = (np.ascontiguousarray(b[:, 2:4]).view("<u2") >> np.arange(0, 16, 2, dtype=np.uint16)) & 3
    scales = ((low | (high.astype(np.uint8) << 4)).astype(np.int8) - 32).astype(np.float32)
    q = _nibbles(b[:, 8:136].reshape(n, 8, 16))
    return ((_f16(b[:, 0:2]) * scales)[:, :, None] * _IQ4NL_LEVELS[q]).reshape(n, 256)


def _mxfp4(b: np.ndarray) -> np.ndarray:
    """MXFP4: an e8m0 exponent byte e (scale 2^(e - 128)) and 32 4-bit e2m1 codes."""
    scale = np.ldexp(np.float32(1), b[:, :1].astype(np.int32) - 128).astype(np.float32)
    return scale * _FP4_LEVELS[_nibbles(b[:, 1:17])]


def _q1_0(b: np.ndarray) -> np.ndarray:
    """Q1_0: d and 128 sign bits (least significant bit first): d * (+1 or -1)."""
    signs = np.unpackbits(np.ascontiguousarray(b[:, 2:18]), axis=-1, bitorder="little").astype(np.float32) * 2 - 1
    return _f16(b[:, 0:2]) * signs


_DECODERS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0, 12: lambda b: _qk(b, False), 13: lambda b: _qk(b, True),
    14: _q6_k, 23: _iq4_xs, 39: _mxfp4, 41: _q1_0}


def ggml_nbytes(n: int, ggml_type: int) -> int:
    """How many bytes `n` values of `ggml_type` take (ValueError for a type not read here or a partial block)."""
    if (dt := GGML_NATIVE.get(ggml_type)) is not None:
        return n * dt.itemsize
    if ggml_type in _GRID_TYPES:
        raise NotImplementedError(f"GGML type {ggml_type} ({_GRID_TYPES[ggml_type]}) is not supported")
    if ggml_type not in GGML_BLOCKS:
        raise ValueError(f"GGML type {ggml_type} is not a known type")
    per_block, block_bytes = GGML_BLOCKS[ggml_type]
    if n % per_block:
        raise ValueError(f"{n} values of GGML type {ggml_type} are not whole blocks of {per_block}")
    return n // per_block * block_bytes


def ggml_array(data: np.ndarray, n: int, ggml_type: int) -> np.ndarray:
    """`n` values of `ggml_type` from the uint8 array `data` (its first bytes), as a 1-d numpy array: native types
    as they are stored, quantized ones dequantized to float32. bfloat16 comes back as its uint16 bit patterns."""
    size = ggml_nbytes(n, ggml_type)
    if data.size < size:
        raise ValueError(f"{n} values of GGML type {ggml_type} need {size} bytes, only {data.size} are there")
    raw = np.ascontiguousarray(data[:size])
    if (dt := GGML_NATIVE.get(ggml_type)) is not None:
        return raw.view("<u2" if dt == dtypes.bfloat16 else np.dtype(dt.np).newbyteorder("<"))
    return _DECODERS[ggml_type](raw.reshape(-1, GGML_BLOCKS[ggml_type][1])).reshape(-1)


def _to_tensor(values: np.ndarray, ggml_type: int, device: str | None) -> Tensor:
    if GGML_NATIVE.get(ggml_type) == dtypes.bfloat16:
        return Tensor(values.astype(np.uint16), device=device).bitcast(dtypes.bfloat16)
    return Tensor(values.astype(values.dtype.newbyteorder("=")), device=device)


def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
    """tinygrad's `ggml_data_to_tensor`: `n` values of `ggml_type` from the uint8 tensor `t` (its first bytes), as
    a 1-d tensor on `t`'s device (native types keep their dtype; quantized ones are float32)."""
    if t.dtype != dtypes.uint8 or t.ndim != 1:
        raise TypeError(f"ggml_data_to_tensor: expected a 1-d uint8 tensor of bytes, got {t.dtype} {t.shape}")
    size = ggml_nbytes(n, ggml_type)
    return _to_tensor(ggml_array(t[:min(size, t.shape[0])].numpy(), n, ggml_type), ggml_type, t.device)


class _Reader:
    """Reads GGUF's little-endian fields from a uint8 array, refusing to read past its end."""
    _SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def __init__(self, data: np.ndarray, name: str) -> None:
        self.data, self.pos, self.name = data, 0, name

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.data.size:
            raise ValueError(f"{self.name}: truncated GGUF file (a field at byte {self.pos} runs past its end)")
        out = self.data[self.pos:self.pos + n].tobytes()
        self.pos += n
        return out

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.string()
        if kind == 9:
            item, count = self.scalar("<i"), self.scalar("<Q")
            if count > self.data.size - self.pos:  # every item takes at least a byte
                raise ValueError(f"{self.name}: a GGUF array of {count} items is longer than the file")
            return [self.value(item) for _ in range(count)]
        if kind not in self._SCALARS:
            raise ValueError(f"{self.name}: unknown GGUF value type {kind}")
        return self.scalar(self._SCALARS[kind])


def _parse(data: np.ndarray, name: str, device: str | None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    r = _Reader(data, name)
    if r.take(4) != b"GGUF":
        raise ValueError(f"{name}: not a GGUF file (its first bytes are not b'GGUF')")
    version, n_tensors, n_kv = r.scalar("<i"), r.scalar("<q"), r.scalar("<q")
    if version not in (2, 3) or n_tensors < 0 or n_kv < 0:
        raise ValueError(f"{name}: GGUF version {version} is not supported (2 and 3 are)")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        kv[key] = r.value(r.scalar("<i"))
    infos = []
    for _ in range(n_tensors):
        tname, n_dims = r.string(), r.scalar("<I")
        dims = tuple(r.scalar("<Q") for _ in range(n_dims))
        infos.append((tname, dims, r.scalar("<i"), r.scalar("<Q")))
    alignment = kv.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"{name}: general.alignment must be a positive int, got {alignment!r}")
    start = -(-r.pos // alignment) * alignment
    state: dict[str, Tensor] = {}
    for tname, dims, kind, offset in infos:
        n = math.prod(dims)
        begin = start + offset
        if begin + ggml_nbytes(n, kind) > data.size:
            raise ValueError(f"{name}: tensor {tname!r} ({n} values of GGML type {kind} at byte {begin}) runs past "
                             f"the end of the file ({data.size} bytes)")
        state[tname] = _to_tensor(ggml_array(data[begin:], n, kind), kind, device).reshape(tuple(reversed(dims)))
    return kv, state


def _split_paths(path: pathlib.Path, kv: dict[str, Any]) -> list[pathlib.Path]:
    """The parts of a multi-part GGUF (`name-00001-of-00003.gguf`, ...) loaded from its first part."""
    total = kv.get("split.count", 1)
    if kv.get("split.no", 0) != 0:
        raise ValueError(f"a multi-part GGUF is loaded from its first part, {path} is part {kv['split.no'] + 1}")
    match = re.fullmatch(r"(.*)-00001-of-\d{5}\.gguf", str(path))
    if match is None:
        raise ValueError(f"the first part of a multi-part GGUF is named NAME-00001-of-NNNNN.gguf, got {path}")
    return [pathlib.Path(f"{match.group(1)}-{i:05d}-of-{total:05d}.gguf") for i in range(1, total + 1)]


def _file_bytes(path: str | os.PathLike[str]) -> np.ndarray:
    return np.fromfile(os.fspath(path), dtype=np.uint8)


def gguf_load(fn: Tensor | str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """A GGUF file's `(kv_data, state_dict)`, from a path or a 1-d uint8 tensor of its bytes (the tensors are made on
    that tensor's device, else the default one). A multi-part file (`split.count` > 1) loaded by the path of its
    first part brings in the other parts' tensors too (a missing part raises FileNotFoundError)."""
    if isinstance(fn, Tensor):
        if fn.dtype != dtypes.uint8 or fn.ndim != 1:
            raise TypeError(f"gguf_load: expected a 1-d uint8 tensor of the file's bytes, got {fn.dtype} {fn.shape}")
        kv, state = _parse(fn.numpy(), "<tensor>", fn.device)
        if kv.get("split.count", 1) > 1:
            raise ValueError("a multi-part GGUF is loaded by the path of its first part, not from a tensor")
        return kv, state
    kv, state = _parse(_file_bytes(fn), os.fspath(fn), None)
    if kv.get("split.count", 1) > 1:
        for part in _split_paths(pathlib.Path(fn), kv)[1:]:
            state.update(_parse(_file_bytes(part), str(part), None)[1])
    return kv, state
