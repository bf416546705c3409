"""SSDTrain's stores: byte-exact round trips (dtypes, odd and empty shapes, non-contiguous inputs),
files gone after free, close, garbage collection and exit, damaged files and full disks reported
in one line, tmpfs refused, the page cache bypassed, emulated bandwidth and the counters."""

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch

from harness.errors import UserError
from harness.resources import block_device_counters
from systems.ssdtrain import DirectFileStore, EmulatedStore, HostStore, KvikioStore, fileio
from systems.ssdtrain.stores import STORES as REGISTRY
from systems.ssdtrain.stores import _base, _files, emulated

REPO_ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
BLOCK = 64 << 10  # small blocks in tests, so modest tensors take several
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]
SHAPES = [(), (0,), (3, 0), (1,), (7, 13), (1001,), (BLOCK // 4 + 3, 5)]  # the last spans several blocks


@contextlib.contextmanager
def real_disk_folder(tmp_path: Path):
    """A folder on a disk, as O_DIRECT needs: ``tmp_path`` unless that is in memory (tmpfs), else a
    new folder under the repository's .scratch/ (ignored by git), removed afterwards."""
    if fileio.filesystem_type(tmp_path) not in fileio.MEMORY_FILESYSTEMS:
        yield tmp_path
        return
    (REPO_ROOT / ".scratch").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="test-ssdtrain-", dir=REPO_ROOT / ".scratch"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def disk(tmp_path):
    with real_disk_folder(tmp_path) as folder:
        yield folder


def make_store(kind: str, folder: Path, device="cpu"):
    if kind == "host":
        return HostStore()
    if kind == "direct_file":
        return DirectFileStore(folder, threads=3, block_bytes=BLOCK)
    if kind == "emulated":
        return EmulatedStore(50.0)  # fast enough not to slow the tests
    raise ValueError(kind)


STORES = ["host", "direct_file", "emulated"]


def random_tensor(shape, dtype, seed=0, device="cpu") -> torch.Tensor:
    """Random values, never all zeros (a store that wrote nothing must not pass)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        t = torch.randint(0, 2, shape, generator=g).bool()
    elif dtype.is_floating_point:
        t = torch.randn(shape, generator=g).to(dtype)
    else:
        t = torch.randint(1, 2**40, shape, generator=g, dtype=dtype)
    if t.numel():
        t.view(-1)[0] = True if dtype == torch.bool else 1
        assert t.ne(0).any()
    return t.to(device)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()


def round_trip(store, key, tensor, device=None) -> torch.Tensor:
    store.put(key, tensor).result()
    out = torch.empty(tensor.shape, dtype=tensor.dtype, device=device or tensor.device)
    store.get(key, out).result()
    return out


def files_in(store) -> list[Path]:
    return sorted(store.directory.iterdir())


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_byte_exact(kind, dtype, disk):
    with make_store(kind, disk) as store:
        for key, shape in enumerate(SHAPES):
            tensor = random_tensor(shape, dtype, seed=key)
            out = round_trip(store, key, tensor)
            assert torch.equal(as_bytes(out), as_bytes(tensor)), (shape, dtype)
        assert len(store) == len(SHAPES)


NON_CONTIGUOUS = {
    "transposed": lambda t: t.t(),
    "strided": lambda t: t[::2, 1::3],
    "offset_view": lambda t: t[3:, 5:],
    "expanded": lambda t: t[:1].expand(40, -1),
}


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("view", NON_CONTIGUOUS)
def test_non_contiguous_inputs_are_stored_as_their_values(kind, view, disk):
    base = random_tensor((37, 1031), torch.bfloat16)
    tensor = NON_CONTIGUOUS[view](base)
    assert not tensor.is_contiguous()
    with make_store(kind, disk) as store:
        out = round_trip(store, 0, tensor)
        assert torch.equal(as_bytes(out), as_bytes(tensor))
        assert torch.equal(base, random_tensor((37, 1031), torch.bfloat16))  # the source is untouched


@pytest.mark.parametrize("kind", STORES)
def test_bad_requests_are_refused_clearly(kind, disk):
    tensor = random_tensor((8, 8), torch.float32)
    with make_store(kind, disk) as store:
        store.put(0, tensor).result()
        with pytest.raises(KeyError, match="already stored"):
            store.put(0, tensor)
        with pytest.raises(KeyError, match="not stored"):
            store.get(1, torch.empty(8, 8))
        with pytest.raises(ValueError, match="holds"):
            store.get(0, torch.empty(8, 8, dtype=torch.float16))
        with pytest.raises(ValueError, match="contiguous"):
            store.get(0, torch.empty(8, 8).t())
        with pytest.raises(TypeError, match="keys are ints"):
            store.put("a", tensor)
    with pytest.raises(UserError, match=r": the store is closed \(a with block or close\(\) ended it\)"):
        store.put(2, tensor)
    store.close()  # idempotent
    store.free(0)  # after close: nothing left to free, no error


def test_files_are_removed_on_free_and_close(disk):
    store = DirectFileStore(disk, block_bytes=BLOCK)
    assert store.directory.parent == disk
    for key in range(3):
        store.put(key, random_tensor((300, 7), torch.float32, seed=key)).result()
    assert [p.name for p in files_in(store)] == ["0.bin", "1.bin", "2.bin"]
    assert all(p.stat().st_size % fileio.ALIGN == 0 for p in files_in(store))
    store.free(1)
    assert [p.name for p in files_in(store)] == ["0.bin", "2.bin"]
    store.close()
    assert not store.directory.exists()
    assert list(disk.iterdir()) == []


def test_free_during_a_write_removes_the_file_once_written(disk):
    store = EmulatedStore(0.2, inner=DirectFileStore(disk, block_bytes=BLOCK))  # 4 MiB: about 20 ms
    future = store.put(0, random_tensor((MIB,), torch.float32))
    store.free(0)
    future.result()
    assert len(store) == 0 and len(store.inner) == 0
    assert files_in(store.inner) == []
    store.close()


def test_garbage_collection_and_exit_remove_the_files(disk):
    store = DirectFileStore(disk)
    store.put(0, random_tensor((1000,), torch.float32)).result()
    directory = store.directory
    del store
    assert not directory.exists()
    # A process that never closes its store: the folder goes at exit.
    code = (
        "import sys, torch; from systems.ssdtrain import DirectFileStore\n"
        f"s = DirectFileStore({str(disk)!r}); s.put(0, torch.ones(5000)).result(); print(s.directory)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert Path(child.stdout.strip()).parent == disk
    assert not Path(child.stdout.strip()).exists()


def test_a_killed_process_s_files_are_removed_by_the_next_store_and_an_open_store_s_never(disk):
    code = (
        "import os, torch; from systems.ssdtrain import DirectFileStore\n"
        f"s = DirectFileStore({str(disk)!r}); s.put(0, torch.ones(5000)).result(); print(s.directory, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert child.returncode == -9
    abandoned = Path(child.stdout.strip())
    assert (abandoned / "0.bin").exists() and fileio.owner_file(abandoned).exists()  # killed: nothing removed it
    stranger = disk / "ssdtrain-not-a-store"  # no owner file: not this code's, left alone
    stranger.mkdir()
    elsewhere = disk / "ssdtrain-1-other"  # another host's (a shared disk): its lock says nothing here
    elsewhere.mkdir()
    fileio.owner_file(elsewhere).write_text("another-host")
    with pytest.warns(UserWarning, match=rf"removed 1 scratch folder.*\(0.02 MiB\): {abandoned.name}") as caught:
        open_one = DirectFileStore(disk)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert not abandoned.exists() and stranger.exists() and elsewhere.exists()
    with open_one, warnings.catch_warnings():
        warnings.simplefilter("error")
        with DirectFileStore(disk) as store:  # the open store's folder is not abandoned
            assert open_one.directory.exists() and store.directory.exists()
    assert sorted(p.name for p in disk.iterdir()) == sorted([stranger.name, elsewhere.name, f"{elsewhere.name}.owner"])


def test_a_file_system_without_locks_still_takes_a_store(disk, monkeypatch):
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with DirectFileStore(disk) as store:
        tensor = random_tensor((1000,), torch.float32)
        store.put(0, tensor).result()
        out = torch.empty_like(tensor)
        store.get(0, out).result()
        assert torch.equal(out, tensor) and not fileio.owner_file(store.directory).exists()
    assert list(disk.iterdir()) == []


def test_a_file_that_cannot_be_removed_is_said_once_and_raises_nothing(disk, monkeypatch):
    with DirectFileStore(disk) as store:
        for key in range(3):
            store.put(key, random_tensor((1000,), torch.float32)).result()

        def read_only(self, missing_ok=False):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

        monkeypatch.setattr(Path, "unlink", read_only)
        with pytest.warns(UserWarning, match=r"removing .*0\.bin failed \(Read-only file system\)") as caught:
            for key in range(3):
                store.free(key)
        assert len(caught) == 1
        monkeypatch.undo()


@pytest.mark.parametrize("damage", ["truncated", "missing", "grown"])
def test_a_damaged_file_raises_naming_it(damage, disk):
    with DirectFileStore(disk, block_bytes=BLOCK) as store:
        tensor = random_tensor((3 * BLOCK,), torch.float32)
        store.put(7, tensor).result()
        path = store.path_of(7)
        if damage == "truncated":
            os.truncate(path, path.stat().st_size - fileio.ALIGN)
        elif damage == "grown":
            os.truncate(path, path.stat().st_size + fileio.ALIGN)
        else:
            path.unlink()
        with pytest.raises(UserError, match=str(path)):
            store.get(7, torch.empty_like(tensor)).result()


def test_a_full_disk_is_one_line_and_leaves_no_file(disk, monkeypatch):
    with DirectFileStore(disk, block_bytes=BLOCK) as store:

        def no_space(*args):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwrite", no_space)
        future = store.put(0, random_tensor((3 * BLOCK,), torch.float32))
        with pytest.raises(UserError, match="no space left on the device") as err:
            future.result()
        assert "\n" not in str(err.value) and str(store.path_of(0)) in str(err.value)
        assert files_in(store) == []
        assert store.counters.bytes_written == 0 and store.counters.tensors_stored == 0
        with pytest.raises(RuntimeError, match="its put failed"):
            store.get(0, torch.empty(3 * BLOCK))
        store.free(0)


def test_a_folder_without_permission_is_one_line(disk, monkeypatch):
    with DirectFileStore(disk) as store:
        real_open = os.open

        def denied(path, flags, *args, **kwargs):
            if Path(path).parent == store.directory:
                raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", denied)
        with pytest.raises(UserError, match="permission denied"):
            store.put(0, torch.ones(100)).result()


@pytest.mark.parametrize("folder", ["/proc", "/sys"])
def test_the_kernels_virtual_file_systems_are_refused_with_the_reason(folder):
    """/proc failed deep in tempfile with FileNotFoundError."""
    if not Path(folder).is_dir() or fileio.filesystem_type(Path(folder)) not in fileio.VIRTUAL_FILESYSTEMS:
        pytest.skip(f"{folder} is no virtual file system here")
    with pytest.raises(UserError, match=rf"^{folder} is on \w+, the kernel's virtual file system, not a disk"):
        DirectFileStore(folder)


def test_tmpfs_is_refused_with_the_reason():
    shm = Path("/dev/shm")
    if not shm.is_dir() or fileio.filesystem_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm on this machine")
    with pytest.raises(UserError, match="tmpfs, which is memory, not a disk"):
        DirectFileStore(shm)
    assert not any(p.name.startswith(f"ssdtrain-{os.getpid()}-") for p in shm.iterdir())


def test_a_file_system_refusing_o_direct_is_one_line(disk, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_direct)
    with pytest.raises(UserError, match="refuses O_DIRECT"):
        DirectFileStore(disk)
    assert list(disk.iterdir()) == []  # the scratch folder made for the probe is gone too


def test_bad_arguments_are_one_line(disk):
    with pytest.raises(UserError, match="multiple of 4096"):
        DirectFileStore(disk, block_bytes=1000)
    with pytest.raises(UserError, match="threads"):
        DirectFileStore(disk, threads=0)
    with pytest.raises(UserError, match="positive, finite number"):
        EmulatedStore(0)


def test_reads_come_from_the_disk_not_the_page_cache(disk):
    if block_device_counters(disk) is None:
        pytest.skip(f"{disk} is not on a block device, so there are no device byte counters to read")
    with DirectFileStore(disk, threads=2) as store:
        tensor = random_tensor((8 * MIB,), torch.float32)  # 32 MiB
        round_trip(store, 0, tensor)
        round_trip(store, 1, tensor[1:])  # another file, of an odd size
        read, written = store.device_bytes_ratio()
    assert read >= 0.95, f"the device saw only {read:.0%} of the bytes read: the page cache served them"
    assert written >= 0.95


def test_the_page_cache_check_needs_a_block_device(disk, monkeypatch):
    monkeypatch.setattr(_files, "block_device_counters", lambda path: None)
    with DirectFileStore(disk) as store, pytest.raises(UserError, match="not on a block device"):
        store.device_bytes_ratio()


class VirtualClock:
    """``time.monotonic`` and ``time.sleep`` on a clock that only sleeping moves: the emulated
    device's pacing, checked exactly, however busy the machine is."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += max(seconds, 0.0)


def test_emulated_bandwidth_is_the_target(monkeypatch):
    clock = VirtualClock()
    monkeypatch.setattr(emulated, "time", clock)
    monkeypatch.setattr(_base, "time", clock)  # the busy-time counters
    target = 0.2  # GB/s
    tensor = random_tensor((4 * MIB,), torch.float32)
    seconds = tensor.nbytes / (target * 1e9)
    with EmulatedStore(target) as store:
        assert store.emulated and "emulated" in store.name
        start = clock.monotonic()
        store.put(0, tensor).result()
        assert clock.monotonic() - start == pytest.approx(seconds)
        out = torch.zeros_like(tensor)
        start = clock.monotonic()
        store.get(0, out).result()
        assert clock.monotonic() - start == pytest.approx(seconds)
        counters = store.counters
    assert counters.write_seconds == pytest.approx(seconds) and counters.read_seconds == pytest.approx(seconds)
    assert torch.equal(out, tensor)


def test_emulated_transfers_take_at_least_their_time_on_the_real_clock():
    target = 1.0  # GB/s: what the device allows is a floor; a busy machine only adds to it
    tensor = random_tensor((4 * MIB,), torch.float32)
    with EmulatedStore(target) as store:
        start = time.monotonic()
        store.put(0, tensor).result()
        assert time.monotonic() - start >= tensor.nbytes / (target * 1e9)


def test_emulated_transfers_share_one_device():
    target = 1.0
    with EmulatedStore(target) as store:
        start = time.monotonic()
        futures = [store.put(key, random_tensor((4 * MIB,), torch.float32, seed=key)) for key in range(2)]
        for f in futures:
            f.result()
        elapsed = time.monotonic() - start
    assert elapsed >= 2 * 16 * MIB / (target * 1e9)


@pytest.mark.parametrize("kind", STORES)
def test_counters_count_what_moved(kind, disk):
    sizes = [(1000,), (333, 3), (0,)]
    with make_store(kind, disk) as store:
        assert not store.emulated or kind == "emulated"
        before = store.counters
        tensors = [random_tensor(s, torch.float32, seed=i) for i, s in enumerate(sizes)]
        for key, t in enumerate(tensors):
            store.put(key, t).result()
        for key in (0, 1):
            store.get(key, torch.empty_like(tensors[key])).result()
        moved = store.counters - before
    assert moved.bytes_written == sum(t.nbytes for t in tensors)
    assert moved.bytes_read == tensors[0].nbytes + tensors[1].nbytes
    assert moved.tensors_stored == 3
    assert moved.write_seconds > 0 and moved.read_seconds > 0
    assert moved.bytes_made_contiguous == 0  # every tensor was contiguous


@pytest.mark.parametrize("kind", STORES)
def test_a_strided_tensor_is_stored_whole_and_its_contiguous_copy_counted(kind, disk):
    """A transposed, a sliced and an expanded view are stored as their values; the bytes copied to
    make each contiguous before its write (memory held twice until the write lands) are counted."""
    base = random_tensor((37, 64), torch.float32, seed=5)
    views = [base.t(), base[3:30:2], base[0].expand(9, 64), base[5:20]]  # the last is contiguous
    with make_store(kind, disk) as store:
        before = store.counters
        for key, view in enumerate(views):
            store.put(key, view).result()
        outs = [torch.full(v.shape, float("nan")) for v in views]
        for key, out in enumerate(outs):
            store.get(key, out).result()
        moved = store.counters - before
    assert all(torch.equal(out, view) for out, view in zip(outs, views, strict=True))
    assert moved.bytes_made_contiguous == sum(v.numel() * v.element_size() for v in views[:3])


def test_many_transfers_in_flight_at_once(disk):
    tensors = [random_tensor((BLOCK + 17 * i,), torch.float32, seed=i) for i in range(24)]
    with DirectFileStore(disk, threads=4, block_bytes=BLOCK) as store:
        for f in [store.put(i, t) for i, t in enumerate(tensors)]:
            f.result()
        outs = [torch.empty_like(t) for t in tensors]
        for f in [store.get(i, out) for i, out in enumerate(outs)]:
            f.result()
    assert all(torch.equal(o, t) for o, t in zip(outs, tensors))


def test_kvikio_store_says_why_it_cannot_run(disk):
    try:
        import kvikio  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="needs the kvikio package"):
            KvikioStore(disk)
        return
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="GPU"):
            KvikioStore(disk)


