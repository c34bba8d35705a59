"""Crashes, signals, rot and full disks: what survives and what is cleaned up.

The crash tests run ``blobsvc serve`` as a child process (the ``spawn_server`` fixture),
kill it by PID mid-upload, and start a new one on the same data directory. The promises
checked are the storage module's: nothing partial is ever visible, no staging file outlives
its upload, every blob published before the crash is served intact, and a blob whose bytes
rotted on disk is dropped at start together with every name that shares it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import blake3
import pytest

from blobsvc import AsyncBlobClient, BlobClient, BlobServer, BlobStorage, InsufficientStorage, NotFound, Settings
from blobsvc.ha.coordinator import ZooKeeperHA
from blobsvc.server import RESERVE_ON_LOOP_LIMIT
from blobsvc.storage import Publication, StagedUpload
from blobsvc.wire._protocol import JobBlob

from .conftest import ServerProcess, assert_no_staging, staging_files

HELLO = b"BLOB\x01\x00"
PUT, CONTENT, JOB = 0x00, 0x00, 0x01
INSUFFICIENT_STORAGE = 9
STEP = 10.0  # the longest any single wait in these tests may take
MiB = 1 << 20
JOB_ID = "5eed0000000000000000000000000001"
OTHER_JOB_ID = "5eed0000000000000000000000000002"

Spawn = Callable[..., ServerProcess]


def digest(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


def put_header(length: int, job: str | None = None, name: bytes = b"") -> bytes:
    if job is None:
        return bytes([PUT, CONTENT]) + struct.pack("<Q", length)
    return bytes([PUT, JOB]) + bytes.fromhex(job) + struct.pack("<H", len(name)) + name + struct.pack("<Q", length)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def until_closed(sock: socket.socket) -> bytes:
    """What the server still sends before it closes (a reset counts as closing)."""
    out = bytearray()
    try:
        while chunk := sock.recv(1 << 16):
            out += chunk
    except ConnectionResetError:
        pass
    return bytes(out)


def connect(server: ServerProcess) -> socket.socket:
    """A raw connection that has done the preamble."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=STEP)
    sock.sendall(HELLO)
    assert recv_exactly(sock, 6) == HELLO
    return sock


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + STEP
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def staging_sizes(data_dir: Path) -> list[int]:
    sizes = []
    for path in (data_dir / "incoming").iterdir():
        with contextlib.suppress(FileNotFoundError):  # published or removed meanwhile
            sizes.append(path.stat().st_size)
    return sorted(sizes)


def client_of(server: ServerProcess) -> BlobClient:
    return BlobClient(server.address, timeout=STEP, retries=0)


# --- SIGKILL ----------------------------------------------------------------------------


def test_sigkill_mid_put_leaves_no_partial_blob_and_every_earlier_blob_intact(spawn_server: Spawn) -> None:
    first = spawn_server()
    data_dir = first.data_dir
    earlier = {"empty": b"", "small": os.urandom(1000), "large": os.urandom(3 * MiB)}
    model_v1 = os.urandom(2 * MiB)
    with client_of(first) as client:
        keys = {label: client.put(data) for label, data in earlier.items()}
        client.put(model_v1, job=JOB_ID, name="model.bin")
        client.put(earlier["small"], job=JOB_ID, name="same-as-small")

    big = os.urandom(64 * MiB)  # the server's max_blob_size: a PUT it accepts
    model_v2 = os.urandom(16 * MiB)  # would replace model.bin
    content_put, job_put = connect(first), connect(first)
    try:
        content_put.sendall(put_header(len(big)))
        job_put.sendall(put_header(len(model_v2), JOB_ID, b"model.bin"))
        for offset in range(0, 40 * MiB, MiB):  # slowly: 40 of 64 MiB, and 8 of 16 MiB
            content_put.sendall(big[offset : offset + MiB])
            if offset < 8 * MiB:
                job_put.sendall(model_v2[offset : offset + MiB])
            time.sleep(0.005)
        wait_until(lambda: staging_sizes(data_dir) == [8 * MiB, 40 * MiB], "the server has written what was sent")
        os.kill(first.process.pid, signal.SIGKILL)
        assert first.process.wait(STEP) == -signal.SIGKILL
    finally:
        content_put.close()
        job_put.close()
    assert len(staging_files(data_dir)) == 2  # the crash left its staging files behind

    second = spawn_server()
    assert staging_files(data_dir) == []
    with client_of(second) as client:
        for partial in (big, model_v2):
            with pytest.raises(NotFound):
                client.stat(digest(partial).hex())
        assert client.get(job=JOB_ID, name="model.bin") == model_v1
        for label, data in earlier.items():
            assert client.get(keys[label]) == data
        assert client.get(job=JOB_ID, name="same-as-small") == earlier["small"]
        assert sorted(info.name or "" for info in client.list(JOB_ID)) == ["model.bin", "same-as-small"]
    stored = {digest(data).hex() for data in [*earlier.values(), model_v1]}
    assert set(os.listdir(data_dir / "objects")) == stored


