"""Archives built to reach outside their tree, or to fill the disk: each is refused, and
nothing outside the tree changes (files, modes, owners, times), whatever the archive holds;
as root (who could chown) and as an unprivileged user, and under the oldest Python at hand."""

from __future__ import annotations

import io
import os
import posixpath
import pwd
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blobsvc.cache import _extract
from blobsvc.cache._archives import ArchiveTooLarge, UnsafeArchive, unpack
from blobsvc.cache._extract import MAX_HEADER_BYTES

from .hostile_archives import (
    BOMB_LIMIT,
    MEMBER_LIMIT,
    Member,
    build,
    build_tar,
    build_zip,
    holes,
    sentinel,
    snapshot,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("hole", list(holes(Path("/outside"))))
def test_a_hostile_archive_is_refused_and_nothing_outside_changes(tmp_path: Path, hole: str) -> None:
    outside = sentinel(tmp_path)
    kind, members, environment, words = holes(outside)[hole]
    archive = build(tmp_path, "hostile", kind, members)
    before = snapshot(tmp_path)
    root = tmp_path / "unpacked"
    with pytest.raises(UnsafeArchive, match=words):
        unpack(root, "k", archive, kind, environment=environment, max_bytes=BOMB_LIMIT, max_members=MEMBER_LIMIT)
    assert snapshot(tmp_path, skip=str(root)) == before, "nothing outside the tree changed"
    assert list(root.iterdir()) == [], "nothing left behind"


def test_a_bomb_stops_at_the_limit_not_after(tmp_path: Path) -> None:
    """The bound holds as bytes are written: a member whose header under-states nothing is
    refused before its first byte, and the whole tree never passes the limit."""
    archive = build_zip(tmp_path / "bomb.zip", [("file", f"f{i}", b"\0" * (300 << 10)) for i in range(8)])
    with pytest.raises(ArchiveTooLarge, match=f"more than {BOMB_LIMIT} bytes"):
        unpack(tmp_path / "u", "k", archive, "zip", max_bytes=BOMB_LIMIT)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ArchiveTooLarge):
        _extract.extract(archive, "zip", dest, max_bytes=BOMB_LIMIT)
    assert sorted(p.name for p in dest.iterdir()) == ["f0", "f1", "f2"], "f3 refused before its first byte"
    exact = build_tar(tmp_path / "exact.tar", [("file", "f", b"\1" * BOMB_LIMIT)])
    tree = unpack(tmp_path / "u", "fits", exact, "tar", max_bytes=BOMB_LIMIT)
    assert (tree / "f").stat().st_size == BOMB_LIMIT, "an archive of exactly the limit fits"


def test_members_are_created_read_only_and_owned_by_the_unpacker(tmp_path: Path) -> None:
    """Set-uid, set-gid, sticky and write bits are dropped; the members' owner (4242) is not
    taken, even by root; the members' times are kept."""
    members: list[Member] = [("file", "bin/tool", b"#!/bin/sh\n"), ("dir", "etc", b""), ("symlink", "cur", "bin/tool")]
    for kind, builder in (("tar", build_tar), ("zip", build_zip)):
        archive = builder(tmp_path / f"a.{kind}", members)
        tree = unpack(tmp_path / "u", kind, archive, kind)
        for path in (tree, tree / "bin", tree / "bin" / "tool", tree / "etc"):
            st_ = os.lstat(path)
            assert (st_.st_uid, st_.st_gid) == (os.geteuid(), os.getegid()), path
            assert stat.S_IMODE(st_.st_mode) in (0o555, 0o444), f"{path}: {st_.st_mode:o}"
        assert os.access(tree / "cur", os.X_OK) and os.readlink(tree / "cur") == "bin/tool"
    with_time = build_tar(tmp_path / "t.tar", [("file", "old.py", b"")])
    tree = unpack(tmp_path / "u", "t", with_time, "tar")
    assert (tree / "old.py").stat().st_mtime == 0, "tarfile's default time of a member: the epoch"


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_a_file_may_replace_a_file_of_its_name_and_nothing_else(tmp_path: Path, kind: str) -> None:
    """As tar does, the last of two files of one name wins: venv-pack writes its rewritten
    pyvenv.cfg after the original. Any other pair of one name is refused."""
    archive = build(tmp_path, "twice", kind, [("file", "pyvenv.cfg", b"old"), ("file", "pyvenv.cfg", b"new")])
    assert (unpack(tmp_path / "u", "k", archive, kind) / "pyvenv.cfg").read_bytes() == b"new"
    pairs: list[list[Member]] = [
        [("file", "a", b"x"), ("symlink", "a", "b")],
        [("symlink", "a", "b"), ("file", "a", b"x")],
        [("dir", "a", b""), ("file", "a", b"x")],
        [("file", "a", b"x"), ("dir", "a", b"")],
    ]
    if kind == "tar":
        pairs.append([("file", "b", b"x"), ("file", "a", b"x"), ("hardlink", "a", "b")])
    for number, members in enumerate(pairs):
        with pytest.raises(UnsafeArchive, match=r"appears twice|would replace"):
            unpack(tmp_path / "u", f"bad{number}", build(tmp_path, f"bad{number}", kind, members), kind)


