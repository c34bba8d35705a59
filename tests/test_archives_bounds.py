"""What a small archive may make the unpacker hold, spend or leave: memory (peak, measured in
a process of its own), depth, blocks on disk, and the errors a malformed member gets."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from benchmarks.harness.agent import run_agent
from blobsvc import BlobClient
from blobsvc.cache import _extract, _trees
from blobsvc.cache._archives import ArchiveTooLarge, UnsafeArchive, unpack
from blobsvc.cache._extract import BLOCK, MAX_DEPTH, MAX_HEADER_BYTES
from blobsvc.cache._trees import remove_unpacked
from blobsvc.http import python_path

from .conftest import ServerThread
from .hostile_archives import build_tar, build_zip

REPO = Path(__file__).resolve().parent.parent
# The bound docs/security.md states on the unpacker's extra memory.
MEMORY_BOUND = 64 << 20


def _sparse_10(path: Path) -> Path:
    """A GNU sparse 1.0 member whose map claims 5 million entries, in a few kilobytes."""
    data = b"5000000\n" + b"0\n" * 200_000
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as out:
        info = tarfile.TarInfo("sparse")
        info.size = len(data)
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "s"}
        out.addfile(info, io.BytesIO(data))
    return path


def _old_sparse(path: Path) -> Path:
    """An old GNU sparse member ('S') whose extension blocks go on and on."""
    header = bytearray(tarfile.TarInfo("s").tobuf(format=tarfile.GNU_FORMAT))
    header[156:157] = b"S"
    header[482] = 1  # isextended
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header[:512])
    block = bytearray(512)
    block[504] = 1  # another one follows
    with gzip.open(path, "wb") as out:
        out.write(bytes(header[:512]) + bytes(block) * 20_000 + bytes(1024))
    return path


def _globals(path: Path) -> Path:
    """Pax global headers of 1 MiB each, more of them than the bound allows."""
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as out:
        for i in range(3):
            info = tarfile.TarInfo(f"g{i}")
            info.type = tarfile.XGLTYPE
            record = f"comment{i}=" + "x" * ((1 << 20) - 64)
            info.pax_headers = {}
            data = b"%d %s\n" % (len(record) + 9, record.encode())
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
            out.addfile(tarfile.TarInfo(f"f{i}"), io.BytesIO(b""))
    return path


def _long_names(path: Path) -> Path:
    """A chain of GNU long-name headers of nearly 1 MiB each before one member."""
    name = b"n" * ((1 << 20) - 600) + b"\0"
    one = tarfile.TarInfo("././@LongLink")
    one.type = tarfile.GNUTYPE_LONGNAME
    one.size = len(name)
    block = one.tobuf(format=tarfile.GNU_FORMAT) + name + bytes(-len(name) % 512)
    with gzip.open(path, "wb") as out:
        out.write(block * 80 + tarfile.TarInfo("f").tobuf(format=tarfile.GNU_FORMAT) + bytes(1024))
    return path


def _zip_link(path: Path) -> Path:
    """A zip symlink whose target is 64 MiB (deflated to a few kilobytes)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        info = zipfile.ZipInfo("link")
        info.create_system = 3
        info.external_attr = 0o120777 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        out.writestr(info, b"a" * (64 << 20))
    return path


CRAFTED = {
    "gnu-sparse-1.0-map": (_sparse_10, "tar.gz", "sparse"),
    "old-gnu-sparse-extension-blocks": (_old_sparse, "tar.gz", "sparse"),
    "pax-global-headers": (_globals, "tar.gz", "global headers pass"),
    "gnu-long-name-chain": (_long_names, "tar.gz", "headers pass"),
    "zip-symlink-with-a-huge-target": (_zip_link, "zip", "target longer than 4095"),
}

# An executor's process: a BlobCache (no server needed to unpack), unpacking as resolve() does.
_PEAK = """
import sys
from pathlib import Path
from blobsvc import BlobCache
from blobsvc.cache._archives import UnsafeArchive, unpack

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

cache = BlobCache("127.0.0.1:1", sys.argv[2], max_bytes=1 << 30)
before = peak()
try:
    unpack(cache.store.unpacked_dir, "k", Path(sys.argv[1]), sys.argv[3], max_bytes=cache.max_bytes, store=cache.store)
except UnsafeArchive as exc:
    print(peak() - before, exc, sep="\\n")
cache.close()
"""


