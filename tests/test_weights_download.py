"""Pretrained weight files fetched on first use and checked (metrics/weights.py), against a small HTTP server on
127.0.0.1: the fetch lands in torch hub's cache, is stamped and reused; a file with another full digest (even one that
shares the 8 hex digits of the name), another length, an endless body or a cut-short one never stands under the real
name; a download killed with SIGKILL mid-body leaves nothing under the real name and its partial file is removed by
the next run; a cached file is hashed once, then trusted by its stamp until its size, times or inode change, and a
file altered or replaced after stamping is checked again and refused; several processes fetch once; offline mode and a
failed download give the one paragraph naming the file and where to put it; train.py stops on a forged cached file
with that paragraph and exit status 2; a path the user gives is used without any network; and the table's full digests
and lengths agree with the names and torchvision's metadata."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torchvision
from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3

from pixelsmith.metrics import image_metrics, weights
from pixelsmith.metrics.weights import (
    OFFLINE_ENV,
    PUBLISHED,
    STAMP_SUFFIX,
    MissingWeightsError,
    PublishedWeights,
    resolve_weights_file,
    stamp_path,
)
from tests.conftest import CHECKOUT, run_cli

BODY = bytes(range(256)) * 40  # 10,240 bytes
DIGEST = hashlib.sha256(BODY).hexdigest()
OTHER = BODY[::-1]  # the same length, other bytes
OTHER_DIGEST = hashlib.sha256(OTHER).hexdigest()
NAME = "fake-weights-0123abcd.pth"
# What /slow sends at once: more than a file object buffers (8 KiB), so part of the body reaches the disk.
SLOW_HEAD = 9000


class _Server:
    """Serves /good (BODY), /wrong (OTHER: BODY's length, other bytes), /truncated (BODY's length announced, 400
    bytes sent, connection closed), /endless (no length announced, bytes until the client hangs up), /slow (BODY's
    length announced, SLOW_HEAD bytes sent, then a byte every 0.5 s) and /missing (404); counts the requests for each
    path."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.files: dict[str, bytes] = {}  # more paths a test serves
        self.delay_s = 0.0
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests[self.path] = server.requests.get(self.path, 0) + 1
                time.sleep(server.delay_s)
                if self.path == "/missing":
                    self.send_error(404)
                    return
                if self.path == "/endless":
                    self.send_response(200)
                    self.end_headers()  # HTTP/1.0, no Content-Length: the body ends when the connection does
                    self._drip(b"\0" * 65536, pause_s=0.0)
                    return
                body = OTHER if self.path == "/wrong" else BODY
                body = server.files.get(self.path, body)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.path == "/truncated":
                    self.wfile.write(body[:400])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if self.path == "/slow":
                    self.wfile.write(body[:SLOW_HEAD])
                    self.wfile.flush()
                    self._drip(b"\1", pause_s=0.5)
                    return
                self.wfile.write(body)

            def _drip(self, piece: bytes, pause_s: float) -> None:
                try:
                    while not server.stop.is_set():
                        self.wfile.write(piece)
                        self.wfile.flush()
                        time.sleep(pause_s)
                except OSError:  # the client hung up (or was killed)
                    pass

            def log_message(self, *args) -> None:  # quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    served = _Server()
    yield served
    served.close()


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty torch hub cache, downloads allowed (the test session sets PIXELSMITH_OFFLINE=1)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.delenv(OFFLINE_ENV, raising=False)
    return tmp_path / "torch_home" / "hub" / "checkpoints"


def _publish(
    monkeypatch, url: str, sha256: str = DIGEST, size: int = len(BODY), key: str = "inception-v3-fid"
) -> None:
    monkeypatch.setitem(PUBLISHED, key, PublishedWeights(NAME, url, sha256, size))


def _resolve(config_path=None) -> Path:
    return resolve_weights_file(
        what="FID Inception-v3",
        published="inception-v3-fid",
        config_path=config_path,
        config_key="eval.weights_path",
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # renamed or removed between listing and looking
        return 0


def _leftovers(directory: Path) -> list[str]:
    """What a download left in the cache besides its lock and stamp: partial files, a file under the final name."""
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith((".lock", STAMP_SUFFIX)))


@pytest.fixture
def hash_calls(monkeypatch) -> list[Path]:
    """The files the weights module hashes whole, in order (a download hashes as it receives, so it is not one)."""
    calls: list[Path] = []
    real = weights.file_sha256

    def counting(path: Path):
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(weights, "file_sha256", counting)
    return calls


