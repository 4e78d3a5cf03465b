"""The host-side cache of pinned harness packages (filled once, atomically, under a lock)."""

from __future__ import annotations

import io
import tarfile
import threading
from pathlib import Path

import pytest

from harnesses.assets import ASSETS_ENV, COMPLETE_MARKER, assets_root, ensure_asset, extract_member
from harnesses.errors import HarnessAssetError


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path / "assets"))
    return tmp_path / "assets"


def test_root_follows_the_environment(cache: Path) -> None:
    assert assets_root() == cache


def test_an_asset_is_filled_once(cache: Path) -> None:
    calls: list[Path] = []

    def fill(folder: Path) -> None:
        calls.append(folder)
        (folder / "pkg.whl").write_text("wheel")

    first = ensure_asset("pkg-1.0", fill)
    second = ensure_asset("pkg-1.0", fill)
    assert first == second == cache / "pkg-1.0"
    assert len(calls) == 1
    assert (first / "pkg.whl").read_text() == "wheel"
    assert (first / COMPLETE_MARKER).is_file()


def test_a_failed_fill_leaves_nothing_behind_and_is_retried(cache: Path) -> None:
    def broken(folder: Path) -> None:
        (folder / "half").write_text("x")
        raise HarnessAssetError("network down")

    with pytest.raises(HarnessAssetError, match="network down"):
        ensure_asset("pkg-2.0", broken)
    assert not (cache / "pkg-2.0").exists()
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    assert (ensure_asset("pkg-2.0", lambda folder: None) / COMPLETE_MARKER).is_file()


def test_concurrent_callers_share_one_fill(cache: Path) -> None:
    calls: list[int] = []
    gate = threading.Event()

    def slow(folder: Path) -> None:
        calls.append(1)
        gate.wait(5)

    threads = [threading.Thread(target=ensure_asset, args=("pkg-3.0", slow)) for _ in range(4)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(10)
    assert len(calls) == 1


def make_tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return path


def test_extract_member_writes_an_executable(tmp_path: Path) -> None:
    tarball = make_tarball(
        tmp_path / "pkg.tgz", {"package/bin/tool": b"\x7fELF", "package/package.json": b"{}"}
    )
    target = extract_member(tarball, "package/bin/tool", tmp_path / "out" / "tool")
    assert target.read_bytes() == b"\x7fELF"
    assert target.stat().st_mode & 0o111


def test_extract_member_names_what_is_missing(tmp_path: Path) -> None:
    tarball = make_tarball(tmp_path / "pkg.tgz", {"package/package.json": b"{}"})
    with pytest.raises(HarnessAssetError, match="package/bin/tool"):
        extract_member(tarball, "package/bin/tool", tmp_path / "tool")
