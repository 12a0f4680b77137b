"""GGUF loading (`glassgrad.llm.gguf`, tinygrad 0.14's `tinygrad.llm.gguf`; `nn.state` exports it too): files built
here byte by byte, quantized blocks checked against scalar decoders that follow ggml's C reference loops
(`dequantize_row_*` in ggml-quants.c) element by element, in float32 like them."""
from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from glassgrad import Tensor, dtypes
from glassgrad.llm.gguf import ggml_data_to_tensor, gguf_load

F32 = np.float32


def _f16(b: np.ndarray, at: int) -> np.float32:
    return F32(np.frombuffer(b[at:at + 2].tobytes(), "<f2")[0])


def _value(kind: int, v: Any) -> bytes:
    if kind == 8:
        return struct.pack("<Q", len(v.encode())) + v.encode()
    if kind == 9:
        item, items = v
        return struct.pack("<iQ", item, len(items)) + b"".join(_value(item, x) for x in items)
    return struct.pack({4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}[kind], v)


def build_gguf(tensors: list[tuple[str, tuple[int, ...], int, bytes]], kvs: list[tuple[str, int, Any]],
               alignment: int = 32) -> bytes:
    """A GGUF v3 file: header, key/values (name, value type, value), tensor infos (dims written innermost
    first), padding to `alignment`, data."""
    out = bytearray(struct.pack("<4siqq", b"GGUF", 3, len(tensors), len(kvs)))
    for key, kind, v in kvs:
        out += _value(8, key) + struct.pack("<i", kind) + _value(kind, v)
    offset = 0
    for name, shape, kind, data in tensors:
        out += _value(8, name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape[::-1])
        out += struct.pack("<iQ", kind, offset)
        offset += len(data)
    out += b"\0" * (-len(out) % alignment)
    return bytes(out) + b"".join(d for *_, d in tensors)


# ---------------------------------------------------------------------- ggml's reference loops, one value at a time
def ref_q4_0(b: np.ndarray) -> list[np.float32]:
    d, out = _f16(b, 0), [F32(0)] * 32
    for j in range(16):
        out[j], out[j + 16] = d * F32(int(b[2 + j] & 15) - 8), d * F32(int(b[2 + j] >> 4) - 8)
    return out


def ref_q4_1(b: np.ndarray) -> list[np.float32]:
    d, m, out = _f16(b, 0), _f16(b, 2), [F32(0)] * 32
    for j in range(16):
        out[j], out[j + 16] = d * F32(int(b[4 + j] & 15)) + m, d * F32(int(b[4 + j] >> 4)) + m
    return out


