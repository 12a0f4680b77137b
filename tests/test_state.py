"""glassgrad.nn.state: state dicts, load_state_dict, and the safetensors reader/writer (incl. hostile files)."""
from __future__ import annotations

import io
import json
import struct
import tarfile
import zipfile
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from glassgrad import Tensor, TinyJit, dtypes, nn
from glassgrad.dtype import ALL_DTYPES, DType
from glassgrad.nn.state import (
    MAX_HEADER_BYTES,
    TensorIO,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_load_metadata,
    safe_save,
    tar_extract,
    torch_load,
    zip_extract,
)
from glassgrad.nn.torch_pickle import Unknown

# ---------------------------------------------------------------------------------------------- helpers


def sample_array(dtype: DType, shape: tuple[int, ...] = (3, 5)) -> np.ndarray:
    """Values that exercise each dtype's edges (as raw storage: bfloat16 as uint16 bits)."""
    n = int(np.prod(shape))
    if dtype == dtypes.bool:
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dtype == dtypes.bfloat16:  # NaN payloads, -0, inf, denormals: the bits must survive unchanged
        bits = np.array([0x7F81, 0xFFFF, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x3F80, 0xC2F7], np.uint16)
        return np.resize(bits, n).reshape(shape)
    if dtype.is_int:
        info = np.iinfo(dtype.np)
        edges = np.array([info.min, info.max, 0, 1, info.max - 1], dtype=dtype.np)
        return np.resize(edges, n).reshape(shape)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1.5, np.finfo(dtype.np).tiny, np.finfo(dtype.np).max],
                        dtype=dtype.np)
    return np.resize(specials, n).reshape(shape)


def make_tensor(storage: np.ndarray, dtype: DType) -> Tensor:
    return Tensor(storage).bitcast(dtypes.bfloat16) if dtype == dtypes.bfloat16 else Tensor(storage)


def raw_bits(t: Tensor) -> bytes:
    """The exact bytes a tensor holds (bfloat16 through its uint16 bits)."""
    return (t.bitcast(dtypes.uint16).numpy() if t.dtype == dtypes.bfloat16 else t.numpy()).tobytes()