# -- GPU -----------------------------------------------------------------------------------------


def produced_late(shape, dtype) -> torch.Tensor:
    """A CUDA tensor whose values come from kernels queued just before: a copy that does not wait
    for the producer's stream reads stale memory."""
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(8):
        a = (a @ a).tanh()
    return random_tensor(shape, dtype, device="cuda") + (a[0, 0] * 0).to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_round_trip_is_ordered_after_the_producer(kind, dtype, disk):
    with make_store(kind, disk) as store:
        for key, shape in enumerate(SHAPES):
            tensor = produced_late(shape, dtype) if dtype != torch.bool else random_tensor(shape, dtype, device="cuda")
            out = round_trip(store, key, tensor)
            assert out.is_cuda and torch.equal(as_bytes(out), as_bytes(tensor))
            assert torch.equal(as_bytes(round_trip_cpu_out(store, key, tensor)), as_bytes(tensor))


def round_trip_cpu_out(store, key, tensor) -> torch.Tensor:
    out = torch.empty(tensor.shape, dtype=tensor.dtype)
    store.get(key, out).result()
    return out


@pytest.mark.gpu
def test_gpu_non_contiguous_round_trip(disk):
    base = produced_late((300, 1031), torch.bfloat16)
    with make_store("direct_file", disk) as store:
        out = round_trip(store, 0, base.t()[::3])
    assert torch.equal(out, base.t()[::3])


