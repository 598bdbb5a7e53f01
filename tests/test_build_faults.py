"""Builds under abuse: foreign and odd output folders, a full disk (a real small tmpfs where this
machine lets us mount one), builds killed mid-way, Ctrl-C after the swap, repositories that must own
their files, damaged caches and missing files. Nothing the user had may be lost, and every failure
is an `Error:` line with a `fix:` line, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit.cli.main import cli
from toolkit.serve.launcher import check_repository

from tiny import make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


LIMITS = ("--max-seq-len", "256", "--max-input-len", "128", "--max-output-len", "64")


def build(*args: str):
    if "-m" in args:  # the tiny checkpoint: limits within its 512 positions
        args = (*args, *LIMITS)
    return CliRunner().invoke(cli, ["build", *args])


def tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def assert_clean_error(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Error:" in result.output and "fix:" in result.output, result.output
    for needle in needles:
        assert needle in result.output, result.output


# --- foreign output folders ----------------------------------------------------------------------


def test_a_foreign_folder_with_a_json_object_manifest_is_refused_and_untouched(tmp_path):
    """The reported case: an app whose manifest.json is a JSON object lost its src/."""
    app = tmp_path / "app"
    (app / "src").mkdir(parents=True)
    (app / "manifest.json").write_text('{"name":"app"}')
    (app / "src" / "index.js").write_text("keep")
    before = tree(app)
    result = build("-t", "synthetic", "-o", str(app))
    assert_clean_error(result, str(app), "not a toolkit repository")
    assert tree(app) == before


@pytest.mark.parametrize(
    "manifest",
    [
        "[1, 2]",
        '"text"',
        "{not json",
        '{"build_key": "x"}',  # looks like ours but has no generator marker
        '{"build_key": "x", "generator": "someone-else"}',
    ],
)
def test_odd_manifests_are_refused_without_a_traceback(tmp_path, manifest):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "manifest.json").write_text(manifest)
    (folder / "data.bin").write_bytes(b"\0" * 10)
    before = tree(folder)
    assert_clean_error(build("-t", "synthetic", "-o", str(folder)), str(folder))
    assert tree(folder) == before
    served = CliRunner().invoke(cli, ["serve", "--repo", str(folder)])
    assert_clean_error(served, str(folder))


def test_a_file_as_output_is_refused(tmp_path):
    target = tmp_path / "file"
    target.write_text("keep")
    assert_clean_error(build("-t", "synthetic", "-o", str(target)), "is a file")
    assert target.read_text() == "keep"


# --- a full disk -----------------------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    """tmpfs(size) -> a tmpfs of our own: a real filesystem that fills up. Skipped where mounting is not
    permitted."""
    mounted = []

    def mount(size: str) -> Path:
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def test_a_disk_too_small_is_refused_before_writing(tiny, tmpfs):
    """The tiny checkpoint's repository (~400 kB) on 128 kB: refused up front with both sizes, nothing written."""
    small = tmpfs("128k")
    result = build("-t", "cpu", "-m", str(tiny), "-o", str(small / "repo"))
    assert_clean_error(result, "MB are free")
    assert list(small.iterdir()) == [] or [p.name for p in small.iterdir()] == [".repo.lock"]


def test_a_disk_that_fills_during_the_write_gives_an_error_and_keeps_the_old_repository(
    tiny, tmpfs, monkeypatch
):
    """Another writer takes the space after our free-space check: the write itself hits ENOSPC."""
    import toolkit.repository.writer as writer

    small_tmpfs = tmpfs("3m")
    repo = small_tmpfs / "repo"
    assert build("-t", "synthetic", "-m", str(tiny), "-o", str(repo)).exit_code == 0
    before = tree(repo)
    filler = small_tmpfs / "filler"
    with open(filler, "wb") as handle:  # leave less than a second repository needs
        free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
        handle.write(b"\0" * max(free - 64 * 1024, 0))
    # the race: space went after it
    monkeypatch.setattr(writer, "check_free_space", lambda *a, **k: None)
    result = build("-t", "synthetic", "-m", str(tiny), "-o", str(repo), "--max-batch-size", "4")
    assert_clean_error(result, "is full", "nothing was changed")
    assert tree(repo) == before
    assert not [
        p for p in small_tmpfs.iterdir() if p.name.startswith((".repo.building", ".repo.old"))
    ]


# --- killed builds and Ctrl-C --------------------------------------------------------------------