def test_a_venv_pack_archive_unpacks(tmp_path: Path) -> None:
    venv_pack = pytest.importorskip("venv_pack")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    venv_pack.pack(prefix=str(venv), output=str(tmp_path / "env.tar.gz"))
    tree = unpack(tmp_path / "u", "k", tmp_path / "env.tar.gz", "tar", environment=True)
    ran = subprocess.run(
        [tree / "bin" / "python", "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True
    )
    assert ran.stdout.strip() == str(tree), ran.stderr


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("a/" + "n" * 256, "component longer than 255 bytes"),
        ("/".join(["d" * 200] * 25), "longer than 4095 bytes"),
        ("C:/x", "absolute path"),
    ],
    ids=["component", "whole", "drive"],
)
def test_a_name_too_long_or_absolute_is_a_clear_refusal(tmp_path: Path, name: str, words: str) -> None:
    """Refused by the rules, with a reason, rather than by the file system with an OSError."""
    with pytest.raises(UnsafeArchive, match=words):
        unpack(tmp_path / "u", "k", build_tar(tmp_path / "a.tar", [("file", name, b"x")]), "tar")


def test_a_relative_link_may_not_climb_after_a_name(tmp_path: Path) -> None:
    """``a -> .`` makes ``a/a/../..`` lexically inside yet, followed, above the tree: so a
    '..' may only lead a target, and the leading ones may not pass the tree's top."""
    archive = build_tar(tmp_path / "a.tar", [("symlink", "a", "."), ("symlink", "b", "a/a/../..")])
    with pytest.raises(UnsafeArchive, match="points outside"):
        unpack(tmp_path / "u", "k", archive, "tar")
    fine = build_tar(tmp_path / "b.tar", [("file", "lib/x", b"x"), ("symlink", "bin/x", "../lib/x")])
    assert (unpack(tmp_path / "u", "b", fine, "tar") / "bin" / "x").read_bytes() == b"x"


def test_a_directory_swapped_for_a_link_midway_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing rests on what the unpacker believes the tree holds: were a directory it made
    replaced by a link to outside (by a bug, or by another process), the next member's
    descriptor walk refuses to follow it."""
    outside = sentinel(tmp_path)
    made = os.mkdir

    def mkdir_then_swap(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        made(path, mode, dir_fd=dir_fd)
        if path == "lib":
            os.rmdir(path, dir_fd=dir_fd)
            os.symlink(outside / "dir", path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    archive = build_tar(tmp_path / "a.tar", [("dir", "lib", b""), ("file", "lib/file", b"through the link")])
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeArchive, match="'lib' is not a directory of the tree"):
        unpack(tmp_path / "u", "k", archive, "tar")
    assert snapshot(tmp_path, skip=str(tmp_path / "u")) == before


def test_links_are_made_after_every_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """So that no member is ever written through one, whatever the archive's order."""
    made_with: list[set[str]] = []
    symlink = os.symlink

    def symlink_and_look(target: str, path: str, *, dir_fd: int | None = None) -> None:
        made_with.append({p.name for p in (tmp_path / "u").glob(".unpacking-*/*")})
        symlink(target, path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "symlink", symlink_and_look)
    members: list[Member] = [("symlink", "l", "f"), ("file", "f", b"x"), ("dir", "d", b""), ("symlink", "m", "d")]
    tree = unpack(tmp_path / "u", "k", build_tar(tmp_path / "a.tar", members), "tar")
    assert made_with == [{"f", "d"}, {"f", "d", "l"}] and (tree / "l").read_bytes() == b"x"


def test_a_tar_header_is_read_only_up_to_its_bound(tmp_path: Path) -> None:
    """A pax record is read whole by tarfile: one claiming gigabytes would fill memory."""
    path = tmp_path / "pax.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as out:
        info = tarfile.TarInfo("f")
        info.pax_headers = {"comment": "x" * (MAX_HEADER_BYTES + 1)}
        out.addfile(info, io.BytesIO(b""))
    with pytest.raises(UnsafeArchive, match="a tar header claims"):
        unpack(tmp_path / "u", "k", path, "tar")


# --- generated archives --------------------------------------------------------------------------

_COMPONENTS = st.sampled_from(["a", "b", "c", "..", ".", "d" * 200, "lib", "bin"])
_NAMES = st.lists(_COMPONENTS, min_size=1, max_size=24).map("/".join)


def _member(outside: str) -> st.SearchStrategy[Member]:
    targets = st.one_of(
        _NAMES,
        st.sampled_from([outside, f"{outside}/file", f"{outside}/dir", "/", "../outside", "../../outside/file"]),
    )
    return st.one_of(
        st.tuples(st.just("file"), _NAMES, st.binary(max_size=64)),
        st.tuples(st.just("dir"), _NAMES, st.just(b"")),
        st.tuples(st.just("symlink"), _NAMES, targets),
        st.tuples(st.just("hardlink"), _NAMES, targets),
    )