@pytest.mark.gpu
def test_gpu_kvikio_round_trip(disk):
    pytest.importorskip("kvikio")
    with KvikioStore(disk) as store:
        for key, shape in enumerate(SHAPES):
            tensor = produced_late(shape, torch.float32)
            assert torch.equal(round_trip(store, key, tensor), tensor)
        assert len(files_in(store)) == len(SHAPES)


def test_the_registry_has_each_store_with_its_needs(disk):
    """Every store is an entry: the suite's four, what each needs, and how a part makes it from its
    parameters (the emulated store once per bandwidth)."""
    assert REGISTRY.names()[:4] == ("host", "file", "kvikio", "emulated")
    assert REGISTRY["kvikio"].needs_gpu and REGISTRY["kvikio"].packages == ("kvikio",)
    assert REGISTRY["file"].scratch and not REGISTRY["host"].scratch and REGISTRY["emulated"].emulated
    params = {"file_threads": 2, "file_block_mib": 1, "emulated_gbps": [0.5, 2]}
    assert REGISTRY["emulated"].settings(params) == [{"gbps": 0.5}, {"gbps": 2.0}]
    with REGISTRY["file"].build(params, disk) as store:
        assert isinstance(store, DirectFileStore) and store.block_bytes == MIB
    with REGISTRY["emulated"].build(params, None, gbps=2.0) as store:
        assert isinstance(store, EmulatedStore) and store.bandwidth_gbps == 2.0
    with pytest.raises(ValueError, match="needs a scratch folder"):
        REGISTRY["file"].build(params, None)
    with pytest.raises(UserError, match="unknown offload store 'ssd'; one of host, file, kvikio, emulated"):
        REGISTRY["ssd"]