def ref_q5_0(b: np.ndarray) -> list[np.float32]:
    d, qh, out = _f16(b, 0), struct.unpack("<I", b[2:6].tobytes())[0], [F32(0)] * 32
    for j in range(16):
        x0 = (int(b[6 + j] & 15) | (((qh >> j) << 4) & 0x10)) - 16
        x1 = (int(b[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16
        out[j], out[j + 16] = d * F32(x0), d * F32(x1)
    return out


def ref_q8_0(b: np.ndarray) -> list[np.float32]:
    return [_f16(b, 0) * F32(int(v)) for v in b[2:34].view(np.int8)]


def _scale_min_k4(j: int, q: np.ndarray) -> tuple[int, int]:
    if j < 4:
        return int(q[j] & 63), int(q[j + 4] & 63)
    return int(q[j + 4] & 0xF) | (int(q[j - 4] >> 6) << 4), int(q[j + 4] >> 4) | (int(q[j] >> 6) << 4)


def ref_q4_k(b: np.ndarray) -> list[np.float32]:
    d, dmin, scales, out = _f16(b, 0), _f16(b, 2), b[4:16], []
    for chunk in range(4):
        q = b[16 + 32 * chunk:48 + 32 * chunk]
        for half, nib in ((0, q & 15), (1, q >> 4)):
            sc, m = _scale_min_k4(2 * chunk + half, scales)
            out += [d * F32(sc) * F32(int(v)) - dmin * F32(m) for v in nib]
    return out


def ref_q6_k(b: np.ndarray) -> list[np.float32]:
    out = [F32(0)] * 256
    d, sc = _f16(b, 208), b[192:208].view(np.int8)
    for n in range(2):
        ql, qh, s, y = b[64 * n:64 * n + 64], b[128 + 32 * n:160 + 32 * n], sc[8 * n:8 * n + 8], 128 * n
        for j in range(32):
            i = j // 16
            lo, hi, h = int(ql[j]), int(ql[j + 32]), int(qh[j])
            q = [(lo & 15 | (h & 3) << 4) - 32, (hi & 15 | (h >> 2 & 3) << 4) - 32,
                 (lo >> 4 | (h >> 4 & 3) << 4) - 32, (hi >> 4 | (h >> 6 & 3) << 4) - 32]
            for k in range(4):
                out[y + j + 32 * k] = d * F32(int(s[i + 2 * k])) * F32(q[k])
    return out


def _random_blocks(rng: np.random.Generator, count: int, size: int, f16_at: tuple[int, ...]) -> np.ndarray:
    """Random block bytes whose float16 fields are finite values of moderate size."""
    b = rng.integers(0, 256, (count, size), dtype=np.uint8)
    for at in f16_at:
        b[:, at:at + 2] = np.frombuffer(rng.uniform(-2, 2, count).astype("<f2").tobytes(), np.uint8).reshape(count, 2)
    return b


QUANT_CASES: list[tuple[str, int, int, int, tuple[int, ...], Callable[[np.ndarray], list[np.float32]]]] = [
    ("Q4_0", 2, 32, 18, (0,), ref_q4_0), ("Q4_1", 3, 32, 20, (0, 2), ref_q4_1), ("Q5_0", 6, 32, 22, (0,), ref_q5_0),
    ("Q8_0", 8, 32, 34, (0,), ref_q8_0), ("Q4_K", 12, 256, 144, (0, 2), ref_q4_k),
    ("Q6_K", 14, 256, 210, (208,), ref_q6_k)]


@pytest.mark.parametrize("name,kind,per_block,size,f16_at,ref", QUANT_CASES, ids=[c[0] for c in QUANT_CASES])
def test_quantized_blocks_match_ggmls_reference(name: str, kind: int, per_block: int, size: int,
                                                f16_at: tuple[int, ...], ref: Callable[[np.ndarray], list[Any]],
                                                tmp_path: Path) -> None:
    blocks = _random_blocks(np.random.default_rng(kind), 3, size, f16_at)
    want = np.array([v for b in blocks for v in ref(b)], np.float32)
    got = ggml_data_to_tensor(Tensor(blocks.reshape(-1)), 3 * per_block, kind)
    assert (got.shape, got.dtype) == ((3 * per_block,), dtypes.float32)
    np.testing.assert_array_equal(got.numpy(), want)
    fn = tmp_path / "q.gguf"
    fn.write_bytes(build_gguf([("w", (3, per_block), kind, blocks.tobytes())], []))
    np.testing.assert_array_equal(gguf_load(fn)[1]["w"].numpy(), want.reshape(3, per_block))


def test_hand_computed_blocks() -> None:
    """tinygrad's hardcoded cases: Q8_0 is scale * int8; MXFP4 with exponent 128 is its codes' e2m1 values (x2)."""
    q8 = np.frombuffer(np.float16(2.0).tobytes() + np.arange(1, 33, dtype=np.int8).tobytes(), np.uint8).copy()
    np.testing.assert_array_equal(ggml_data_to_tensor(Tensor(q8), 32, 8).numpy(), np.arange(1, 33) * 2.0)
    mx = np.array([0x80] + list(range(16)), np.uint8)
    want = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12] + [0] * 16
    np.testing.assert_array_equal(ggml_data_to_tensor(Tensor(mx), 32, 39).numpy(), want)


def test_native_tensors_and_metadata(tmp_path: Path) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    h = np.array([[0.5, -1.25]], np.float16)
    i = np.array([-3, 7, 2**40], np.int64)
    bf = np.array([1.0, -2.5, 3.0e38], np.float32)
    bf_bits = (bf.view(np.uint32) >> 16).astype("<u2")
    kvs = [("general.name", 8, "tiny"), ("n", 4, 7), ("ok", 7, True), ("eps", 6, 0.5), ("ids", 9, (5, [1, -2, 3])),
           ("big", 10, 2**40), ("general.alignment", 4, 64)]
    fn = tmp_path / "m.gguf"
    fn.write_bytes(build_gguf([("a", a.shape, 0, a.tobytes()), ("h", h.shape, 1, h.tobytes()),
                               ("i", i.shape, 27, i.tobytes()), ("bf", bf.shape, 30, bf_bits.tobytes())],
                              kvs, alignment=64))
    kv, sd = gguf_load(fn)
    assert kv == {"general.name": "tiny", "n": 7, "ok": True, "eps": 0.5, "ids": [1, -2, 3], "big": 2**40,
                  "general.alignment": 64}
    np.testing.assert_array_equal(sd["a"].numpy(), a)
    assert sd["h"].dtype == dtypes.float16 and sd["h"].numpy().tolist() == h.tolist()
    assert sd["i"].dtype == dtypes.int64 and sd["i"].tolist() == i.tolist()
    assert sd["bf"].dtype == dtypes.bfloat16
    assert sd["bf"].float().tolist() == (bf_bits.astype(np.uint32) << 16).view(np.float32).tolist()
    kv2, sd2 = gguf_load(Tensor(fn))  # the file's bytes as a tensor (tinygrad's usual call)
    assert kv2 == kv and sd2["a"].tolist() == a.tolist()
    from glassgrad.nn.state import gguf_load as from_nn_state
    assert from_nn_state is gguf_load


def test_multi_part_files(tmp_path: Path) -> None:
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0], np.float32)
    (tmp_path / "m-00001-of-00002.gguf").write_bytes(
        build_gguf([("a", (2,), 0, a.tobytes())], [("split.count", 4, 2), ("split.no", 4, 0)]))
    (tmp_path / "m-00002-of-00002.gguf").write_bytes(
        build_gguf([("b", (1,), 0, b.tobytes())], [("split.count", 4, 2), ("split.no", 4, 1)]))
    _, sd = gguf_load(tmp_path / "m-00001-of-00002.gguf")
    assert (sd["a"].tolist(), sd["b"].tolist()) == ([1.0, 2.0], [3.0])
    with pytest.raises(ValueError, match="first part"):
        gguf_load(tmp_path / "m-00002-of-00002.gguf")
    (tmp_path / "m-00002-of-00002.gguf").unlink()
    with pytest.raises(FileNotFoundError):
        gguf_load(tmp_path / "m-00001-of-00002.gguf")


