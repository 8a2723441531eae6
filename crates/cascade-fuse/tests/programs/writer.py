"""A writer that never finishes by itself (tests/mount.rs, the kill -9 test).

    python3 writer.py PATH

Creates PATH and pwrites 1 MiB blocks over its first 64 MiB, round and round, until a write
fails; then prints "writer: errno N (TEXT)" on stderr and exits 3.
"""

import os
import sys

fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
block = bytes(range(256)) * 4096
i = 0
try:
    while True:
        os.pwrite(fd, block, (i % 64) << 20)
        i += 1
except OSError as e:
    print(f"writer: errno {e.errno} ({e.strerror}) after {i} blocks", file=sys.stderr)
    sys.exit(3)
