"""Time a command on a pseudo-terminal as an operator's terminal runs it (200x50, PAGER=cat).

    python scripts/tty_dump_timing.py first rmqstore dump STORE   # seconds to the first table row
    python scripts/tty_dump_timing.py full rmqstore dump STORE    # seconds, bytes, max RSS to the end

Used for docs/performance.md's "dump on a terminal" figures (issue 12's acceptance).
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import sys
import termios
import time


def main() -> None:
    mode, argv = sys.argv[1], sys.argv[2:]
    pid, fd = os.forkpty()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env["PAGER"] = "cat"
        os.execvpe(argv[0], argv, env)
    t0 = time.monotonic()
    buf, n = b"", 0
    while True:
        select.select([fd], [], [], 60)
        try:
            b = os.read(fd, 1 << 16)
        except OSError:
            break
        if not b:
            break
        n += len(b)
        if mode == "first":
            buf += b
            if buf.count(b"\n") >= 2:  # the header and the first row
                print(f"first row after {time.monotonic() - t0:.3f} s")
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
    _, status, ru = os.wait4(pid, 0)
    print(f"{time.monotonic() - t0:.1f} s, {n:,} bytes, exit {os.waitstatus_to_exitcode(status)}, "
          f"max RSS {ru.ru_maxrss // 1024} MB")


if __name__ == "__main__":
    main()