def test_bad_files_and_types_raise(tmp_path: Path) -> None:
    """Never garbage: a wrong magic, a truncated file, a tensor past the end, a partial block, an unknown or
    unsupported type each raise."""
    good = build_gguf([("a", (4,), 0, np.ones(4, np.float32).tobytes())], [("k", 8, "v")])
    for data, err, match in [(b"GGUX" + good[4:], ValueError, "not a GGUF"), (good[:30], ValueError, "truncated"),
                             (good[:-4], ValueError, "past the end")]:
        (tmp_path / "bad.gguf").write_bytes(data)
        with pytest.raises(err, match=match):
            gguf_load(tmp_path / "bad.gguf")
    with pytest.raises(ValueError, match="whole blocks"):
        ggml_data_to_tensor(Tensor(np.zeros(34, np.uint8)), 16, 8)
    with pytest.raises(ValueError, match="not a known type"):
        ggml_data_to_tensor(Tensor.zeros(512, dtype=dtypes.uint8), 256, 1337)
    with pytest.raises(NotImplementedError, match="IQ3_S"):
        ggml_data_to_tensor(Tensor.zeros(512, dtype=dtypes.uint8), 256, 21)
    with pytest.raises(ValueError, match="need 34 bytes"):
        ggml_data_to_tensor(Tensor(np.zeros(20, np.uint8)), 32, 8)
