"""The wire: the bytes between a client and a server, below both.

* ``_protocol``: the binary protocol, version 1, as sans-IO state machines (frames, limits,
  error codes);
* ``_ids``: keys and job ids, in their raw wire form and as hex text;
* ``_netio``: one non-blocking TCP socket, every call with its own timeout;
* ``_tls``: TLS contexts from settings, and :class:`~._tls.TlsStream` over a socket;
* ``_connect``: connecting to a server: TCP, then the TLS handshake when asked;
* ``_threads``: waiting out work handed to a worker thread.

May import :mod:`blobsvc.config`, :mod:`blobsvc._numbers` and :mod:`blobsvc._exceptions`,
nothing else of blobsvc.
Inside, ``_connect`` → ``_tls`` → ``_netio`` (pyproject.toml's import-linter contracts).
"""