@pytest.mark.parametrize("craft", list(CRAFTED))
def test_a_crafted_archive_is_refused_within_the_memory_bound(tmp_path: Path, craft: str) -> None:
    """Peak memory (VmHWM) of an executor's process (a BlobCache) that unpacks it, over what
    it had before."""
    make, suffix, words = CRAFTED[craft]
    archive = make(tmp_path / f"crafted.{suffix}")
    kind = "zip" if suffix == "zip" else "tar"
    ran = subprocess.run(
        [sys.executable, "-c", _PEAK, str(archive), str(tmp_path / "u"), kind],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    grown, message = ran.stdout.splitlines()
    assert words in message
    assert int(grown) < MEMORY_BOUND, f"{craft}: the unpacker grew by {int(grown) >> 20} MiB"


def test_a_relative_link_may_not_climb_one_level_above_its_tree(tmp_path: Path) -> None:
    for target in ("../../x", "../x"):
        archive = build_tar(tmp_path / "up.tar", [("dir", "d", b""), ("symlink", f"d{'/e' * 0}/l", target)])
        if target == "../x":
            archive = build_tar(tmp_path / "up.tar", [("symlink", "l", target)])
        with pytest.raises(UnsafeArchive, match="points outside the directory"):
            unpack(tmp_path / "u", "k", archive, "tar")
    inside = build_tar(tmp_path / "in.tar", [("file", "x", b""), ("symlink", "d/l", "../x")])
    assert os.readlink(unpack(tmp_path / "u", "in", inside, "tar") / "d" / "l") == "../x"


def test_depth_is_bounded_and_a_tree_at_the_bound_unpacks_and_is_removed(tmp_path: Path) -> None:
    deepest = "/".join(["d"] * MAX_DEPTH)
    with pytest.raises(UnsafeArchive, match=f"deeper than {MAX_DEPTH} directories"):
        unpack(tmp_path / "u", "k", build_tar(tmp_path / "deep.tar", [("file", deepest + "/f", b"")]), "tar")
    tree = unpack(tmp_path / "u", "ok", build_tar(tmp_path / "ok.tar", [("file", deepest, b"x")]), "tar")
    assert (tree / deepest).read_bytes() == b"x"
    os.chmod(tree / "d" / "d", 0)  # neither read nor search: removal gets in through descriptors
    remove_unpacked(tree)
    assert not tree.exists()


def test_directories_and_links_count_a_block_each(tmp_path: Path) -> None:
    dirs = build_tar(tmp_path / "dirs.tar", [("dir", f"d{i}", b"") for i in range(11)])
    with pytest.raises(ArchiveTooLarge, match=f"more than {10 * BLOCK} bytes"):
        unpack(tmp_path / "u", "k", dirs, "tar", max_bytes=10 * BLOCK)
    links = build_tar(tmp_path / "links.tar", [("symlink", f"l{i}", "x") for i in range(11)])
    with pytest.raises(ArchiveTooLarge):
        unpack(tmp_path / "u", "l", links, "tar", max_bytes=10 * BLOCK)


def _zip_raw(path: Path, name: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("PLACEHOLDER", b"x")
    data = path.read_bytes().replace(b"PLACEHOLDER", name.ljust(11, b"\0")[:11])
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: _zip_raw(p / "e.zip", b"\0" * 11), "empty name"),
        (lambda p: _zip_raw(p / "n.zip", b"\0abc"), "empty name"),
        (lambda p: build_tar(p / "t.tar", [("symlink", "l", "a/" * 2048)]), "longer than 4095"),
        (lambda p: build_zip(p / "z.zip", [("symlink", "l", "a/" * 2048)]), "longer than 4095"),
    ],
)
def test_a_malformed_name_or_target_is_a_clear_refusal(tmp_path: Path, make: object, words: str) -> None:
    archive = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(UnsafeArchive, match=words):
        unpack(tmp_path / "u", "k", archive, "zip" if archive.suffix == ".zip" else "tar")


def test_a_pax_record_at_the_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as out:
        info = tarfile.TarInfo("f")
        info.pax_headers = {"comment": "x" * (MAX_HEADER_BYTES - 600)}
        out.addfile(info, io.BytesIO(b""))
    assert (unpack(tmp_path / "u", "k", path, "tar") / "f").exists()


