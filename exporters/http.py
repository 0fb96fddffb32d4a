"""HTTP plumbing of the exporter: listen addresses, basic auth, TLS and spliced gzip.

Kept apart from ``exporters.prometheus`` so each piece is small and testable without a server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ssl
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ibmon.config import parse_listen  # the one listen-address rule, shared with config checks

__all__ = [
    "BasicAuth",
    "Deflated",
    "accepts_gzip",
    "concat",
    "crc32_combine",
    "deflate_chunks",
    "gzip_parts",
    "hash_password",
    "inflate",
    "parse_listen",
    "tls_context",
]


def hash_password(password: str) -> str:
    """The hash a basic auth file line holds for ``password`` (same as ``sha256sum``)."""
    return hashlib.sha256(password.encode("utf-8")).hexdigest()


_DUMMY_HASH = hash_password("ibmon: user does not exist")


class BasicAuth:
    """Users and password hashes from a basic auth file.

    Format, one user per line; blank lines and lines starting with ``#`` are ignored::

        # user:sha256(password) in hex, e.g. printf %s 'secret' | sha256sum
        prometheus:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b

    Unsalted SHA-256 only protects against reading the file, not against guessing weak
    passwords: use long random passwords (Prometheus stores them in its config anyway) and TLS,
    since basic auth over plain HTTP sends the password in clear.
    """

    def __init__(self, users: dict[str, str]) -> None:
        if not users:
            raise ValueError("basic auth file has no users")
        self._users = dict(users)

    @classmethod
    def from_file(cls, path: Path) -> BasicAuth:
        users: dict[str, str] = {}
        text = path.read_text(encoding="utf-8")
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, digest = line.partition(":")
            digest = digest.lower()
            if (
                not sep
                or not user
                or len(digest) != 64
                or any(ch not in "0123456789abcdef" for ch in digest)
            ):
                raise ValueError(f"{path}:{number}: expected user:<sha256 hex of the password>")
            if user in users:
                raise ValueError(f"{path}:{number}: user {user!r} listed twice")
            users[user] = digest
        return cls(users)

    def check(self, authorization: str | None) -> bool:
        """True when the ``Authorization`` header names a user with the right password."""
        if not authorization:
            return False
        scheme, _, encoded = authorization.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        if not sep:
            return False
        stored = self._users.get(user)
        # Compare against a dummy for unknown users too, so timing does not reveal user names.
        ok = hmac.compare_digest(hash_password(password), stored or _DUMMY_HASH)
        return ok and stored is not None


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context with the platform's secure defaults and at least TLS 1.2."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    return ctx


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether ``Accept-Encoding`` allows gzip (explicitly or via ``*``), honouring ``q=0``."""
    if not accept_encoding:
        return False
    gzip_q: float | None = None
    star_q: float | None = None
    for item in accept_encoding.split(","):
        name, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        name = name.lower()
        if name in ("gzip", "x-gzip"):
            gzip_q = q
        elif name == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


# --- gzip splicing -------------------------------------------------------------------------------
# The port series are compressed once per state, when it is published, and only the compressed
# stream is kept; the small self-metrics head changes per scrape.
# A gzip member is header + raw deflate + CRC-32 + length: the head is deflated per scrape and
# ended with a sync flush (byte aligned, not final), the cached port stream follows unchanged (a
# fresh deflate stream never refers back before its start), and the CRC of the whole is combined
# from the two parts' CRCs without reading the 40 MB of ports again.

_POLY = 0xEDB88320
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0, OS unknown


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial (reflected bit order), as in zlib's crc32.c."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return tuple(table)


_X2N = _x2n_table()


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A+B from crc32(A), crc32(B) and len(B) (zlib's crc32_combine, pure Python)."""
    p = 1 << 31  # x^0
    n, k = len2, 3  # multiply by x^(8 * len2)
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


@dataclass(frozen=True, slots=True)
class Deflated:
    """Raw deflate data of some chunks, with their CRC-32 and total size.

    ``parts`` concatenated are the deflate stream. A ``final`` stream ends with the last block;
    a non-final one (a segment) ends byte-aligned after a sync flush and never refers back before
    its own start, so a segment followed by any other deflate stream is one valid stream
    (``concat``): the exporter keeps the rarely changing ``_info`` families as such a segment.
    """

    parts: tuple[bytes, ...]
    crc: int
    size: int
    final: bool = True

    @property
    def compressed_size(self) -> int:
        return sum(len(p) for p in self.parts)


def deflate_chunks(chunks: Iterable[bytes], level: int, *, final: bool = True) -> Deflated:
    """Compress chunks as they come (a generator never has the whole body in memory).

    Runs in a worker thread for big fabrics; zlib releases the GIL while it compresses.
    """
    comp = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    parts: list[bytes] = []
    crc = 0
    size = 0
    for chunk in chunks:
        if piece := comp.compress(chunk):
            parts.append(piece)
        crc = zlib.crc32(chunk, crc)
        size += len(chunk)
        del chunk  # a lazy producer builds the next chunk without this one alive
    parts.append(comp.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH))
    # One contiguous block per stream: zlib's small outputs would otherwise each cost a
    # separate allocation for as long as the state is served.
    return Deflated((b"".join(parts),), crc, size, final)


def concat(segment: Deflated, tail: Deflated) -> Deflated:
    """``segment`` then ``tail`` as one stream, without recompressing either."""
    if segment.final:
        raise ValueError("only a non-final (sync-flushed) segment can be followed by more data")
    return Deflated(
        segment.parts + tail.parts,
        crc32_combine(segment.crc, tail.crc, tail.size),
        segment.size + tail.size,
        tail.final,
    )


def inflate(deflated: Deflated, piece_size: int = 256 * 1024) -> Iterator[bytes]:
    """Decompress ``deflated`` in pieces of at most ``piece_size`` bytes (plain-text scrapes).

    Memory stays at one piece plus zlib's 32 KB window however big the body is.
    """
    decomp = zlib.decompressobj(-zlib.MAX_WBITS)
    for part in deflated.parts:
        data = part
        while data:
            piece = decomp.decompress(data, piece_size)
            data = decomp.unconsumed_tail
            if piece:
                yield piece
    if tail := decomp.flush():
        yield tail


def gzip_parts(head: bytes, tail: Deflated, level: int) -> list[bytes]:
    """One gzip member holding ``head`` followed by the already-deflated, final ``tail``."""
    if not tail.final:
        raise ValueError("the tail of a gzip member must be a final deflate stream")
    comp = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    head_deflated = comp.compress(head) + comp.flush(zlib.Z_SYNC_FLUSH)
    crc = crc32_combine(zlib.crc32(head), tail.crc, tail.size)
    trailer = struct.pack("<II", crc, (len(head) + tail.size) & 0xFFFFFFFF)
    return [GZIP_HEADER, head_deflated, *tail.parts, trailer]
