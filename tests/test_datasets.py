"""glassgrad.nn.datasets: IDX parsing, where MNIST files are found, the checked download (with a fake network),
and the real MNIST test set when ../shared/data/mnist has it."""
from __future__ import annotations

import gzip
import hashlib
import io
import struct
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from glassgrad import dtypes
from glassgrad.nn import datasets
from glassgrad.nn.datasets import RemoteFile, mnist, mnist_test, parse_idx, read_maybe_gzip, write_idx

SHARED_MNIST = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
HAS_SHARED_MNIST = (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file() and \
    (SHARED_MNIST / "t10k-labels-idx1-ubyte.gz").is_file()


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own empty cache, no $MNIST_DIR, and a network that fails loudly if used."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("CACHEDIR", str(cache))
    monkeypatch.delenv("MNIST_DIR", raising=False)
    monkeypatch.delenv("CIFAR_DIR", raising=False)

    def no_network(url: str) -> io.BytesIO:
        raise AssertionError(f"test tried to reach the network: {url}")
    monkeypatch.setattr(datasets, "_urlopen", no_network)
    yield cache / "mnist"


# ---------------------------------------------------------------------------------------------- fake MNIST files


def fake_split(n: int, seed: int, label_offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = ((np.arange(n) + label_offset) % 10).astype(np.uint8)
    return images, labels


def write_split(directory: Path, prefix: str, images: np.ndarray, labels: np.ndarray, gz: bool = True) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
        data = write_idx(array)
        name = f"{prefix}-{kind}-ubyte"
        if gz:
            (directory / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (directory / name).write_bytes(data)


# ---------------------------------------------------------------------------------------------- IDX parsing


def test_parse_hand_written_idx() -> None:
    """Bytes built by hand from the format description, independent of write_idx."""
    images = struct.pack(">BBBB", 0, 0, 0x08, 3) + struct.pack(">III", 2, 2, 3) + bytes(range(12))
    parsed = parse_idx(images)
    assert parsed.dtype == np.uint8 and parsed.shape == (2, 2, 3)
    assert parsed.ravel().tolist() == list(range(12))
    ints = struct.pack(">BBBB", 0, 0, 0x0C, 1) + struct.pack(">I", 2) + struct.pack(">ii", -5, 70000)
    assert parse_idx(ints).tolist() == [-5, 70000]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip(dtype: type) -> None:
    array = (np.arange(24) - 7).reshape(2, 3, 4).astype(dtype)
    parsed = parse_idx(write_idx(array))
    assert parsed.dtype == np.dtype(dtype) and parsed.dtype.isnative
    np.testing.assert_array_equal(parsed, array)


def test_write_idx_rejects_types_idx_cannot_hold() -> None:
    with pytest.raises(TypeError, match="IDX files cannot hold"):
        write_idx(np.zeros(3, np.uint32))


GOOD_IDX = write_idx(np.arange(6, dtype=np.uint8).reshape(2, 3))


@pytest.mark.parametrize("data, fragment", [
    (b"", "not an IDX file"),
    (b"\x01\x00\x08\x01" + GOOD_IDX[4:], "bad magic"),
    (b"\x00\x00\x07\x02" + GOOD_IDX[4:], "unknown IDX element type 0x07"),
    (GOOD_IDX[:9], "truncated: 9 bytes, but the header of 2 dimensions needs 12"),
    (GOOD_IDX[:-1], "truncated"),
    (GOOD_IDX + b"\x00", "trailing bytes"),
    (b"\x00\x00\x08\x02" + struct.pack(">II", 2**32 - 1, 2**32 - 1) + b"\x00" * 6, "truncated"),
])
def test_corrupt_idx_raises_value_error(data: bytes, fragment: str) -> None:
    with pytest.raises(ValueError, match="name.idx") as info:
        parse_idx(data, "name.idx")
    assert fragment in str(info.value)


def test_read_maybe_gzip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plain").write_bytes(GOOD_IDX)
    (tmp_path / "packed").write_bytes(gzip.compress(GOOD_IDX))
    assert read_maybe_gzip(tmp_path / "plain") == GOOD_IDX
    assert read_maybe_gzip(tmp_path / "packed") == GOOD_IDX
    (tmp_path / "cut").write_bytes(gzip.compress(GOOD_IDX * 100)[:-20])
    with pytest.raises(ValueError, match="corrupt gzip"):
        read_maybe_gzip(tmp_path / "cut")
    (tmp_path / "garbled").write_bytes(b"\x1f\x8b" + b"\xff" * 40)
    with pytest.raises(ValueError, match="corrupt gzip"):
        read_maybe_gzip(tmp_path / "garbled")
    monkeypatch.setattr(datasets, "MAX_IDX_BYTES", 1000)
    (tmp_path / "bomb").write_bytes(gzip.compress(b"\0" * 100_000))
    with pytest.raises(ValueError, match="more than 1000 bytes"):
        read_maybe_gzip(tmp_path / "bomb")


# --------------------------------------------------------------------------------------------- loading from directories


def test_mnist_from_a_directory(tmp_path: Path) -> None:
    train, test = fake_split(12, seed=1), fake_split(5, seed=2)
    write_split(tmp_path / "d", "train", *train)
    write_split(tmp_path / "d", "t10k", *test, gz=False)  # unzipped files work too
    X_train, Y_train, X_test, Y_test = mnist(directory=tmp_path / "d", download=False)
    assert X_train.shape == (12, 1, 28, 28) and X_train.dtype == dtypes.uint8
    assert Y_train.shape == (12,) and Y_train.dtype == dtypes.uint8
    assert X_test.shape == (5, 1, 28, 28) and Y_test.shape == (5,)
    np.testing.assert_array_equal(X_train.numpy()[:, 0], train[0])
    np.testing.assert_array_equal(Y_train.numpy(), train[1])
    np.testing.assert_array_equal(X_test.numpy()[:, 0], test[0])
    np.testing.assert_array_equal(Y_test.numpy(), test[1])


def test_mnist_test_needs_only_the_test_files(tmp_path: Path) -> None:
    write_split(tmp_path, "t10k", *fake_split(3, seed=3))
    X, Y = mnist_test(tmp_path, download=False)
    assert X.shape == (3, 1, 28, 28) and Y.tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="train-images-idx3-ubyte.gz not found"):
        mnist(directory=tmp_path, download=False)


def test_search_order_directory_then_env_then_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    isolated_cache: Path) -> None:
    # the same file names in three places, told apart by their labels
    write_split(tmp_path / "arg", "t10k", *fake_split(2, seed=0, label_offset=1))
    write_split(tmp_path / "env", "t10k", *fake_split(2, seed=0, label_offset=5))
    write_split(isolated_cache, "t10k", *fake_split(2, seed=0, label_offset=8))
    monkeypatch.setenv("MNIST_DIR", str(tmp_path / "env"))
    assert mnist_test(tmp_path / "arg")[1].tolist() == [1, 2]
    assert mnist_test(tmp_path / "missing")[1].tolist() == [5, 6]
    assert mnist_test()[1].tolist() == [5, 6]
    monkeypatch.delenv("MNIST_DIR")
    assert mnist_test()[1].tolist() == [8, 9]


def test_inconsistent_files_raise_value_error(tmp_path: Path) -> None:
    images, labels = fake_split(4, seed=4)
    write_split(tmp_path / "count", "t10k", images, labels[:3])
    with pytest.raises(ValueError, match="has 4 images but .* has 3 labels"):
        mnist_test(tmp_path / "count", download=False)
    write_split(tmp_path / "label", "t10k", images, np.array([1, 2, 10, 3], np.uint8))
    with pytest.raises(ValueError, match="labels must be digits 0..9, found 10"):
        mnist_test(tmp_path / "label", download=False)
    write_split(tmp_path / "size", "t10k", np.zeros((4, 27, 28), np.uint8), labels)
    with pytest.raises(ValueError, match=r"shape \(N, 28, 28\), got uint8 \(4, 27, 28\)"):
        mnist_test(tmp_path / "size", download=False)
    write_split(tmp_path / "float", "t10k", images.astype(np.float32), labels)
    with pytest.raises(ValueError, match="expected uint8 images"):
        mnist_test(tmp_path / "float", download=False)
    write_split(tmp_path / "trunc", "t10k", images, labels)
    path = tmp_path / "trunc" / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(write_idx(images)[:-100]))
    with pytest.raises(ValueError, match="truncated"):
        mnist_test(tmp_path / "trunc", download=False)