def write_raw(path: Path, header: Any, data: bytes = b"", length: int | None = None) -> Path:
    """A safetensors-like file with any header (a JSON-able object, or raw bytes) and any claimed length."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return path


# ---------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_round_trip_every_dtype_keeps_bytes(tmp_path: Path, dtype: DType) -> None:
    storage = sample_array(dtype)
    path = tmp_path / "t.safetensors"
    safe_save({"x": make_tensor(storage, dtype)}, path)
    loaded = safe_load(path)["x"]
    assert loaded.dtype == dtype
    assert loaded.shape == storage.shape
    assert raw_bits(loaded) == storage.astype(storage.dtype.newbyteorder("<")).tobytes()


def test_file_layout_follows_the_spec(tmp_path: Path) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1, -2, 3], dtype=np.int16)
    path = tmp_path / "layout.safetensors"
    safe_save({"a": Tensor(a), "b": Tensor(b)}, path, metadata={"format": "np"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0, "data section should start 8-byte aligned"
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"format": "np"}
    assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"] == {"dtype": "I16", "shape": [3], "data_offsets": [24, 30]}
    data = raw[8 + n:]
    assert data == a.astype("<f4").tobytes() + b.astype("<i2").tobytes()


def test_scalar_empty_and_many_dims(tmp_path: Path) -> None:
    tensors = {
        "scalar": Tensor(np.array(2.5, np.float32)),
        "empty": Tensor(np.zeros((0, 4), np.int32)),
        "empty_bf16": Tensor(np.zeros((2, 0), np.uint16)).bitcast(dtypes.bfloat16),
        "cube": Tensor(np.arange(24, dtype=np.float64).reshape(2, 3, 4)),
    }
    path = tmp_path / "shapes.safetensors"
    safe_save(tensors, path)
    loaded = safe_load(path)
    assert list(loaded) == list(tensors)
    for name, t in tensors.items():
        assert loaded[name].shape == t.shape and loaded[name].dtype == t.dtype
        np.testing.assert_array_equal(loaded[name].numpy(), t.numpy())


def test_lazy_and_non_contiguous_tensors_are_saved_by_value(tmp_path: Path) -> None:
    base = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    path = tmp_path / "lazy.safetensors"
    safe_save({"t": base.permute(1, 0) * 2}, path)
    np.testing.assert_array_equal(safe_load(path)["t"].numpy(), np.arange(12, dtype=np.float32).reshape(3, 4).T * 2)


def test_metadata_round_trip_and_header_reader(tmp_path: Path) -> None:
    path = tmp_path / "meta.safetensors"
    safe_save({"w": Tensor(np.ones((2, 2), np.float16))}, path, metadata={"step": "10", "name": "ünïcode"})
    header = safe_load_metadata(path)
    assert header["__metadata__"] == {"step": "10", "name": "ünïcode"}
    assert header["w"]["dtype"] == "F16" and header["w"]["shape"] == [2, 2]
    assert list(safe_load(path)) == ["w"]


def test_save_rejects_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    with pytest.raises(ValueError, match="__metadata__"):
        safe_save({"__metadata__": Tensor([1.0])}, path)
    with pytest.raises(TypeError, match="strings"):
        safe_save({"w": Tensor([1.0])}, path, metadata={"step": 10})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="not a Tensor"):
        safe_save({"w": np.ones(3)}, path)  # type: ignore[dict-item]
    assert not path.exists(), "a failed save must not leave a file behind"
    assert list(tmp_path.iterdir()) == []


def test_save_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    safe_save({"a": Tensor([1.0, 2.0])}, path)
    safe_save({"b": Tensor([3, 4, 5])}, path)
    loaded = safe_load(path)
    assert list(loaded) == ["b"] and loaded["b"].tolist() == [3, 4, 5]
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]


# ---------------------------------------------------------------------------------------------- hostile files

GOOD_ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
EIGHT_BYTES = np.array([1.0, 2.0], np.float32).tobytes()


def test_a_well_formed_hand_written_file_loads(tmp_path: Path) -> None:
    """The baseline the hostile cases below each break in one way."""
    path = write_raw(tmp_path / "ok.safetensors", {"x": GOOD_ENTRY}, EIGHT_BYTES)
    assert safe_load(path)["x"].tolist() == [1.0, 2.0]


HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    # name: (arguments of write_raw besides the path, expected message fragment)
    "absurd_header_length": ({"header": b"{}", "length": MAX_HEADER_BYTES + 1}, "absurd"),
    "huge_header_length": ({"header": b"{}", "length": 2**63}, "absurd"),
    "header_past_end": ({"header": b"{}", "length": 4096}, "past the end"),
    "invalid_json": ({"header": b'{"x": {"dtype": '}, "JSON"),
    "invalid_utf8": ({"header": b'{"\xff\xfe": 1}'}, "JSON"),
    "deeply_nested_json": ({"header": b"[" * 100_000 + b"]" * 100_000}, "JSON"),
    "header_is_a_list": ({"header": [1, 2, 3]}, "must be a JSON object"),
    "header_is_a_string": ({"header": "hello"}, "must be a JSON object"),
    "duplicate_keys": ({"header": b'{"x": 1, "x": 2}'}, "duplicate key"),
    "entry_not_an_object": ({"header": {"x": [1, 2]}}, "must be an object"),
    "entry_missing_offsets": ({"header": {"x": {"dtype": "F32", "shape": [2]}}}, "data_offsets"),
    "unknown_dtype": ({"header": {"x": {**GOOD_ENTRY, "dtype": "F8_E4M3"}}, "data": EIGHT_BYTES}, "unknown dtype"),
    "dtype_not_a_string": ({"header": {"x": {**GOOD_ENTRY, "dtype": 7}}, "data": EIGHT_BYTES}, "unknown dtype"),
    "negative_shape": ({"header": {"x": {**GOOD_ENTRY, "shape": [-2]}}, "data": EIGHT_BYTES}, "non-negative"),
    "float_shape": ({"header": {"x": {**GOOD_ENTRY, "shape": [2.0]}}, "data": EIGHT_BYTES}, "non-negative integers"),
    "bool_shape": ({"header": {"x": {**GOOD_ENTRY, "shape": [True, True]}}, "data": EIGHT_BYTES}, "integers"),
    "shape_not_a_list": ({"header": {"x": {**GOOD_ENTRY, "shape": 2}}, "data": EIGHT_BYTES}, "shape must be"),
    "offsets_past_end": ({"header": {"x": {**GOOD_ENTRY, "data_offsets": [0, 8]}}, "data": b"\0" * 4}, "past the end"),
    "offsets_far_past_end": ({"header": {"x": {"dtype": "U8", "shape": [2**40], "data_offsets": [0, 2**40]}},
                              "data": EIGHT_BYTES}, "past the end"),
    "negative_offset": ({"header": {"x": {**GOOD_ENTRY, "data_offsets": [-8, 0]}}, "data": EIGHT_BYTES},
                        "begin <= end"),
    "reversed_offsets": ({"header": {"x": {**GOOD_ENTRY, "data_offsets": [8, 0]}}, "data": EIGHT_BYTES},
                         "begin <= end"),
    "three_offsets": ({"header": {"x": {**GOOD_ENTRY, "data_offsets": [0, 4, 8]}}, "data": EIGHT_BYTES},
                      "data_offsets must be"),
    "offsets_too_small_for_shape": ({"header": {"x": {**GOOD_ENTRY, "shape": [3]}}, "data": EIGHT_BYTES * 2},
                                    "needs 12"),
    "offsets_too_big_for_shape": ({"header": {"x": {**GOOD_ENTRY, "data_offsets": [0, 16]}},
                                   "data": EIGHT_BYTES * 2}, "needs 8"),
    "astronomical_shape": ({"header": {"x": {**GOOD_ENTRY, "shape": [2**62, 2**62]}}, "data": EIGHT_BYTES},
                           "needs more than the whole 8-byte data section"),
    "million_huge_dims": ({"header": {"x": {**GOOD_ENTRY, "shape": [2**60] * 1_000_000}}, "data": EIGHT_BYTES},
                          "needs more than"),
    "zero_dim_among_huge_ones": ({"header": {"x": {**GOOD_ENTRY, "shape": [2**60] * 1000 + [0]}},
                                  "data": EIGHT_BYTES}, "hold 8 bytes, but shape"),
    "duplicate_tensor_names": ({"header": b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "x": 2}',
                                "data": EIGHT_BYTES}, "duplicate key 'x'"),
    "enormous_name": ({"header": {"n" * 10_000: {**GOOD_ENTRY, "dtype": "?"}}, "data": EIGHT_BYTES},
                      "unknown dtype"),
    "overlapping": ({"header": {"x": GOOD_ENTRY, "y": {**GOOD_ENTRY, "data_offsets": [4, 12]}},
                     "data": EIGHT_BYTES * 2}, "overlap"),
    "metadata_not_strings": ({"header": {"__metadata__": {"step": 3}, "x": GOOD_ENTRY}, "data": EIGHT_BYTES},
                             "__metadata__"),
    "metadata_a_list": ({"header": {"__metadata__": ["a"], "x": GOOD_ENTRY}, "data": EIGHT_BYTES}, "__metadata__"),
}


def test_file_shorter_than_the_length_field(tmp_path: Path) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match="fewer than the 8-byte"):
        safe_load(path)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_raises_clear_value_error(tmp_path: Path, case: str) -> None:
    kwargs, fragment = HOSTILE[case]
    path = write_raw(tmp_path / f"{case}.safetensors", **kwargs)
    for reader in (safe_load, safe_load_metadata):
        with pytest.raises(ValueError) as info:
            reader(path)
        assert str(path) in str(info.value), "the error must name the file"
        assert fragment in str(info.value)


def test_error_messages_stay_short_for_enormous_names(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "name.safetensors", {"n" * 10_000: {**GOOD_ENTRY, "dtype": "?"}}, EIGHT_BYTES)
    with pytest.raises(ValueError, match=r"tensor 'n+'\.\.\.: unknown dtype") as info:
        safe_load(path)
    assert len(str(info.value)) < 600


def test_overlap_check_does_not_reject_neighbours_or_empty_tensors(tmp_path: Path) -> None:
    header = {"a": GOOD_ENTRY, "e": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
              "b": {**GOOD_ENTRY, "data_offsets": [8, 16]}}
    loaded = safe_load(write_raw(tmp_path / "n.safetensors", header, EIGHT_BYTES * 2))
    assert loaded["a"].tolist() == loaded["b"].tolist() == [1.0, 2.0] and loaded["e"].shape == (0,)


def test_bool_bytes_other_than_zero_and_one_read_as_true(tmp_path: Path) -> None:
    header = {"m": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}}
    loaded = safe_load(write_raw(tmp_path / "b.safetensors", header, bytes([0, 1, 2, 255])))
    assert loaded["m"].tolist() == [False, True, True, True]
    assert (loaded["m"].cast(dtypes.int32).sum()).item() == 3


# --------------------------------------------------------------------------------------- interop: safetensors package


def test_files_from_the_safetensors_package_load(tmp_path: Path) -> None:
    st_numpy = pytest.importorskip("safetensors.numpy")
    arrays = {d.name: sample_array(d) for d in ALL_DTYPES if d != dtypes.bfloat16}  # numpy has no bfloat16
    path = tmp_path / "theirs.safetensors"
    st_numpy.save_file(arrays, str(path), metadata={"by": "safetensors"})
    loaded = safe_load(path)
    assert safe_load_metadata(path)["__metadata__"] == {"by": "safetensors"}
    for name, array in arrays.items():
        assert loaded[name].dtype.name == name
        assert loaded[name].numpy().tobytes() == array.tobytes()


def test_our_files_load_in_the_safetensors_package(tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors")
    path = tmp_path / "ours.safetensors"
    tensors = {d.name: make_tensor(sample_array(d), d) for d in ALL_DTYPES}
    safe_save(tensors, path, metadata={"by": "glassgrad"})
    theirs = dict(safetensors.deserialize(path.read_bytes()))  # raw bytes: covers bfloat16 too
    assert set(theirs) == set(tensors)
    for name, t in tensors.items():
        assert theirs[name]["shape"] == list(t.shape)
        assert bytes(theirs[name]["data"]) == raw_bits(t)
    from safetensors.numpy import load_file
    no_bf16 = {k: v for k, v in tensors.items() if k != "bfloat16"}
    safe_save(no_bf16, tmp_path / "ours_no_bf16.safetensors")
    arrays = load_file(str(tmp_path / "ours_no_bf16.safetensors"))
    for name, t in no_bf16.items():
        assert arrays[name].dtype == t.dtype.np and arrays[name].tobytes() == raw_bits(t)


def test_bfloat16_interop_with_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    values = torch.tensor([1.0, -2.5, 3.0e38, float("inf")], dtype=torch.bfloat16)
    path = tmp_path / "bf16.safetensors"
    st_torch.save_file({"v": values}, str(path))
    loaded = safe_load(path)["v"]
    assert loaded.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(loaded.numpy(), values.float().numpy())
    safe_save({"v": loaded * 2}, path)
    back = st_torch.load_file(str(path))["v"]
    assert back.dtype == torch.bfloat16
    np.testing.assert_array_equal(back.float().numpy(), (values.float() * 2).numpy())


# ---------------------------------------------------------------------------------------------- state dicts


class Linear:
    def __init__(self, fan_in: int, fan_out: int, bias: bool = True) -> None:
        self.weight = Tensor(np.random.default_rng(fan_in).standard_normal((fan_out, fan_in)).astype(np.float32))
        self.bias = Tensor(np.zeros(fan_out, np.float32)) if bias else None


Pair = namedtuple("Pair", ["first", "second"])


class Net:
    def __init__(self) -> None:
        self.layers = [Linear(4, 3), Linear(3, 2, bias=False)]
        self.heads = {"cls": Linear(2, 5)}
        self.pair = Pair(Tensor([1.0]), (Tensor([2.0]), Tensor([3.0])))
        self.scale = 0.5
        self.name = "net"
        self.table = np.ones(3)  # numpy arrays are not state


def test_state_dict_keys_follow_the_attribute_path() -> None:
    net = Net()
    sd = get_state_dict(net)
    assert list(sd) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "heads.cls.weight", "heads.cls.bias",
                        "pair.first", "pair.second.0", "pair.second.1"]
    assert sd["layers.0.weight"] is net.layers[0].weight
    assert sd["heads.cls.bias"] is net.heads["cls"].bias
    assert list(get_state_dict(net.layers, prefix="body.")) == ["body.0.weight", "body.0.bias", "body.1.weight"]


def test_state_dict_of_a_bare_tensor_and_of_leaves() -> None:
    t = Tensor([1.0, 2.0])
    assert get_state_dict(t, prefix="w.") == {"w": t}
    assert get_state_dict(3) == {} and get_state_dict("text") == {} and get_state_dict(None) == {}


def test_state_dict_survives_reference_cycles() -> None:
    parent = Linear(2, 2)
    child = Linear(2, 2)
    parent.child = child  # type: ignore[attr-defined]
    child.parent = parent  # type: ignore[attr-defined]
    assert list(get_state_dict(parent)) == ["weight", "bias", "child.weight", "child.bias"]


def test_get_parameters_deduplicates_tied_weights() -> None:
    net = Net()
    net.heads["tied"] = net.layers[0]  # the same layer under two names
    sd = get_state_dict(net)
    assert "heads.tied.weight" in sd and sd["heads.tied.weight"] is sd["layers.0.weight"]
    params = get_parameters(net)
    assert len(params) == len(sd) - 2
    assert len({id(p) for p in params}) == len(params)
    assert params[0] is net.layers[0].weight


def test_load_state_dict_through_a_file(tmp_path: Path) -> None:
    source, target = Net(), Net()
    for t in get_parameters(source):
        t.assign(t + 1.0)
    expected = {k: v.numpy() for k, v in get_state_dict(source).items()}
    path = tmp_path / "net.safetensors"
    safe_save(get_state_dict(source), path)
    weight_before = target.layers[0].weight
    load_state_dict(target, safe_load(path))
    assert target.layers[0].weight is weight_before, "loading writes into the model's own tensors"
    for name, t in get_state_dict(target).items():
        np.testing.assert_array_equal(t.numpy(), expected[name], err_msg=name)


def test_load_state_dict_casts_dtypes() -> None:
    net = Linear(2, 3)
    values = np.arange(6, dtype=np.float16).reshape(3, 2)
    load_state_dict(net, {"weight": Tensor(values), "bias": Tensor(np.array([1, 2, 3], np.int32))})
    assert net.weight.dtype == dtypes.float32 and net.bias is not None and net.bias.dtype == dtypes.float32
    np.testing.assert_array_equal(net.weight.numpy(), values.astype(np.float32))
    assert net.bias.tolist() == [1.0, 2.0, 3.0]


def test_strict_load_names_missing_unexpected_and_mismatched_keys() -> None:
    class Model:
        def __init__(self) -> None:
            self.layer = Linear(4, 3)

    model = Model()
    before = model.layer.weight.numpy()
    bad = {"layer.weight": Tensor(np.zeros((4, 3), np.float32)), "layer.extra": Tensor([1.0])}
    with pytest.raises(ValueError) as info:
        load_state_dict(model, bad)
    message = str(info.value)
    assert "layer.weight: model has (3, 4), file has (4, 3)" in message
    assert "missing keys" in message and "layer.bias" in message
    assert "unexpected keys" in message and "layer.extra" in message
    np.testing.assert_array_equal(model.layer.weight.numpy(), before)  # nothing was written


def test_non_strict_load_skips_missing_and_unexpected_but_not_bad_shapes() -> None:
    model = Linear(2, 2)
    load_state_dict(model, {"weight": Tensor(np.full((2, 2), 7.0, np.float32)), "other": Tensor([1.0])}, strict=False)
    assert model.weight.numpy().tolist() == [[7.0, 7.0], [7.0, 7.0]]
    assert model.bias is not None and model.bias.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"bias: model has \(2,\), file has \(3,\)"):
        load_state_dict(model, {"bias": Tensor([1.0, 2.0, 3.0])}, strict=False)
    with pytest.raises(ValueError, match="expected a Tensor"):
        load_state_dict(model, {"bias": np.zeros(2)}, strict=False)  # type: ignore[dict-item]


def test_state_dict_skips_a_tinyjit_attribute() -> None:
    """gpt2.py/llama.py keep `self.forward_jit = TinyJit(self.forward)`: after a few calls the JIT holds captured
    outputs. They are not the model's state: the names stay the layers', and a fresh model loads the state dict."""
    class Model:
        def __init__(self) -> None:
            self.lin = nn.Linear(3, 2)
            self.forward_jit = TinyJit(self.forward)

        def forward(self, x: Tensor) -> Tensor:
            return self.lin(x).realize()

    model = Model()
    for _ in range(3):
        model.forward_jit(Tensor.rand(1, 3))
    state = get_state_dict(model)
    assert sorted(state) == ["lin.bias", "lin.weight"]
    assert len(get_parameters(model)) == 2
    load_state_dict(Model(), state)


# ---------------------------------------------------------------------------------------------- torch checkpoints
class _Canary:
    """Pickles as a call of os.remove on a file: loading must not run it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os
        return os.remove, (str(self.path),)


