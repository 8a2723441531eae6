//! The index log's byte format: file header, record framing and record bodies
//! (docs/staging-arenas.md, "index.log").

/// First 8 bytes of index.log.
pub(crate) const MAGIC: &[u8; 8] = b"CASCIDX1";
/// The only format version this code reads and writes.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// Magic, version, reserved.
pub(crate) const HEADER_LEN: u64 = 16;
/// Frame: u32 body length, u32 crc32c of the body.
pub(crate) const FRAME_LEN: usize = 8;
/// A longer body is corruption: bounds what replay allocates for one record.
pub(crate) const MAX_BODY: usize = 16 << 20;

const T_NEW_ARENA: u8 = 1;
const T_VERSION: u8 = 2;
const T_EXTENT: u8 = 3;
const T_SEAL: u8 = 4;
const T_DRAINED: u8 = 5;
const T_MANIFEST: u8 = 6;
const T_MANIFEST_DONE: u8 = 7;
const T_ARENA_DELETED: u8 = 8;
const T_ID_RESERVE: u8 = 9;
/// A Seal with its writer's tag (T_SEAL, written before tags existed, has none).
const T_SEAL_TAGGED: u8 = 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileRec {
    pub path: String,
    pub size: u64,
    pub blake3: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    NewArena {
        arena: u32,
    },
    Version {
        id: u64,
        stamp: u64,
        size: u64,
        key: String,
    },
    Extent {
        id: u64,
        offset: u64,
        len: u32,
        arena: u32,
        position: u64,
        crc: u32,
    },
    Seal {
        id: u64,
        blake3: [u8; 32],
        /// The writer's tag (cascade_wire::auth::JobKey::version_tag), if it sent one.
        tag: Option<[u8; 32]>,
    },
    Drained {
        id: u64,
    },
    Manifest {
        id: u64,
        single_file: bool,
        checkpoint: String,
        files: Vec<FileRec>,
    },
    ManifestDone {
        id: u64,
    },
    ArenaDeleted {
        arena: u32,
    },
    /// Ids below these may have been handed out: never issue them again.
    IdReserve {
        versions_below: u64,
        manifests_below: u64,
        arenas_below: u32,
    },
}

/// The file header of a fresh index.
pub(crate) fn header() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h
}

/// Checks a header; Err names what is wrong.
pub(crate) fn check_header(data: &[u8]) -> Result<(), String> {
    if data.len() < HEADER_LEN as usize {
        return Err(format!(
            "too short for its {HEADER_LEN}-byte header ({} bytes)",
            data.len()
        ));
    }
    if &data[..8] != MAGIC {
        return Err("bad magic (not a Cascade staging index)".into());
    }
    let version = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ));
    }
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Callers validate lengths (valid_str_len) before building a record.
    let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..len as usize]);
}

/// Strings are stored with a u16 length.
pub(crate) fn valid_str_len(s: &str) -> bool {
    s.len() <= u16::MAX as usize
}

