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
from blobsvc.cache._archives import archive_kind, prune, remove_unpacked, unpack, unpack_once
from blobsvc.cache._extract import BLOCK
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
    assert list((tmp_path / "unpacked").iterdir()) == []
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
    assert list((tmp_path / "unpacked").iterdir()) == []


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
    (root / ".k.boot").write_text("an earlier boot\n6")
    os.chmod(tree / "lib", 0o755)
    os.chmod(tree / "lib" / "x.py", 0o644)
    (tree / "lib" / "x.py").write_bytes(b"")  # what a crash of the host may leave
    assert unpack(root, "k", archive, "tar") == tree
    assert (tree / "lib" / "x.py").read_bytes() == b"x = 1\n"
    assert (root / ".k.boot").read_text() == f"{boot_id()}\n{6 + BLOCK}", "the boot, the bytes of the tree and its lib/"


# --- environment mode: a packed Python environment's absolute bin/python ------------------


def venv_pack_like(path: Path, *extra: tarfile.TarInfo, interpreter: str = "/usr/bin/python3") -> Path:
    """What venv-pack makes: ``bin/python`` a symlink to the base interpreter's absolute path."""
    return tar(
        path,
        ("pyvenv.cfg", b"home = /usr/bin\n"),
        link("bin/python", interpreter),
        link("bin/python3", "python"),
        ("lib/python3/site-packages/probe.py", b"X = 1\n"),
        *extra,
    )


def test_a_venv_pack_archive_unpacks_in_environment_mode_only(tmp_path: Path) -> None:
    host_dir = tmp_path / "host-lib"
    host_dir.mkdir(mode=0o755)
    archive = venv_pack_like(tmp_path / "env.tar.gz", link("lib64", str(host_dir)))
    root = tmp_path / "unpacked"
    with pytest.raises(UnsafeArchive, match="absolute path '/usr/bin/python3'"):
        unpack(root, "k", archive, "tar")
    tree, fresh = unpack_once(root, "k", archive, "tar", environment=True)
    assert fresh and tree == root / "k.env", "kept apart from the default mode's tree"
    assert os.readlink(tree / "bin" / "python") == "/usr/bin/python3"
    assert (tree / "lib" / "python3" / "site-packages" / "probe.py").read_bytes() == b"X = 1\n"
    assert os.stat(tree / "pyvenv.cfg").st_mode & 0o222 == 0, "read-only as every tree"
    assert os.stat(host_dir).st_mode & 0o777 == 0o755, "a linked directory of the host is not made read-only"
    assert unpack_once(root, "k", archive, "tar", environment=True) == (tree, False), "once per host"
    assert not (root / "k").exists()
    content = tmp_path / "content"
    content.mkdir()
    assert prune(root, content) == ["k.env"], "pruned with its archive"


OUTSIDE = "<outside>"  # stands for a directory outside the tree, made by the test


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ([link("lib", OUTSIDE), ("lib/evil", b"x")], "through the link 'lib'"),
        ([("/etc/evil", b"x")], "absolute path"),
        ([("a/../../evil", b"x")], "'..'"),
        ([link("up", "../../etc")], "points outside"),
        ([link("hard", "/etc/passwd", tarfile.LNKTYPE)], "absolute path"),
    ],
    ids=["written-through-an-outside-link", "absolute-member", "dot-dot", "relative-link-out", "hard-link-absolute"],
)
def test_environment_mode_relaxes_only_absolute_symlink_targets(
    tmp_path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]], words: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    for member in members:
        if isinstance(member, tarfile.TarInfo) and member.linkname == OUTSIDE:
            member.linkname = str(outside)
    archive = tar(tmp_path / "bad.tar", ("fine.txt", b"ok"), *members)
    with pytest.raises(UnsafeArchive, match=words):
        unpack(tmp_path / "unpacked", "k", archive, "tar", environment=True)
    assert list(outside.iterdir()) == [], "nothing written outside the tree"
    assert not (tmp_path / "unpacked" / "k.env").exists()


def test_environment_mode_refuses_a_zip_member_written_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = zip_with(tmp_path / "env.zip", {"fine.txt": b"ok", "lib/evil": b"x"}, {"lib": str(outside)})
    with pytest.raises(UnsafeArchive, match="'lib' would replace the directory 'lib'"):  # its members come first
        unpack(tmp_path / "unpacked", "k", archive, "zip", environment=True)
    assert list(outside.iterdir()) == []
    zipped = zip_with(tmp_path / "ok.zip", {"pyvenv.cfg": b""}, {"bin/python": "/usr/bin/python3"})
    tree = unpack(tmp_path / "unpacked", "z", zipped, "zip", environment=True)
    assert os.readlink(tree / "bin" / "python") == "/usr/bin/python3"
