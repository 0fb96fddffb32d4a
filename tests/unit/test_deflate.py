"""Both compressors (ISA-L where python-isal is installed, zlib elsewhere) give streams every
client decompresses to the exact text, also when segments of the two are spliced together
(``exporters.deflate``). Scrapers decompress with zlib, as here."""

from __future__ import annotations

import gzip
import importlib.util
import platform
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporters import deflate
from exporters.http import concat, deflate_chunks, gzip_parts, inflate
from ibmon.runtime.selfmetrics import SelfMetrics

BACKENDS = ("isal", "zlib")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    name: str = request.param
    if name == "isal" and deflate._isal is None:
        pytest.skip("python-isal has no wheel for this machine (zlib is used)")
    monkeypatch.setattr(deflate, "BACKEND", name)
    return name


def test_isal_is_what_a_linux_x86_64_or_arm64_install_uses() -> None:
    """The dependency is declared for these machines; the fast path must really be taken."""
    if platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64"):
        assert deflate.BACKEND == "isal"


def test_build_info_names_the_compressor_and_numpy_in_use() -> None:
    """``ibmon_build_info`` tells an operator which optional backends this install runs."""
    labels = SelfMetrics().registry.render().decode()
    numpy = "yes" if importlib.util.find_spec("numpy") is not None else "no"
    assert f'deflate="{deflate.BACKEND}"' in labels and f'numpy="{numpy}"' in labels


chunks = st.lists(st.binary(max_size=3000) | st.text(max_size=2000).map(str.encode),
                  max_size=8)


# The backend fixture sets the same value for every example: sharing it is safe.
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=st.binary(max_size=500), first=chunks, second=chunks)
def test_spliced_segments_decompress_to_the_text(
    backend: str, head: bytes, first: list[bytes], second: list[bytes]
) -> None:
    segment = deflate_chunks(first, 1, final=False)
    tail = deflate_chunks(second, 1)
    body = concat(segment, tail)
    text = b"".join(first) + b"".join(second)
    assert b"".join(inflate(body)) == text
    assert zlib.decompress(b"".join(body.parts), -zlib.MAX_WBITS) == text
    assert body.crc == zlib.crc32(text) and body.size == len(text)
    assert gzip.decompress(b"".join(gzip_parts(head, body, 1))) == head + text


def test_segments_of_both_compressors_splice_into_one_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if deflate._isal is None:
        pytest.skip("python-isal has no wheel for this machine")
    text = b'ibmon_port_transmit_data_bytes_total{guid="0x1",port="1"} 123\n' * 2000
    monkeypatch.setattr(deflate, "BACKEND", "isal")
    a = deflate_chunks((text,), 1, final=False)
    monkeypatch.setattr(deflate, "BACKEND", "zlib")
    b = deflate_chunks((text[::-1],), 1)
    assert gzip.decompress(b"".join(gzip_parts(b"# head\n", concat(a, b), 1))) == (
        b"# head\n" + text + text[::-1])
    assert a.compressed_size < len(text) / 10  # it did compress


@given(st.binary(max_size=5000), st.binary(max_size=5000))
def test_both_crc_combines_give_the_crc_of_the_whole(a: bytes, b: bytes) -> None:
    """The CRC of spliced streams is combined, never read from the text: ISA-L's combine
    where python-isal is installed, the pure-Python one elsewhere; both as zlib counts."""
    from exporters import http

    whole = zlib.crc32(a + b)
    assert http.crc32_combine_py(zlib.crc32(a), zlib.crc32(b), len(b)) == whole
    assert http.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == whole
    if deflate._isal is not None:
        assert http.crc32_combine is not http.crc32_combine_py  # the C one is really used
