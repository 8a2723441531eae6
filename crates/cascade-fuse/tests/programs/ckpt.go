// A checkpoint writer and checker for tests/mount.rs, the Go twin of ckpt.c: built with
// CGO_ENABLED=0 (a static binary making its own system calls, out of the preload library's
// reach), its files reach the store only through the FUSE mount.
//
//	ckpt-go write DIR    writes the checkpoint below DIR (which must exist)
//	ckpt-go verify DIR   reads it back and checks every byte, the sizes and the listing
//
// The same files, bytes and write order as ckpt.c: NAME.tmp written with WriteAt (pwrite) at
// scattered offsets, Sync (fsync), Close, Rename to NAME; sparse.dat extended with Truncate
// and written in the middle; MANIFEST last. Exit 0 on success, 1 with a message on stderr.
package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

type spec struct {
	name string
	size uint64
	seed uint64
}

var files = []spec{
	{"rank0.dat", 3*1048576 + 5, 1},
	{"rank1.dat", 1048576, 2},
	{"rank2.dat", 4096 + 17, 3},
	{"empty.dat", 0, 4},
}

const (
	sparseSize = 2*1048576 + 100
	sparseAt   = 1234567
	sparseLen  = 1000
	sparseSeed = 5
	chunk      = 3*65536 + 7
)

func pattern(seed, off uint64) byte {
	v := (off ^ (seed << 40)) * 0x9E3779B97F4A7C15
	v ^= v >> 29
	return byte(v >> 24)
}

func sparseByte(seed, off uint64) byte {
	if off >= sparseAt && off < sparseAt+sparseLen {
		return pattern(seed, off)
	}
	return 0
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "ckpt-go: "+format+"\n", args...)
	os.Exit(1)
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fill(buf []byte, seed, off uint64) {
	for i := range buf {
		buf[i] = pattern(seed, off+uint64(i))
	}
}

// finish syncs, closes and renames tmp to final.
func finish(f *os.File, final string) {
	check(f.Sync())
	check(f.Close())
	check(os.Rename(f.Name(), final))
}

func writeFile(dir string, s spec) {
	f, err := os.OpenFile(filepath.Join(dir, s.name+".tmp"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	check(err)
	chunks := (s.size + chunk - 1) / chunk
	buf := make([]byte, chunk)
	// Odd chunks from the last one down, then even chunks from the first one up.
	for pass := 0; pass < 2; pass++ {
		for k := uint64(0); k < chunks; k++ {
			c := k
			if pass == 0 {
				c = chunks - 1 - k
			}
			if (c%2 == 1) != (pass == 0) {
				continue
			}
			off := c * chunk
			n := min(s.size-off, chunk)
			fill(buf[:n], s.seed, off)
			_, err := f.WriteAt(buf[:n], int64(off))
			check(err)
		}
	}
	finish(f, filepath.Join(dir, s.name))
}

func manifest() string {
	var b strings.Builder
	for _, s := range files {
		fmt.Fprintf(&b, "%s %d\n", s.name, s.size)
	}
	fmt.Fprintf(&b, "sparse.dat %d\n", sparseSize)
	return b.String()
}

func doWrite(dir string) {
	for _, s := range files {
		writeFile(dir, s)
	}

	f, err := os.OpenFile(filepath.Join(dir, "sparse.dat.tmp"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	check(err)
	check(f.Truncate(sparseSize))
	buf := make([]byte, sparseLen)
	fill(buf, sparseSeed, sparseAt)
	_, err = f.WriteAt(buf, sparseAt)
	check(err)
	finish(f, filepath.Join(dir, "sparse.dat"))

	f, err = os.OpenFile(filepath.Join(dir, "MANIFEST.tmp"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	check(err)
	text := []byte(manifest())
	// Sequential writes, a few bytes at a time.
	for off := 0; off < len(text); off += 7 {
		_, err := f.Write(text[off:min(off+7, len(text))])
		check(err)
	}
	finish(f, filepath.Join(dir, "MANIFEST"))

	d, err := os.Open(dir)
	check(err)
	check(d.Sync())
	check(d.Close())
	fmt.Printf("wrote %d files in %s\n", len(files)+2, dir)
}

func verifyFile(path string, size uint64, expect func(seed, off uint64) byte, seed uint64) uint64 {
	st, err := os.Stat(path)
	check(err)
	if !st.Mode().IsRegular() || uint64(st.Size()) != size {
		fail("%s: size %d, expected %d", path, st.Size(), size)
	}
	f, err := os.Open(path)
	check(err)
	defer f.Close()
	buf := make([]byte, 1048576)
	off := uint64(0)
	for {
		n, err := f.Read(buf)
		for i := 0; i < n; i++ {
			if buf[i] != expect(seed, off+uint64(i)) {
				fail("%s: byte %d differs", path, off+uint64(i))
			}
		}
		off += uint64(n)
		if err == io.EOF {
			break
		}
		check(err)
	}
	if off != size {
		fail("%s: read %d bytes, expected %d", path, off, size)
	}
	if size > 10 {
		b := make([]byte, 1)
		_, err := f.ReadAt(b, int64(size/2))
		check(err)
		if b[0] != expect(seed, size/2) {
			fail("%s: ReadAt in the middle differs", path)
		}
	}
	return off
}

func doVerify(dir string) {
	total := uint64(0)
	for _, s := range files {
		total += verifyFile(filepath.Join(dir, s.name), s.size, pattern, s.seed)
	}
	total += verifyFile(filepath.Join(dir, "sparse.dat"), sparseSize, sparseByte, sparseSeed)

	got, err := os.ReadFile(filepath.Join(dir, "MANIFEST"))
	check(err)
	if !bytes.Equal(got, []byte(manifest())) {
		fail("MANIFEST differs: %q", got)
	}

	entries, err := os.ReadDir(dir)
	check(err)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp") {
			fail("left behind: %s", e.Name())
		}
	}
	if len(entries) != len(files)+2 {
		fail("%s holds %d names, expected %d", dir, len(entries), len(files)+2)
	}
	fmt.Printf("verified %d files, %d bytes in %s\n", len(files)+2, total, dir)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: ckpt-go write|verify DIR")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "write":
		doWrite(os.Args[2])
	case "verify":
		doVerify(os.Args[2])
	default:
		fmt.Fprintln(os.Stderr, "usage: ckpt-go write|verify DIR")
		os.Exit(2)
	}
}
