"""POSIX calls from Python through a Cascade FUSE mount (tests/mount.rs).

    python3 posix_ops.py MOUNTPOINT CAPACITY

Creates MOUNTPOINT/py/: writes state.tmp, fsyncs it and the directory, renames it to
sub/state.bin and checks os.stat and the bytes; maps mapped.bin shared, writes through the
mapping, msyncs and reads back with read() through another descriptor, then pwrites and
reads back through the mapping; checks os.statvfs against CAPACITY (bytes). Prints "ok" last;
any failed check raises (exit 1). tests/mount.rs then checks the files from outside.
"""

import mmap
import os
import stat
import sys

root, capacity = sys.argv[1], int(sys.argv[2])
d = os.path.join(root, "py")
os.makedirs(os.path.join(d, "sub"))


def periodic(n, step, add):
    """n bytes of ((i * step + add) % 251): the same formula in tests/mount.rs."""
    period = bytes((i * step + add) % 251 for i in range(251))
    return (period * (n // 251 + 1))[:n]


def read_all(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        out = bytearray()
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return bytes(out)
            out += b
    finally:
        os.close(fd)


# write, fsync, rename, stat
data = periodic(3 * 1024 * 1024 + 11, 1, 0)
tmp = os.path.join(d, "state.tmp")
final = os.path.join(d, "sub", "state.bin")
with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
os.fsync(dfd)
os.close(dfd)
os.rename(tmp, final)
assert not os.path.exists(tmp), "state.tmp still exists after the rename"
st = os.stat(final)
assert stat.S_ISREG(st.st_mode), oct(st.st_mode)
assert st.st_size == len(data), (st.st_size, len(data))
assert read_all(final) == data, "state.bin differs after the rename"

# shared mmap: write through the mapping, msync, read() through another descriptor
size = 2 * 1024 * 1024 + 3 * 4096 + 5
mapped_path = os.path.join(d, "mapped.bin")
fd = os.open(mapped_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(fd, size)
m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
assert m[:] == bytes(size), "a fresh mapping of a truncated file is not zeros"
pat = periodic(size, 7, 3)
m[:] = pat
m.flush()  # msync(MS_SYNC)
assert read_all(mapped_path) == pat, "read() after msync does not see the mapping's writes"

# and the reverse: pwrite through the descriptor, read through the mapping
marker = b"HELLO-FROM-PWRITE"
at = 100 * 4096 + 3
assert os.pwrite(fd, marker, at) == len(marker)
assert m[at : at + len(marker)] == marker, "the mapping does not see a pwrite"
# a pwrite through a second, independent open, too
fd2 = os.open(mapped_path, os.O_WRONLY)
marker2 = b"SECOND-DESCRIPTOR"
at2 = size - len(marker2)
assert os.pwrite(fd2, marker2, at2) == len(marker2)
os.close(fd2)
assert m[at2:size] == marker2, "the mapping does not see a pwrite through another open"
m.close()
os.close(fd)
want = pat[:at] + marker + pat[at + len(marker) : at2] + marker2
assert read_all(mapped_path) == want, "mapped.bin differs after unmap"

# statvfs: the store's capacity
sv = os.statvfs(root)
assert sv.f_blocks * sv.f_frsize == capacity, (sv.f_blocks, sv.f_frsize, capacity)
assert 0 < sv.f_bavail * sv.f_frsize < capacity, (sv.f_bavail, sv.f_frsize)
print("ok")