impl Record {
    fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Record::NewArena { arena } => {
                out.push(T_NEW_ARENA);
                out.extend_from_slice(&arena.to_le_bytes());
            }
            Record::Version {
                id,
                stamp,
                size,
                key,
            } => {
                out.push(T_VERSION);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&stamp.to_le_bytes());
                out.extend_from_slice(&size.to_le_bytes());
                put_str(out, key);
            }
            Record::Extent {
                id,
                offset,
                len,
                arena,
                position,
                crc,
            } => {
                out.push(T_EXTENT);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&arena.to_le_bytes());
                out.extend_from_slice(&position.to_le_bytes());
                out.extend_from_slice(&crc.to_le_bytes());
            }
            Record::Seal { id, blake3, tag } => {
                out.push(if tag.is_some() { T_SEAL_TAGGED } else { T_SEAL });
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(blake3);
                if let Some(tag) = tag {
                    out.extend_from_slice(tag);
                }
            }
            Record::Drained { id } => {
                out.push(T_DRAINED);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Record::Manifest {
                id,
                single_file,
                checkpoint,
                files,
            } => {
                out.push(T_MANIFEST);
                out.extend_from_slice(&id.to_le_bytes());
                out.push(u8::from(*single_file));
                put_str(out, checkpoint);
                let n = u32::try_from(files.len()).unwrap_or(u32::MAX);
                out.extend_from_slice(&n.to_le_bytes());
                for f in files.iter().take(n as usize) {
                    put_str(out, &f.path);
                    out.extend_from_slice(&f.size.to_le_bytes());
                    out.extend_from_slice(&f.blake3);
                }
            }
            Record::ManifestDone { id } => {
                out.push(T_MANIFEST_DONE);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Record::ArenaDeleted { arena } => {
                out.push(T_ARENA_DELETED);
                out.extend_from_slice(&arena.to_le_bytes());
            }
            Record::IdReserve {
                versions_below,
                manifests_below,
                arenas_below,
            } => {
                out.push(T_ID_RESERVE);
                out.extend_from_slice(&versions_below.to_le_bytes());
                out.extend_from_slice(&manifests_below.to_le_bytes());
                out.extend_from_slice(&arenas_below.to_le_bytes());
            }
        }
    }

    /// Appends the framed record (length, crc32c, body) to `out`; returns the frame's length.
    pub(crate) fn frame_into(&self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(&[0u8; FRAME_LEN]);
        self.encode_body(out);
        let body_len = out.len() - start - FRAME_LEN;
        let crc = crc32c::crc32c(&out[start + FRAME_LEN..]);
        out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        out.len() - start
    }

    /// Length of the framed record.
    pub(crate) fn framed_len(&self) -> usize {
        let mut v = Vec::new();
        self.frame_into(&mut v)
    }

    /// Decodes a body whose CRC checked. None: malformed (unknown type, wrong length).
    pub(crate) fn decode_body(body: &[u8]) -> Option<Record> {
        let mut r = Reader { b: body, at: 0 };
        let rec = match r.u8()? {
            T_NEW_ARENA => Record::NewArena { arena: r.u32()? },
            T_VERSION => Record::Version {
                id: r.u64()?,
                stamp: r.u64()?,
                size: r.u64()?,
                key: r.str()?,
            },
            T_EXTENT => Record::Extent {
                id: r.u64()?,
                offset: r.u64()?,
                len: r.u32()?,
                arena: r.u32()?,
                position: r.u64()?,
                crc: r.u32()?,
            },
            T_SEAL => Record::Seal {
                id: r.u64()?,
                blake3: r.hash()?,
                tag: None,
            },
            T_SEAL_TAGGED => Record::Seal {
                id: r.u64()?,
                blake3: r.hash()?,
                tag: Some(r.hash()?),
            },
            T_DRAINED => Record::Drained { id: r.u64()? },
            T_MANIFEST => {
                let id = r.u64()?;
                let single_file = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                let checkpoint = r.str()?;
                let n = r.u32()? as usize;
                // Each file takes at least 42 bytes: a count larger than the body is garbage.
                if n > body.len() / 42 {
                    return None;
                }
                let mut files = Vec::with_capacity(n);
                for _ in 0..n {
                    files.push(FileRec {
                        path: r.str()?,
                        size: r.u64()?,
                        blake3: r.hash()?,
                    });
                }
                Record::Manifest {
                    id,
                    single_file,
                    checkpoint,
                    files,
                }
            }
            T_MANIFEST_DONE => Record::ManifestDone { id: r.u64()? },
            T_ARENA_DELETED => Record::ArenaDeleted { arena: r.u32()? },
            T_ID_RESERVE => Record::IdReserve {
                versions_below: r.u64()?,
                manifests_below: r.u64()?,
                arenas_below: r.u32()?,
            },
            _ => return None,
        };
        if r.at != body.len() {
            return None;
        }
        Some(rec)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn hash(&mut self) -> Option<[u8; 32]> {
        self.take(32)?.try_into().ok()
    }
    fn str(&mut self) -> Option<String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

/// Why the scan of the record sequence stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Fewer bytes left than a frame or than the body length says.
    Torn,
    /// body_len is 0 or above MAX_BODY.
    BadLength(u32),
    /// The CRC does not match the body.
    BadCrc,
}

