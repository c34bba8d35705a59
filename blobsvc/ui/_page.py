"""The ``/ui/`` route: the page's files, its JSON, and the headers every answer carries.

The page is three files in the package (``static/``: HTML, one script, one style sheet) and
an icon, read once and served as they are: no build step, no request to another host. Every
answer under ``/ui/``, refusals too, carries :data:`SECURITY_HEADERS`: a Content-Security-Policy
that lets the page load only its own files and talk only to its own server (no inline script,
no frame around it), ``nosniff``, and no referrer. Files are revalidated by ETag; the JSON is
never cached.
"""

from __future__ import annotations

import hashlib
from importlib import resources

from ..http import HttpError, HttpFace, HttpRequest, HttpResponse, text_response
from ._access import PAGE_PATH, admit
from ._api import PageData, PageServer

__all__ = ["OperatorPage", "SECURITY_HEADERS"]

SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
)
_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
_API = PAGE_PATH + "api/"


class OperatorPage:
    """The operator's page of one server: :meth:`add_route` serves it on the HTTP face."""

    def __init__(self, server: PageServer, *, tls: bool = False) -> None:
        self.data = PageData(server)
        self.tls = tls
        """The HTTP face speaks TLS: the cookie is ``Secure``."""
        static = resources.files(__package__) / "static"
        self._files = {name: (static / name).read_bytes() for name in _TYPES}
        self._etags = {name: f'"{hashlib.sha256(body).hexdigest()[:32]}"' for name, body in self._files.items()}
        self._face: HttpFace | None = None

    def add_route(self, face: HttpFace) -> None:
        self._face = face
        face.routes["ui"] = self.respond

    async def respond(self, request: HttpRequest) -> HttpResponse:
        assert self._face is not None, "add_route() first"
        response = admit(self._face, request, tls=self.tls) or await self._answer(request)
        response.headers.extend(SECURITY_HEADERS)
        return response

    async def _answer(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if path == PAGE_PATH.rstrip("/"):
            return HttpResponse(308, [("Location", PAGE_PATH)])
        if path.startswith(_API):
            try:
                body = await self.data.answer(path[len(_API) :], request.query)
            except HttpError as exc:
                return text_response(exc.status, str(exc), [("Cache-Control", "no-store")])
            return HttpResponse(200, [("Content-Type", "application/json"), ("Cache-Control", "no-store")], body)
        name = path[len(PAGE_PATH) :] or "index.html"
        if name not in _TYPES or not path.startswith(PAGE_PATH):
            return text_response(404, f"nothing here: the operator's page is at {PAGE_PATH}")
        etag = self._etags[name]
        headers = [("ETag", etag), ("Cache-Control", "no-cache")]
        if request.headers.get("if-none-match") == etag:
            return HttpResponse(304, headers)
        return HttpResponse(200, [("Content-Type", _TYPES[name]), *headers], self._files[name])
