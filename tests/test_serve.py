"""`vse serve`: the JSON API against the running server on localhost (uvicorn in a thread,
httpx), and the page in headless Chromium (playwright, Debian's /usr/bin/chromium)."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from search_fakes import (
    DEMO_IMAGES,
    StandInEmbedder,
    demo_embeddings,
    demo_items,
    png_bytes,
    write_embeddings,
)

from cli.main import cli
from pipeline.core.fsutil import file_sha256
from pipeline.search import searcher as search_module
from pipeline.search.faiss_index import IndexOptions, SearchIndex, build_index
from pipeline.search.searcher import QueryLimits, Searcher
from pipeline.search.serve import DEFAULT_HOST, MAX_HEAD_BYTES, create_app, server_config

pytestmark = pytest.mark.slow  # processes, real images or servers: `pytest -m "not slow"` skips them

CHROMIUM = shutil.which("chromium") or next((p for p in ("/usr/bin/chromium",) if Path(p).is_file()), None)
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
N = 12
LIMITS = QueryLimits(max_upload_bytes=200_000, max_chars=300, max_k=20, max_pixels=1_000_000)


@contextlib.contextmanager
def running(app, **settings):
    """The app served by uvicorn on a free port of 127.0.0.1, in a thread; yields its URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(app, log_level="critical", **settings))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class FailingEmbedder(StandInEmbedder):
    def embed_texts(self, texts):
        if texts == ["boom"]:
            raise RuntimeError("secret detail /home/someone/model.pt line 42")
        return super().embed_texts(texts)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """An image index of N demo images (a few under a sub-folder with an awkward name) and a
    caption index, made for a stand-in checkpoint."""
    root = tmp_path_factory.mktemp("serve")
    checkpoint = root / "model.pt"
    checkpoint.write_bytes(b"stand-in model")
    images = root / "images"
    (images / "sub dir").mkdir(parents=True)
    names, captions = demo_items(N)
    ids = [f"sub dir/é{n}" if i < 3 else n for i, n in enumerate(names)]
    for name, item in zip(names, ids):
        shutil.copy(DEMO_IMAGES / name, images / item)
    embeddings, embedder = demo_embeddings(root / "e.h5", checkpoint, n=N)
    import h5py

    with h5py.File(embeddings, "a") as f:  # ids and paths with a folder, spaces and non-ASCII
        del f["images/ids"], f["images/paths"]
        f["images"].create_dataset("ids", data=ids, dtype=h5py.string_dtype("utf-8"))
        f["images"].create_dataset("paths", data=ids, dtype=h5py.string_dtype("utf-8"))
    build_index(embeddings, root / "idx", IndexOptions(), image_root=images)
    build_index(embeddings, root / "captions", IndexOptions(of="captions"))
    return {"root": root, "checkpoint": checkpoint, "ids": ids, "captions": captions, "embedder": embedder}


@pytest.fixture(scope="module")
def server(demo):
    index = SearchIndex(demo["root"] / "idx")
    embedder = FailingEmbedder(index.checkpoint_sha256, 32)
    with running(create_app(Searcher(index, embedder, LIMITS, demo["checkpoint"]), thumb_size=128)) as url:
        yield url


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server, timeout=30) as c:
        yield c


def test_text_search_get_and_post_rank_the_matching_image_first(client, demo):
    query = demo["captions"][4][0]  # image 4's vector is the stand-in's vector of this caption
    for response in (client.get("/api/search", params={"q": query, "k": 3}),
                     client.post("/api/search", json={"q": query, "k": 3})):
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        answer = response.json()
        assert answer["query"] == query and answer["k"] == 3 and len(answer["results"]) == 3
        top = answer["results"][0]
        assert top["id"] == demo["ids"][4] and top["score"] == pytest.approx(1.0, abs=1e-5)
        assert top["image_url"] == "/image/" + demo["ids"][4] and "path" not in top
        scores = [hit["score"] for hit in answer["results"]]
        assert scores == sorted(scores, reverse=True) and scores[1] < 0.9
    assert client.get("/api/search", params={"q": query}).json()["k"] == 10