/// Result of scanning an index file.
pub(crate) struct Scan {
    pub records: Vec<Record>,
    /// Bytes of the file (from 0, header included) that hold valid records.
    pub valid_len: u64,
    /// Why scanning stopped early, None when it reached the end of the file.
    pub tail: Option<Tail>,
}

/// Scans `data` (a whole index file whose header checked). Stops at the first record
/// whose frame or CRC does not check: that record and everything after it are the torn
/// tail. A record whose CRC checks but whose body does not decode is Err: that is not a
/// torn write, and truncating it would throw away acknowledged records after it.
pub(crate) fn scan(data: &[u8]) -> Result<Scan, String> {
    let mut at = HEADER_LEN as usize;
    let mut records = Vec::new();
    let tail = loop {
        let rest = &data[at.min(data.len())..];
        if rest.is_empty() {
            break None;
        }
        if rest.len() < FRAME_LEN {
            break Some(Tail::Torn);
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len == 0 || len as usize > MAX_BODY {
            break Some(Tail::BadLength(len));
        }
        let Some(body) = rest.get(FRAME_LEN..FRAME_LEN + len as usize) else {
            break Some(Tail::Torn);
        };
        if crc32c::crc32c(body) != crc {
            break Some(Tail::BadCrc);
        }
        match Record::decode_body(body) {
            Some(rec) => records.push(rec),
            None => {
                return Err(format!(
                    "record at offset {at} (type {}, {len} bytes) has a valid checksum but does not decode",
                    body[0]
                ))
            }
        }
        at += FRAME_LEN + len as usize;
    };
    Ok(Scan {
        records,
        valid_len: at as u64,
        tail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Record> {
        vec![
            Record::NewArena { arena: 7 },
            Record::Version {
                id: 1,
                stamp: 2,
                size: 3,
                key: "a/b.dat".into(),
            },
            Record::Extent {
                id: 1,
                offset: 4,
                len: 5,
                arena: 6,
                position: 7,
                crc: 8,
            },
            Record::Seal {
                id: 1,
                blake3: [9; 32],
                tag: None,
            },
            Record::Seal {
                id: 2,
                blake3: [9; 32],
                tag: Some([3; 32]),
            },
            Record::Drained { id: 1 },
            Record::Manifest {
                id: 3,
                single_file: true,
                checkpoint: "ckpt.1".into(),
                files: vec![FileRec {
                    path: "x".into(),
                    size: 10,
                    blake3: [1; 32],
                }],
            },
            Record::ManifestDone { id: 3 },
            Record::ArenaDeleted { arena: 7 },
            Record::IdReserve {
                versions_below: 11,
                manifests_below: 12,
                arenas_below: 13,
            },
        ]
    }

    #[test]
    fn records_round_trip_and_sizes_match_the_docs() {
        let mut file = header().to_vec();
        for r in all() {
            r.frame_into(&mut file);
        }
        let s = scan(&file).unwrap();
        assert_eq!(s.records, all());
        assert_eq!(s.tail, None);
        assert_eq!(s.valid_len, file.len() as u64);
        // Body sizes documented in docs/staging-arenas.md.
        let sizes: Vec<usize> = all().iter().map(|r| r.framed_len() - FRAME_LEN).collect();
        assert_eq!(
            sizes,
            vec![
                5,
                27 + 7,
                37,
                41,
                73,
                9,
                16 + 6 + (2 + 1 + 8 + 32),
                9,
                5,
                21
            ]
        );
    }

    #[test]
    fn the_framing_example_in_the_docs_is_exact() {
        // Standard CRC-32C (Castagnoli) check value.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        let mut out = Vec::new();
        Record::Drained { id: 5 }.frame_into(&mut out);
        assert_eq!(
            out,
            [9, 0, 0, 0, 0x92, 0x83, 0x35, 0xf9, 5, 5, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(&header(), b"CASCIDX1\x01\0\0\0\0\0\0\0");
    }

    #[test]
    fn valid_crc_with_bad_body_is_an_error_not_a_tail() {
        let mut file = header().to_vec();
        let body = [0xEEu8, 1, 2];
        file.extend_from_slice(&(body.len() as u32).to_le_bytes());
        file.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        file.extend_from_slice(&body);
        assert!(scan(&file).is_err());
    }
}