def test_leftovers_of_killed_builds_are_removed_by_the_next_build(tiny, tmp_path):
    """kill -9 of a real build while it writes, several times; the next build cleans what they left."""
    repo = tmp_path / "repo"
    argv = [
        sys.executable,
        "-m",
        "toolkit.cli.main",
        "build",
        "-t",
        "cpu",
        "-m",
        str(tiny),
        "-o",
        str(repo),
        *LIMITS,
    ]
    caught = 0
    for _ in range(3):
        seen = set(tmp_path.glob(".repo.building-*"))
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not set(tmp_path.glob(".repo.building-*")) - seen and time.monotonic() < deadline:
            if process.poll() is not None:
                break
            time.sleep(0.005)
        caught += bool(set(tmp_path.glob(".repo.building-*")) - seen)
        process.send_signal(signal.SIGKILL)
        process.wait()
    left = list(tmp_path.glob(".repo.building-*"))
    (
        tmp_path / ".repo.old-12345-abc"
        # a retired repository a kill left between the renames
    ).mkdir()
    assert caught == 3, "builds were not caught mid-write (the test would test nothing)"
    assert len(left) == 1  # each build first removes what killed ones left: leftovers never pile up
    assert build("-t", "cpu", "-m", str(tiny), "-o", str(repo)).exit_code == 0
    assert not list(tmp_path.glob(".repo.*-*"))
    check_repository(repo)


def test_ctrl_c_after_the_swap_reports_success(tiny, tmp_path, monkeypatch):
    """SIGINT arriving while the new repository is swapped in: it is complete, so exit 0 and say so."""
    import toolkit.repository.writer as writer

    real = writer._swap_into_place

    def swap_then_interrupt(staging, output):
        os.kill(os.getpid(), signal.SIGINT)  # held until the swap is done
        real(staging, output)

    monkeypatch.setattr(writer, "_swap_into_place", swap_then_interrupt)
    result = build("-t", "synthetic", "-m", str(tiny), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 0, result.output
    assert "it is complete" in result.output and "Aborted" not in result.output
    check_repository(tmp_path / "repo")


# --- repositories own their files --------------------------------------------------------------


def test_repository_weights_are_copies_never_hard_links(tiny, tmp_path):
    repo = tmp_path / "repo"
    assert build("-t", "cpu", "-m", str(tiny), "-o", str(repo)).exit_code == 0
    source = tiny / "model.safetensors"
    original = source.read_bytes()
    copy = next((repo / "tensorrt_llm" / "1").rglob("*.safetensors"))
    assert copy.stat().st_nlink == 1 and copy.stat().st_ino != source.stat().st_ino
    with copy.open("r+b") as handle:  # damage the repository's copy
        handle.truncate(10)
    assert source.read_bytes() == original  # the user's checkpoint is untouched


def test_a_damaged_conversion_cache_is_not_reused(tmp_path):
    """The embedded model's converted checkpoint is reused only while its files hash as written."""
    from toolkit.model import embedded

    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    (folder / "config.json").write_text("{}")
    embedded._record(folder)
    assert embedded._intact(folder)
    weights = folder / "model.safetensors"
    stat = weights.stat()
    with weights.open("r+b") as handle:  # same size, same mtime: only the content differs
        handle.seek(100)
        handle.write(b"broken")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert not embedded._intact(folder)


def test_repositories_are_readable_by_other_users(tiny, tmp_path):
    """mkdtemp makes 0700 folders; a server running as another user must be able to read the repository."""
    repo = tmp_path / "repo"
    previous = os.umask(0o022)
    try:
        assert build("-t", "synthetic", "-m", str(tiny), "-o", str(repo)).exit_code == 0
    finally:
        os.umask(previous)
    assert repo.stat().st_mode & 0o777 == 0o755
    for path in repo.rglob("*"):
        assert path.stat().st_mode & 0o004, f"{path} is not world-readable"


def test_serve_names_a_missing_tokenizer_file(tiny, tmp_path):
    repo = tmp_path / "repo"
    assert build("-t", "synthetic", "-m", str(tiny), "-o", str(repo)).exit_code == 0
    missing = repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"
    missing.unlink()
    result = CliRunner().invoke(cli, ["serve", "--repo", str(repo)])
    assert_clean_error(result, "preprocessing/1/tokenizer/tokenizer.json (missing)")


def test_manifest_json_of_a_built_repository_is_what_serve_reads(tiny, tmp_path):
    """The marker is checked strictly both ways: our own manifest is recognised after a build."""
    repo = tmp_path / "repo"
    assert build("-t", "synthetic", "-m", str(tiny), "-o", str(repo)).exit_code == 0
    data = json.loads((repo / "manifest.json").read_text())
    assert data["generator"] == "toolkit"
    assert (
        build(
            "-t", "synthetic", "-m", str(tiny), "-o", str(repo), "--max-batch-size", "2"
        ).exit_code
        == 0
    )


# --- locks ---------------------------------------------------------------------------------------


def test_a_build_leaves_nothing_beside_its_output(tiny, tmp_path):
    """The folder that holds the output gets the repository and nothing else: no lock file, no
    leftovers (the quickstart builds into a git checkout, which must stay clean)."""
    repo = tmp_path / "repo"
    assert build("-t", "cpu", "-m", str(tiny), "-o", str(repo)).exit_code == 0
    assert build("-t", "cpu", "-m", str(tiny), "-o", str(repo)).exit_code == 0  # a rebuild too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from toolkit.fsutil import file_lock
lock, log, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
for _ in range(rounds):
    with file_lock(lock):
        with open(log, "a") as out:
            out.write("in\\n"); out.flush(); time.sleep(0.002); out.write("out\\n")
"""


def test_a_lock_that_removes_its_file_still_excludes(tmp_path):
    """Removing the lock file on release must not let two holders in at once (one that waited on the
    removed file's inode would otherwise hold a lock nobody else sees)."""
    lock, log = tmp_path / ".x.lock", tmp_path / "log"
    workers = [
        subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(lock), str(log), "60"])
        for _ in range(4)
    ]
    assert all(w.wait(120) == 0 for w in workers)
    lines = log.read_text().split()
    assert len(lines) == 4 * 60 * 2
    assert lines == ["in", "out"] * (4 * 60), "two holders were inside the lock at once"
    assert not lock.exists()


