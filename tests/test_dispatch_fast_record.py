"""The single put's dispatch: its inline form (the usual record, handled in
``Dispatcher.dispatch_record``) and its general form (``_dispatch_record``) each write
the ConsumeQueues and IndexFiles RocketMQ 4.9.8 wrote (fixtures), not merely each
other's bytes."""
import random

import pytest

from conftest import ROCKETMQ_498, manifest, scenario_params
from rmqstore.engine.dispatch import Dispatcher
from rmqstore.format.hashing import index_hash, prefix_hash, token_hash
from test_append_fixtures import _files, parsed_message, replay


def test_ascii_token_hash_equals_java():
    """The two base-31 parses of an ASCII token, against the spec's hash of the whole key
    (pinned to spec §12.1 in test_codec)."""
    rnd = random.Random(7)
    for _ in range(2000):
        topic = "".join(chr(rnd.randrange(32, 0x3000)) for _ in range(rnd.randrange(1, 20)))
        t = "".join(chr(rnd.randrange(128)) for _ in range(rnd.randrange(0, 60)))
        assert token_hash(prefix_hash(topic), topic, t) == index_hash(f"{topic}#{t}")


# basic: single and several space-separated KEYS, UNIQ_KEYs; unicode: non-ASCII keys and
# tags; special: transactions, SCHEDULE_TOPIC, KEYS of only spaces (fixtures/README). The
# inline form is held to the same files by test_append_fixtures'
# test_parsed_properties_and_waiting_keys_reproduce_rocketmq (the same replay).
@pytest.mark.parametrize("scenario", scenario_params(["basic", "unicode", "special"]))
def test_general_dispatch_form_reproduces_rocketmq(scenario, tmp_path, monkeypatch):
    general_form = Dispatcher._dispatch_record
    general = []

    def counted_general(self, *args, **kwargs):
        general.append(1)
        return general_form(self, *args, **kwargs)

    # Every single put's record goes to the general form, none handled inline.
    monkeypatch.setattr(Dispatcher, "dispatch_record", counted_general)
    root = tmp_path / "store"
    replay(scenario, root, make=parsed_message)  # dict properties: the fast single put
    assert general
    ref = ROCKETMQ_498 / scenario
    assert _files(root, "consumequeue") == _files(ref, "consumequeue")
    assert list(_files(root, "index").values()) == list(_files(ref, "index").values())
