"""rmqstore: read, check, repair and rebuild Apache RocketMQ broker stores offline.

The library holds the engine and returns data; the ``rmqstore`` command (package ``cli``)
only parses arguments and renders. The public API is importable from here::

    import rmqstore

    with rmqstore.open_store("/data/rocketmq/store") as store:
        for msg in store.messages(topic="Orders", since="2024-06-10T08:00:00+08:00"):
            ...

Names resolve on first use (PEP 562), so ``import rmqstore`` stays cheap: numpy and the
engine load only when a script reaches for them. See docs/scripting.md.
"""

from __future__ import annotations

import importlib
import sys
import types

from .errors import (ConfigError, InputError, NotAStoreError, OffsetError, RecordError,
                     RefusedError, RmqStoreError, SegmentError, StoreIOError, StoreLockedError,
                     UnsafePathError, UnsupportedStoreError)

__version__ = "0.1.0"

# public name -> (module, attribute)
_LAZY = {
    "open_store": ("reader", "open_store"),
    "open_segment_file": ("reader", "open_segment_file"),
    "classify": ("reader", "classify"),
    "StoreReader": ("reader", "StoreReader"),
    "KeyQueryResult": ("reader", "KeyQueryResult"),
    "MessageFilter": ("selection", "MessageFilter"),
    "MessageScan": ("selection", "MessageScan"),
    "ScanStop": ("selection", "ScanStop"),
    "Follower": ("follow", "Follower"),
    "verify": ("verify", "verify"),
    "VerifyReport": ("recovery.verify", "VerifyReport"),
    "plan_repair": ("recovery.repair_plan", "plan_repair"),
    "repair": ("recovery.repair", "repair"),
    "rebuild": ("rebuild", "rebuild"),
    "store_stats": ("stats", "store_stats"),
    "MessageStore": ("engine.store", "MessageStore"),
    "Message": ("format.message", "Message"),
    "Host": ("format.message", "Host"),
    "message_dict": ("view", "message_dict"),
    "decode_body": ("format.compression", "decode_body"),
    "BodyDir": ("view", "BodyDir"),
    "uniq_key_info": ("uniqkey", "uniq_key_info"),
    "parse_time": ("times", "parse_time"),
    "format_time": ("times", "format_time"),
    "resolve_tz": ("times", "resolve_tz"),
    "set_default_tz": ("times", "set_default_tz"),
    "StoreConfig": ("files.config", "StoreConfig"),
    "load_config": ("files.config", "load_config"),
}

__all__ = sorted([*_LAZY, "ConfigError", "InputError", "NotAStoreError", "OffsetError",
                  "RecordError", "RefusedError", "RmqStoreError", "SegmentError", "StoreIOError",
                  "StoreLockedError", "UnsafePathError", "UnsupportedStoreError", "__version__"])


class _CallableModule(types.ModuleType):
    """A module that is also the public function of the same name: ``rmqstore.verify`` is
    the module :mod:`rmqstore.recovery.verify` (so ``import rmqstore.verify as v`` and
    ``from rmqstore.verify import ...`` work as documented) and calling it runs
    ``rmqstore.recovery.verify.verify``; ``rmqstore.rebuild`` likewise."""

    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rsplit(".", 1)[1])(*args, **kwargs)


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'rmqstore' has no attribute {name!r}") from None
    mod = importlib.import_module(f".{module}", __name__)
    value = mod if module == name else getattr(mod, attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


class _Package(types.ModuleType):
    """Importing a submodule sets it as an attribute of its package; one named like a
    public function (verify, rebuild) becomes callable as that function."""

    def __setattr__(self, name, value):
        if (name in _LAZY and isinstance(value, types.ModuleType)
                and type(value) is types.ModuleType and callable(getattr(value, name, None))):
            value.__class__ = _CallableModule
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
