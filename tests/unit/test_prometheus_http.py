"""HTTP helpers of the exporter: listen parsing, basic auth, Accept-Encoding, spliced gzip."""

from __future__ import annotations

import base64
import gzip
import random
import zlib
from pathlib import Path

import pydantic
import pytest

import exporters.http
import ibmon.config
from exporters.http import (
    BasicAuth,
    accepts_gzip,
    concat,
    crc32_combine,
    deflate_chunks,
    gzip_parts,
    hash_password,
    inflate,
    parse_listen,
)
from exporters.prometheus import PrometheusExporter
from ibmon.config import PrometheusConfig
from ibmon.runtime.selfmetrics import SelfMetrics


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9683", ("127.0.0.1", 9683)),
        ("[::1]:0", ("::1", 0)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        ("localhost:65535", ("localhost", 65535)),
        ("[fe80::1%eth0]:9683", ("fe80::1%eth0", 9683)),
    ],
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


BAD_LISTEN = ["9683", ":9683", "host:", "host:port", "::1:9683", "[]:1", "h:65536", "h:-1",
              "[127.0.0.1]:80", "[host]:80", "[::1:80", "h]:80", " 127.0.0.1:9683",
              "127.0.0.1 :9683", "h:\u00b2", "h:+80", "h:٣"]


@pytest.mark.parametrize("listen", BAD_LISTEN)
def test_parse_listen_rejects(listen: str) -> None:
    with pytest.raises(ValueError, match="listen address"):
        parse_listen(listen)


@pytest.mark.parametrize("listen", BAD_LISTEN)
def test_config_refuses_exactly_what_the_exporter_cannot_bind(listen: str) -> None:
    """One rule: check-config accepts a listen address only if the exporter does."""
    assert exporters.http.parse_listen is ibmon.config.parse_listen
    with pytest.raises(pydantic.ValidationError, match="listen address"):
        PrometheusConfig(listen=listen)


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (None, False),
        ("", False),
        ("gzip", True),
        ("GZIP", True),
        ("deflate, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0, identity", False),
        ("*", True),
        ("*;q=0", False),
        ("identity", False),
        ("br, *;q=0.1", True),
        ("gzip;q=0, *", False),
        ("gzip;q=bogus", False),
        ("x-gzip", True),
    ],
)
def test_accepts_gzip(header: str | None, ok: bool) -> None:
    assert accepts_gzip(header) is ok


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_auth_file(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text(
        "# comment\n\n"
        f"prometheus:{hash_password('s3cret:with colon')}\n"
        f"  grafana:{hash_password('ünïcode').upper()}  \n",
        encoding="utf-8",
    )
    auth = BasicAuth.from_file(path)
    assert auth.check(_basic("prometheus", "s3cret:with colon"))
    assert auth.check(_basic("grafana", "ünïcode"))
    assert auth.check("basic " + _basic("grafana", "ünïcode").split()[1])
    assert not auth.check(_basic("prometheus", "s3cret"))
    assert not auth.check(_basic("nobody", "s3cret:with colon"))
    assert not auth.check(None)
    assert not auth.check("Bearer abc")
    # right credentials, wrong scheme
    assert not auth.check("Bearer " + _basic("grafana", "ünïcode").split()[1])
    assert not auth.check("Basic !!!not-base64")
    # valid credentials with characters base64 does not have: refused, not decoded leniently
    assert not auth.check(_basic("grafana", "ünïcode") + "*")
    assert not auth.check("Basic " + base64.b64encode(b"no-colon").decode())
    # no colon: not a user with an empty password either
    empty = tmp_path / "empty"
    empty.write_text(f"blank:{hash_password('')}\n", encoding="utf-8")
    assert BasicAuth.from_file(empty).check(_basic("blank", ""))
    assert not BasicAuth.from_file(empty).check(
        "Basic " + base64.b64encode(b"blank").decode())
    # an unknown user is compared with a stand-in hash for timing's sake; its password
    # must not let anyone in
    assert not auth.check(_basic("nobody", "ibmon: user does not exist"))
    assert not auth.check("Basic " + base64.b64encode(b"prometheus:\xff").decode())


def test_sha256_matches_sha256sum_documented_in_the_file_format() -> None:
    # printf %s 'secret' | sha256sum
    assert hash_password("secret") == (
        "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
    )


@pytest.mark.parametrize(
    "content",
    ["", "# only comments\n", "user\n", "user:abc\n", f":{'0' * 64}\n",
     f"a:{'0' * 64}\na:{'1' * 64}\n", f"a:b:{'0' * 64}\n"],
)
def test_basic_auth_file_rejects(tmp_path: Path, content: str) -> None:
    path = tmp_path / "users"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=r"users|expected|twice"):
        BasicAuth.from_file(path)