def test_nothing_found_lists_every_place_tried(tmp_path: Path, isolated_cache: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNIST_DIR", str(tmp_path / "env"))
    with pytest.raises(RuntimeError) as info:
        mnist_test(tmp_path / "arg", download=False)
    message = str(info.value)
    for place in (tmp_path / "arg", tmp_path / "env", isolated_cache):
        assert str(place / "t10k-images-idx3-ubyte.gz") in message
    assert "download=False" in message


# ---------------------------------------------------------------------------------------------- downloading


class FakeServer:
    """Serves `files` (url -> bytes) in place of urllib; counts requests; unknown urls fail like a dead host."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.requests: list[str] = []

    def __call__(self, url: str) -> io.BytesIO:
        self.requests.append(url)
        if url not in self.files:
            raise urllib.error.URLError(f"fake network: no route to {url}")
        return io.BytesIO(self.files[url])


def remote(name: str, data: bytes) -> RemoteFile:
    return RemoteFile(name, len(data), hashlib.sha256(data).hexdigest())


@pytest.fixture
def fake_test_files(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, bytes], np.ndarray, np.ndarray]:
    """Small fake t10k files, with the module's expected size/sha256 pointed at them; returns name -> gz bytes."""
    images, labels = fake_split(6, seed=7)
    blobs = {"t10k-images-idx3-ubyte.gz": gzip.compress(write_idx(images)),
             "t10k-labels-idx1-ubyte.gz": gzip.compress(write_idx(labels))}
    for attribute, name in (("TEST_IMAGES", "t10k-images-idx3-ubyte.gz"), ("TEST_LABELS", "t10k-labels-idx1-ubyte.gz")):
        monkeypatch.setattr(datasets, attribute, remote(name, blobs[name]))
    return blobs, images, labels


@pytest.mark.parametrize("with_tqdm", [True, False])
def test_download_into_the_cache(monkeypatch: pytest.MonkeyPatch, isolated_cache: Path, with_tqdm: bool,
                                 fake_test_files: tuple[dict[str, bytes], np.ndarray, np.ndarray]) -> None:
    if with_tqdm:
        pytest.importorskip("tqdm")
    else:
        monkeypatch.setitem(sys.modules, "tqdm", None)  # makes `import tqdm` raise ImportError
    blobs, images, labels = fake_test_files
    server = FakeServer({datasets.MIRRORS[0] + name: data for name, data in blobs.items()})
    monkeypatch.setattr(datasets, "_urlopen", server)
    X, Y = mnist_test()
    np.testing.assert_array_equal(X.numpy()[:, 0], images)
    np.testing.assert_array_equal(Y.numpy(), labels)
    assert sorted(p.name for p in isolated_cache.iterdir()) == sorted(blobs), "no partial files left behind"
    assert len(server.requests) == 2
    mnist_test()  # now served from the cache
    assert len(server.requests) == 2


def test_checksum_mismatch_falls_back_to_the_next_mirror(monkeypatch: pytest.MonkeyPatch, isolated_cache: Path,
                                                         fake_test_files: tuple[dict[str, bytes], np.ndarray,
                                                                                np.ndarray]) -> None:
    blobs, images, _ = fake_test_files
    first, second = datasets.MIRRORS[0], datasets.MIRRORS[1]
    tampered = {name: bytes([data[0] ^ 1]) + data[1:] for name, data in blobs.items()}  # same size, other hash
    files = {first + name: data for name, data in tampered.items()}
    files.update({second + name: data for name, data in blobs.items()})
    monkeypatch.setattr(datasets, "_urlopen", FakeServer(files))
    X, _ = mnist_test()
    np.testing.assert_array_equal(X.numpy()[:, 0], images)
    for name, data in blobs.items():
        assert (isolated_cache / name).read_bytes() == data


def test_all_mirrors_bad_raises_one_runtime_error(monkeypatch: pytest.MonkeyPatch, isolated_cache: Path,
                                                  fake_test_files: tuple[dict[str, bytes], np.ndarray,
                                                                         np.ndarray]) -> None:
    blobs, _, _ = fake_test_files
    name = "t10k-images-idx3-ubyte.gz"
    first, second = datasets.MIRRORS[0], datasets.MIRRORS[1]
    files = {first + name: b"\0" * len(blobs[name]), second + name: blobs[name] + b"extra"}
    monkeypatch.setattr(datasets, "_urlopen", FakeServer(files))
    with pytest.raises(RuntimeError) as info:
        mnist_test()
    message = str(info.value)
    assert f"{first + name} (SHA-256 mismatch" in message
    assert f"{second + name} (" in message and "more than the expected" in message
    assert str(isolated_cache / name) in message  # the local places are listed too
    assert not isolated_cache.exists() or list(isolated_cache.iterdir()) == [], "nothing bad may reach the cache"


def test_short_download_and_dead_network(monkeypatch: pytest.MonkeyPatch, isolated_cache: Path,
                                         fake_test_files: tuple[dict[str, bytes], np.ndarray, np.ndarray]) -> None:
    blobs, _, _ = fake_test_files
    name = "t10k-images-idx3-ubyte.gz"
    monkeypatch.setattr(datasets, "_urlopen", FakeServer({datasets.MIRRORS[0] + name: blobs[name][:-3]}))
    with pytest.raises(RuntimeError) as info:
        mnist_test()
    assert f"sent {len(blobs[name]) - 3} bytes, expected {len(blobs[name])}" in str(info.value)
    assert "no route to" in str(info.value)  # the second mirror is down
    assert not isolated_cache.exists() or list(isolated_cache.iterdir()) == []


@pytest.mark.skipif(not HAS_SHARED_MNIST, reason=f"no MNIST test files in {SHARED_MNIST}")
def test_real_file_constants_match_the_shared_copy() -> None:
    for file in (datasets.TEST_IMAGES, datasets.TEST_LABELS):
        data = (SHARED_MNIST / file.name).read_bytes()
        assert len(data) == file.size and hashlib.sha256(data).hexdigest() == file.sha256


# ---------------------------------------------------------------------------------------------- the real test set


@pytest.mark.skipif(not HAS_SHARED_MNIST, reason=f"no MNIST test files in {SHARED_MNIST}")
def test_real_mnist_test_set() -> None:
    X, Y = mnist_test(SHARED_MNIST, download=False)
    assert X.shape == (10000, 1, 28, 28) and X.dtype == dtypes.uint8
    assert Y.shape == (10000,) and Y.dtype == dtypes.uint8
    labels = Y.numpy()
    assert labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # the well-known first test digits
    counts = np.bincount(labels, minlength=10)
    assert len(counts) == 10 and counts.sum() == 10000 and counts.min() > 800
    images = X.numpy()
    assert images.max() == 255 and images.min() == 0
    assert 0.1 < (images > 0).mean() < 0.25  # digits cover roughly a fifth of each image


def test_mnist_takes_tinygrads_arguments(tmp_path: Path) -> None:
    """`mnist(device=None, fashion=False)` as in tinygrad; a folder goes in `directory=`, and clear errors otherwise."""
    with pytest.raises(TypeError, match="directory="):
        mnist(str(tmp_path / "x"))
    with pytest.raises(NotImplementedError, match="Fashion-MNIST"):
        mnist(fashion=True)


# ---------------------------------------------------------------------------------------------- CIFAR-10
def fake_cifar(n: int, seed: int) -> bytes:
    """`n` records of CIFAR-10's binary format: a label byte, then 3 x 32 x 32 image bytes."""
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, size=(n, 3073), dtype=np.uint8)
    records[:, 0] = np.arange(n) % 10
    return records.tobytes()