# --- a user's changes to a built repository ------------------------------------------------------


def test_a_rebuild_over_a_changed_repository_is_refused_and_loses_nothing(tiny, tmp_path):
    """`serve --allow-modified` invites editing a repository: a rebuild must not throw edits away."""
    repo = tmp_path / "repo"
    assert build("-t", "synthetic", "-m", str(tiny), "-o", str(repo)).exit_code == 0
    (repo / "NOTES.md").write_text("mine\n")
    config = repo / "preprocessing" / "config.pbtxt"
    config.write_text(config.read_text() + "# tuned by hand\n")
    before = tree(repo)
    result = build("-t", "synthetic", "-m", str(tiny), "-o", str(repo), "--max-batch-size", "4")
    assert_clean_error(
        result, "NOTES.md (added)", "preprocessing/config.pbtxt (modified)", "--discard-changes"
    )
    assert tree(repo) == before
    result = build(
        "-t", "synthetic", "-m", str(tiny), "-o", str(repo), "--max-batch-size", "4",
        "--discard-changes",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not (repo / "NOTES.md").exists()
    check_repository(repo)


def test_leftover_cleanup_treats_the_output_name_literally(tiny, tmp_path):
    """An output named like a glob pattern must not remove another output's live staging folder."""
    other = tmp_path / ".ab.building-999-live"
    other.mkdir()
    assert build("-t", "synthetic", "-m", str(tiny), "-o", str(tmp_path / "a[b]")).exit_code == 0
    assert other.exists()


# --- round two: what a checkpoint may bring in ---------------------------------------------------
def _checkpoint_copy(tiny: Path, where: Path) -> Path:
    import shutil

    shutil.copytree(tiny, where)
    return where


def test_a_checkpoint_link_to_a_file_outside_it_is_refused(tiny, tmp_path):
    """A chat_template.jinja linking to a private (0600) file elsewhere was copied into the repository
    (as 0644, readable by all) and used."""
    checkpoint = _checkpoint_copy(tiny, tmp_path / "ckpt")
    secret = tmp_path / "secret.txt"
    secret.write_text("{{ 'the secret' }}")
    secret.chmod(0o600)
    (checkpoint / "chat_template.jinja").unlink()
    (checkpoint / "chat_template.jinja").symlink_to(secret)
    repo = tmp_path / "repo"
    result = build("-t", "cpu", "-m", str(checkpoint), "-o", str(repo))
    assert_clean_error(result, "chat_template.jinja", str(secret))
    assert not repo.exists()


def test_links_inside_the_checkpoint_still_build(tiny, tmp_path):
    """The Hugging Face cache's own layout: snapshot files link to blobs inside the cached repo."""
    cache = tmp_path / "models--acme--tiny"
    checkpoint = _checkpoint_copy(tiny, cache / "snapshots" / ("0" * 40))
    (cache / "blobs").mkdir()
    blob = cache / "blobs" / "tokenizer.json"
    (checkpoint / "tokenizer.json").rename(blob)
    (checkpoint / "tokenizer.json").symlink_to(Path("../../blobs/tokenizer.json"))
    result = build("-t", "synthetic", "-m", str(checkpoint), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 0, result.output
