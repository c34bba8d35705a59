"""Archives for executors, without Spark: unpacked once, atomically, read-only, and never
outside their directory."""

from __future__ import annotations

import io
import multiprocessing
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from blobsvc import InvalidArgument
from blobsvc.cache._archives import archive_kind, prune, remove_unpacked, unpack
from blobsvc.cache._store import boot_id
from blobsvc.spark import UnsafeArchive


def tar(path: Path, *members: tarfile.TarInfo | tuple[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz" if path.name.endswith("gz") else "w") as out:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                out.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                out.addfile(info, io.BytesIO(member[1]))
    return path


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def zip_with(path: Path, members: dict[str, bytes], symlinks: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as out:
        for name, data in members.items():
            out.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            out.writestr(info, target)
    return path


def test_tar_and_zip_unpack_read_only_with_inner_links(tmp_path: Path) -> None:
    archive = tar(tmp_path / "env.tgz", ("bin/tool", b"x"), ("conf/a.txt", b"a"), link("bin/cur", "tool"))
    tree = unpack(tmp_path / "unpacked", "k1", archive, archive_kind(archive.name))
    assert (tree / "conf" / "a.txt").read_bytes() == b"a"
    assert (tree / "bin" / "cur").read_bytes() == b"x"
    for path in (tree, tree / "conf", tree / "conf" / "a.txt"):
        assert os.stat(path).st_mode & 0o222 == 0, f"{path} is writable"
    zipped = zip_with(tmp_path / "m.zip", {"pkg/__init__.py": b"X = 1\n"}, {"pkg/alias.py": "__init__.py"})
    tree = unpack(tmp_path / "unpacked", "k2", zipped, "zip")
    assert (tree / "pkg" / "alias.py").read_bytes() == b"X = 1\n"


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ([("/etc/evil", b"x")], "absolute path"),
        ([("a/../../evil", b"x")], "'..'"),
        ([link("out", "../../etc/passwd")], "points outside"),
        ([link("out", "/etc/passwd")], "absolute path"),
        ([link("hard", "../x", tarfile.LNKTYPE)], "points outside"),
        ([link("deep/ok", "../../x")], "points outside"),
    ],
)
def test_a_tar_member_escaping_the_directory_refuses_the_whole_archive(
    tmp_path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]], words: str
) -> None:
    archive = tar(tmp_path / "bad.tar", ("fine.txt", b"ok"), *members)
    with pytest.raises(UnsafeArchive, match=words):
        unpack(tmp_path / "unpacked", "k", archive, "tar")
    assert list((tmp_path / "unpacked").iterdir()) == [tmp_path / "unpacked" / ".k.lock"]
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()


def test_a_device_member_is_refused(tmp_path: Path) -> None:
    device = tarfile.TarInfo("dev")
    device.type = tarfile.CHRTYPE
    with pytest.raises(UnsafeArchive, match="device"):
        unpack(tmp_path / "u", "k", tar(tmp_path / "d.tar", device), "tar")


@pytest.mark.parametrize(
    ("members", "symlinks", "words"),
    [
        ({"../evil": b"x"}, {}, "'..'"),
        ({"/abs": b"x"}, {}, "absolute path"),
        ({"C:/win": b"x"}, {}, "absolute path"),
        ({}, {"out": "../../etc/passwd"}, "points outside"),
    ],
)
def test_a_zip_member_escaping_the_directory_refuses_the_whole_archive(
    tmp_path: Path, members: dict[str, bytes], symlinks: dict[str, str], words: str
) -> None:
    archive = zip_with(tmp_path / "bad.zip", {"fine.txt": b"ok", **members}, symlinks)
    with pytest.raises(UnsafeArchive, match=words):
        unpack(tmp_path / "unpacked", "k", archive, "zip")
    assert not (tmp_path / "unpacked" / "k").exists()


def test_a_corrupt_archive_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "broken.tar.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UnsafeArchive, match="not a readable tar archive"):
        unpack(tmp_path / "unpacked", "k", tmp_path / "broken.tar.gz", "tar")
    assert [p.name for p in (tmp_path / "unpacked").iterdir()] == [".k.lock"]


def test_unknown_suffixes_are_refused_by_name() -> None:
    assert archive_kind("x.TGZ") == "tar" and archive_kind("x.zip") == "zip"
    with pytest.raises(InvalidArgument, match=r"\.tar\.gz"):
        archive_kind("x.rar")


def _unpack_in_child(root: str, archive: str) -> str:
    return str(unpack(Path(root), "shared", Path(archive), "tar"))


def test_processes_unpacking_at_once_share_one_tree_and_a_killed_unpacker_leaves_only_debris(
    tmp_path: Path,
) -> None:
    archive = tar(tmp_path / "a.tar", *[(f"f{i}", os.urandom(1 << 16)) for i in range(64)])
    root = tmp_path / "unpacked"
    root.mkdir()
    debris = root / ".unpacking-shared-dead"  # what an unpacker killed midway leaves
    debris.mkdir()
    (debris / "f0").write_bytes(b"half")
    with multiprocessing.get_context("fork").Pool(4) as pool:
        trees = pool.starmap(_unpack_in_child, [(str(root), str(archive))] * 8)
    assert set(trees) == {str(root / "shared")}
    assert sorted(p.name for p in root.iterdir()) == [".shared.boot", ".shared.lock", "shared"]
    assert len(list((root / "shared").iterdir())) == 64
    remove_unpacked(root / "shared")
    assert not (root / "shared").exists()


def test_prune_removes_only_trees_whose_archive_left_the_cache(tmp_path: Path) -> None:
    content = tmp_path / "content"
    content.mkdir()
    (content / "kept").write_bytes(b"archive bytes")
    archive = tar(tmp_path / "a.tar", ("x", b"x"))
    root = tmp_path / "unpacked"
    for key in ("kept", "evicted"):
        unpack(root, key, archive, "tar")
    assert prune(root, content) == ["evicted"]
    assert sorted(p.name for p in root.iterdir()) == [".kept.boot", ".kept.lock", "kept"]


def test_a_tree_unpacked_in_an_earlier_boot_is_unpacked_again(tmp_path: Path) -> None:
    """Trees are not fsynced, so a crash of the host may cut their files short. The test
    fakes a reboot by rewriting the boot id recorded beside the tree."""
    archive = tar(tmp_path / "a.tar", ("lib/x.py", b"x = 1\n"))
    root = tmp_path / "unpacked"
    tree = unpack(root, "k", archive, "tar")
    inode = os.stat(tree / "lib" / "x.py").st_ino
    assert unpack(root, "k", archive, "tar") == tree
    assert os.stat(tree / "lib" / "x.py").st_ino == inode  # this boot's tree is used as it is
    (root / ".k.boot").write_text("an earlier boot")
    os.chmod(tree / "lib", 0o755)
    os.chmod(tree / "lib" / "x.py", 0o644)
    (tree / "lib" / "x.py").write_bytes(b"")  # what a crash of the host may leave
    assert unpack(root, "k", archive, "tar") == tree
    assert (tree / "lib" / "x.py").read_bytes() == b"x = 1\n"
    assert (root / ".k.boot").read_text() == boot_id()