def test_sigkill_amid_concurrent_small_puts_keeps_every_acknowledged_one(spawn_server: Spawn) -> None:
    """Small PUTs are held in memory and written by their batch's flush: a crash at any
    point of that loses only PUTs not yet answered, and leaves nothing partial behind."""
    first = spawn_server()
    data_dir = first.data_dir
    acknowledged: list[tuple[bytes, str | None]] = []
    stop = threading.Event()

    def put_until_killed(worker: int) -> None:
        with contextlib.suppress(OSError):
            sock = connect(first)
            with sock:
                for n in range(10_000):
                    if stop.is_set():
                        return
                    body = os.urandom(4096)
                    name = f"w{worker}-{n}" if n % 2 else None
                    header = put_header(len(body)) if name is None else put_header(len(body), JOB_ID, name.encode())
                    sock.sendall(header + body[:2048])
                    sock.sendall(body[2048:] + digest(body))
                    if recv_exactly(sock, 33) == b"\x00" + digest(body):
                        acknowledged.append((body, name))

    workers = [threading.Thread(target=put_until_killed, args=(i,)) for i in range(8)]
    for worker in workers:
        worker.start()
    try:
        wait_until(lambda: len(acknowledged) >= 200, "200 small PUTs are acknowledged")
        os.kill(first.process.pid, signal.SIGKILL)
        assert first.process.wait(STEP) == -signal.SIGKILL
    finally:
        stop.set()
        for worker in workers:
            worker.join(STEP)
    second = spawn_server()
    assert staging_files(data_dir) == []
    with client_of(second) as client:
        for body, name in acknowledged:
            if name is None:
                assert client.get(digest(body).hex()) == body
            else:
                assert client.get(job=JOB_ID, name=name) == body
        for info in client.list(JOB_ID):  # whatever else made it is whole
            assert info.name is not None
            assert digest(bytes(client.get(job=JOB_ID, name=info.name))) == bytes.fromhex(info.key)