@pytest.mark.parametrize("store", [DirectFileStore, lambda folder: KvikioStore(folder)])
def test_a_missing_folder_is_refused_and_never_created(store, disk):
    if store is not DirectFileStore:  # KvikioStore checks its package and the GPU before the folder
        pytest.importorskip("kvikio")
        if not torch.cuda.is_available():
            pytest.skip("KvikioStore needs a GPU before it looks at the folder")
    missing = disk / "not" / "there"
    with pytest.raises(UserError, match="does not exist") as err:
        store(missing)
    assert "\n" not in str(err.value) and not (disk / "not").exists()
    (disk / "a_file").write_text("")
    with pytest.raises(UserError, match="is not a folder"):
        store(disk / "a_file")


def test_a_scratch_folder_removed_behind_the_stores_back_is_said_in_one_line(disk):
    """Removed while forward writes (a cleaner, a user's rm): the next put names the folder, not
    the file's ENOENT with a long traceback; the store still closes."""
    store = DirectFileStore(disk, block_bytes=BLOCK)
    round_trip(store, 0, random_tensor((7, 13), torch.float32))
    shutil.rmtree(store.directory)
    with pytest.raises(UserError, match="is missing: the store's scratch folder was removed behind the store's back"):
        store.put(1, random_tensor((7, 13), torch.float32)).result()
    store.close()
    assert list(disk.iterdir()) == []