def test_thumbnails_are_served_by_id_only_and_resized(client, demo):
    from urllib.parse import quote

    for item in (demo["ids"][0], demo["ids"][5]):  # "sub dir/é…" and a plain name
        response = client.get("/image/" + quote(item, safe=""))
        assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
        thumb = Image.open(io.BytesIO(response.content))
        original = Image.open(demo["root"] / "images" / item)
        assert max(thumb.size) == 128 and thumb.format == "JPEG"
        assert thumb.size[0] / thumb.size[1] == pytest.approx(original.size[0] / original.size[1], abs=0.02)
    for bad in ("/image/nope.jpg", "/image/" + quote(str(demo["root"] / "images" / demo["ids"][5]), safe=""),
                "/image/..%2F..%2Fe.h5", "/image/"):
        response = client.get(bad)
        assert response.status_code == 404 and "error" in response.json(), bad


def test_image_search_by_multipart_and_by_raw_bytes(client, demo):
    photo = (DEMO_IMAGES / demo_items(N)[0][7]).read_bytes()
    expected = demo["embedder"].embed_images([Image.open(io.BytesIO(photo))])
    index = SearchIndex(demo["root"] / "idx")
    want = [h["id"] for h in index.hits(*[a[0] for a in index.search(expected, 5)])]
    for response in (client.post("/api/search/image", params={"k": 5},
                                 files={"image": ("q.jpg", photo, "image/jpeg")}),
                     client.post("/api/search/image?k=5", content=photo,
                                 headers={"content-type": "image/jpeg"})):
        assert response.status_code == 200, response.text
        assert [h["id"] for h in response.json()["results"]] == want


def test_info_names_the_model_and_the_index(client, demo):
    info = client.get("/api/info").json()
    assert info["checkpoint_sha256"] == file_sha256(demo["checkpoint"]) and info["count"] == N
    assert (info["kind"], info["of"], info["exact"], info["recall"], info["recall_at"]) == \
        ("flat", "images", True, 1.0, 10)
    assert info["max_k"] == 20 and info["max_upload_bytes"] == 200_000
    assert info["checkpoint"].endswith("model.pt")


