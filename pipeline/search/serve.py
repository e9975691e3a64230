"""`vse serve`: a search index and its model behind a small HTTP service (FastAPI on uvicorn).

    GET  /                      one self-contained page (pipeline/search/page.html): a search
                                box and an image upload, results as thumbnails or captions
                                with their scores; no external request (CSP says so too)
    GET  /api/info              the index (kind, count, recall@10) and the model's sha256
    GET  /api/search?q=TEXT&k=10   and   POST /api/search {"q": TEXT, "k": 10}
    POST /api/search/image?k=10 an image: multipart form field "image", or the raw bytes
    GET  /image/{id}            a JPEG thumbnail of an indexed image, found by its id in the
                                index; never a path taken from the request

Every error is JSON ``{"error": message}`` with a 4xx status (bad query 400, unknown id or
route 404, wrong method 405, upload too large 413, not an image 415); anything unexpected is
a 500 with a fixed message, the traceback only in the server's log.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations, whose
# types are imported inside create_app (fastapi is imported only when serving)
import base64
import hashlib
import io
import json
import logging
import re
from functools import lru_cache
from pathlib import Path

from pipeline.core.errors import VseError
from pipeline.search.searcher import QueryError, Searcher, decode_image

PAGE = Path(__file__).with_name("page.html")
MAX_JSON_BYTES = 64 * 1024            # a POST /api/search body
MULTIPART_SLACK = 64 * 1024           # form boundaries and headers around an uploaded image
DEFAULT_HOST, DEFAULT_PORT, DEFAULT_THUMB = "127.0.0.1", 8000, 256
INTERNAL_ERROR = "internal error (the server's log has the details)"
log = logging.getLogger("vse.serve")


def _csp(page: str) -> str:
    """A Content-Security-Policy allowing the page's own inline script and style only."""
    def hashes(tag):
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
                        for body in re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S))
    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
            "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")


class _Images:
    """Thumbnails of the indexed images, by row (the id is looked up by the caller)."""

    def __init__(self, searcher: Searcher, image_root, size: int):
        index = searcher.index
        root = image_root if image_root is not None else index.meta.get("image_root")
        self.root = Path(root) if root else Path.cwd()
        self.paths, self.size = index.shown, size
        self.thumbnail = lru_cache(maxsize=1024)(self._thumbnail)

    def _thumbnail(self, row: int) -> bytes:
        """A JPEG of at most ``size`` pixels a side. The file is the operator's, not an upload:
        no size cap, but a JPEG is decoded at a reduced scale (``draft``) and an image past
        PIL's decompression-bomb limit is refused."""
        import warnings

        from PIL import Image, ImageOps, UnidentifiedImageError

        path = Path(self.paths[row])
        path = path if path.is_absolute() else self.root / path
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(path) as image:
                    image.draft("RGB", (self.size, self.size))
                    image = ImageOps.exif_transpose(image).convert("RGB")
        except FileNotFoundError:
            raise QueryError("the image file of this id is not there", 404) from None
        except UnidentifiedImageError:
            raise QueryError("the file of this id is not an image", 415) from None
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError,
                Image.DecompressionBombWarning):
            raise QueryError("the image file of this id cannot be read", 415) from None
        image.thumbnail((self.size, self.size))
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=85)
        return out.getvalue()


def allowed_hosts(host: str) -> tuple[str, ...] | None:
    """The ``Host:`` names a request may carry when the service listens on ``host``: a loopback
    service answers only its own names, so a web page elsewhere cannot reach it through a name
    that resolves to 127.0.0.1 (DNS rebinding). None: any (a service on every interface)."""
    if host in ("0.0.0.0", "::", ""):
        return None
    loopback = ("127.0.0.1", "localhost", "::1", "[::1]")
    return loopback if host in loopback else (host, *loopback)


