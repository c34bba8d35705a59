"""The operator's page: servers, hosts, jobs and checkpoints at a glance, in a browser.

A read-only page at ``/ui/`` on the server's HTTP face, in the spirit of Flink's dashboard:
an overview of the server (role, leader, HA store, disk, connections, request rates), its
executor hosts (lost ones first), its jobs, and each pipeline's checkpoint history with a
chart of durations and sizes. The page is plain HTML, one script and one style sheet shipped
in the package; it reads the server's JSON every few seconds.

The part ``blobsvc/ui/``: ``_access`` (who may see it: everyone, or with a secret the holder
of a signed link and of the cookie it sets), ``_api`` (the JSON, paged and bounded),
``_page`` (the route on the HTTP face, the files, the security headers), ``static/`` (the
page's files). The server adds its route; it knows the server only as a :class:`PageServer`.
May import :mod:`blobsvc.http` (the face it serves on), the storage (typing only), the wire
and config; never the server.
"""

from ._access import COOKIE, PAGE_PATH, page_link
from ._api import DEFAULT_PAGE, MAX_PAGE, SNAPSHOT_SECONDS, PageServer
from ._page import SECURITY_HEADERS, OperatorPage

__all__ = [
    "COOKIE",
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "PAGE_PATH",
    "SECURITY_HEADERS",
    "SNAPSHOT_SECONDS",
    "OperatorPage",
    "PageServer",
    "page_link",
]
