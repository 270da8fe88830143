#!/usr/bin/env python3
"""Regenerate the sample stores in this folder, byte for byte.

    .venv/bin/python samples/make_samples.py            # rewrite samples/*/
    .venv/bin/python samples/make_samples.py /tmp/out   # write them somewhere else

Everything that could vary (times, seed, IndexFile names) is fixed in rmqstore.samples,
so the output matches the checked-in files; tests/test_samples.py checks that.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rmqstore.samples import SAMPLES, generate


def main(argv: list[str]) -> int:
    dest = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    for root in generate(dest, SAMPLES):
        print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
