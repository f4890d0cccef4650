"""Rank 0's /metrics, read as hostile input: the endpoint runs the tenant's code.

One shared operator scrapes every running job, so one endpoint must not be able to cost it more
than a bounded amount of memory and CPU:

  * only the pods of the attempt's own child are scraped (their controller chain of uids up to the
    child, owners.py): a pod a tenant creates by hand with the job's labels is never asked;
  * the body is read streamed, at most MAX_BODY_BYTES (an oversized body, announced or not, is
    dropped at the bound, never read to its end);
  * no content encoding: the request asks for identity and a compressed answer is refused
    unread (aiohttp would otherwise inflate a gzip bomb on the way in);
  * only our own series are parsed, at most MAX_SERIES_LINES of them, by a line scan whose cost is
    linear in the (bounded) body, instead of prometheus_client's full parser of every family.

The trainer's own exposition is a few KiB (tests/operator_core/test_hostile_tenant.py).
"""

from __future__ import annotations

import logging

import aiohttp

# the parse is pure (controller/policy/progress.py); this module only fetches the body
from ..policy.progress import MAX_BODY_BYTES, Progress, parse_progress

log = logging.getLogger("llmtrain.operator.scrape")

_CHUNK = 16 * 1024


class Refused(Exception):
    """The endpoint answered with something the operator does not read."""


async def fetch(session: aiohttp.ClientSession, url: str, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body at `url`, at most `limit` bytes, uncompressed; raises Refused otherwise. The
    session must be made with auto_decompress=False (`session`)."""
    async with session.get(url, headers={"Accept-Encoding": "identity"}, allow_redirects=False) as resp:
        if resp.status != 200:
            raise Refused(f"HTTP {resp.status}")
        encoding = (resp.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise Refused(f"Content-Encoding {encoding[:40]!r} (identity was asked for)")
        if resp.content_length is not None and resp.content_length > limit:
            raise Refused(f"Content-Length {resp.content_length} > {limit}")
        body = bytearray()
        while True:
            chunk = await resp.content.read(_CHUNK)
            if not chunk:
                return bytes(body)
            body += chunk
            if len(body) > limit:
                resp.close()  # the connection is dropped, not drained
                raise Refused(f"body over {limit} bytes")


def session(timeout: float) -> aiohttp.ClientSession:
    # Headers bounded too: an endless header section is refused at the 64th header.
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout),
        auto_decompress=False,
        max_line_size=8190,
        max_field_size=8190,
        max_headers=64,
    )


async def scrape(http: aiohttp.ClientSession, url: str) -> Progress | None:
    """rank 0's Progress at `url`, or None (unreachable, refused, too slow: logged)."""
    try:
        body = await fetch(http, url)
    except Refused as err:
        log.warning("scrape of %s refused: %s", url, err)
        return None
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
        log.info("scrape of %s failed: %r", url, err)
        return None
    return parse_progress(body)