def create_app(searcher: Searcher, *, image_root=None, thumb_size: int = DEFAULT_THUMB,
               hosts: tuple[str, ...] | None = allowed_hosts(DEFAULT_HOST)):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from starlette.concurrency import run_in_threadpool
    from starlette.datastructures import UploadFile
    from starlette.exceptions import HTTPException

    page = PAGE.read_text(encoding="utf-8")
    page_headers = {"Content-Security-Policy": _csp(page), "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
    limits, index = searcher.limits, searcher.index
    images = _Images(searcher, image_root, thumb_size) if index.of == "images" else None
    app = FastAPI(title="vse search", docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status,
                            headers={"X-Content-Type-Options": "nosniff"})

    @app.exception_handler(QueryError)
    async def query_error(request, exc: QueryError):
        return error(exc.status, str(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return error(400, f"{where}: {first.get('msg', 'invalid request')}".strip(": "))

    app.add_middleware(_CatchAll, response=lambda: error(500, INTERNAL_ERROR), hosts=hosts,
                       wrong_host=lambda: error(400, "unknown Host header: this service answers "
                                                     "requests for its own address only"))

    def shown(answer: dict) -> dict:
        """Results for the page: an image's thumbnail URL instead of its path."""
        if images is not None:
            for hit in answer["results"]:
                hit.pop("path", None)
                hit["image_url"] = "/image/" + _quote(hit["id"])
        return answer

    async def read_limited(request: Request, cap: int, too_large: str) -> bytes:
        """The body, or a 413 as soon as it is known to exceed ``cap`` bytes."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise QueryError(too_large, 413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > cap:
                raise QueryError(too_large, 413)
        return bytes(body)

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def home():
        return HTMLResponse(page, headers=page_headers)

    @app.get("/api/info")
    async def info():
        return searcher.info()

    @app.get("/api/search")
    async def search_get(q: str | None = None, k: str = "10"):
        if q is None:
            raise QueryError("give the query as ?q=TEXT")
        return shown(await run_in_threadpool(searcher.text, q, k))

    @app.post("/api/search")
    async def search_post(request: Request):
        body = await read_limited(request, MAX_JSON_BYTES, f"the body is more than {MAX_JSON_BYTES} bytes")
        try:
            query = json.loads(body, parse_constant=_no_constant)
        except RecursionError:
            raise QueryError("the JSON body is nested too deeply") from None
        except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise QueryError('the body must be JSON: {"q": "a dog runs on the beach", "k": 10}') from None
        if not isinstance(query, dict) or "q" not in query:
            raise QueryError('the body must be a JSON object with "q" (and optionally "k")')
        return shown(await run_in_threadpool(searcher.text, query["q"], query.get("k", 10)))

    @app.post("/api/search/image")
    async def search_image(request: Request, k: str = "10"):
        body = await read_limited(request, limits.max_upload_bytes + MULTIPART_SLACK,
                                  f"the upload is more than {limits.max_upload_bytes} bytes")
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            async def replay():
                return {"type": "http.request", "body": body, "more_body": False}

            try:
                form = await Request(request.scope, receive=replay).form(max_files=1, max_fields=4)
            except HTTPException as exc:
                raise QueryError(f"malformed form upload ({exc.detail})") from None
            upload = form.get("image")
            if not isinstance(upload, UploadFile):
                raise QueryError('send the image as the form\'s file field "image"')
            body = await upload.read()
        image = await run_in_threadpool(decode_image, body, limits)
        return shown(await run_in_threadpool(searcher.image, image, k))

    _register_any_text()

    @app.get("/image/{item_id:anytext}")
    async def image(item_id: str):
        if images is None:
            raise QueryError("this index holds captions, not images", 404)
        row = index.row(item_id)
        if row is None:
            raise QueryError("no image of this id in the index", 404)
        data = await run_in_threadpool(images.thumbnail, row)
        return Response(data, media_type="image/jpeg",
                        headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"})

    return app


class _CatchAll:
    """The outermost layer of the app. It answers a request for another ``Host:`` than
    ``hosts`` with ``wrong_host()``, marks every answer ``X-Content-Type-Options: nosniff``, and
    answers an unexpected exception with ``response()`` (a JSON 500), logged, without handing it
    on to the server: Starlette's own handler re-raises it, and uvicorn then closes the
    connection, so a client's next request on it would fail."""

    def __init__(self, app, response, hosts=None, wrong_host=None):
        self.app, self.response, self.hosts, self.wrong_host = app, response, hosts, wrong_host

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.hosts is not None and _host_name(scope) not in self.hosts:
            return await self.wrong_host()(scope, receive, send)
        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"x-content-type-options" for k, _ in headers):
                    message = {**message, "headers": headers + [(b"x-content-type-options", b"nosniff")]}
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if started:  # too late for another answer
                raise
            await self.response()(scope, receive, send)


def _register_any_text() -> None:
    """A path parameter that is any text, line breaks included (Starlette's ``path`` is ``.*``,
    which stops at a newline: an id holding one could not be looked up)."""
    from starlette.convertors import CONVERTOR_TYPES, PathConvertor, register_url_convertor

    class AnyText(PathConvertor):
        regex = "[\\s\\S]*"

    if "anytext" not in CONVERTOR_TYPES:
        register_url_convertor("anytext", AnyText())


def _host_name(scope) -> str:
    """The request's ``Host:`` without its port (an IPv6 literal keeps its brackets)."""
    value = next((v for k, v in scope.get("headers", []) if k == b"host"), b"").decode("latin-1").strip()
    if value.startswith("["):
        return value[:value.find("]") + 1]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _no_constant(name: str):
    """NaN, Infinity and -Infinity are not JSON numbers (Python's json accepts them)."""
    raise ValueError(f"{name} is not JSON")


def _quote(item_id: str) -> str:
    from urllib.parse import quote

    return quote(item_id, safe="")


def bind(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT):
    """The listening socket, bound now: a port in use or out of range is refused in one line
    before anything slow (loading the model) happens, and nothing can take it meanwhile."""
    import socket

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise VseError(f"--port must be between 0 and 65535, not {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise VseError(f"--host {host!r} is not an address of this machine ({exc})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise VseError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    return sock


# uvicorn's h11 implementation (httptools reads a request line of any length): a request line
# with its headers is capped at MAX_HEAD_BYTES (a 400 beyond it), and a connection that has not
# sent a complete request head HEAD_TIMEOUT seconds after it opened (or after its last answer)
# is closed: uvicorn itself times out only idle keep-alive connections, so a half-open one
# would otherwise stay forever.
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT = 10.0


def server_config(app, head_timeout: float = HEAD_TIMEOUT, **kwargs):
    """The uvicorn configuration `vse serve` runs (and its tests run)."""
    import uvicorn

    return uvicorn.Config(app, http=_head_timeout_protocol(head_timeout),
                          h11_max_incomplete_event_size=MAX_HEAD_BYTES, timeout_keep_alive=5,
                          server_header=False, **kwargs)


def _head_timeout_protocol(seconds: float):
    """uvicorn's H11Protocol with a deadline for each request head."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimeoutH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_deadline()  # the next request's head has the same time

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not self._waiting_after:  # a head arrived
                self._cancel_head_deadline()

        def connection_lost(self, exc) -> None:
            self._cancel_head_deadline()
            super().connection_lost(exc)

        def _arm_head_deadline(self) -> None:
            self._cancel_head_deadline()
            self._waiting_after = self.cycle
            self._head_timer = self.loop.call_later(seconds, self._head_overdue)

        def _cancel_head_deadline(self) -> None:
            timer = getattr(self, "_head_timer", None)
            if timer is not None:
                timer.cancel()
                self._head_timer = None

        def _head_overdue(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return HeadTimeoutH11Protocol


def serve(searcher: Searcher, *, sock=None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          image_root=None, thumb_size: int = DEFAULT_THUMB, log_level: str = "info") -> None:
    """Run the service on ``sock`` (``bind``; bound here from host and port if None) until
    interrupted."""
    import uvicorn

    sock = sock if sock is not None else bind(host, port)
    app = create_app(searcher, image_root=image_root, thumb_size=thumb_size,
                     hosts=allowed_hosts(host))
    uvicorn.Server(server_config(app, log_level=log_level)).run(sockets=[sock])