@pytest.mark.parametrize("compressed", [False, True])
def test_a_members_own_bytes_are_not_counted_as_its_headers(tmp_path: Path, compressed: bool) -> None:
    """A file of many chunks (a wheel, a shared library, a model) unpacks whole: only the
    reads before a member's bytes count against the headers' bound."""
    data = os.urandom(4 * MAX_HEADER_BYTES + 12345)
    path = tmp_path / ("big.tar.gz" if compressed else "big.tar")
    with tarfile.open(path, "w:gz" if compressed else "w", format=tarfile.PAX_FORMAT) as out:
        for name in ("big", "after"):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    tree = unpack(tmp_path / "u", "k", path, "tar")
    assert (tree / "big").read_bytes() == data
    assert (tree / "after").read_bytes() == data


def _peak(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_the_agent_answers_each_crafted_archive_with_one_line_4xx_within_its_memory_bound(
    server_thread: ServerThread, tmp_path: Path
) -> None:
    """Through the agent's HTTP face: each crafted archive, a member too deep, and an environment
    without bin/python as deep as allowed (found useless and removed): a one-line 4xx naming the
    problem, the agent's peak memory within the bound, no traceback in its log."""
    deep = "/".join(["d"] * MAX_DEPTH)
    cases = {
        **{craft: (make, suffix, words) for craft, (make, suffix, words) in CRAFTED.items()},
        "too-deep": (lambda p: build_tar(p, [("file", deep + "/f", b"")]), "tar", "deeper than"),
        "deep-without-python": (lambda p: build_tar(p, [("file", deep, b"")]), "tar", "no bin/python"),
    }
    with (
        BlobClient(server_thread.address, timeout=10) as client,
        run_agent(server_thread.address, tmp_path / "c") as agent,
    ):
        before = _peak(agent.process.pid)
        for case, (make, suffix, words) in cases.items():
            key = client.put(make(tmp_path / f"{case}.{suffix}"))
            status, body = agent.get(python_path(key, f"{case}.{suffix}", "env-python"))
            assert status == 400 and words.encode() in body and body.count(b"\n") == 1, (case, status, body)
        grown = _peak(agent.process.pid) - before
        assert [p.name for p in (agent.cache_dir / "unpacked").iterdir()] == [], "no tree left"
        agent.kill()
    assert agent.process.stderr is not None
    logged = agent.process.stderr.read()
    assert "Traceback" not in logged, logged
    assert grown < MEMORY_BOUND, f"the agent grew by {grown >> 20} MiB"


def test_the_names_kept_and_a_zips_directory_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds, lowered so that a small archive passes them."""
    monkeypatch.setattr(_extract, "MAX_NAME_BYTES", 1000)
    names = build_tar(tmp_path / "names.tar", [("file", f"{i:0100d}", b"") for i in range(11)])
    with pytest.raises(ArchiveTooLarge, match="names pass 1000 bytes"):
        unpack(tmp_path / "u", "k", names, "tar")
    with pytest.raises(ArchiveTooLarge, match="lists 11 members, more than the 10"):
        unpack(
            tmp_path / "u",
            "m",
            build_zip(tmp_path / "m.zip", [("file", f"{i}", b"") for i in range(11)]),
            "zip",
            max_members=10,
        )
    monkeypatch.setattr(_extract, "MAX_ZIP_DIRECTORY", 1000)
    listing = build_zip(tmp_path / "listing.zip", [("file", f"{i:0100d}", b"") for i in range(11)])
    with pytest.raises(ArchiveTooLarge, match="central directory passes 1000 bytes"):
        unpack(tmp_path / "u", "z", listing, "zip")


def test_a_tree_whose_removal_fails_keeps_its_record_and_is_not_evicted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A removal that fails (faked: root may remove anything its own process made) leaves the
    tree set aside with its record, so no one uses what is left and it still counts; the next
    removal finishes it."""
    root = tmp_path / "u"
    tree = unpack(root, "k", build_tar(tmp_path / "a.tar", [("file", "d/f", b"x")]), "tar")

    def fails(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(_trees, "remove_unpacked", fails)
    assert not _trees.remove_all(root, "k")
    assert not tree.exists(), "set aside: never taken for a tree unpacked"
    assert _trees.sizes(root) == {"k": 1 + BLOCK}, "what is left still counted"
    monkeypatch.undo()
    assert _trees.remove_all(root, "k") and list(root.iterdir()) == [] and _trees.sizes(root) == {}
