"""Pretrained weight files fetched on first use (metrics/weights.py), against a small HTTP server on 127.0.0.1: the
fetch lands in torch hub's cache and is reused, a wrong checksum or a cut-short body never stands under the real
name, several processes fetch once, offline mode and a failed download give the one paragraph naming the file and
where to put it, and a path the user gives is used without any network."""

from __future__ import annotations

import hashlib
import http.server
import io
import re
import threading
import time
from pathlib import Path

import pytest
import torch
import torchvision
from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3

from pixelsmith.metrics import image_metrics
from pixelsmith.metrics.weights import (
    OFFLINE_ENV,
    PUBLISHED,
    MissingWeightsError,
    PublishedWeights,
    resolve_weights_file,
)

BODY = bytes(range(256)) * 40  # 10,240 bytes
DIGEST = hashlib.sha256(BODY).hexdigest()
NAME = "fake-weights-0123abcd.pth"


class _Server:
    """Serves /good (BODY), /wrong (other bytes), /truncated (BODY's length announced, 400 bytes sent, connection
    closed) and /missing (404); counts the requests for each path."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.files: dict[str, bytes] = {}  # more paths a test serves
        self.delay_s = 0.0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests[self.path] = server.requests.get(self.path, 0) + 1
                time.sleep(server.delay_s)
                if self.path == "/missing":
                    self.send_error(404)
                    return
                body = b"not the published file" * 100 if self.path == "/wrong" else BODY
                body = server.files.get(self.path, body)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.path == "/truncated":
                    self.wfile.write(body[:400])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
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


def _publish(monkeypatch, url: str, sha256: str = DIGEST, key: str = "inception-v3-fid") -> None:
    monkeypatch.setitem(PUBLISHED, key, PublishedWeights(NAME, url, sha256))


def _resolve(config_path=None) -> Path:
    return resolve_weights_file(
        what="FID Inception-v3",
        published="inception-v3-fid",
        config_path=config_path,
        config_key="eval.weights_path",
    )


def _leftovers(directory: Path) -> list[str]:
    """What a download left in the cache besides its lock: partial files, a file under the final name."""
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock"))


def test_a_missing_file_is_fetched_into_the_hub_cache_once_and_reused(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/good"))
    path = _resolve()
    assert path == hub / NAME and path.read_bytes() == BODY
    assert _leftovers(hub) == [NAME]  # no temporary file stays beside it
    assert _resolve() == path and server.requests == {"/good": 1}  # the second run reads the cache


def test_a_digest_prefix_as_in_the_file_name_is_checked_too(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/good"), sha256=DIGEST[:8].upper())
    assert _resolve().read_bytes() == BODY


def test_a_wrong_checksum_is_refused_and_nothing_stays_under_the_name(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/wrong"))
    with pytest.raises(MissingWeightsError) as error:
        _resolve()
    message = str(error.value)
    assert f"not the published one (which begins {DIGEST})" in message and server.url("/wrong") in message
    assert _leftovers(hub) == []
    assert "\n" not in message


def test_a_download_cut_short_is_never_left_as_the_real_file(server, hub, monkeypatch):
    _publish(monkeypatch, server.url("/truncated"))
    with pytest.raises(MissingWeightsError, match=f"closed after 400 of {len(BODY)} bytes"):
        _resolve()
    assert _leftovers(hub) == []
    # The next attempt, against a good copy, is not fooled by anything the first left.
    _publish(monkeypatch, server.url("/good"))
    assert _resolve().read_bytes() == BODY


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
        PublishedWeights(name, server.url("/squeezenet"), hashlib.sha256(payload).hexdigest()),
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
    for key, weights in enums.items():
        assert PUBLISHED[key].url == weights.url
    for entry in PUBLISHED.values():
        # torch hub's convention: the name carries the leading digits of the file's SHA-256.
        assert entry.url.rsplit("/", 1)[-1] == entry.file_name
        assert re.search(torch.hub.HASH_REGEX, entry.file_name).group(1) == entry.sha256
