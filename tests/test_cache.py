"""BlobCache in one process: sharing, references, delayed cleanup, eviction, checks.

Each test pins one invariant of docs/cache.md against a real BlobServer (``server_thread``)
and a real cache directory; GETs are counted on the server side.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from blobsvc import BlobClient, InvalidArgumentType, LocalProtocolError, new_job_id
from blobsvc.cache import BlobCache, CacheFull, CacheStore, TooLargeForCache, _trees
from blobsvc.cache._archives import ArchiveTooLarge, unpack

from .conftest import ServerThread
from .hostile_archives import build_tar

MiB = 1 << 20

OpenCache = Callable[..., BlobCache]


def gets(server: ServerThread) -> int:
    return server.server.requests["GET"]


def hex_digest(path: Path) -> str:
    return str(blake3.blake3(path.read_bytes()).hexdigest())


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def overwrite(path: Path, data: bytes, *, keep_mtime: bool = False) -> None:
    """Damage a cached file in place, as a stray process (or the disk) would."""
    before = os.stat(path)
    os.chmod(path, 0o644)
    with open(path, "r+b") as file:
        file.write(data)
    os.chmod(path, 0o444)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.fixture
def uploader(server_thread: ServerThread) -> Iterator[BlobClient]:
    with BlobClient(server_thread.address, timeout=10) as client:
        yield client


@pytest.fixture
def open_cache(server_thread: ServerThread, tmp_path: Path) -> Iterator[OpenCache]:
    """Open BlobCaches on one directory (``tmp_path/"cache"`` unless told); all closed after."""
    opened: list[BlobCache] = []

    def open_(**options: Any) -> BlobCache:
        options = {"retries": 2, "backoff": 0.01, "timeout": 5.0, **options}
        cache = BlobCache(
            options.pop("server", server_thread.address), options.pop("cache_dir", tmp_path / "cache"), **options
        )
        opened.append(cache)
        return cache

    yield open_
    for cache in opened:
        cache.close()


def test_a_content_blob_is_fetched_once_and_read_only(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    data = os.urandom(3 * MiB)
    key = uploader.put(data)
    cache = open_cache()
    path = cache.path(key)
    assert path.read_bytes() == data
    assert cache.path(key) == path
    assert gets(server_thread) == 1
    assert os.stat(path).st_mode & 0o222 == 0  # a task cannot scribble on bytes other jobs share
    assert cache.check() == []


def test_threads_asking_for_one_blob_share_one_download(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    data = os.urandom(16 * MiB)
    key = uploader.put(data)
    cache = open_cache()
    barrier = threading.Barrier(8)
    paths: list[Path] = []

    def fetch() -> None:
        barrier.wait(10)
        paths.append(cache.path(key))

    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(set(paths)) == 1 and len(paths) == 8
    assert gets(server_thread) == 1
    assert hex_digest(paths[0]) == key


def test_job_blobs_keep_their_file_name_and_share_bytes_with_content(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    data = os.urandom(MiB)
    key = uploader.put(data)
    job = new_job_id()
    names = ["lib/app.jar", "..", "a/", "x" * 255]
    for name in names:
        uploader.put(data, job=job, name=name)
    cache = open_cache()
    content = cache.path(key)
    with cache.job(job) as blobs:
        paths = [blobs.path(name) for name in names]
    assert [p.name for p in paths] == ["app.jar", "blob", "a", "x" * 255]
    assert len(set(paths)) == len(names)
    assert {os.stat(p).st_ino for p in paths} == {os.stat(content).st_ino}
    assert gets(server_thread) == 1  # one content, however many names hold it


def test_a_second_application_with_the_same_jar_downloads_nothing(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    jar = os.urandom(2 * MiB)
    first_job, second_job = new_job_id(), new_job_id()
    uploader.put(jar, job=first_job, name="app.jar")
    uploader.put(jar, job=second_job, name="app.jar")
    with open_cache().job(first_job) as blobs:
        first = blobs.path("app.jar")
    with open_cache().job(second_job) as blobs:  # another application: another BlobCache
        second = blobs.path("app.jar")
    assert first != second and second.read_bytes() == jar
    assert gets(server_thread) == 1


def test_a_job_name_replaced_between_stat_and_get_is_fetched_again_and_poisons_no_key(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache asks the name's key (STAT), then downloads the name (GET). A hook on the
    cache's STAT replaces the blob on the server between the two, since a real race cannot
    be timed: the download brings the new blob's bytes, which must not be kept (and marked
    verified) under the old key; the cache asks again and gets the new blob."""
    job = new_job_id()
    old_key = uploader.put(b"the first version", job=job, name="lib.jar")
    cache = open_cache()
    stat = cache._client.stat

    def stat_then_replace(*args: Any, **kwargs: Any) -> Any:
        info = stat(*args, **kwargs)
        monkeypatch.setattr(cache._client, "stat", stat)  # once
        uploader.put(b"the second version", job=job, name="lib.jar")
        return info

    monkeypatch.setattr(cache._client, "stat", stat_then_replace)
    with cache.job(job) as blobs:
        assert blobs.path("lib.jar").read_bytes() == b"the second version"
    assert not cache.store.content(old_key).exists()
    assert cache.check() == []
    assert gets(server_thread) == 2


