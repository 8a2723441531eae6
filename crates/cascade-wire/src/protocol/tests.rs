//! Round trips and hostile bodies of every message kind.

use super::*;

fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let header = Header {
        kind,
        body_len: body.len() as u32,
        request: 7,
    };
    write_frame(&mut out, header, &[body]).unwrap();
    out
}

/// A writer taking at most `cap` bytes per call, over at most 3 slices.
struct Dribble {
    out: Vec<u8>,
    cap: usize,
}

impl Write for Dribble {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.cap);
        self.out.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs.iter().take(3) {
            let take = b.len().min(self.cap - n);
            self.out.extend_from_slice(&b[..take]);
            n += take;
            if n == self.cap {
                break;
            }
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn partial_vectored_writes_send_every_byte_once() {
    let parts: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; i as usize % 7]).collect();
    let body: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
    let len = body.iter().map(|b| b.len()).sum::<usize>() as u32;
    let header = Header {
        kind: kind::WRITE,
        body_len: len,
        request: 3,
    };
    let mut whole = header.encode().to_vec();
    body.iter().for_each(|b| whole.extend_from_slice(b));
    for cap in [1, 2, 5, 16, 17, 1000] {
        let mut w = Dribble {
            out: Vec::new(),
            cap,
        };
        write_frame(&mut w, header, &body).unwrap();
        assert_eq!(w.out, whole, "cap {cap}");
    }
}

#[test]
fn write_round_trip_with_several_segments() {
    let mut w = BodyWriter::default();
    w.u32(2);
    encode_segment_header(&mut w, "ckpt.1/a", 5, 6, 0, 4, None);
    let d = [9u8; 32];
    encode_segment_header(
        &mut w,
        "ckpt.1/b",
        5,
        2,
        0,
        2,
        Some(&Seal {
            blake3: d,
            tag: [4; 32],
        }),
    );
    w.bytes(b"abcd").bytes(b"xy");
    let f = frame(kind::WRITE, &w.buf);
    let (h, req) = decode_request_frame(&f).unwrap();
    assert_eq!(h.request, 7);
    let Request::Write(segs) = req else {
        panic!("not a write: {req:?}")
    };
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[0].data, b"abcd");
    assert_eq!(segs[0].seal, None);
    assert_eq!(segs[1].key, "ckpt.1/b");
    assert_eq!(segs[1].data, b"xy");
    assert_eq!(
        segs[1].seal,
        Some(Seal {
            blake3: d,
            tag: [4; 32]
        })
    );
}

#[test]
fn hostile_frames_are_refused_without_allocating() {
    // A header claiming a 4 GiB body.
    let mut h = Header {
        kind: kind::WRITE,
        body_len: 0,
        request: 1,
    }
    .encode();
    h[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(Header::decode(&h), Err(FrameError::TooLarge(u32::MAX)));
    // A Write claiming 65536 segments in 10 bytes.
    let mut w = BodyWriter::default();
    w.u32(65_536).bytes(&[0; 6]);
    assert!(matches!(
        Request::decode(kind::WRITE, &w.buf),
        Err(FrameError::Malformed { .. })
    ));
    // A segment running past its file's size.
    let mut w = BodyWriter::default();
    w.u32(1);
    encode_segment_header(&mut w, "a", 1, 2, 1, 4, None);
    w.bytes(b"abcd");
    assert!(Request::decode(kind::WRITE, &w.buf).is_err());
    // Wrong magic and version.
    let mut f = frame(kind::PING, &[]);
    f[4] = 9;
    assert_eq!(
        decode_request_frame(&f).unwrap_err(),
        FrameError::Version(9)
    );
    f[0] = b'X';
    assert!(matches!(
        decode_request_frame(&f),
        Err(FrameError::Magic(_))
    ));
}

#[test]
fn paths_cannot_escape_the_namespace() {
    for bad in [
        "",
        "/etc/passwd",
        "a/../../b",
        "..",
        "a//b",
        "./a",
        "a/.",
        "a\0b",
        "a\nb",
        "a\x7f",
    ] {
        assert!(check_key(bad).is_err(), "{bad:?} accepted");
        let body = encode_read(bad, 0, 1);
        assert!(Request::decode(kind::READ, &body).is_err(), "{bad:?} read");
    }
    for good in ["a", "ckpt.0001/rank-3.dat", "x/..y/z..", "..."] {
        assert!(check_key(good).is_ok(), "{good:?} refused");
    }
}

fn chunk(score: u8, stored: Stored, raw_len: u32, data: &[u8]) -> WireChunk<'_> {
    WireChunk {
        score: [score; 32],
        kind: if score % 2 == 0 {
            BlobKind::Data
        } else {
            BlobKind::Tree
        },
        stored,
        raw_len,
        data,
    }
}

