"""Who may see the operator's page: everyone on a server without a secret, on one with a
secret only the holder of a signed link or of the cookie that link sets.

The rules, kept here:

* **The link.** ``/ui/?expires=<unix s>&signature=<hex>``, signed as a blob URL is
  (:func:`blobsvc.http.url_signature`) over the path ``/ui/``; :func:`page_link` mints it and
  ``blobsvc ui`` prints it. Whoever holds the secret can make one; nobody else can.
* **The cookie.** Following a valid link answers 303 to ``/ui/`` (so the token leaves the
  address bar and the history) and sets :data:`COOKIE` to ``<expires>.<signature>``:
  ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it),
  ``Path=/ui/``, ``Secure`` when the server speaks TLS (a browser then never sends it in the
  clear), and the link's expiry as its ``Max-Age``. The server keeps nothing: every
  request's cookie is checked as a link is, so an expired or altered one is refused.
* **Nothing without.** On a server with a secret, every path under ``/ui/`` (the page, its
  script, its JSON) is refused with 403 and a one-line text without one or the other.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie

from ..http import DEFAULT_EXPIRES_IN, HttpFace, HttpRequest, HttpResponse, signed_url, text_response

__all__ = ["COOKIE", "PAGE_PATH", "admit", "page_link"]

PAGE_PATH = "/ui/"
COOKIE = "blobsvc_ui"
REFUSAL = "this page needs a signed link on this server: run `blobsvc ui` and open the link it prints"


def page_link(base_url: str, secret: bytes | str | None, expires_in: float = DEFAULT_EXPIRES_IN) -> str:
    """The operator's page at ``base_url`` (the HTTP face), signed to open for ``expires_in``
    seconds when the server has a ``secret``."""
    return signed_url(base_url, PAGE_PATH, secret, expires_in)


def admit(face: HttpFace, request: HttpRequest, *, tls: bool = False) -> HttpResponse | None:
    """None when ``request`` may be answered; else the answer: the 303 that trades a valid
    link for the cookie (``Secure`` on a ``tls`` face), or a 403."""
    if face.secret is None:
        return None
    if "signature" in request.query or "expires" in request.query:
        refused = face.authorise(PAGE_PATH, request.query)
        if refused is not None or request.path != PAGE_PATH:
            return refused or text_response(403, REFUSAL)
        expires = request.query["expires"]
        max_age = max(0, int(expires) - int(time.time()))
        cookie = (
            f"{COOKIE}={expires}.{request.query['signature'].lower()}; Path={PAGE_PATH}; "
            f"Max-Age={max_age}; HttpOnly; SameSite=Strict{'; Secure' if tls else ''}"
        )
        return HttpResponse(303, [("Location", PAGE_PATH), ("Set-Cookie", cookie)])
    token = _cookie(request.headers)
    if token is None:
        return text_response(403, REFUSAL)
    expires, _, signature = token.partition(".")
    refused = face.authorise(PAGE_PATH, {"expires": expires, "signature": signature})
    return None if refused is None else text_response(403, f"{REFUSAL} ({refused.body.decode().strip()})")


def _cookie(headers: Mapping[str, str]) -> str | None:
    header = headers.get("cookie")
    if header is None:
        return None
    try:
        morsel = SimpleCookie(header).get(COOKIE)
    except CookieError:
        return None
    return None if morsel is None else morsel.value