def fake_cifar_files() -> dict[str, bytes]:
    return {**{f"data_batch_{i}.bin": fake_cifar(3, i) for i in range(1, 6)}, "test_batch.bin": fake_cifar(4, 9)}


def write_cifar_archive(path: Path, files: dict[str, bytes]) -> bytes:
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def check_cifar(got: tuple, files: dict[str, bytes]) -> None:  # type: ignore[type-arg]
    x_train, y_train, x_test, y_test = (t.numpy() for t in got)
    train = np.frombuffer(b"".join(files[f"data_batch_{i}.bin"] for i in range(1, 6)), np.uint8).reshape(-1, 3073)
    test = np.frombuffer(files["test_batch.bin"], np.uint8).reshape(-1, 3073)
    assert x_train.shape == (15, 3, 32, 32) and x_test.shape == (4, 3, 32, 32) and x_train.dtype == np.uint8
    np.testing.assert_array_equal(x_train.reshape(15, -1), train[:, 1:])
    np.testing.assert_array_equal(y_train, train[:, 0])
    np.testing.assert_array_equal(x_test[2, 1], test[2, 1 + 1024:1 + 2048].reshape(32, 32))  # the green plane
    np.testing.assert_array_equal(y_test, test[:, 0])


def test_cifar_from_an_archive_or_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tinygrad's `nn.datasets.cifar()` (beautiful_cifar.py, hlb_cifar10.py): the binary version's batches, read
    from the archive without unpacking it, or from the unpacked folder, here or in $CIFAR_DIR."""
    files = fake_cifar_files()
    write_cifar_archive(tmp_path / "a" / "cifar-10-binary.tar.gz", files)
    check_cifar(datasets.cifar(directory=tmp_path / "a"), files)
    folder = tmp_path / "b" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    monkeypatch.setenv("CIFAR_DIR", str(tmp_path / "b"))
    check_cifar(datasets.cifar(), files)


def test_cifar_download_and_bad_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path) -> None:
    files = fake_cifar_files()
    archive = write_cifar_archive(tmp_path / "served.tar.gz", files)
    monkeypatch.setattr(datasets, "CIFAR_ARCHIVE", RemoteFile("cifar-10-binary.tar.gz", len(archive),
                                                              hashlib.sha256(archive).hexdigest()))
    with pytest.raises(RuntimeError, match="CIFAR-10 not found"):
        datasets.cifar(download=False)
    monkeypatch.setattr(datasets, "_urlopen", lambda url: io.BytesIO(archive))
    check_cifar(datasets.cifar(), files)
    assert (isolated_cache.parent / "cifar" / "cifar-10-binary.tar.gz").read_bytes() == archive
    bad = dict(files, **{"test_batch.bin": files["test_batch.bin"][:-5]})
    write_cifar_archive(tmp_path / "bad" / "cifar-10-binary.tar.gz", bad)
    with pytest.raises(ValueError, match="whole number"):
        datasets.cifar(directory=tmp_path / "bad")
    (tmp_path / "cut" / "cifar-10-binary.tar.gz").parent.mkdir()
    (tmp_path / "cut" / "cifar-10-binary.tar.gz").write_bytes(archive[:len(archive) // 2])
    with pytest.raises(ValueError, match="not a complete CIFAR-10"):
        datasets.cifar(directory=tmp_path / "cut")