def _assert_refused_paragraph(message: str, path: Path, found: str, expected: str) -> None:
    """The refusal of a cached file: one paragraph naming the file, both digests, and the ways out."""
    assert "\n" not in message and "Traceback" not in message
    assert str(path) in message
    assert f"its SHA-256 is {found} ({len(BODY)} bytes)" in message
    assert f"the published file's is {expected} ({len(BODY)} bytes)" in message
    assert "Delete it and run again" in message and "place it by hand in" in message
    assert "`eval.weights_path=/path/to/" in message


def test_a_missing_file_is_fetched_into_the_hub_cache_once_stamped_and_reused(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/good"))
    path = _resolve()
    assert path == hub / NAME and path.read_bytes() == BODY
    assert _leftovers(hub) == [NAME]  # no temporary file stays beside it
    stamp = json.loads(stamp_path(path).read_text())
    stat = path.stat()
    assert stamp == {
        "file": NAME,
        "sha256": DIGEST,
        "size": len(BODY),
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
        "inode": stat.st_ino,
    }
    assert _resolve() == path and server.requests == {"/good": 1}  # the second run reads the cache


def test_a_digest_prefix_as_in_the_file_name_is_checked_too(server, hub, monkeypatch):
    # The mode for a file whose full digest nobody publishes (no entry of the table uses it): prefix and length.
    _publish(monkeypatch, server.url("/good"), sha256=DIGEST[:8].upper())
    assert _resolve().read_bytes() == BODY
    # There the length carries the rest of the check: the same bytes are refused under another published length.
    _publish(monkeypatch, server.url("/good"), sha256=DIGEST[:8], size=len(BODY) + 1)
    with pytest.raises(MissingWeightsError) as error:
        _resolve()
    assert f"published file's is one beginning {DIGEST[:8]} ({len(BODY) + 1} bytes; only those digits" in str(
        error.value
    )


def test_a_wrong_checksum_is_refused_naming_both_digests_and_nothing_stays(server, hub, monkeypatch):
    _publish(
        monkeypatch, server.url("/wrong")
    )  # OTHER has BODY's length, so only the digest tells them apart
    with pytest.raises(MissingWeightsError) as error:
        _resolve()
    message = str(error.value)
    assert f"have the SHA-256 {OTHER_DIGEST}, not the published {DIGEST} ({len(BODY)} bytes)" in message
    assert server.url("/wrong") in message and "nothing was kept" in message
    assert _leftovers(hub) == [] and not stamp_path(hub / NAME).exists()
    assert "\n" not in message


def test_a_forged_file_sharing_the_names_hex_digits_is_refused(server, hub, monkeypatch):
    # The table's entry begins with the 8 hex digits of the served file's digest, as a second preimage of the
    # name's digits would: the old check (those digits only) took such a file; the full digest refuses it.
    published = OTHER_DIGEST[:8] + DIGEST[8:]
    _publish(monkeypatch, server.url("/wrong"), sha256=published)
    with pytest.raises(MissingWeightsError) as error:
        _resolve()
    message = str(error.value)
    assert f"have the SHA-256 {OTHER_DIGEST}, not the published {published}" in message
    assert _leftovers(hub) == []


def test_a_body_of_another_announced_length_is_refused_before_it_is_read(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/good"), size=len(BODY) - 1)
    with pytest.raises(MissingWeightsError, match=f"announced {len(BODY)} bytes, but the published file has"):
        _resolve()
    assert _leftovers(hub) == []


def test_an_endless_body_is_cut_one_byte_past_the_length_and_refused(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/endless"))
    with pytest.raises(MissingWeightsError) as error:
        _resolve()
    message = str(error.value)
    assert (
        f"more than the {len(BODY)} bytes of the published file (stopped reading at {len(BODY) + 1})"
        in message
    )
    assert _leftovers(hub) == [] and "\n" not in message


def test_a_download_cut_short_is_never_left_as_the_real_file(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/truncated"))
    with pytest.raises(MissingWeightsError, match=f"closed after 400 of {len(BODY)} bytes"):
        _resolve()
    assert _leftovers(hub) == []
    # The next attempt, against a good copy, is not fooled by anything the first left.
    _publish(monkeypatch, server.url("/good"))
    assert _resolve().read_bytes() == BODY


_KILLED_CHILD = """
import sys
from pixelsmith.metrics.weights import PUBLISHED, PublishedWeights, resolve_weights_file

url, sha256, size, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
PUBLISHED["inception-v3-fid"] = PublishedWeights(name, url, sha256, size)
resolve_weights_file(what="FID Inception-v3", published="inception-v3-fid", config_path=None, config_key="k")
"""


@pytest.mark.slow  # a child process that imports torch
def test_a_download_killed_mid_body_leaves_nothing_under_the_name_and_the_next_run_cleans_up(
    server, hub, monkeypatch, tmp_path
):
    script = tmp_path / "fetch.py"
    script.write_text(_KILLED_CHILD)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(CHECKOUT / "src"), os.environ.get("PYTHONPATH")])),
    )
    child = subprocess.Popen(
        [sys.executable, str(script), server.url("/slow"), DIGEST, str(len(BODY)), NAME],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300  # the child imports torch on a loaded machine
        # Whatever the download is writing, under whatever name: mid-body once some of the body is on disk.
        written: list[Path] = []
        while not written and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
            candidates = list(hub.iterdir()) if hub.exists() else []
            written = [p for p in candidates if not p.name.endswith(".lock") and _size(p) > 0]
        assert written, (
            f"the child never got mid-body: {child.stderr.read().decode() if child.poll() else ''}"
        )
        os.kill(child.pid, signal.SIGKILL)  # no handler, no finally: what a power cut or the OOM killer does
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()
    assert not (hub / NAME).exists() and not stamp_path(hub / NAME).exists()
    stale = _leftovers(hub)  # the killed process's partial file, and nothing else
    assert len(stale) == 1 and re.fullmatch(rf"\.{re.escape(NAME)}\.[0-9a-f]{{32}}\.partial", stale[0])
    _publish(monkeypatch, server.url("/good"))
    assert _resolve().read_bytes() == BODY
    assert _leftovers(hub) == [NAME]  # the stale partial was removed under the lock


def test_stale_partial_files_are_removed_under_the_lock_and_others_kept(server, hub, monkeypatch):
    hub.mkdir(parents=True)
    stale = hub / f".{NAME}.0123456789abcdef.partial"
    stale.write_bytes(BODY[:100])
    someone_elses = hub / ".another-file.pth.0123456789abcdef.partial"
    someone_elses.write_bytes(b"x")
    _publish(monkeypatch, server.url("/good"))
    assert _resolve().read_bytes() == BODY
    assert not stale.exists() and someone_elses.exists()
    # A run that only checks the cached file clears them too.
    stale.write_bytes(BODY[:100])
    assert _resolve() == hub / NAME and not stale.exists()


def test_an_untouched_stamped_file_is_not_hashed_again(server, hub, monkeypatch, hash_calls):
    _publish(monkeypatch, server.url("/good"))
    path = _resolve()
    assert hash_calls == []  # the download hashed what it received; no second read
    for _ in range(3):
        assert _resolve() == path
    assert hash_calls == [] and server.requests == {"/good": 1}
    stamp_path(path).unlink()  # no stamp (a file copied in by hand): hashed once, then stamped
    assert _resolve() == path and hash_calls == [path]
    assert _resolve() == path and hash_calls == [path]


def test_a_file_placed_by_hand_is_checked_once_then_trusted(hub, monkeypatch, hash_calls):
    _publish(monkeypatch, "http://127.0.0.1:9/never-used")
    monkeypatch.setenv(OFFLINE_ENV, "1")  # a cluster without internet: the user copied the file in
    hub.mkdir(parents=True)
    (hub / NAME).write_bytes(BODY)
    assert _resolve() == hub / NAME and stamp_path(hub / NAME).is_file()
    assert _resolve() == hub / NAME and hash_calls == [hub / NAME]


def test_a_cached_file_altered_after_stamping_is_checked_again_and_refused(
    server, hub, monkeypatch, hash_calls
):
    _publish(monkeypatch, server.url("/good"))
    path = _resolve()
    stamp_path(path).unlink()
    assert _resolve() == path  # hashed here too, so this process has the good file's digest at hand
    stamped = path.stat()
    path.write_bytes(OTHER)  # the same size
    os.utime(path, ns=(stamped.st_atime_ns, stamped.st_mtime_ns + 10**9))
    with pytest.raises(MissingWeightsError) as error:
        _resolve()
    _assert_refused_paragraph(str(error.value), path, found=OTHER_DIGEST, expected=DIGEST)
    assert hash_calls == [path, path] and path.read_bytes() == OTHER  # checked again; the file left as it is
    assert server.requests == {"/good": 1}  # nothing fetched over it
    # Its old modification time put back: the change time still differs, so neither the stamp nor a digest this
    # process remembers for the old file stands for it: checked again, and refused.
    os.utime(path, ns=(stamped.st_atime_ns, stamped.st_mtime_ns))
    with pytest.raises(MissingWeightsError, match=f"its SHA-256 is {OTHER_DIGEST}"):
        _resolve()
    assert hash_calls == [path] * 3


def test_a_replaced_cached_file_is_refused_even_offline(hub, monkeypatch):
    _publish(monkeypatch, "http://127.0.0.1:9/never-used")
    monkeypatch.setenv(OFFLINE_ENV, "1")
    hub.mkdir(parents=True)
    (hub / NAME).write_bytes(BODY)
    assert _resolve() == hub / NAME
    replacement = hub / "incoming.pth"
    replacement.write_bytes(OTHER)
    os.replace(
        replacement, hub / NAME
    )  # another file under the name, as a tool that fetched it would leave it
    with pytest.raises(MissingWeightsError) as error:
        _resolve()
    _assert_refused_paragraph(str(error.value), hub / NAME, found=OTHER_DIGEST, expected=DIGEST)


@pytest.mark.slow  # an entry point in a subprocess
def test_a_forged_cached_file_stops_train_py_with_the_paragraph(tmp_path):
    """A file under a published name that is not the published file (here a small stand-in for a forged
    vgg19-dcbb9e9d.pth): train.py exits 2 with the one paragraph, before training, and leaves the file as it is."""
    checkpoints = tmp_path / "torch_home" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    forged = checkpoints / "vgg19-dcbb9e9d.pth"
    forged.write_bytes(OTHER)
    published = PUBLISHED["vgg19"]
    result = run_cli(
        ["train.py", "experiment=style_adain", f"hydra.run.dir={tmp_path}/run"],
        timeout=300,
        env_extra={"TORCH_HOME": str(tmp_path / "torch_home")},
    )
    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    assert "Traceback" not in text
    paragraph = next(line for line in text.splitlines() if "is not the published" in line)
    assert f"{forged} is not the published vgg19-dcbb9e9d.pth" in paragraph
    assert f"its SHA-256 is {OTHER_DIGEST} ({len(OTHER)} bytes)" in paragraph
    assert f"the published file's is {published.sha256} ({published.size} bytes)" in paragraph
    assert published.url in paragraph and "model.loss_net.weights_path=" in paragraph
    assert forged.read_bytes() == OTHER and not (tmp_path / "run" / "checkpoints").exists()


def test_a_malformed_or_oversized_stamp_only_means_hashing_again(hub, monkeypatch, hash_calls):
    _publish(monkeypatch, "http://127.0.0.1:9/never-used")
    monkeypatch.setenv(OFFLINE_ENV, "1")
    hub.mkdir(parents=True)
    (hub / NAME).write_bytes(BODY)
    for stamp in (b"[" * 4000, b"{" * 100_000, b"\xff\xfe not json", b'{"sha256": 1}'):
        stamp_path(hub / NAME).write_bytes(stamp)
        assert _resolve() == hub / NAME
    assert hash_calls == [hub / NAME] * 4
    assert json.loads(stamp_path(hub / NAME).read_text())["sha256"] == DIGEST  # replaced by a good one
    if hasattr(os, "mkfifo"):  # a FIFO under the stamp's name: read without blocking, so the run goes on
        stamp_path(hub / NAME).unlink()
        os.mkfifo(stamp_path(hub / NAME))
        assert _resolve() == hub / NAME and len(hash_calls) == 5


def test_a_read_only_cache_is_checked_on_every_run_without_lock_or_stamp(hub, monkeypatch, hash_calls):
    _publish(monkeypatch, "http://127.0.0.1:9/never-used")
    hub.mkdir(parents=True)
    (hub / NAME).write_bytes(BODY)
    monkeypatch.setattr(weights.os, "access", lambda path, mode: False)  # a shared, read-only $TORCH_HOME
    assert _resolve() == hub / NAME and _resolve() == hub / NAME
    assert hash_calls == [hub / NAME] * 2 and sorted(p.name for p in hub.iterdir()) == [NAME]


def test_an_http_error_is_the_paragraph_naming_file_place_and_key(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/missing"))
    with pytest.raises(MissingWeightsError) as error:
        _resolve()
    message = str(error.value)
    assert "HTTP 404" in message and f"{NAME} was not found in {hub}" in message
    assert "`eval.weights_path=/path/to/" in message and "\n" not in message
    assert _leftovers(hub) == []


def test_offline_mode_fetches_nothing_and_says_where_to_put_the_file(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/good"))
    monkeypatch.setenv(OFFLINE_ENV, "1")
    with pytest.raises(MissingWeightsError) as error:
        _resolve()
    message = str(error.value)
    assert f"{OFFLINE_ENV}=1 forbids downloading it" in message
    assert NAME in message and str(hub) in message and server.url("/good") in message
    assert "`eval.weights_path=/path/to/" in message and "\n" not in message
    assert server.requests == {} and not hub.exists()


def test_offline_a_file_gone_while_waiting_for_the_lock_is_missing_and_nothing_is_fetched(
    server, hub, monkeypatch
):
    _publish(monkeypatch, server.url("/good"))
    monkeypatch.setenv(OFFLINE_ENV, "1")
    hub.mkdir(parents=True)
    (hub / NAME).write_bytes(BODY)
    real_lock = weights._entry_lock

    def lock_after_another_process_removed_it(*args, **kwargs):
        (hub / NAME).unlink()
        return real_lock(*args, **kwargs)

    monkeypatch.setattr(weights, "_entry_lock", lock_after_another_process_removed_it)
    with pytest.raises(MissingWeightsError, match=f"{OFFLINE_ENV}=1 forbids downloading it"):
        _resolve()
    assert server.requests == {} and _leftovers(hub) == []


def test_a_file_the_user_gives_is_used_as_is_without_any_network(server, hub, monkeypatch, tmp_path):
    _publish(monkeypatch, server.url("/good"))
    mine = tmp_path / "my_inception.pth"
    mine.write_bytes(b"the user's own copy, whatever its digest")
    assert _resolve(config_path=mine) == mine
    with pytest.raises(MissingWeightsError, match=r"`eval.weights_path=.*nowhere.pth` does not exist"):
        _resolve(config_path=tmp_path / "nowhere.pth")
    assert server.requests == {} and not hub.exists()


def test_processes_fetching_at_once_download_once(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/good"))
    server.delay_s = 0.3  # both are waiting while the first download runs
    paths, errors = [], []

    def fetch() -> None:
        try:
            paths.append(_resolve())
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=fetch) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == [] and paths == [hub / NAME] * 3
    assert server.requests == {"/good": 1} and (hub / NAME).read_bytes() == BODY


def test_lpips_fetches_its_backbone_on_first_use(server, hub, monkeypatch):
    # SqueezeNet keeps the served file small (5 MB); the other backbones and the VGG loss network take this path.
    backbone = torchvision.models.squeezenet1_1(weights=None)
    buffer = io.BytesIO()
    torch.save(backbone.state_dict(), buffer)
    payload = buffer.getvalue()
    server.files["/squeezenet"] = payload
    name = image_metrics.lpips_backbone_file_name("squeeze")
    monkeypatch.setitem(
        PUBLISHED,
        "squeezenet1_1",
        PublishedWeights(name, server.url("/squeezenet"), hashlib.sha256(payload).hexdigest(), len(payload)),
    )
    network = image_metrics.build_lpips_network("squeeze")
    assert (hub / name).read_bytes() == payload
    first_conv = next(m for m in network.net.modules() if isinstance(m, torch.nn.Conv2d))
    torch.testing.assert_close(first_conv.weight, backbone.features[0].weight)


def test_the_table_matches_the_addresses_torch_fidelity_and_torchvision_use():
    assert PUBLISHED["inception-v3-fid"].url == URL_INCEPTION_V3
    enums = {
        "vgg16": torchvision.models.VGG16_Weights.IMAGENET1K_V1,
        "vgg19": torchvision.models.VGG19_Weights.IMAGENET1K_V1,
        "alexnet": torchvision.models.AlexNet_Weights.IMAGENET1K_V1,
        "squeezenet1_1": torchvision.models.SqueezeNet1_1_Weights.IMAGENET1K_V1,
    }
    for key, enum in enums.items():
        assert PUBLISHED[key].url == enum.url
        # torchvision gives each file's size in MiB to 3 decimals: the recorded length is that file's.
        assert PUBLISHED[key].size / 2**20 == pytest.approx(enum.meta["_file_size"], abs=0.0005)
    for entry in PUBLISHED.values():
        assert entry.url.rsplit("/", 1)[-1] == entry.file_name
        # A full SHA-256 for every file, and it begins with the digits the name carries (torch hub's convention).
        assert entry.has_full_digest and re.fullmatch(r"[0-9a-f]{64}", entry.sha256)
        for name in entry.names:
            assert entry.sha256.startswith(re.search(torch.hub.HASH_REGEX, name).group(1))
