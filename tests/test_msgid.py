"""offsetMsgId (spec §5.1): one encoder and decoder, in ``rmqstore.format.message``.

Golden data are the spec's vectors (§12.4) and the ids RocketMQ itself returned for every
record of the fixture stores (``stored.msgId`` in each manifest), IPv4 and IPv6 store
hosts. Every form (whole id, host prefix + offset, vectorised) is held to the same ids.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import FIXTURES, NO_FIXTURES
from rmqstore.errors import InputError
from rmqstore.format import layout as L
from rmqstore.format.message import (Host, decode_offset_msg_id, is_offset_msg_id,
                                     offset_msg_id, offset_msg_id_at, offset_msg_id_prefix,
                                     offset_msg_ids)

#: spec §12.4: (store host, physical offset, offsetMsgId)
SPEC_VECTORS = [
    ("192.168.0.100:10911", 2048, "C0A8006400002A9F0000000000000800"),
    ("[2001:db8::1]:10911", 4294967296, "20010DB800000000000000000000000100002A9F0000000100000000"),
]

#: Manifests that list their messages (torn and recovered copies point at another's list).
MANIFESTS = [p for p in sorted(FIXTURES.glob("*/*/manifest.json"))
             if '"messages"' in p.read_text()] if FIXTURES.is_dir() else []


def _stored(path) -> list[tuple[Host, int, str]]:
    out = []
    for m in json.loads(path.read_text())["messages"]:
        s = m["stored"]
        out.append((Host.parse(s["storeHost"]), s["phyOffset"], s["msgId"]))
    return out


def _vectorised(cases: list[tuple[Host, int, str]]) -> list[str]:
    n = len(cases)
    address = np.zeros((n, 16), np.uint8)
    for i, (h, _, _) in enumerate(cases):
        address[i, :len(h.address)] = np.frombuffer(h.address, np.uint8)
    offsets, data = offset_msg_ids(address, np.array([h.port for h, _, _ in cases]),
                                   np.array([h.is_v6 for h, _, _ in cases]),
                                   np.array([p for _, p, _ in cases], np.int64))
    raw = data.tobytes()
    return [raw[a:b].decode("ascii") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def test_the_layout_is_the_specs():
    # address (4 or 16) + i32 port + i64 offset, two hex digits a byte: 32 or 56 characters
    assert L.OFFSET_MSG_ID_SIZE == {False: 4 + 4 + 8, True: 16 + 4 + 8}
    assert L.OFFSET_MSG_ID_HEX_LENGTHS == {32: False, 56: True}


@pytest.mark.parametrize("host, phys, msg_id", SPEC_VECTORS)
def test_spec_vectors_in_every_form(host, phys, msg_id):
    h = Host.parse(host)
    assert offset_msg_id(h, phys) == msg_id
    assert offset_msg_id_at(offset_msg_id_prefix(h), phys) == msg_id
    assert offset_msg_id_prefix(h) == msg_id[:-16]
    assert decode_offset_msg_id(msg_id) == (h, phys)
    assert decode_offset_msg_id(msg_id.lower()) == (h, phys)
    assert _vectorised([(h, phys, msg_id)]) == [msg_id]


@pytest.mark.parametrize("path", MANIFESTS or [pytest.param(None, marks=pytest.mark.skip(reason=NO_FIXTURES))],
                         ids=lambda p: "/".join(p.parts[-3:-1]) if p else "none")
def test_the_ids_rocketmq_returned(path):
    cases = _stored(path)
    assert cases
    for h, phys, msg_id in cases:
        assert offset_msg_id(h, phys) == msg_id
        assert offset_msg_id_at(offset_msg_id_prefix(h), phys) == msg_id
        assert decode_offset_msg_id(msg_id) == (h, phys)
        assert is_offset_msg_id(msg_id)
    assert _vectorised(cases) == [m for _, _, m in cases]


@pytest.mark.skipif(not (FIXTURES / "rocketmq-4.9.8" / "ipv6").is_dir(), reason=NO_FIXTURES)
def test_ipv4_and_ipv6_hosts_mixed_in_one_vector():
    v6 = _stored(FIXTURES / "rocketmq-4.9.8" / "ipv6" / "manifest.json")
    v4 = _stored(FIXTURES / "rocketmq-4.9.8" / "basic" / "manifest.json")[:len(v6)]
    assert any(h.is_v6 for h, _, _ in v6) and not any(h.is_v6 for h, _, _ in v4)
    mixed = [c for pair in zip(v4, v6) for c in pair]
    assert _vectorised(mixed) == [m for _, _, m in mixed]


@pytest.mark.parametrize("bad", ["XYZ", "", "C0A8006400002A9F000000000000080",
                                 "C0A8006400002A9F00000000000008000",
                                 "C0A8 0064 00002A9F0000000000000800",  # spaces fromhex would skip
                                 "G0A8006400002A9F0000000000000800"])
def test_what_is_not_an_offset_msg_id(bad):
    with pytest.raises(InputError):
        decode_offset_msg_id(bad)
    assert not is_offset_msg_id(bad)