fn put_chunks_body(chunks: &[WireChunk]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    encode_chunk_descriptors(&mut w, chunks);
    for c in chunks {
        w.bytes(c.data);
    }
    w.buf
}

#[test]
fn dedup_messages_round_trip() {
    let scores: Vec<Score> = (0..9u8).map(|i| [i; 32]).collect();
    let body = encode_scores(&scores);
    assert_eq!(body.len(), 4 + 9 * 32);
    assert_eq!(
        Request::decode(kind::LACKS, &body).unwrap(),
        Request::Lacks(scores.clone())
    );
    assert_eq!(
        Request::decode(kind::GET_CHUNKS, &body).unwrap(),
        Request::GetChunks(scores.clone())
    );
    let chunks = [
        chunk(2, Stored::Raw, 3, b"abc"),
        chunk(3, Stored::Zstd, 1000, b"frame"),
        chunk(4, Stored::Raw, 0, b""),
    ];
    let body = put_chunks_body(&chunks);
    assert_eq!(body.len(), 4 + 3 * CHUNK_FIXED + 8);
    assert_eq!(
        Request::decode(kind::PUT_CHUNKS, &body).unwrap(),
        Request::PutChunks(chunks.to_vec())
    );
    let part = ManifestPart {
        checkpoint: "run1/ckpt.0042",
        single_file: false,
        chunking: "cdc:avg=64KiB",
        compression: "zstd:1",
        part: 3,
        last: true,
        files: vec![RecipeEntry {
            path: "rank0.dat".into(),
            size: 77,
            blake3: [1; 32],
            root: [2; 32],
        }],
        scores: scores[..2].to_vec(),
    };
    let body = encode_manifest_part(&part);
    assert_eq!(
        Request::decode(kind::PUT_MANIFEST, &body).unwrap(),
        Request::PutManifest(part)
    );
    assert_eq!(
        Request::decode(kind::GET_MANIFEST, &encode_get_manifest("a/b")).unwrap(),
        Request::GetManifest { checkpoint: "a/b" }
    );

    let flags = [true, false, false, true, true, false, true, false, true];
    let body = encode_lacks_ok(&flags);
    assert_eq!(body, [9, 0, 0, 0, 0b0101_1001, 1]);
    assert_eq!(
        Reply::decode(kind::LACKS | kind::REPLY, &body).unwrap(),
        Reply::LacksOk(flags.to_vec())
    );
    assert_eq!(
        Reply::decode(kind::PUT_CHUNKS | kind::REPLY, &encode_put_chunks_ok(5, 7)).unwrap(),
        Reply::PutChunksOk {
            stored: 5,
            present: 7
        }
    );
    let mut body = encode_get_chunks_ok_head(4, &chunks[..2]);
    body.extend_from_slice(b"abcframe");
    assert_eq!(
        Reply::decode(kind::GET_CHUNKS | kind::REPLY, &body).unwrap(),
        Reply::GetChunksOk {
            considered: 4,
            chunks: chunks[..2].to_vec()
        }
    );
    for (state, json) in [
        (ManifestState::Unknown, ""),
        (ManifestState::Pending, "{}"),
        (ManifestState::Written, "{\"a\":1}"),
    ] {
        let body = encode_get_manifest_ok(state, json);
        assert_eq!(
            Reply::decode(kind::GET_MANIFEST | kind::REPLY, &body).unwrap(),
            Reply::GetManifestOk { state, json }
        );
    }
}