def _torch_checkpoint() -> tuple[Any, dict[str, np.ndarray]]:
    """A nested checkpoint of torch tensors (views, every storage dtype torch_load maps) and the values expected."""
    torch = pytest.importorskip("torch")
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7
    obj = {"model": {"t": base.t(), "slice": base[1:3, ::2], "p": torch.nn.Parameter(torch.full((2,), 0.5)),
                     "bf16": (base[0] * 3).bfloat16(), "half": base[1].half(), "f64": base[2].double(),
                     "i64": torch.arange(-3, 3), "i32": torch.arange(5, dtype=torch.int32)[::2],
                     "i16": torch.tensor([-7, 8], dtype=torch.int16), "i8": torch.tensor([-1], dtype=torch.int8),
                     "u8": torch.tensor([[250, 3]], dtype=torch.uint8), "bool": torch.tensor([True, False]),
                     "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)},
           "steps": [3, {"lr": 0.1}], "shared_a": base[0], "shared_b": base[3]}
    b = base.numpy()
    want = {"model.t": b.T, "model.slice": b[1:3, ::2], "model.p": np.full((2,), 0.5, np.float32),
            "model.bf16": (base[0] * 3).bfloat16().float().numpy(), "model.half": b[1].astype(np.float16),
            "model.f64": b[2].astype(np.float64), "model.i64": np.arange(-3, 3),
            "model.i32": np.arange(5, dtype=np.int32)[::2],
            "model.i16": np.array([-7, 8], np.int16), "model.i8": np.array([-1], np.int8),
            "model.u8": np.array([[250, 3]], np.uint8), "model.bool": np.array([True, False]),
            "model.scalar": np.float32(2.5), "model.empty": np.zeros((0, 3), np.float32), "shared_a": b[0],
            "shared_b": b[3]}
    return obj, want


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_torch_load_reads_torch_save(tmp_path: Path, legacy: bool) -> None:
    """tinygrad's nn.state.torch_load: both of torch.save's formats, views with their values, every dtype, nested
    containers as they were; a path, a str and a uint8 tensor of the file's bytes."""
    torch = pytest.importorskip("torch")
    obj, want = _torch_checkpoint()
    path = tmp_path / "ckpt.pth"
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    for source in (path, str(path), Tensor(np.fromfile(path, np.uint8))):
        got = torch_load(source)
        assert got["steps"] == [3, {"lr": 0.1}]
        flat = {**{f"model.{k}": v for k, v in got["model"].items()}, "shared_a": got["shared_a"],
                "shared_b": got["shared_b"]}
        assert flat.keys() == want.keys()
        for name, value in flat.items():
            expected = want[name]
            array = value.float().numpy() if value.dtype == dtypes.bfloat16 else value.numpy()
            assert value.shape == expected.shape, name
            assert array.dtype == (np.float32 if value.dtype == dtypes.bfloat16 else expected.dtype), name
            np.testing.assert_array_equal(array, expected, err_msg=name)
        assert got["model"]["bf16"].dtype == dtypes.bfloat16


def test_torch_load_into_a_model_matches_torch(tmp_path: Path) -> None:
    """A torch module's state_dict saved by torch loads into the same glassgrad layers, which then agree."""
    torch = pytest.importorskip("torch")
    t_model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3)).eval()
    with torch.no_grad():
        t_model[1].running_mean.uniform_(-1, 1)
    torch.save(t_model.state_dict(), tmp_path / "m.pth")
    model = [nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)]
    load_state_dict(model, torch_load(tmp_path / "m.pth"))
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)
    got = model[1](model[0](Tensor(x))).numpy()
    np.testing.assert_allclose(got, t_model(torch.tensor(x)).detach().numpy(), atol=1e-5, rtol=1e-5)


