"""``rmqstore.rebuild`` is :mod:`rmqstore.recovery.rebuild`, callable as its ``rebuild`` function:
the public name docs/scripting.md documents (see ``_CallableModule`` in the package)."""

import sys

from .recovery import rebuild as _module

sys.modules[__name__] = _module