def _leads_out(tree: Path, environment: bool) -> list[str]:
    """Links of ``tree`` that, followed, lead out of it (an environment's absolute ones apart)."""
    found = []
    real_tree = os.path.realpath(tree)
    absolute = False
    for parent, dirs, files in os.walk(tree):
        for name in dirs + files:
            path = os.path.join(parent, name)
            if os.path.islink(path):
                absolute |= os.readlink(path).startswith("/")
                resolved = os.path.realpath(path)
                if os.path.commonpath([real_tree, resolved]) != real_tree:
                    found.append(f"{path} -> {os.readlink(path)}")
    # In an environment, a relative link may lead on through one of its absolute ones.
    return [] if environment and absolute else [f for f in found if not posixpath.isabs(f.split(" -> ")[1])]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    members=st.lists(st.data(), min_size=1, max_size=10),
    kind=st.sampled_from(["tar", "zip"]),
    environment=st.booleans(),
)
def test_generated_archives_never_change_anything_outside_their_tree(
    members: list[st.DataObject], kind: str, environment: bool
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        outside = sentinel(base)
        drawn = [data.draw(_member(str(outside))) for data in members]
        if kind == "zip":  # a zip has no hard links
            drawn = [m if m[0] != "hardlink" else ("symlink", m[1], m[2]) for m in drawn]
        archive = build(base, "generated", kind, drawn)
        before = snapshot(base)
        root = base / "unpacked"
        try:
            tree = unpack(root, "k", archive, kind, environment=environment)
        except UnsafeArchive:
            assert list(root.iterdir()) == []
        else:
            assert _leads_out(tree, environment) == []
            for parent, dirs, files in os.walk(tree):
                for name in dirs + files:
                    st_ = os.lstat(os.path.join(parent, name))
                    assert st_.st_uid == os.geteuid() and (stat.S_ISLNK(st_.st_mode) or not st_.st_mode & 0o7222)
                    if stat.S_ISLNK(st_.st_mode) and not environment:
                        assert not os.readlink(os.path.join(parent, name)).startswith("/")
        assert snapshot(base, skip=str(root)) == before


# --- as another user, and under another Python -----------------------------------------------------


def _portable_copy() -> Path:
    """The unpacking and the hostile archives, where any user can read them (the checkout may
    not be readable by all)."""
    copy = Path(tempfile.mkdtemp(prefix="blobsvc-hostile-"))
    for relative in (
        *("blobsvc/_exceptions.py", "blobsvc/cache/_extract.py", "blobsvc/cache/_walk.py", "tests/hostile_archives.py"),
    ):
        (copy / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / relative, copy / relative)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


def _run_checks(interpreter: str, **options: object) -> subprocess.CompletedProcess[str]:
    copy = _portable_copy()
    try:
        ran: subprocess.CompletedProcess[str] = subprocess.run(
            [interpreter, "-I", str(copy / "tests" / "hostile_archives.py"), str(copy)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=copy,
            env={"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"},
            **options,  # type: ignore[call-overload]
        )
        return ran
    finally:
        shutil.rmtree(copy)


def _oldest_python() -> str | None:
    """The system's Python 3.11 when it is older than ours: Debian 12's is 3.11.2, before
    tarfile had its filters (3.11.4), which this unpacking must not need."""
    for candidate in ("/usr/bin/python3.11", "/usr/bin/python3"):
        if os.access(candidate, os.X_OK):
            version = subprocess.run(
                [candidate, "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True, text=True
            ).stdout.split()
            if version and (3, 11) <= tuple(map(int, version)) < sys.version_info[:3]:
                return candidate
    return None


def test_unpacking_holds_under_the_oldest_python_at_hand() -> None:
    oldest = _oldest_python()
    if oldest is None:
        pytest.skip("no Python 3.11 older than the tests' own on this machine")
    ran = _run_checks(oldest)
    assert ran.returncode == 0 and ran.stdout.rstrip().endswith("ok"), ran.stdout + ran.stderr


def _runs(python: str, preexec: Callable[[], None]) -> bool:
    try:
        return subprocess.run([python, "-c", ""], preexec_fn=preexec, capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to an unprivileged user needs root")
def test_unpacking_holds_as_an_unprivileged_user() -> None:
    nobody = pwd.getpwnam("nobody")

    def become_nobody() -> None:
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    # The tests' own interpreter may live where nobody can reach (a home directory).
    runnable = [python for python in (sys.executable, "/usr/bin/python3") if _runs(python, become_nobody)]
    if not runnable:
        pytest.skip("no Python interpreter that the user nobody may run")
    ran = _run_checks(runnable[0], preexec_fn=become_nobody)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.rstrip().endswith(f"uid {nobody.pw_uid}: ok"), ran.stdout