@pytest.mark.parametrize("damage", ["flip-a-byte", "truncate", "append", "empty"])
def test_a_blob_corrupted_on_disk_is_removed_at_start_with_every_name_sharing_it(
    spawn_server: Spawn, damage: str
) -> None:
    first = spawn_server()
    data_dir = first.data_dir
    rotten, sound = os.urandom(MiB), os.urandom(MiB)
    with client_of(first) as client:
        rotten_key = client.put(rotten)
        client.put(rotten, job=JOB_ID, name="shared")
        client.put(rotten, job=OTHER_JOB_ID, name="elsewhere")
        sound_key = client.put(sound)
        client.put(sound, job=JOB_ID, name="own")
    assert first.terminate() == 0

    path = data_dir / "objects" / rotten_key
    assert path.stat().st_nlink == 4  # one object, three names: every name shares the damage
    with open(path, "r+b") as f:
        if damage == "flip-a-byte":
            f.seek(MiB // 2)
            byte = f.read(1)[0]
            f.seek(MiB // 2)
            f.write(bytes([byte ^ 0x40]))
        elif damage == "truncate":
            f.truncate(MiB - 1)
        elif damage == "append":
            f.seek(0, os.SEEK_END)
            f.write(b"\x00")
        else:
            f.truncate(0)

    second = spawn_server()
    with client_of(second) as client:
        with pytest.raises(NotFound):
            client.get(rotten_key)
        with pytest.raises(NotFound):
            client.get(job=JOB_ID, name="shared")
        with pytest.raises(NotFound):
            client.stat(job=OTHER_JOB_ID, name="elsewhere")
        assert client.get(sound_key) == sound
        assert client.get(job=JOB_ID, name="own") == sound
        assert [info.name for info in client.list(JOB_ID)] == ["own"]
        assert client.list(OTHER_JOB_ID) == []
    assert not path.exists()
    assert not (data_dir / "cache" / rotten_key).exists()
    assert os.listdir(data_dir / "objects") == [sound_key]
    assert staging_files(data_dir) == []


# --- SIGTERM ----------------------------------------------------------------------------


def test_sigterm_during_a_put_removes_its_staging_file_and_exits_0(spawn_server: Spawn) -> None:
    shutdown_timeout = 1.0
    server = spawn_server("--shutdown-timeout", str(shutdown_timeout), io_timeout=30.0, idle_timeout=30.0)
    data_dir = server.data_dir
    body = os.urandom(64 * MiB)
    idle, busy = connect(server), connect(server)
    try:
        busy.sendall(put_header(len(body)) + body[: 8 * MiB])
        wait_until(lambda: staging_sizes(data_dir) == [8 * MiB], "the upload is staged")
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(STEP) == 0
        elapsed = time.monotonic() - started
        # The busy connection got its grace period, no more; the idle one held nothing up.
        assert shutdown_timeout * 0.8 <= elapsed <= shutdown_timeout + 5.0, elapsed
        assert staging_files(data_dir) == []
        assert until_closed(idle) == b""
        rest = until_closed(busy)
        assert rest == b"" or rest[:1] == b"\x01", rest  # nothing, or an error frame
    finally:
        idle.close()
        busy.close()

    restarted = spawn_server()
    with client_of(restarted) as client, pytest.raises(NotFound):
        client.stat(digest(body).hex())


def test_sigterm_lets_a_put_in_hand_finish_and_then_exits_0(spawn_server: Spawn) -> None:
    server = spawn_server("--shutdown-timeout", "30", io_timeout=30.0, idle_timeout=30.0)
    data_dir = server.data_dir
    body = os.urandom(16 * MiB)
    sock = connect(server)
    try:
        sock.sendall(put_header(len(body)) + body[: 8 * MiB])
        wait_until(lambda: staging_sizes(data_dir) == [8 * MiB], "the upload is staged")
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert server.process.poll() is None, "the server quit with a request in hand"
        with pytest.raises(ConnectionRefusedError):  # but it takes no new connections
            socket.create_connection(("127.0.0.1", server.port), timeout=STEP).close()
        sock.sendall(body[8 * MiB :] + digest(body))
        assert recv_exactly(sock, 33) == b"\x00" + digest(body)
        assert until_closed(sock) == b""
        assert server.process.wait(STEP) == 0
    finally:
        sock.close()
    assert staging_files(data_dir) == []

    restarted = spawn_server()
    with client_of(restarted) as client:
        assert client.get(digest(body).hex()) == body


# --- a slow disk at shutdown -------------------------------------------------------------


class SlowDisk:
    """Makes some storage calls slow, as a loaded disk does, and records any that ran on an
    upload already discarded: a thread still writing to a staging file that was removed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
        self.seconds = seconds
        self.started = threading.Event()
        self.on_discarded: list[str] = []
        self.slow_write = self.slow_publish = False
        original_write, original_publish = StagedUpload.write, BlobStorage.publish_batch

        def write(upload: StagedUpload, data: bytes | bytearray | memoryview) -> None:
            if self.slow_write and len(data) >= 256 << 10 and not self._stall(upload, "write"):
                return
            original_write(upload, data)

        def publish_batch(storage: BlobStorage, batch: Sequence[Publication]) -> list[bytes | Exception]:
            if self.slow_publish and not all(self._stall(item.upload, "publish") for item in batch):
                raise RuntimeError("publish of a discarded upload")
            return original_publish(storage, batch)

        monkeypatch.setattr(StagedUpload, "write", write)
        monkeypatch.setattr(BlobStorage, "publish_batch", publish_batch)

    def _stall(self, upload: StagedUpload, what: str) -> bool:
        self.started.set()
        time.sleep(self.seconds)
        if upload._fd is None:
            self.on_discarded.append(what)
            return False
        return True


@pytest.mark.parametrize("stage", ["write", "publish"])
async def test_shutdown_waits_for_a_slow_disk_before_removing_the_staging_file(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    disk = SlowDisk(monkeypatch, seconds=0.5)
    server = BlobServer(replace(settings, io_timeout=30.0, idle_timeout=30.0))
    await server.start()
    data_dir = settings.data_dir
    body = os.urandom(8 * MiB)
    _, writer = await asyncio.open_connection(*server.address)
    try:
        if stage == "write":
            disk.slow_write = True
            writer.write(HELLO + put_header(len(body)) + body[: 4 * MiB])
        else:
            disk.slow_publish = True
            writer.write(HELLO + put_header(len(body)) + body + digest(body))
        await writer.drain()
        assert await asyncio.to_thread(disk.started.wait, STEP)
        await server.shutdown(timeout=0.05)  # cancels the connection while the disk is busy
        assert disk.on_discarded == [], "a worker thread used a staging file after it was removed"
        assert staging_files(data_dir) == []
    finally:
        writer.close()
        await server.shutdown()
    await asyncio.sleep(disk.seconds)  # a thread left running would record itself by now
    assert disk.on_discarded == []


# --- full disk --------------------------------------------------------------------------


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted with ``options`` for one test (we run as root in CI), else a skip."""
    mount_point.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs ({options}) for the full-disk tests: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) for the full-disk tests (needs root): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs mounted for this test alone."""
    with mounted_tmpfs(tmp_path / "small-disk", "size=8m") as mount_point:
        yield mount_point


@pytest.fixture
def few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 64 inodes (tmpfs counts each hard link as one), mounted for this test alone."""
    with mounted_tmpfs(tmp_path / "few-inodes", "size=8m,nr_inodes=64") as mount_point:
        yield mount_point


async def test_a_put_bigger_than_the_free_space_gets_insufficient_storage_and_leaves_nothing(
    settings: Settings, small_disk: Path
) -> None:
    data_dir = small_disk / "data"
    async with (
        BlobServer(replace(settings, data_dir=data_dir)) as server,
        AsyncBlobClient(server.address, timeout=STEP, retries=0) as client,
    ):
        earlier = os.urandom(2 * MiB)
        key = await client.put(earlier)
        named = os.urandom(MiB)
        await client.put(named, job=JOB_ID, name="model.bin")

        with pytest.raises(InsufficientStorage):
            await client.put(os.urandom(12 * MiB))
        await assert_no_staging(data_dir)
        with pytest.raises(InsufficientStorage):
            await client.put(os.urandom(12 * MiB), job=JOB_ID, name="model.bin")
        await assert_no_staging(data_dir)

        assert await client.get(key) == earlier
        assert await client.get(job=JOB_ID, name="model.bin") == named
        assert sorted(os.listdir(data_dir / "objects")) == sorted([key, digest(named).hex()])
        # What the failed uploads took is free again.
        later = os.urandom(3 * MiB)
        assert await client.put(later) == digest(later).hex()
        assert await client.get(digest(later).hex()) == later


@pytest.mark.parametrize("length", [12 * MiB, RESERVE_ON_LOOP_LIMIT + MiB])
async def test_a_put_the_disk_cannot_hold_is_refused_before_its_body_is_read(
    settings: Settings, small_disk: Path, length: int
) -> None:
    """The server reserves an upload's announced size when the upload starts (on the loop,
    or on a worker thread for a large one), so a client learns of the full disk at once, not
    after sending all the disk could take (here it sends one piece and waits: without the
    reservation no answer ever comes)."""
    data_dir = small_disk / "data"
    async with BlobServer(replace(settings, data_dir=data_dir, max_blob_size=2 * length)) as server:
        reader, writer = await asyncio.open_connection(*server.address)
        try:
            writer.write(HELLO + put_header(length) + os.urandom(64 << 10))
            await writer.drain()
            async with asyncio.timeout(STEP / 2):
                assert await reader.readexactly(6) == HELLO
                status, code, message_length = struct.unpack("<BHI", await reader.readexactly(7))
                assert (status, code) == (0x01, INSUFFICIENT_STORAGE)
                assert "full" in (await reader.readexactly(message_length)).decode("utf-8")
        finally:
            writer.close()
        await assert_no_staging(data_dir)


async def test_a_download_the_disk_cannot_hold_fails_before_its_body_and_leaves_no_file(
    server: BlobServer, small_disk: Path
) -> None:
    """``get_file`` reserves the blob's size before reading its body: a full disk is an
    OSError at once, with no byte received, no partial file, and a connection that is not
    reused with the unread body on it."""
    data = os.urandom(12 * MiB)
    received: list[int] = []
    async with AsyncBlobClient(server.address, timeout=STEP, retries=0) as client:
        key = await client.put(data)
        with pytest.raises(OSError) as failure:
            await client.get_file(small_disk / "model.bin", key, progress=received.append)
        assert failure.value.errno == errno.ENOSPC
        assert failure.value.filename == str(small_disk / "model.bin")
        assert received == []
        assert os.listdir(small_disk) == []
        assert await client.get(key) == data


async def test_a_small_put_on_a_full_disk_gets_insufficient_storage_and_close(
    settings: Settings, small_disk: Path
) -> None:
    data_dir = small_disk / "data"
    async with BlobServer(replace(settings, data_dir=data_dir)) as server:
        info = os.statvfs(small_disk)
        filler = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(filler, 0, info.f_bavail * info.f_frsize - (64 << 10))
        finally:
            os.close(filler)
        body = os.urandom(200 << 10)  # written on the event loop, in pieces under 256 KiB
        reader, writer = await asyncio.open_connection(*server.address)
        try:
            writer.write(HELLO + put_header(len(body), JOB_ID, b"small") + body + digest(body))
            await writer.drain()
            async with asyncio.timeout(STEP):
                assert await reader.readexactly(6) == HELLO
                status, code, length = struct.unpack("<BHI", await reader.readexactly(7))
                assert (status, code) == (0x01, INSUFFICIENT_STORAGE)
                assert "full" in (await reader.readexactly(length)).decode("utf-8")
                assert await reader.read() == b""  # the connection is closed
        finally:
            writer.close()
        await assert_no_staging(data_dir)

        os.unlink(small_disk / "filler")
        async with AsyncBlobClient(server.address, timeout=STEP, retries=0) as client:
            await client.put(body, job=JOB_ID, name="small")
            assert await client.get(job=JOB_ID, name="small") == body


def allocated(directory: Path) -> int:
    """Bytes of disk blocks the files under ``directory`` hold."""
    return sum(os.stat(Path(parent, name)).st_blocks * 512 for parent, _, names in os.walk(directory) for name in names)


async def test_after_a_full_disk_deleting_blobs_makes_room_and_refused_puts_leave_nothing(
    settings: Settings, small_disk: Path
) -> None:
    """The journal takes no space blobs need: a few small PUTs grow it by a fraction of what
    is free, not by megabytes of zeros. Filling the disk with small and large PUTs, each into
    a job of its own, ends in INSUFFICIENT_STORAGE that leaves no staging file and no job
    directory; deleting every blob then makes room for a PUT of seven eighths of the disk."""
    data_dir = small_disk / "data"
    async with (
        BlobServer(replace(settings, data_dir=data_dir)) as server,
        AsyncBlobClient(server.address, timeout=STEP, retries=0) as client,
    ):
        for _ in range(5):
            await client.put(os.urandom(1000))
        assert allocated(data_dir / "journal") < MiB, "the journal took space blobs need"

        keys: list[str] = []
        jobs: list[str] = []
        refused = 0
        for n in itertools.count():  # small and large, content and job blobs, until refused 8 times
            job = os.urandom(16).hex() if n % 2 else None
            try:
                key = await client.put(os.urandom(30_000 if n % 4 < 2 else 200_000), job=job, name=job and "n")
            except InsufficientStorage:
                refused += 1
                if refused == 8:
                    break
                continue
            (keys if job is None else jobs).append(job or key)
        assert len(keys) > 5 and len(jobs) > 5
        await assert_no_staging(data_dir)
        assert sorted(path.name[len("job_") :] for path in data_dir.glob("job_*")) == sorted(jobs)

        for key in keys:
            await client.delete(key)
        for job in jobs:
            await client.delete_job(job)
        later = os.urandom(7 * MiB)  # seven eighths of the disk
        assert await client.put(later) == digest(later).hex()
        small = os.urandom(1000)
        assert await client.put(small, job=JOB_ID, name="small") == digest(small).hex()


async def test_a_put_the_disk_refuses_first_gets_the_blocks_the_journal_holds_ahead_of_its_records(
    settings: Settings, tmp_path: Path
) -> None:
    """On a 64 MiB disk the first small PUT grows the journal by 4 MiB of zeros (1/16 of what
    is free then). Large PUTs that fill the disk take those blocks back before one is refused."""
    with mounted_tmpfs(tmp_path / "disk", "size=64m") as disk:
        data_dir = disk / "data"
        async with (
            BlobServer(replace(settings, data_dir=data_dir)) as server,
            AsyncBlobClient(server.address, timeout=STEP, retries=0) as client,
        ):
            await client.put(os.urandom(1000))
            assert allocated(data_dir / "journal") > 3 * MiB
            with pytest.raises(InsufficientStorage):
                for _ in range(64):
                    await client.put(os.urandom(MiB))
            assert allocated(data_dir / "journal") < 64 << 10
            await assert_no_staging(data_dir)


async def test_a_segment_cleared_on_a_nearly_full_disk_gives_its_blocks_back_as_it_is_cleared(
    settings: Settings, small_disk: Path
) -> None:
    """Rule 6 of the journal, at the clearing itself: small PUTs into a job fill a few MiB of the
    8 MiB disk with records; deleting the job checkpoints and clears their segment, and with so
    little free its blocks go back then, not when a later upload is refused (where
    ``give_back`` would cover for it, so the full-disk tests above pass without this rule)."""
    data_dir = small_disk / "data"
    async with (
        BlobServer(replace(settings, data_dir=data_dir)) as server,
        AsyncBlobClient(server.address, timeout=STEP, retries=0) as client,
    ):
        names = 0
        while allocated(data_dir / "journal") < 2 * MiB:
            await client.put(os.urandom(60_000), job=JOB_ID, name=f"n{names}")  # journaled: under 64 KiB
            names += 1
        free = os.statvfs(small_disk)
        assert free.f_bavail * free.f_frsize < 4 * MiB, "a nearly full disk"
        await client.delete_job(JOB_ID)  # waits for the checkpoint of the job's records
        assert allocated(data_dir / "journal") < 64 << 10, "the cleared segment kept its blocks"


@pytest.mark.parametrize("size", [1000, 100_000], ids=["journaled", "flushed"])
async def test_a_put_refused_for_want_of_inodes_leaves_no_job_directory(
    settings: Settings, few_inodes: Path, size: int
) -> None:
    """A job's directory made for a name that then cannot be linked goes with the refusal."""
    data_dir = few_inodes / "data"
    async with (
        BlobServer(replace(settings, data_dir=data_dir)) as server,
        AsyncBlobClient(server.address, timeout=STEP, retries=0) as client,
    ):
        jobs: list[str] = []
        for _ in range(64):
            job = os.urandom(16).hex()
            try:
                await client.put(os.urandom(size), job=job, name="n")
            except InsufficientStorage:
                break
            jobs.append(job)
        else:
            pytest.fail("64 PUTs into 64 inodes were all stored")
        await assert_no_staging(data_dir)
        assert sorted(path.name[len("job_") :] for path in data_dir.glob("job_*")) == sorted(jobs)


def test_a_recovery_from_the_ha_store_the_disk_cannot_hold_is_refused_before_a_byte_is_fetched(
    tmp_path: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server lacking a blob fetches it from the HA store into a staging file reserved at
    the blob's size, as a PUT's is: on a disk that cannot hold it, INSUFFICIENT_STORAGE
    before the HA copy is read (the store's reads are recorded), and no staging file."""
    settings = Settings(recovery_mode="zookeeper", zookeeper="127.0.0.1:1", ha_dir=str(tmp_path / "ha"))
    ha = ZooKeeperHA(settings)  # never started: recovery needs its store and the storage alone
    data = os.urandom(12 * MiB)
    (tmp_path / "blob").write_bytes(data)
    target = JobBlob(bytes.fromhex(JOB_ID), "model.bin")
    ha.blobs.put(tmp_path / "blob", digest(data), target)
    read: list[str] = []
    chunks = ha.blobs.files.chunks

    def recorded(path: str) -> Iterator[bytes]:
        read.append(path)
        return chunks(path)

    monkeypatch.setattr(ha.blobs.files, "chunks", recorded)
    ha._storage = storage = BlobStorage(small_disk / "data")
    storage.recover()
    try:
        with pytest.raises(InsufficientStorage):
            asyncio.run(ha.recover(target))
        assert [path for path in read if path.endswith("/data")] == []  # name records only
        assert staging_files(storage.layout.root) == []
    finally:
        storage.close()
