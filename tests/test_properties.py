"""broker.conf is read as java.util.Properties.load reads it (the broker's BrokerStartup
loads it so). Expected values follow the Properties.load javadoc, case by case."""

from __future__ import annotations

import pytest

from rmqstore.files.config import load_broker_conf, parse_properties_file
from rmqstore.errors import ConfigError


@pytest.mark.parametrize("text,expected", [
    # unicode escapes, in keys and values (issue #12: \u002D became "u002D")
    ("brokerClusterName=Default\\u002DCluster\n", {"brokerClusterName": "Default-Cluster"}),
    ("\\u006bey=\\u4e2d\\u6587\n", {"key": "中文"}),
    # the other escapes; an unknown escape is the character itself
    ("esc=a\\tb\\nc\\rd\\fe\\\\f\n", {"esc": "a\tb\nc\rd\x0ce\\f"}),
    ("a\\qb=c\n", {"aqb": "c"}),
    ("key\\ with\\ spaces = v\n", {"key with spaces": "v"}),
    ("a\\=b\\:c=d\n", {"a=b:c": "d"}),
    # separators: '=', ':', whitespace, with blanks around; the value keeps trailing blanks
    ("a=1\nb:2\nc 3\nd\t4\ne = 5  \nf : 6\ng   =   7\n",
     {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5  ", "f": "6", "g": "7"}),
    ("only\nempty=\n", {"only": "", "empty": ""}),
    ("h=x=y\n", {"h": "x=y"}),
    # continuation lines: the next line's leading blanks are dropped; '#' there is text
    ("storePathRootDir=/data/ro\\\n    cket\\\n\tmq\n", {"storePathRootDir": "/data/rocketmq"}),
    ("a=b\\\n#c\n", {"a": "b#c"}),
    ("k = v1 \\\n  v2\n", {"k": "v1 v2"}),
    ("back=slash\\\\\nnext=1\n", {"back": "slash\\", "next": "1"}),  # an escaped backslash ends no line
    # comments and blank lines; CRLF
    ("# c = 1\n! d = 2\n   # e\n\n  \nf=3\n", {"f": "3"}),
    ("a=b\r\nc=d\r\n", {"a": "b", "c": "d"}),
    # the last of a repeated key wins
    ("dup=1\ndup=2\n", {"dup": "2"}),
])
def test_java_properties_rules(text, expected):
    assert parse_properties_file(text) == expected


def test_malformed_unicode_escape_is_a_config_error():
    with pytest.raises(ConfigError, match="not valid Java properties"):
        parse_properties_file("x=\\u00zz\n")


def test_broker_conf_settings_through_escapes_and_continuations(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("# geometry\nmapped\\u0046ileSizeCommitLog : 65536\n"
                    "maxHashSlotNum \\\n   64\nflushDiskType=SYNC\\u005FFLUSH\n", encoding="utf-8")
    got = load_broker_conf(conf)
    assert got["mapped_file_size_commit_log"] == 65536
    assert got["max_hash_slot_num"] == 64
    assert got["flush_disk_type"] == "SYNC_FLUSH"