def test_torch_load_runs_no_code_of_the_file(tmp_path: Path) -> None:
    """A pickled call of anything but the checkpoint's own rebuild functions loads as an inert `Unknown`."""
    torch = pytest.importorskip("torch")
    canary = tmp_path / "canary"
    canary.write_text("still here")
    torch.save({"w": torch.ones(2), "evil": _Canary(canary)}, tmp_path / "evil.pth")
    got = torch_load(tmp_path / "evil.pth")
    assert canary.exists() and isinstance(got["evil"], Unknown) and got["evil"].args == (str(canary),)
    np.testing.assert_array_equal(got["w"].numpy(), np.ones(2, np.float32))


def test_torch_load_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\x00\x01 not a checkpoint")
    with pytest.raises(ValueError, match="not a PyTorch checkpoint"):
        torch_load(tmp_path / "junk")
    with pytest.raises(ValueError, match="1-d uint8"):
        torch_load(Tensor([1.0, 2.0]))


def test_zip_and_tar_extract_and_tensor_io(tmp_path: Path) -> None:
    """tinygrad's nn.state archive readers: every member as a 1-d uint8 tensor (stored and deflated zip members);
    TensorIO is a read-only seekable file over a uint8 tensor."""
    files = {"a.bin": bytes(range(200)), "dir/b.txt": b"hello " * 50}
    with zipfile.ZipFile(tmp_path / "x.zip", "w") as z:
        z.writestr("a.bin", files["a.bin"], compress_type=zipfile.ZIP_STORED)
        z.writestr("dir/b.txt", files["dir/b.txt"], compress_type=zipfile.ZIP_DEFLATED)
    with tarfile.open(tmp_path / "x.tar", "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for extract, archive in ((zip_extract, "x.zip"), (tar_extract, "x.tar")):
        for source in (tmp_path / archive, Tensor(np.fromfile(tmp_path / archive, np.uint8))):
            got = extract(source)
            assert {k: v.numpy().tobytes() for k, v in got.items()} == files
            assert all(v.dtype == dtypes.uint8 and v.ndim == 1 for v in got.values())
    f = TensorIO(Tensor(np.frombuffer(b"0123456789", np.uint8)))
    assert f.read(3) == b"012" and f.seek(-2, 2) == 8 and f.read() == b"89" and f.seek(4) == 4
    buf = bytearray(3)
    assert f.readinto(buf) == 3 and bytes(buf) == b"456"
    with pytest.raises(io.UnsupportedOperation):
        f.write(b"x")
    with pytest.raises(ValueError, match="1-d uint8"):
        TensorIO(Tensor(np.zeros((2, 2), np.uint8)))


def test_load_state_dict_takes_tinygrads_arguments_and_returns_the_loaded_tensors() -> None:
    """tinygrad's load_state_dict(model, state_dict, strict, verbose, consume, realize) returns the tensors it wrote,
    reshapes () against (1,), and with consume=True empties the state dict as it goes (examples pass verbose=False)."""
    layer = nn.BatchNorm(2)
    state = {k: Tensor(np.asarray(v.numpy()) + 1) for k, v in get_state_dict(layer).items()}
    state["num_batches_tracked"] = Tensor(np.array([5], np.int64))  # (1,) for the model's ()
    loaded = load_state_dict(layer, state, strict=True, verbose=False, consume=True)
    assert [id(t) for t in loaded] == [id(t) for t in get_state_dict(layer).values()]
    assert state == {} and layer.num_batches_tracked.shape == () and layer.num_batches_tracked.item() == 5
    np.testing.assert_array_equal(layer.running_var.numpy(), [2.0, 2.0])


# ---------------------------------------------------------------------------------------------- pickle
def test_pickle_round_trips_lazy_realized_and_view_tensors_and_models() -> None:
    """pickle.dumps of a tensor that has not run (its graph holds void nodes: DEVICE, SINK) failed to load with
    "unknown dtype 'void'"; realized tensors, views, models and gradients travel as values."""
    import pickle
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    w = Tensor(x, requires_grad=True)
    (w * w).sum().backward()
    model = nn.Linear(4, 2)
    objs = {"lazy": Tensor(x) * 2 + 1, "real": Tensor(x).realize(), "view": Tensor(x).realize()[1:, ::2].T,
            "half": Tensor(x).half(), "int": Tensor([1, 2, 3]), "empty": Tensor.zeros(0, 3), "0d": Tensor(3.0)}
    back = pickle.loads(pickle.dumps((objs, w, model)))
    for k, t in objs.items():
        assert back[0][k].dtype is t.dtype and back[0][k].shape == t.shape, k
        np.testing.assert_array_equal(back[0][k].numpy(), t.numpy(), err_msg=k)
    np.testing.assert_array_equal(back[1].numpy(), x)
    assert back[1].requires_grad
    np.testing.assert_array_equal(back[1].grad.numpy(), 2 * x)
    np.testing.assert_array_equal(back[2].weight.numpy(), model.weight.numpy())
    assert pickle.loads(pickle.dumps(dtypes.void)) is dtypes.void


def test_safe_load_from_a_tensor_of_the_files_bytes(tmp_path: Path) -> None:
    """tinygrad's safe_load and safe_load_metadata take a 1-d uint8 tensor of the file (`safe_load(Tensor(data))`,
    a download held in memory); they raised TypeError for anything but a path."""
    path = tmp_path / "m.safetensors"
    safe_save({"w": Tensor([[1.0, 2.0]]), "b": Tensor([3], dtype=dtypes.int8)}, str(path), metadata={"k": "v"})
    blob = Tensor(path.read_bytes())
    loaded = safe_load(blob)
    np.testing.assert_array_equal(loaded["w"].numpy(), [[1.0, 2.0]])
    assert loaded["b"].dtype == dtypes.int8 and loaded["b"].tolist() == [3]
    assert safe_load_metadata(blob) == safe_load_metadata(path)
    with pytest.raises(ValueError, match="8-byte header"):
        safe_load(Tensor(b"1234"))
    with pytest.raises(ValueError, match="1-d uint8"):
        safe_load(Tensor([1.0, 2.0]))
