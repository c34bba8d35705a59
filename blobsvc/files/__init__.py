"""Local files as every part writes them: the server's storage, the HA store, a host's cache
and the client's downloads. Below all of them, so that a client or a cache never loads the
server's storage to write a file.

* ``_filewrite``: a large file whose size is known first: blocks reserved, bytes written in
  pieces;
* ``_writeback``: bytes and names to disk: a directory's fsync, a file's writeback started early;
* ``_pages``: fresh memory for a download into memory, and its page faults taken ahead;
* ``_locks``: directories made durably, and one lock per name;
* ``_stamps``: a file's stamp (device, inode, size, mtime, ctime), and when it may stand for
  the content (git's "racily clean" rule);
* ``_layout``: where things live in a data directory, and how blob names become file names
  (a cache directory names its blobs the same way).

May import :mod:`blobsvc.wire`, :mod:`blobsvc.config` and :mod:`blobsvc._exceptions`.
"""
