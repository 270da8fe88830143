"""``rmqstore.verify`` is :mod:`rmqstore.recovery.verify`, callable as its ``verify`` function:
the public name docs/scripting.md documents (see ``_CallableModule`` in the package)."""

import sys

from .recovery import verify as _module

sys.modules[__name__] = _module