def test_a_store_leaves_its_folder_as_it_found_it(disk):
    with DirectFileStore(disk, block_bytes=BLOCK) as store:
        round_trip(store, 0, random_tensor((BLOCK // 4 + 3,), torch.float32))
    assert list(disk.iterdir()) == []


def test_a_folder_given_from_the_home_folder_is_found(disk, monkeypatch):
    """'~/scratch' was refused as missing though it exists: the store did not expand '~'."""
    monkeypatch.setenv("HOME", str(disk.parent))
    with DirectFileStore(f"~/{disk.name}", block_bytes=BLOCK) as store:
        assert store.folder == disk and store.directory.parent == disk
        round_trip(store, 0, random_tensor((BLOCK // 4 + 3,), torch.float32))
    assert list(disk.iterdir()) == []
    scratch, owner = fileio.make_scratch(f"~/{disk.name}", direct=False)  # the check a store's folder meets
    assert scratch.parent == disk
    fileio.remove_scratch(scratch, owner)
    # The suite's own scratch folder, made on first use, is made in the home folder too, not in "./~".
    made = REGISTRY["file"].build({"file_threads": 1, "file_block_mib": 1}, f"~/{disk.name}/suite")
    made.close()
    assert (disk / "suite").is_dir() and not Path("~").exists()


def test_a_missing_folder_on_tmpfs_is_refused_and_not_left_behind():
    shm = Path("/dev/shm")
    if not shm.is_dir() or fileio.filesystem_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm on this machine")
    folder = shm / f"ssdtrain-test-{os.getpid()}"
    for target in (folder / "inner", shm):
        with pytest.raises(UserError):
            DirectFileStore(target)
    assert not folder.exists()


def short_then(error: int):
    """An ``os.pwrite`` that writes one aligned block of each request, as a disk that fills up does,
    and fails with ``error`` on the write after."""
    real_pwrite, calls = os.pwrite, []

    def pwrite(fd, data, offset):
        calls.append(len(data))
        if len(calls) == 1:
            return real_pwrite(fd, data[: fileio.ALIGN], offset)
        raise OSError(error, os.strerror(error))

    return pwrite, calls


@pytest.mark.parametrize(
    "error, message",
    [(errno.ENOSPC, "no space left on the device"), (errno.EFBIG, "larger than the file system allows")],
)
def test_a_write_cut_short_reports_why(error, message, disk, monkeypatch):
    with DirectFileStore(disk, block_bytes=BLOCK) as store:
        pwrite, calls = short_then(error)
        monkeypatch.setattr(os, "pwrite", pwrite)
        with pytest.raises(UserError, match=message) as err:
            store.put(0, random_tensor((BLOCK // 4,), torch.float32)).result()
        assert "\n" not in str(err.value) and err.value.__cause__.errno == error
        # The rest was asked for from the first byte the disk did not take.
        assert calls == [BLOCK, BLOCK - fileio.ALIGN]
        assert files_in(store) == []


def test_a_real_file_size_limit_reports_efbig(disk):
    """A process limited to files of two blocks (RLIMIT_FSIZE): the kernel cuts the write short,
    then refuses the rest with EFBIG."""
    script = f"""
import resource, signal, torch
from pathlib import Path
from systems.ssdtrain import fileio
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (2 * fileio.ALIGN, resource.RLIM_INFINITY))
data = torch.arange(4 * fileio.ALIGN, dtype=torch.uint8)
buffer = fileio.BounceBuffer(len(data), pin=False)
try:
    fileio.write_file(Path({str(disk / "limited.bin")!r}), len(data), buffer, lambda o, n, b: b.copy_(data[o:o + n]))
except Exception as err:
    print(type(err).__name__, err.__cause__.errno, err)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"UserError {errno.EFBIG} ") and "larger than the file system allows" in done.stdout
    assert not (disk / "limited.bin").exists()


def test_a_store_whose_put_returns_no_future_is_one_line_naming_it():
    class Forgetful(HostStore):
        def _put(self, key, src, ready):
            super()._put(key, src, ready)  # the transfer runs; its future is not handed back

    store = Forgetful()
    try:
        with pytest.raises(TypeError, match=r"^host: Forgetful._put returned NoneType, not the concurrent"):
            store.put(0, torch.ones(4))
        assert 0 not in store._records  # the failed key is not left stored
    finally:
        store.close()
