"""rmqstore: read, check, repair and rebuild Apache RocketMQ broker stores offline.

The library holds the engine and returns data; the ``rmqstore`` command (package
``cli``) only parses arguments and renders. Heavy modules load lazily.
"""

__version__ = "0.1.0"