#[test]
fn hostile_dedup_frames_are_refused() {
    let bad = |k: u8, body: &[u8]| {
        assert!(
            matches!(Request::decode(k, body), Err(FrameError::Malformed { .. })),
            "kind {k:#x} accepted {body:02x?}"
        )
    };
    // Counts the body cannot hold, or over the limit; a partial score.
    bad(kind::LACKS, &BodyWriter::default().u32(65_536).buf);
    bad(kind::LACKS, &BodyWriter::default().u32(65_537).buf);
    bad(
        kind::GET_CHUNKS,
        &BodyWriter::default().u32(1).bytes(&[0; 31]).buf,
    );
    bad(
        kind::LACKS,
        &BodyWriter::default().u32(1).bytes(&[0; 33]).buf,
    );
    bad(
        kind::PUT_CHUNKS,
        &BodyWriter::default().u32(1000).bytes(&[0; 100]).buf,
    );
    // A raw chunk whose stored length is not its raw length; an empty zstd frame; a
    // chunk over 16 MiB; an unknown kind or storage; data shorter or longer.
    bad(
        kind::PUT_CHUNKS,
        &put_chunks_body(&[chunk(1, Stored::Raw, 4, b"abc")]),
    );
    bad(
        kind::PUT_CHUNKS,
        &put_chunks_body(&[chunk(1, Stored::Zstd, 4, b"")]),
    );
    let mut w = BodyWriter::default();
    w.u32(1)
        .bytes(&[0; 32])
        .u8(0)
        .u8(1)
        .u32(MAX_DATA as u32 + 1)
        .u32(1)
        .u8(0);
    bad(kind::PUT_CHUNKS, &w.buf);
    let mut b = put_chunks_body(&[chunk(2, Stored::Raw, 3, b"abc")]);
    b[4 + 32] = 2;
    bad(kind::PUT_CHUNKS, &b);
    let mut b = put_chunks_body(&[chunk(2, Stored::Raw, 3, b"abc")]);
    b[4 + 33] = 2;
    bad(kind::PUT_CHUNKS, &b);
    let b = put_chunks_body(&[chunk(2, Stored::Raw, 3, b"abc")]);
    bad(kind::PUT_CHUNKS, &b[..b.len() - 1]);
    let mut long = b.clone();
    long.push(0);
    bad(kind::PUT_CHUNKS, &long);
    // More raw bytes than one frame may decompress to.
    let zstd: Vec<WireChunk> = (0..17)
        .map(|i| chunk(i, Stored::Zstd, MAX_DATA as u32, b"z"))
        .collect();
    bad(kind::PUT_CHUNKS, &put_chunks_body(&zstd));
    // A manifest: bad flags, trailing bytes, a file count the body cannot hold.
    let part = ManifestPart {
        checkpoint: "c",
        single_file: true,
        chunking: "fixed:4KiB",
        compression: "none",
        part: 0,
        last: true,
        files: vec![],
        scores: vec![[5; 32]],
    };
    let good = encode_manifest_part(&part);
    assert!(Request::decode(kind::PUT_MANIFEST, &good).is_ok());
    let mut b = good.clone();
    b[3] = 2;
    bad(kind::PUT_MANIFEST, &b);
    let mut b = good.clone();
    b.push(0);
    bad(kind::PUT_MANIFEST, &b);
    let mut w = BodyWriter::default();
    w.str("c")
        .u8(0)
        .str("")
        .str("")
        .u32(0)
        .u8(1)
        .u32(60_000)
        .u32(0);
    bad(kind::PUT_MANIFEST, &w.buf);
    assert!(matches!(
        Request::decode(kind::GET_MANIFEST, &encode_get_manifest("../x")),
        Err(FrameError::BadPath { .. })
    ));
    // Replies: bits past the count, more chunks than scores considered, a manifest
    // with an unknown state or without its JSON.
    let badr = |k: u8, body: &[u8]| assert!(Reply::decode(k, body).is_err(), "{body:02x?}");
    badr(kind::LACKS | kind::REPLY, &[3, 0, 0, 0, 0b1000]);
    badr(kind::LACKS | kind::REPLY, &[9, 0, 0, 0, 0]);
    let mut b = encode_get_chunks_ok_head(0, &[chunk(2, Stored::Raw, 1, b"a")]);
    b.push(b'a');
    badr(kind::GET_CHUNKS | kind::REPLY, &b);
    badr(kind::GET_MANIFEST | kind::REPLY, &[3, b'{', b'}']);
    badr(kind::GET_MANIFEST | kind::REPLY, &[1]);
    badr(kind::GET_MANIFEST | kind::REPLY, &[0, b'{', b'}']);
}

#[test]
fn replies_round_trip() {
    let states = vec![PullState {
        level: Level::Staged,
        stamp: 3,
        size: 10,
        blake3: [1; 32],
    }];
    let body = encode_pull_ok(&states);
    assert_eq!(
        Reply::decode(kind::PULL | kind::REPLY, &body).unwrap(),
        Reply::PullOk(states)
    );
    let body = encode_error(code::FULL, "server full");
    assert_eq!(
        Reply::decode(kind::ERROR, &body).unwrap(),
        Reply::Error {
            code: code::FULL,
            message: "server full"
        }
    );
}