def test_exporter_config_errors_surface_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="together"):
        PrometheusExporter(self_metrics=SelfMetrics(), tls_cert=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="listen"):
        PrometheusExporter(listen="nonsense", self_metrics=SelfMetrics())
    with pytest.raises(FileNotFoundError):
        PrometheusExporter(self_metrics=SelfMetrics(), basic_auth_file=tmp_path / "missing")


def test_crc32_combine_matches_zlib() -> None:
    rng = random.Random(1)
    for size_a, size_b in [(0, 0), (0, 5), (5, 0), (1, 1), (3, 1000), (70_000, 12_345)]:
        a = rng.randbytes(size_a)
        b = rng.randbytes(size_b)
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_spliced_gzip_is_one_valid_member() -> None:
    head = b"# HELP self metrics\n" * 50
    chunks = (b"ibmon_port_info{...} 1\n" * 1000, b"", b"x" * 70_000, "nœud\n".encode())
    parts = gzip_parts(head, deflate_chunks(chunks, 1), 1)
    blob = b"".join(parts)
    whole = head + b"".join(chunks)
    assert gzip.decompress(blob) == whole  # checks CRC and length trailer
    # One member, not several concatenated: single-member decoders (aiohttp, curl) see it all.
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert d.decompress(blob) == whole
    assert d.eof
    assert d.unused_data == b""


def test_spliced_gzip_with_empty_tail() -> None:
    blob = b"".join(gzip_parts(b"head\n", deflate_chunks((), 1), 1))
    assert gzip.decompress(blob) == b"head\n"


def _chunks() -> list[bytes]:
    rng = random.Random(7)
    text = [f"ibmon_x{{guid=\"0x{rng.getrandbits(64):016x}\"}} {rng.random()!r}\n".encode()
            for _ in range(20_000)]
    return [b"".join(text[:5000]), b"", b"".join(text[5000:]), "n\u0153ud\n".encode()]


def test_deflate_takes_a_generator_and_inflate_streams_it_back_in_bounded_pieces() -> None:
    chunks = _chunks()
    whole = b"".join(chunks)
    deflated = deflate_chunks((c for c in chunks), 1)
    assert deflated.size == len(whole)
    assert deflated.crc == zlib.crc32(whole)
    assert deflated.compressed_size < len(whole) / 2
    pieces = list(inflate(deflated, 4096))
    assert b"".join(pieces) == whole
    assert len(pieces) > len(whole) // 4096 - 1
    assert max(len(p) for p in pieces) <= 4096
    assert list(inflate(deflate_chunks((), 1))) == []


def test_a_segment_and_a_tail_concatenate_into_one_stream() -> None:
    """The exporter reuses the _info families' compressed segment behind fresh series."""
    chunks = _chunks()
    segment = deflate_chunks(chunks[:2], 1, final=False)
    tail = deflate_chunks(chunks[2:], 1)
    body = concat(segment, tail)
    whole = b"".join(chunks)
    assert body.final
    assert body.size == len(whole)
    assert body.crc == zlib.crc32(whole)
    assert b"".join(inflate(body, 1000)) == whole
    assert zlib.decompress(b"".join(body.parts), -zlib.MAX_WBITS) == whole
    blob = b"".join(gzip_parts(b"head\n", body, 1))
    assert gzip.decompress(blob) == b"head\n" + whole
    # An empty segment (no ports) is still a valid prefix.
    assert b"".join(inflate(concat(deflate_chunks((), 1, final=False), tail))) == b"".join(
        chunks[2:])


def test_misordered_streams_are_refused() -> None:
    final = deflate_chunks([b"x"], 1)
    segment = deflate_chunks([b"x"], 1, final=False)
    with pytest.raises(ValueError, match="non-final"):
        concat(final, segment)
    with pytest.raises(ValueError, match="final deflate stream"):
        gzip_parts(b"head", segment, 1)
