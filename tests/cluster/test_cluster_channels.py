"""Each host's channel, and the patterns that hear every other host's, on a real redis.

Why against redis-server: the patterns are redis glob syntax; only the server
can say what they match. The ids are chosen to hit the bytes glob syntax uses.
"""

from __future__ import annotations

import itertools
import time

from djcachebench.bench.servers import RedisServer
from djcachebench.coherence.cluster.channels import (
    ID_BYTES,
    channel_id,
    host_channel,
    other_hosts_patterns,
    patterns_excluding,
)
from djcachebench.coherence.cluster.resp import RespConnection, parse_url

#: Bytes a redis glob reads as syntax, and the ends of the byte range.
AWKWARD = b"*?[]\\^-\x00\xff:a"


def _received(sub: RespConnection, wait: float = 0.3) -> list[bytes]:
    """Channels of the pmessages that arrive within ``wait`` seconds."""
    got = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        sub.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            item = sub.reply()
        except TimeoutError:
            break
        assert item[0] == b"pmessage"
        got.append(item[2])
    return got


def test_patterns_hear_every_other_id_once_and_their_own_never(
        redis_server: RedisServer) -> None:
    address = parse_url(redis_server.location)
    publisher = RespConnection(address, 5.0)
    try:
        for own in (b"\x00" * ID_BYTES, b"*?[]\\^", b"-\xff]\\a:", channel_id(12345)):
            patterns = patterns_excluding("t:base", own)
            assert len(patterns) == ID_BYTES
            sub = RespConnection(address, 5.0)
            sub.send("PSUBSCRIBE", *patterns)
            for _ in patterns:
                assert sub.reply()[0] == b"psubscribe"
            others = set()
            for i, byte in itertools.product(range(ID_BYTES), AWKWARD):
                other = own[:i] + bytes((byte,)) + own[i + 1:]
                if other != own:
                    others.add(other)
            for other in sorted(others):
                assert publisher.call("PUBLISH", b"t:base:" + other, b"x") == 1, other
            assert publisher.call("PUBLISH", b"t:base:" + own, b"x") == 0
            assert publisher.call("PUBLISH", b"t:other:" + own[:-1] + b"?", b"x") == 0
            got = _received(sub)
            assert sorted(got) == sorted(b"t:base:" + o for o in others)  # each once
            sub.close()
    finally:
        publisher.close()


def test_a_hosts_channel_and_patterns_agree() -> None:
    assert host_channel("b", 7) == b"b:" + channel_id(7)
    assert len(channel_id(7)) == ID_BYTES and channel_id(7) != channel_id(8)
    assert other_hosts_patterns("b", 7) == patterns_excluding("b", channel_id(7))
