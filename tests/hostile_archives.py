"""Hostile archives, one per known way out of an unpacked tree, and a sentinel tree to watch.

Imported by the tests, and run as a script under another interpreter or user:
``python hostile_archives.py <directory holding blobsvc/_exceptions.py and
blobsvc/cache/_extract.py>`` loads the unpacking from there (it needs nothing but the standard
library), unpacks every archive below, and exits 0 when each was refused as it must be, the
sentinel tree is unchanged and a harmless environment unpacks as it should; else 1, saying why.
So it must itself import nothing but the standard library.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import stat
import sys
import tarfile
import tempfile
import types
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

# Small bounds for the bombs, so that each stays fast.
BOMB_LIMIT = 1 << 20
BOMB_BYTES = 4 << 20
MEMBER_LIMIT = 100
OUTSIDER = 4242  # the owner hostile members claim


# --- the sentinel tree ---------------------------------------------------------------------------


def sentinel(base: Path) -> Path:
    """``base/outside``: a directory, files of several modes and times, a nested file."""
    outside = base / "outside"
    (outside / "dir").mkdir(parents=True)
    for path, mode in ((outside / "file", 0o600), (outside / "dir" / "file", 0o640), (outside / "script", 0o750)):
        path.write_bytes(b"original " + path.name.encode())
        path.chmod(mode)
        os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    (outside / "dir").chmod(0o750)
    return outside


def snapshot(base: Path, skip: str = "") -> dict[str, tuple[object, ...]]:
    """Every path under ``base`` (but ``skip``'s subtree) with its kind, mode, owner, times and
    bytes or target: what must not change outside a tree."""
    seen: dict[str, tuple[object, ...]] = {}
    for parent, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if os.path.join(parent, d) != skip]
        for name in dirs + files:
            path = os.path.join(parent, name)
            st = os.lstat(path)
            body: object = None
            if stat.S_ISREG(st.st_mode):
                body = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                body = os.readlink(path)
            seen[path] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_nlink, body)
    return seen


# --- builders ------------------------------------------------------------------------------------

Member = tuple[str, str, "bytes | str"]  # (kind: file|dir|symlink|hardlink, name, data or target)


def build_tar(path: Path, members: list[Member]) -> Path:
    with tarfile.open(path, "w:gz" if path.name.endswith("gz") else "w", format=tarfile.PAX_FORMAT) as out:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            info.uid = info.gid = OUTSIDER
            info.mode = 0o6777  # set-uid, set-gid, writable by all: none of it may stick
            if kind == "file":
                assert isinstance(data, bytes)
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}[kind]
            if kind != "dir":
                assert isinstance(data, str)
                info.linkname = data
            out.addfile(info)
    return path


def build_zip(path: Path, members: list[Member]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a duplicate name is what some of these are for
        for kind, name, data in members:
            info = zipfile.ZipInfo(name + ("/" if kind == "dir" else ""))
            info.create_system = 3
            info.compress_type = zipfile.ZIP_DEFLATED
            mode = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}[kind] | 0o6777
            info.external_attr = mode << 16 | (0x10 if kind == "dir" else 0)
            out.writestr(info, data if isinstance(data, bytes) else data.encode())
    return path


def cve_2025_4517_members(outside: Path) -> list[Member]:
    """Directories of 247-byte names 16 deep behind a chain of links, so that the resolved path
    of a link at the bottom passes PATH_MAX and ``realpath`` stops resolving: a check by
    ``realpath`` takes that link for a directory inside, though it leads to ``outside``."""
    comp, path = "d" * 247, ""
    members: list[Member] = []
    for step in "abcdefghijklmnop":
        members += [("dir", f"{path}{comp}", b""), ("symlink", f"{path}{step}", comp)]
        path += comp + "/"
    deep = "/".join("abcdefghijklmnop") + "/" + "l" * 254
    return [*members, ("symlink", deep, str(outside)), ("file", f"{deep}/file", b"written through the link")]


def holes(outside: Path) -> dict[str, tuple[str, list[Member], bool, str]]:
    """Each known way out: (kind, members, environment mode?, words of the refusal)."""
    zeros = b"\0" * BOMB_BYTES
    return {
        "tar-hard-link-through-an-absolute-symlink-to-a-directory": (
            "tar",
            [("symlink", "v", str(outside / "dir")), ("hardlink", "h", "v/file")],
            True,
            "no file unpacked before it",
        ),
        "tar-hard-link-to-an-absolute-symlink-to-a-file": (
            "tar",
            [("symlink", "s", str(outside / "file")), ("hardlink", "h", "s")],
            True,
            "no file unpacked before it",
        ),
        "zip-symlink-then-a-member-of-its-name": (
            "zip",
            [("symlink", "x", str(outside / "file")), ("file", "x", b"written through the link")],
            True,
            "appears twice",
        ),
        "tar-resolved-path-longer-than-path-max": ("tar", cve_2025_4517_members(outside), True, "through the link"),
        "tar-gz-bomb": ("tar", [("file", "zeros", zeros)], False, "more than"),
        "zip-bomb": ("zip", [("file", "a", zeros[:BOMB_LIMIT]), ("file", "b", zeros[:BOMB_LIMIT])], False, "more than"),
        "member-count-bomb": ("tar", [("file", f"f{i}", b"") for i in range(MEMBER_LIMIT + 1)], False, "members"),
    }  # fmt: skip


def build(directory: Path, name: str, kind: str, members: list[Member]) -> Path:
    if kind == "zip":
        return build_zip(directory / f"{name}.zip", members)
    return build_tar(directory / f"{name}.tar.gz", members)


def harmless_environment() -> list[Member]:
    """What a packed environment holds: its interpreter by absolute path, files, links in it."""
    return [
        ("file", "pyvenv.cfg", b"home = /usr/bin\n"),
        ("symlink", "bin/python", sys.executable),
        ("symlink", "bin/python3", "python"),
        ("file", "lib/site-packages/probe.py", b"X = 1\n"),
        ("hardlink", "lib/site-packages/again.py", "lib/site-packages/probe.py"),
        ("symlink", "lib64", "lib"),
        ("symlink", "lib/site-packages/up", "../../bin"),
        ("dir", "share/empty", b""),
        ("file", "pyvenv.cfg", b"home = /usr/bin\nrelocated = true\n"),  # rewritten, as venv-pack does
    ]


# --- the script ----------------------------------------------------------------------------------


def load_extract(code: Path) -> types.ModuleType:
    """``blobsvc.cache._extract`` from ``code``, without running blobsvc's ``__init__`` (whose
    imports need the package's dependencies)."""
    for package in ("blobsvc", "blobsvc.cache"):
        module = types.ModuleType(package)
        module.__path__ = [str(code.joinpath(*package.split(".")))]
        sys.modules[package] = module
    return importlib.import_module("blobsvc.cache._extract")


def check_all(extract: Callable[..., None], refusal: type[Exception], base: Path) -> list[str]:
    """Unpack every hole and the harmless environment under ``base``; the problems found."""
    problems = []
    outside = sentinel(base)
    before = snapshot(base, skip=str(base / "trees"))
    (base / "trees").mkdir()
    for number, (name, (kind, members, environment, words)) in enumerate(holes(outside).items()):
        archive = build(base, name, kind, members)
        tree = base / "trees" / str(number)
        tree.mkdir()
        try:
            extract(archive, kind, tree, environment=environment, max_bytes=BOMB_LIMIT, max_members=MEMBER_LIMIT)
        except refusal as exc:
            if words not in str(exc):
                problems.append(f"{name}: refused, but not for {words!r}: {exc}")
        else:
            problems.append(f"{name}: not refused")
        archive.unlink()
    after = snapshot(base, skip=str(base / "trees"))
    if after != before:
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        problems.append(f"the sentinel tree changed: {changed}")
    tree = base / "trees" / "harmless"
    tree.mkdir()
    archive = build(base, "harmless", "tar", harmless_environment())
    extract(archive, "tar", tree, environment=True, max_bytes=BOMB_LIMIT, max_members=MEMBER_LIMIT)
    if (tree / "lib64" / "site-packages" / "probe.py").read_bytes() != b"X = 1\n":
        problems.append("the harmless environment did not unpack whole")
    if (tree / "pyvenv.cfg").read_bytes() != b"home = /usr/bin\nrelocated = true\n":
        problems.append("the harmless environment's pyvenv.cfg is not the last of its name")
    if os.readlink(tree / "bin" / "python") != sys.executable:
        problems.append("the harmless environment's bin/python is not its interpreter")
    for parent, dirs, files in os.walk(tree):
        for name in dirs + files:
            st = os.lstat(os.path.join(parent, name))
            if st.st_uid != os.geteuid() or (not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o7222):
                problems.append(f"{parent}/{name}: mode {st.st_mode:o}, owner {st.st_uid}")
    os.chmod(tree / "lib64", 0)  # neither read nor search, which binds all but root
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        importlib.import_module("blobsvc.cache._walk").empty(fd)
    except OSError as exc:
        problems.append(f"the harmless environment could not be removed: {exc}")
    finally:
        os.close(fd)
    if os.listdir(tree):
        problems.append("the harmless environment was not removed whole")
    return problems


def main() -> int:
    module = load_extract(Path(sys.argv[1]))
    with tempfile.TemporaryDirectory() as scratch:
        problems = check_all(module.extract, module.UnsafeArchive, Path(scratch))
    for problem in problems:
        print(problem)
    print(f"{sys.version.split()[0]} uid {os.geteuid()}: {'ok' if not problems else 'FAILED'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