@pytest.mark.parametrize("method, url, kwargs, status, words", [
    ("GET", "/api/search", {"params": {"q": "  "}}, 400, "empty"),
    ("GET", "/api/search", {}, 400, "?q="),
    ("GET", "/api/search", {"params": {"q": "x" * 301}}, 400, "301 characters"),
    ("POST", "/api/search", {"json": {"q": "x" * 50_000}}, 400, "50000 characters"),
    ("POST", "/api/search", {"content": b"x" * 70_000}, 413, "more than 65536 bytes"),
    ("GET", "/api/search", {"params": {"q": "dog", "k": "many"}}, 400, "k must be an integer"),
    ("GET", "/api/search", {"params": {"q": "dog", "k": "21"}}, 400, "at most 20"),
    ("POST", "/api/search", {"content": b"{not json"}, 400, "must be JSON"),
    ("POST", "/api/search", {"json": ["dog"]}, 400, '"q"'),
    ("POST", "/api/search", {"json": {"q": 7}}, 400, "must be a string"),
    ("POST", "/api/search/image", {"files": {"image": ("a.txt", b"just text", "text/plain")}}, 415,
     "not an image"),
    ("POST", "/api/search/image", {"files": {"image": ("a.png", png_bytes()[:60], "image/png")}}, 400,
     "cannot be decoded"),
    ("POST", "/api/search/image", {"files": {"photo": ("a.png", png_bytes(), "image/png")}}, 400, '"image"'),
    ("POST", "/api/search/image", {"content": b""}, 400, "empty"),
    ("POST", "/api/search/image", {"files": {"image": ("a.png", b"\x89PNG" + b"0" * 300_000, "image/png")}},
     413, "more than 200000 bytes"),
    ("POST", "/api/search/image", {"files": {"image": ("a.png", b"\x89PNG" + b"0" * 220_000, "image/png")}},
     413, "at most 200000"),
    ("POST", "/api/search/image", {"content": png_bytes(size=(1001, 1000))}, 413, "1001x1000 pixels"),
    # a tiny very wide image would be huge after the resize to the short side
    ("POST", "/api/search/image", {"content": png_bytes(size=(8000, 1))}, 413, "at most 20:1"),
    # one rule for k, from a URL or from JSON; JSON's non-numbers; unpaired surrogates; nesting
    ("POST", "/api/search", {"content": b'{"q": "dog", "k": 1e400}'}, 400, "k must be an integer"),
    ("POST", "/api/search", {"content": b'{"q": "dog", "k": Infinity}'}, 400, "must be JSON"),
    ("POST", "/api/search", {"json": {"q": "dog", "k": 2.9}}, 400, "k must be an integer"),
    ("POST", "/api/search", {"json": {"q": "dog", "k": True}}, 400, "k must be an integer"),
    ("GET", "/api/search", {"params": {"q": "dog", "k": "1.5"}}, 400, "k must be an integer"),
    ("GET", "/api/search", {"params": {"q": "dog", "k": "0"}}, 400, "k must be at least 1"),
    ("POST", "/api/search", {"content": b'{"q": "dog \\ud800"}'}, 400, "not valid Unicode"),
    ("POST", "/api/search", {"content": b'{"q": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"}, 400,
     "nested too deeply"),
    ("DELETE", "/api/search", {}, 405, "Method Not Allowed"),
    ("PUT", "/api/search/image", {}, 405, "Method Not Allowed"),
    ("GET", "/api/nothing", {}, 404, "Not Found"),
    ("GET", "/api/search", {"params": {"q": "boom"}}, 500, "internal error"),
])
def test_bad_requests_get_a_json_message_and_never_a_traceback(client, method, url, kwargs, status, words):
    response = client.request(method, url, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["error"] and words in body["error"], body
    assert "Traceback" not in response.text and "secret" not in response.text and ".py" not in response.text


def test_json_answers_say_nosniff_and_head_of_the_page_is_not_405(client):
    assert client.get("/api/info").headers["x-content-type-options"] == "nosniff"
    assert client.get("/api/search", params={"q": "dog"}).headers["x-content-type-options"] == "nosniff"
    assert client.head("/").status_code == 200


def raw_request(url: str, data: bytes, read_timeout: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


def test_a_huge_request_line_is_refused_and_stalls_nobody(server, client, demo):
    """uvicorn's h11 with a cap on the request head: 100 MB of request line is refused after
    MAX_HEAD_BYTES, and a query on another connection meanwhile is answered as usual."""
    host, port = server.removeprefix("http://").split(":")
    answer = {}

    def flood():
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            try:
                sock.sendall(b"GET /api/search?q=" + b"a" * (100 * 2 ** 20))
            except OSError:  # the server closed the connection once the cap was passed
                pass
            try:
                answer["flood"] = sock.recv(200)
            except TimeoutError:  # no answer in 10 s: the server was still reading the line
                answer["flood"] = b"no answer"
            except OSError:  # reset before its 400 could be read: refused all the same
                answer["flood"] = b""

    thread = threading.Thread(target=flood)
    thread.start()
    started = time.perf_counter()
    assert client.get("/api/search", params={"q": demo["captions"][0][0]}).status_code == 200
    answer["took"] = time.perf_counter() - started
    thread.join(30)
    assert answer["flood"] == b"" or answer["flood"].startswith(b"HTTP/1.1 400"), answer  # refused
    assert answer["took"] < 2.0, answer  # normally ~20 ms; 8-11 s before the cap
    assert MAX_HEAD_BYTES <= 64 * 1024


def test_a_connection_that_never_finishes_its_request_head_is_closed(demo):
    index = SearchIndex(demo["root"] / "idx")
    app = create_app(Searcher(index, StandInEmbedder(index.checkpoint_sha256, 32), LIMITS,
                              demo["checkpoint"]))
    with running(app, head_timeout=0.5) as url:
        started = time.perf_counter()
        reply = raw_request(url, b"GET /api/info HTTP/1.1\r\nHost: x\r\n", read_timeout=5)
        waited = time.perf_counter() - started
        assert reply == b"" and 0.4 < waited < 4, (reply, waited)  # closed at the deadline, no answer
        with httpx.Client(base_url=url) as ok:  # a complete request on a new connection is answered
            assert ok.get("/api/info").status_code == 200


def test_the_server_keeps_answering_after_errors(client, demo):
    client.get("/api/search", params={"q": "boom"})
    assert client.get("/api/search", params={"q": demo["captions"][2][0]}).json()["results"][0]["id"] == \
        demo["ids"][2]


def test_a_caption_index_returns_texts_and_has_no_images(demo):
    index = SearchIndex(demo["root"] / "captions")
    searcher = Searcher(index, StandInEmbedder(index.checkpoint_sha256, 32), LIMITS)
    with running(create_app(searcher)) as url, httpx.Client(base_url=url) as client:
        caption = demo["captions"][1][2]
        top = client.get("/api/search", params={"q": caption, "k": 2}).json()["results"][0]
        assert top["text"] == caption and top["score"] == pytest.approx(1.0, abs=1e-5)
        assert "image_url" not in top
        response = client.get("/image/" + top["id"])
        assert response.status_code == 404 and "captions" in response.json()["error"]


def test_indexed_files_missing_broken_or_larger_than_an_upload(tmp_path):
    checkpoint = tmp_path / "m.pt"
    checkpoint.write_bytes(b"m")
    sha = file_sha256(checkpoint)
    vectors = np.eye(3, 4, dtype=np.float32)
    write_embeddings(tmp_path / "e.h5", checkpoint_sha256=sha,
                     images=(vectors, ["gone", "text", "big"], ["gone.jpg", "t.jpg", "big.jpg"]))
    (tmp_path / "t.jpg").write_text("not an image")
    noise = np.random.default_rng(0).integers(0, 256, (1200, 1600, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "big.jpg", quality=95)
    assert (tmp_path / "big.jpg").stat().st_size > LIMITS.max_upload_bytes  # the operator's file: shown
    build_index(tmp_path / "e.h5", tmp_path / "idx", image_root=tmp_path)
    searcher = Searcher(SearchIndex(tmp_path / "idx"), StandInEmbedder(sha, 4), LIMITS)
    with running(create_app(searcher)) as url, httpx.Client(base_url=url) as client:
        gone = client.get("/image/gone")
        assert gone.status_code == 404 and gone.json() == {"error": "the image file of this id is not there"}
        text = client.get("/image/text")
        assert text.status_code == 415 and "not an image" in text.json()["error"]
        big = client.get("/image/big")
        assert big.status_code == 200 and Image.open(io.BytesIO(big.content)).size == (256, 192)


def test_vse_serve_binds_localhost_and_checks_the_model(demo, monkeypatch, tmp_path):
    """The command's defaults and refusals; uvicorn's run is replaced by a recorder."""
    import uvicorn

    seen = {}
    monkeypatch.setattr(search_module, "load_embedder",
                        lambda checkpoint, device="auto", digest=None:
                        StandInEmbedder.for_checkpoint(checkpoint))
    monkeypatch.setattr(uvicorn.Server, "run",
                        lambda self, sockets=None: seen.update(config=self.config, sockets=sockets))
    with socket.socket() as probe:  # the default port, if this machine has it free
        free = probe.connect_ex(("127.0.0.1", 8000)) != 0
    args = ["serve", str(demo["root"] / "idx")] + ([] if free else ["--port", "0"])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (sock,) = seen["sockets"]
    assert DEFAULT_HOST == "127.0.0.1" and sock.getsockname()[0] == "127.0.0.1"
    assert not free or sock.getsockname()[1] == 8000
    sock.close()
    other = tmp_path / "other.pt"
    other.write_bytes(b"another model")
    result = CliRunner().invoke(cli, ["serve", str(demo["root"] / "idx"), "--checkpoint", str(other)])
    assert result.exit_code == 1 and "another model" in result.output and "Traceback" not in result.output


# ---------------------------------------------------------------------------- the page


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make install: apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def test_the_page_searches_and_shows_thumbnails_with_scores(browser, server, demo, tmp_path):
    """Under the page's Content-Security-Policy (no eval), so the checks use selectors."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1200, "height": 800})
    requests, problems = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(server + "/")
    expect(page.locator("#info")).to_contain_text(f"{N} images · exact search · model ")
    status, hits = page.locator("#status"), page.locator("#results .hit")

    query = demo["captions"][6][0]
    page.fill("#q", query)
    page.press("#q", "Enter")
    expect(status).to_have_text(re.compile(r"^10 results in [0-9.]+ ms$"))
    expect(hits).to_have_count(10)
    assert hits.nth(0).locator(".caption").inner_text() == demo["ids"][6]
    assert hits.nth(0).locator(".score").inner_text() == "1.000"
    assert hits.nth(0).locator(".rank").inner_text() == "#1"
    scores = [float(s) for s in page.locator("#results .score").all_inner_texts()]
    assert len(scores) == 10 and scores == sorted(scores, reverse=True) and scores[1] < 0.9
    images = page.locator("#results img")
    expect(images).to_have_count(10)
    for i in range(10):  # every thumbnail loaded (a broken one has naturalWidth 0)
        images.nth(i).scroll_into_view_if_needed()
        expect(images.nth(i)).to_have_js_property("complete", True)
        assert 0 < images.nth(i).evaluate("img => img.naturalWidth") <= 128

    page.evaluate("window.scrollTo(0, 0)")
    shot = tmp_path / "search_page.png"
    page.screenshot(path=str(shot))
    image = Image.open(shot)
    assert image.format == "PNG" and image.size == (1200, 800)
    colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 50  # text and photographs, not a blank page

    page.fill("#q", "x" * 300)  # at the length limit: accepted
    page.evaluate("document.getElementById('status').textContent = ''")
    page.press("#q", "Enter")
    expect(status).to_have_text(re.compile(r"^10 results"))
    page.evaluate("document.getElementById('status').textContent = ''")
    page.set_input_files("#image", files=[{"name": "q.png", "mimeType": "image/png", "buffer": png_bytes()}])
    expect(status).to_have_text(re.compile(r"^10 results"))
    expect(page.locator("#q")).to_have_value("")  # the text box no longer claims to be the query
    expect(page.locator("#query")).to_be_visible()  # the query image is shown beside its results
    expect(page.locator("#query-image")).to_have_js_property("complete", True)
    assert page.locator("#query-image").evaluate("img => img.naturalWidth") == 64
    page.fill("#q", query)
    page.press("#q", "Enter")
    expect(page.locator("#query")).to_be_hidden()
    page.set_input_files("#image", files=[{"name": "q.png", "mimeType": "image/png", "buffer": png_bytes()}])
    page.set_input_files("#image", files=[{"name": "q.txt", "mimeType": "text/plain", "buffer": b"text"}])
    expect(status).to_have_class("error")
    expect(status).to_contain_text("not an image")
    expect(hits).to_have_count(0)

    assert all("415" in p for p in problems), problems  # only the refused upload's status, no script error
    assert requests and all(url.startswith((server + "/", f"blob:{server}/")) for url in requests), requests
    page.close()


def test_an_older_search_answering_late_never_overwrites_a_newer_one(browser, server, demo):
    """An image search held back, then a bad upload refused at once: the page shows the refusal,
    and still does after the older search has answered (with 10 results)."""
    from playwright.sync_api import expect

    page = browser.new_page()
    page.goto(server + "/")
    expect(page.locator("#info")).to_contain_text("images")
    held = []
    page.route("**/api/search/image*", lambda route: held.append(route)
               if b"PNG" in (route.request.post_data_buffer or b"") else route.continue_())
    status, hits = page.locator("#status"), page.locator("#results .hit")
    page.set_input_files("#image", files=[{"name": "q.png", "mimeType": "image/png", "buffer": png_bytes()}])
    page.set_input_files("#image", files=[{"name": "q.txt", "mimeType": "text/plain", "buffer": b"text"}])
    expect(status).to_contain_text("not an image")
    assert len(held) == 1
    with page.expect_response("**/api/search/image*") as late:
        held[0].fulfill(response=held[0].fetch())  # the older search answers now
    assert late.value.status == 200
    page.wait_for_timeout(300)  # its answer handled by the page's script
    expect(status).to_contain_text("not an image")
    expect(status).to_have_class("error")
    expect(hits).to_have_count(0)
    page.close()


def test_the_thumbnail_of_an_id_with_a_line_break_is_found(tmp_path, demo):
    """Starlette's path parameter stopped at a newline: such an id (from a CSV's id column) was a 404."""
    from urllib.parse import quote

    import h5py

    names, _ = demo_items(N)
    embeddings, _ = demo_embeddings(tmp_path / "e.h5", demo["checkpoint"], n=N)
    ids = [f"line\nbreak{k}.jpg" for k in range(N)]
    (tmp_path / "images").mkdir()
    for name, item in zip(names, ids):
        shutil.copy(DEMO_IMAGES / name, tmp_path / "images" / item)
    with h5py.File(embeddings, "a") as f:
        del f["images/ids"], f["images/paths"]
        f["images"].create_dataset("ids", data=ids, dtype=h5py.string_dtype("utf-8"))
        f["images"].create_dataset("paths", data=ids, dtype=h5py.string_dtype("utf-8"))
    build_index(embeddings, tmp_path / "idx", IndexOptions(), image_root=tmp_path / "images")
    index = SearchIndex(tmp_path / "idx")
    app = create_app(Searcher(index, StandInEmbedder(index.checkpoint_sha256, 32), LIMITS,
                              demo["checkpoint"]))
    with running(app) as url, httpx.Client(base_url=url) as c:
        answer = c.get("/image/" + quote(ids[3], safe=""))
        assert answer.status_code == 200 and answer.headers["content-type"] == "image/jpeg"


def test_a_request_for_another_host_is_refused(server, demo):
    """DNS rebinding: a page elsewhere that resolves its own name to 127.0.0.1 sends its own Host."""
    with httpx.Client(base_url=server) as c:
        refused = c.get("/api/info", headers={"Host": "evil.example:8000"})
        assert refused.status_code == 400 and "unknown Host" in refused.json()["error"]
        assert c.get("/api/info", headers={"Host": "localhost"}).status_code == 200


def test_serve_refuses_a_taken_port_and_a_bad_one_in_one_line_before_loading(demo, monkeypatch, tmp_path):
    loaded = []
    monkeypatch.setattr(search_module, "load_embedder",
                        lambda *a, **k: loaded.append(a) or StandInEmbedder.for_checkpoint(a[0]))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", str(demo["root"] / "idx"), "--port", str(port)])
    assert result.exit_code == 1 and loaded == []
    assert result.output.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port} (Address already in use)"], result.output
    result = CliRunner().invoke(cli, ["serve", str(demo["root"] / "idx"), "--port", "99999"])
    assert result.exit_code == 1 and "--port must be between 0 and 65535, not 99999" in result.output
    result = CliRunner().invoke(cli, ["serve", str(demo["root"] / "idx"), "--image-root",
                                      str(tmp_path / "no")])
    assert result.exit_code == 1 and "--image-root: no such folder" in result.output
    result = CliRunner().invoke(cli, ["serve", str(demo["root"] / "idx"), "--max-query-chars", "-1",
                                      "--port", "0"])
    assert result.exit_code == 1 and "--max-query-chars must be a positive integer" in result.output


def test_the_page_labels_an_image_hit_with_its_caption(browser, tmp_path):
    """An image index whose embeddings file names each caption's image (a CSV embedded as both)
    shows each hit's first caption, its id as the tooltip; as a person sees the page."""
    import h5py
    from playwright.sync_api import expect

    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(b"stand-in model, captioned")
    embeddings, embedder = demo_embeddings(tmp_path / "e.h5", checkpoint, n=6)
    names, captions = demo_items(6)
    with h5py.File(embeddings, "a") as f:
        owners = [name for name, cs in zip(names, captions) for _ in cs]
        f["captions"].create_dataset("image_ids", data=owners, dtype=h5py.string_dtype("utf-8"))
    build_index(embeddings, tmp_path / "idx", IndexOptions(), image_root=DEMO_IMAGES)
    index = SearchIndex(tmp_path / "idx")
    searcher = Searcher(index, StandInEmbedder(index.checkpoint_sha256, 32), LIMITS, checkpoint)
    with running(create_app(searcher, thumb_size=128)) as url:
        page = browser.new_page(viewport={"width": 1000, "height": 700})
        page.goto(url + "/")
        page.fill("#q", captions[3][0])
        page.press("#q", "Enter")
        hits = page.locator("#results .hit")
        expect(hits).to_have_count(6)
        label = hits.nth(0).locator(".caption")
        assert label.inner_text() == captions[3][0] and label.get_attribute("title") == names[3]
        assert page.locator("#results .caption").all_inner_texts() != names  # captions, not file names
        page.close()