def test_references_count_registrations_and_release_without_one_raises(
    open_cache: OpenCache, uploader: BlobClient
) -> None:
    job = new_job_id()
    cache, other = open_cache(), open_cache()
    cache.register_job(job)
    other.register_job(job)
    with cache.job(job):
        assert cache.references(job) == 3
    cache.release_job(job)
    assert other.references(job) == 1
    other.release_job(job)
    assert cache.references(job) == 0
    with pytest.raises(ValueError, match="not registered"):
        cache.release_job(job)
    assert cache.references(job) == 0


def test_a_job_is_deleted_one_cleanup_interval_after_its_last_release(
    open_cache: OpenCache, uploader: BlobClient
) -> None:
    job = new_job_id()
    uploader.put(b"model", job=job, name="model.bin")
    cache = open_cache(cleanup_interval=1.0)
    with cache.job(job) as blobs:
        path = blobs.path("model.bin")
    released = time.monotonic()
    assert path.exists()
    assert wait_until(lambda: not path.exists(), timeout=10), "the janitor never deleted the job"
    assert time.monotonic() - released >= 0.9
    assert not (cache.root / "jobs" / job).exists()
    assert cache.path(uploader.put(b"model")).read_bytes() == b"model"  # content outlives the job


def test_registering_again_inside_the_interval_reuses_the_files(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    job = new_job_id()
    uploader.put(os.urandom(MiB), job=job, name="lib.zip")
    cache = open_cache(cleanup_interval=1.0)
    with cache.job(job) as blobs:
        path = blobs.path("lib.zip")
    time.sleep(0.3)
    with cache.job(job) as blobs:
        time.sleep(1.2)  # past the interval counted from the first release
        assert blobs.path("lib.zip") == path and path.exists()
    assert gets(server_thread) == 1


def test_lru_eviction_keeps_the_limit_and_spares_blobs_in_use(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    blobs = [os.urandom(MiB) for _ in range(5)]
    keys = [uploader.put(b) for b in blobs]
    job = new_job_id()
    uploader.put(blobs[0], job=job, name="pinned")
    cache = open_cache(max_bytes=3 * MiB)
    cache.register_job(job)
    pinned = cache.path(job, "pinned")  # the least recently used of all, but in use
    cache.path(keys[1])
    cache.path(keys[2])
    cache.path(keys[1])  # now blob 2 is the least recently used unpinned blob
    cache.path(keys[3])
    present = {k for k in keys if cache.store.content(k).exists()}
    assert present == {keys[0], keys[1], keys[3]}
    assert pinned.read_bytes() == blobs[0]
    cache.path(keys[4])
    assert not cache.store.content(keys[1]).exists() and pinned.exists()
    assert cache.store.stats().bytes <= 3 * MiB
    # Only blob 0 is in use, so 3 MiB fit; a fourth in-use blob does not.
    for i in (3, 4):
        uploader.put(blobs[i], job=job, name=f"n{i}")
        cache.path(job, f"n{i}")
    before = gets(server_thread)
    with pytest.raises(CacheFull, match="limit of 3145728 bytes"):
        cache.path(keys[2])
    assert gets(server_thread) == before
    cache.release_job(job)
    assert cache.path(keys[2]).read_bytes() == blobs[2]  # released: its blobs may go now
    assert cache.check() == []


def test_a_blob_larger_than_the_limit_gets_a_clear_error_and_no_download(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    key = uploader.put(os.urandom(2 * MiB))
    cache = open_cache(max_bytes=MiB)
    with pytest.raises(TooLargeForCache, match=f"blob {key} is 2097152 bytes, more than the limit of 1048576"):
        cache.path(key)
    assert gets(server_thread) == 0
    assert cache.check() == []


def test_a_file_corrupted_on_disk_is_detected_and_fetched_again(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    data = os.urandom(2 * MiB)
    key = uploader.put(data)
    job = new_job_id()
    uploader.put(data, job=job, name="data.bin")
    cache = open_cache()
    with cache.job(job) as blobs:
        path = blobs.path("data.bin")
        overwrite(path, b"garbage")
        again = blobs.path("data.bin")
        assert again == path and again.read_bytes() == data
    assert gets(server_thread) == 2
    overwrite(cache.store.content(key), b"more garbage")
    assert cache.path(key).read_bytes() == data
    assert gets(server_thread) == 3
    assert cache.check() == []


def test_check_rehashes_what_the_stamp_cannot_see_and_fix_leaves_no_warning(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    data = os.urandom(MiB)
    key = uploader.put(data)
    cache = open_cache()
    path = cache.path(key)
    overwrite(path, b"bit rot", keep_mtime=True)
    warnings = cache.check()
    assert len(warnings) == 1 and "hash to" in warnings[0]
    assert cache.check(fix=True) == warnings
    assert cache.check() == []
    assert cache.path(key).read_bytes() == data
    assert gets(server_thread) == 2


def set_boot(cache: BlobCache, key: str, boot: str) -> None:
    """Rewrite the boot id that the stamp of ``key`` records: how a test fakes a reboot of
    the host (or a host crash) since the blob was verified."""
    meta = cache.store.meta_dir / key
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "boot": boot}))


def test_a_blob_verified_in_an_earlier_boot_is_rehashed_before_its_first_use(
    open_cache: OpenCache, uploader: BlobClient, server_thread: ServerThread
) -> None:
    """Downloads are not fsynced, so a crash of the host may lose their bytes behind the
    stamp's back. Without the scan at start, the first use must rehash: the sound blob and
    the job blob are served with no request to the server, the damaged one is fetched again."""
    sound, lost = os.urandom(MiB), os.urandom(MiB)
    key, lost_key = uploader.put(sound), uploader.put(lost)
    job = new_job_id()
    uploader.put(sound, job=job, name="lib/app.jar")
    cache = open_cache(verify_on_start=False)
    cache.path(key)
    cache.path(lost_key)
    with cache.job(job) as blobs:
        jar = blobs.path("lib/app.jar")
    for each in (key, lost_key):
        set_boot(cache, each, "an earlier boot")
    overwrite(cache.store.content(lost_key), bytes(4096), keep_mtime=True)  # the writes the crash lost
    requests = dict(server_thread.server.requests)
    with cache.job(job) as blobs:
        assert blobs.path("lib/app.jar") == jar
    assert cache.path(key).read_bytes() == sound
    assert server_thread.server.requests == requests
    assert cache.path(lost_key).read_bytes() == lost
    assert gets(server_thread) == requests["GET"] + 1
    assert {json.loads((cache.store.meta_dir / each).read_text())["boot"] for each in (key, lost_key)} == {
        cache.store.boot
    }
    assert cache.check() == []


def test_a_download_is_fsynced_only_where_boots_cannot_be_told_apart(
    open_cache: OpenCache, uploader: BlobClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the kernel's boot id the cache leaves downloads to the page cache; a host without
    one (faked here by emptying the id the store read) gets every download fsynced."""
    first, second = uploader.put(os.urandom(MiB)), uploader.put(os.urandom(MiB))
    synced: list[str] = []
    fsync = os.fsync

    def recorded(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded)
    cache = open_cache()
    cache.path(first)
    assert cache.store.boot and not [path for path in synced if first in path]
    cache.store.boot = ""
    cache.path(second)
    assert [path for path in synced if f"partial/{second}" in path]


def test_opening_a_cache_removes_abandoned_downloads_and_corrupt_files(
    open_cache: OpenCache, uploader: BlobClient, tmp_path: Path
) -> None:
    good, bad, rotten = (uploader.put(os.urandom(MiB)) for _ in range(3))
    first = open_cache()
    for key in (good, bad, rotten):
        first.path(key)
    first.close()
    overwrite(first.store.content(bad), b"changed")
    overwrite(first.store.content(rotten), b"changed behind the stamp", keep_mtime=True)
    meta = first.store.meta_dir / rotten  # verified in an earlier boot of the host
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "boot": "an earlier boot"}))
    abandoned = first.store.partial_dir / f"{uploader.put(b'x' * 100)}.100"
    abandoned.write_bytes(b"x" * 10)
    dead_lease = first.root / "jobs" / new_job_id() / ".leases" / f"{2**22 + 1}-1-1"  # no such pid
    dead_lease.parent.mkdir(parents=True)
    dead_lease.touch()
    reopened = open_cache()
    assert reopened.recovery is not None
    assert sorted(reopened.recovery.removed_corrupt) == sorted([bad, rotten])
    assert reopened.recovery.removed_partials == 1 and not abandoned.exists()
    assert reopened.recovery.repaired == [f"{dead_lease}: the lease of a process that is gone"]
    assert reopened.store.lookup(good) is not None
    assert reopened.check() == []


def test_close_releases_what_this_cache_still_holds(open_cache: OpenCache) -> None:
    job = new_job_id()
    cache, observer = open_cache(), open_cache()
    cache.register_job(job)
    cache.register_job(job)
    assert observer.references(job) == 2
    cache.close()
    assert observer.references(job) == 0


def test_every_invariant_in_the_docs_names_tests_that_exist() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "cache.md").read_text()
    invariants = docs.split("## Invariants", 1)[1].split("\n## ", 1)[0]
    items = [item for item in re.split(r"\n(?=\d+\. \*\*)", invariants) if re.match(r"\d+\. ", item)]
    assert len(items) >= 10
    defined = {
        name
        for pattern in ("test_cache*.py", "test_store_reads.py", "test_ha_s3.py")  # the docs' own list
        for module in Path(__file__).parent.glob(pattern)
        for name in re.findall(r"^def (test_\w+)", module.read_text(), flags=re.M)
    }
    for item in items:
        named = re.findall(r"`(test_\w+)`", item)
        assert named, f"no test pins: {item[:60]}"
        assert set(named) <= defined, set(named) - defined


def test_bad_keys_and_names_fail_before_any_request(open_cache: OpenCache, server_thread: ServerThread) -> None:
    cache = open_cache()
    with pytest.raises(ValueError, match="64 hex characters"):
        cache.path("not a key")
    with pytest.raises(LocalProtocolError, match="1 to 255 bytes"):
        cache.path(new_job_id(), "")
    with pytest.raises(LocalProtocolError, match="NUL"):
        cache.path(new_job_id(), "a\0b")
    with pytest.raises(InvalidArgumentType, match="name the job's blob") as caught:
        cache.path(uuid.uuid4())
    assert isinstance(caught.value, TypeError)
    assert sum(server_thread.server.requests.values()) == 0


# --- archives' unpacked trees ------------------------------------------------------------------


def _cached(store: CacheStore, archive: Path) -> tuple[str, Path]:
    """``archive`` published into ``store`` as a verified blob: its key and content path."""
    data = archive.read_bytes()
    key = blake3.blake3(data).hexdigest()
    partial = store.reserve(key, len(data), 1 << 30)
    partial.write_bytes(data)
    return key, store.publish(key, partial)


def test_unpacked_trees_count_against_the_cache_limit(tmp_path: Path) -> None:
    """A tree's bytes are the cache's: unpacking one evicts what was least recently used, its
    trees with it; and a tree may not take the room that blobs in use hold."""
    store = CacheStore(tmp_path / "cache")
    limit = 1 << 20
    trees = store.unpacked_dir
    old_key, old = _cached(store, build_tar(tmp_path / "old.tar.gz", [("file", "zeros", b"\0" * (600 << 10))]))
    unpack(trees, old_key, old, "tar", max_bytes=limit, store=store)
    time.sleep(0.01)  # the next blob is used later: the least recently used is the first
    new_key, new = _cached(store, build_tar(tmp_path / "new.tar.gz", [("file", "ones", b"\1" * (600 << 10))]))
    tree = unpack(trees, new_key, new, "tar", max_bytes=limit, store=store)
    assert (tree / "ones").stat().st_size == 600 << 10
    assert not (trees / old_key).exists() and not old.exists(), "the older archive evicted with its tree"
    stats = store.stats()
    assert stats.unpacked_bytes == 600 << 10 and stats.bytes + stats.unpacked_bytes <= limit
    job = new_job_id()
    store.register(job)
    store.link(job, "new.tar.gz", new_key)  # in use: neither it nor its tree may go
    third_key, third = _cached(store, build_tar(tmp_path / "third.tar.gz", [("file", "twos", b"\2" * (600 << 10))]))
    with pytest.raises(ArchiveTooLarge, match="hold the archive, blobs in use and downloads"):
        unpack(trees, third_key, third, "tar", max_bytes=limit, store=store)
    assert (tree / "ones").exists() and not (trees / third_key).exists()


def test_a_blob_whose_tree_is_being_unpacked_or_removed_is_not_evicted(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "cache")
    key, archive = _cached(store, build_tar(tmp_path / "a.tar.gz", [("file", "zeros", b"\0" * (64 << 10))]))
    unpack(store.unpacked_dir, key, archive, "tar", max_bytes=1 << 20, store=store)
    with _trees.lock(store.unpacked_dir, key):  # as an unpacker or a remover holds it
        store.settle(1, keep="other")
        assert archive.exists() and (store.unpacked_dir / key).is_dir()
    store.settle(1, keep="other")
    assert not archive.exists() and not (store.unpacked_dir / key).exists()
    assert list(store.unpacked_dir.iterdir()) == [], "its record and locks go with it"
