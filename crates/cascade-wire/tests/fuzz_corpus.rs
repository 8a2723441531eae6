//! Replays the fuzz corpus (`fuzz/corpus/<target>/*`, see fuzz/ and docs/staging-protocol.md)
//! through the same decoders and checks as the cargo-fuzz targets, on stable, so every
//! `cargo test` re-checks what the fuzzers found. Files named `valid-*` are seeds built from
//! the protocol's encoders and must decode; everything else only must not panic.
//!
//! `CASCADE_WRITE_FUZZ_SEEDS=1 cargo test -p cascade-wire --test fuzz_corpus` rewrites
//! the seeds (after a protocol change, or after `cargo fuzz cmin` renamed them).

#[path = "../fuzz/src/lib.rs"]
mod fuzz_checks;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cascade_wire::protocol::{
    code, encode_auth, encode_auth_ok, encode_challenge, encode_chunk_descriptors, encode_error,
    encode_get_chunks_ok_head, encode_get_manifest, encode_get_manifest_ok, encode_hello,
    encode_lacks_ok, encode_manifest_part, encode_pull, encode_pull_ok, encode_push,
    encode_put_chunks_ok, encode_read, encode_read_ok_head, encode_scores, encode_segment_header,
    kind, write_frame, BlobKind, BodyWriter, Header, Level, ManifestPart, ManifestState, PullKind,
    PullState, PushFile, RecipeEntry, Seal, Stored, WireChunk, HEADER_LEN,
};

const TARGETS: [&str; 2] = ["decode_frame", "read_frame"];

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

fn frame(k: u8, request: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let header = Header {
        kind: k,
        body_len: body.len() as u32,
        request,
    };
    write_frame(&mut out, header, &[body]).unwrap();
    out
}

fn digest(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// A Write body: each segment as (key, stamp, size, offset, seal, data).
type Seg<'a> = (&'a str, u64, u64, u64, Option<[u8; 32]>, &'a [u8]);

/// A seal with a recognisable tag (the doc example shows it).
fn protocol_seal(blake3: [u8; 32]) -> Seal {
    Seal {
        blake3,
        tag: [0x7a; 32],
    }
}

fn write_body(segments: &[Seg]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(segments.len() as u32);
    for (key, stamp, size, offset, seal, data) in segments {
        encode_segment_header(
            &mut w,
            key,
            *stamp,
            *size,
            *offset,
            data.len() as u32,
            seal.map(protocol_seal).as_ref(),
        );
    }
    for s in segments {
        w.bytes(s.5);
    }
    w.buf
}

/// The two frames shown byte by byte in docs/staging-protocol.md.
fn doc_hello() -> Vec<u8> {
    frame(
        kind::HELLO,
        1,
        &encode_hello("node7:4242", "job42", &[0xa5; 32]),
    )
}

fn doc_write() -> Vec<u8> {
    let body = write_body(&[(
        "ckpt.1/rank0.dat",
        1,
        5,
        0,
        Some(digest(b"hello")),
        b"hello",
    )]);
    frame(kind::WRITE, 2, &body)
}

/// The dedup frames shown byte by byte in docs/staging-protocol.md: a Lacks of the score of
/// `hello`, its answer, and a PutChunks sending `hello` raw.
fn doc_lacks() -> Vec<u8> {
    frame(kind::LACKS, 3, &encode_scores(&[digest(b"hello")]))
}

fn doc_lacks_ok() -> Vec<u8> {
    frame(kind::LACKS | kind::REPLY, 3, &encode_lacks_ok(&[true]))
}

fn hello_chunk() -> WireChunk<'static> {
    WireChunk {
        score: digest(b"hello"),
        kind: BlobKind::Data,
        stored: Stored::Raw,
        raw_len: 5,
        data: b"hello",
    }
}

fn chunks_body(chunks: &[WireChunk]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    encode_chunk_descriptors(&mut w, chunks);
    for c in chunks {
        w.bytes(c.data);
    }
    w.buf
}

fn doc_put_chunks() -> Vec<u8> {
    frame(kind::PUT_CHUNKS, 4, &chunks_body(&[hello_chunk()]))
}

fn manifest_part(part: u32, last: bool) -> ManifestPart<'static> {
    ManifestPart {
        checkpoint: "run1/ckpt.0042",
        single_file: false,
        chunking: "cdc:avg=64KiB",
        compression: "zstd:1",
        part,
        last,
        files: vec![RecipeEntry {
            path: "rank0.dat".into(),
            size: 5,
            blake3: digest(b"hello"),
            root: digest(b"root"),
        }],
        scores: vec![digest(b"hello"), digest(b"root")],
    }
}

/// Valid request frames of every kind.
fn request_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let file = PushFile {
        path: "rank0.dat".into(),
        size: 5,
        blake3: digest(b"hello"),
    };
    let file2 = PushFile {
        path: "sub/rank1.dat".into(),
        size: 3,
        blake3: digest(b"abc"),
    };
    let two_segments = write_body(&[
        ("ckpt.2/a", 7, 6, 0, None, b"abcd"),
        ("ckpt.2/a", 7, 6, 4, Some(digest(b"abcdef")), b"ef"),
    ]);
    let three_keys = write_body(&[
        ("x", 1, 0, 0, Some(digest(b"")), b""),
        ("d/y", 2, 3, 0, Some(digest(b"abc")), b"abc"),
        ("d/z", 3, 8, 2, None, b"mid"),
    ]);
    vec![
        ("hello", doc_hello()),
        (
            "hello-no-namespace",
            frame(kind::HELLO, 9, &encode_hello("s", "", &[0; 32])),
        ),
        ("auth", frame(kind::AUTH, 2, &encode_auth(&[0x3c; 32]))),
        ("write-one-segment", doc_write()),
        ("write-two-segments", frame(kind::WRITE, 3, &two_segments)),
        ("write-three-keys", frame(kind::WRITE, 4, &three_keys)),
        (
            "write-empty",
            frame(kind::WRITE, 5, &BodyWriter::default().u32(0).buf),
        ),
        ("sync", frame(kind::SYNC, 6, &[])),
        (
            "read",
            frame(kind::READ, 7, &encode_read("ckpt.1/rank0.dat", 0, 1 << 20)),
        ),
        (
            "push",
            frame(
                kind::PUSH,
                8,
                &encode_push("ckpt.1", false, &[file.clone(), file2]),
            ),
        ),
        (
            "push-single-file",
            frame(kind::PUSH, 9, &encode_push("model.pt", true, &[file])),
        ),
        (
            "pull",
            frame(
                kind::PULL,
                10,
                &encode_pull(&[
                    (PullKind::File, "ckpt.1/rank0.dat"),
                    (PullKind::Checkpoint, "ckpt.1"),
                ]),
            ),
        ),
        ("ping", frame(kind::PING, 11, &[])),
        ("goodbye", frame(kind::GOODBYE, 12, &[])),
        ("status", frame(kind::STATUS, 13, &[])),
        ("lacks", doc_lacks()),
        (
            "lacks-three",
            frame(
                kind::LACKS,
                14,
                &encode_scores(&[[1; 32], digest(b"a"), [0xff; 32]]),
            ),
        ),
        ("put-chunks", doc_put_chunks()),
        (
            "put-chunks-zstd-tree",
            frame(
                kind::PUT_CHUNKS,
                15,
                &chunks_body(&[
                    WireChunk {
                        score: [3; 32],
                        kind: BlobKind::Tree,
                        stored: Stored::Zstd,
                        raw_len: 40_972,
                        data: b"\x28\xb5\x2f\xfd zstd frame",
                    },
                    hello_chunk(),
                ]),
            ),
        ),
        (
            "put-manifest",
            frame(
                kind::PUT_MANIFEST,
                16,
                &encode_manifest_part(&manifest_part(0, true)),
            ),
        ),
        (
            "put-manifest-part",
            frame(
                kind::PUT_MANIFEST,
                17,
                &encode_manifest_part(&ManifestPart {
                    files: vec![],
                    ..manifest_part(3, false)
                }),
            ),
        ),
        (
            "get-chunks",
            frame(kind::GET_CHUNKS, 18, &encode_scores(&[digest(b"hello")])),
        ),
        (
            "get-manifest",
            frame(
                kind::GET_MANIFEST,
                19,
                &encode_get_manifest("run1/ckpt.0042"),
            ),
        ),
    ]
}

/// Valid reply frames of every kind.
fn reply_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let r = kind::REPLY;
    let mut read_ok = encode_read_ok_head(1, 5, &digest(b"hello"), &[0x7a; 32]);
    read_ok.extend_from_slice(b"hello");
    let states = [
        PullState {
            level: Level::Staged,
            stamp: 1,
            size: 5,
            blake3: digest(b"hello"),
        },
        PullState {
            level: Level::Durable,
            stamp: 0,
            size: 0,
            blake3: [0; 32],
        },
        PullState {
            level: Level::Unknown,
            stamp: 0,
            size: 0,
            blake3: [0; 32],
        },
    ];
    vec![
        (
            "challenge",
            frame(
                kind::HELLO | r,
                1,
                &encode_challenge("stage1:7070", 0x0123_4567_89ab_cdef, &[0x5a; 32]),
            ),
        ),
        (
            "auth-ok",
            frame(kind::AUTH | r, 2, &encode_auth_ok(&[0xc3; 32])),
        ),
        ("write-ok", frame(kind::WRITE | r, 2, &[])),
        ("sync-ok", frame(kind::SYNC | r, 3, &[])),
        ("read-ok", frame(kind::READ | r, 4, &read_ok)),
        (
            "read-ok-empty",
            frame(
                kind::READ | r,
                4,
                &encode_read_ok_head(1, 5, &[7; 32], &[0; 32]),
            ),
        ),
        ("push-ok", frame(kind::PUSH | r, 5, &[])),
        (
            "pull-ok",
            frame(kind::PULL | r, 6, &encode_pull_ok(&states)),
        ),
        ("pong", frame(kind::PING | r, 7, &[])),
        ("goodbye-ok", frame(kind::GOODBYE | r, 8, &[])),
        (
            "status-ok",
            frame(kind::STATUS | r, 9, br#"{"server":"stage1:7070","pid":1}"#),
        ),
        (
            "error",
            frame(
                kind::ERROR,
                0,
                &encode_error(code::AUTH, "wrong shared secret"),
            ),
        ),
        (
            "error-not-found",
            frame(
                kind::ERROR,
                7,
                &encode_error(code::NOT_FOUND, "job42/a: not staged here"),
            ),
        ),
        ("lacks-ok", doc_lacks_ok()),
        (
            "lacks-ok-nine",
            frame(
                kind::LACKS | r,
                10,
                &encode_lacks_ok(&[true, false, false, true, true, false, true, false, true]),
            ),
        ),
        (
            "put-chunks-ok",
            frame(kind::PUT_CHUNKS | r, 11, &encode_put_chunks_ok(3, 1021)),
        ),
        ("put-manifest-ok", frame(kind::PUT_MANIFEST | r, 12, &[])),
        ("get-chunks-ok", {
            let mut b = encode_get_chunks_ok_head(2, &[hello_chunk()]);
            b.extend_from_slice(b"hello");
            frame(kind::GET_CHUNKS | r, 13, &b)
        }),
        (
            "get-manifest-ok",
            frame(
                kind::GET_MANIFEST | r,
                14,
                &encode_get_manifest_ok(
                    ManifestState::Pending,
                    r#"{"format":"cascade-dedup-manifest/1","checkpoint":"c","files":[]}"#,
                ),
            ),
        ),
        (
            "get-manifest-ok-unknown",
            frame(
                kind::GET_MANIFEST | r,
                15,
                &encode_get_manifest_ok(ManifestState::Unknown, ""),
            ),
        ),
        (
            "error-bad-chunk",
            frame(
                kind::ERROR,
                16,
                &encode_error(code::BAD_CHUNK, "chunk ea8f...: its bytes hash to 0000..."),
            ),
        ),
    ]
}

/// Every seed, per target: request and reply frames for decode_frame; for read_frame a
/// reader-control byte and a whole conversation, as the server and as the client read it.
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let requests = request_seeds();
    let replies = reply_seeds();
    for (name, bytes) in requests.iter().chain(&replies) {
        out.push(("decode_frame", format!("valid-{name}"), bytes.clone()));
    }
    let stream = |control: u8, frames: &[(&'static str, Vec<u8>)]| {
        let mut s = vec![control];
        for (_, f) in frames {
            s.extend_from_slice(f);
        }
        s
    };
    for (name, control) in [("whole", 0u8), ("3-byte-reads", 3), ("interrupted", 0x85)] {
        out.push((
            "read_frame",
            format!("valid-requests-{name}"),
            stream(control, &requests),
        ));
        out.push((
            "read_frame",
            format!("valid-replies-{name}"),
            stream(control, &replies),
        ));
    }
    out.push(("read_frame", "valid-empty".into(), Vec::new()));
    out
}

fn corpus_files(target: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(target))
        .unwrap_or_else(|e| panic!("{}: {e}", corpus_dir(target).display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn is_seed(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("valid-"))
}

#[test]
fn seeds_are_in_the_corpus() {
    if std::env::var_os("CASCADE_WRITE_FUZZ_SEEDS").is_some() {
        for (target, name, bytes) in seeds() {
            std::fs::create_dir_all(corpus_dir(target)).unwrap();
            std::fs::write(corpus_dir(target).join(name), bytes).unwrap();
        }
    }
    for (target, name, bytes) in seeds() {
        let path = corpus_dir(target).join(&name);
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (CASCADE_WRITE_FUZZ_SEEDS=1 writes the seeds)",
                path.display()
            )
        });
        assert_eq!(
            on_disk,
            bytes,
            "{} is stale: CASCADE_WRITE_FUZZ_SEEDS=1 rewrites it",
            path.display()
        );
    }
}

#[test]
fn generated_seeds_decode() {
    for (target, name, bytes) in seeds() {
        match target {
            "decode_frame" => {
                let d = fuzz_checks::decode_frame(&bytes);
                assert!(d.request || d.reply, "{name} does not decode: {d:?}");
            }
            _ => {
                let r = fuzz_checks::read_frames(&bytes, &mut Vec::new());
                assert!(r.clean_end && r.decoded == r.frames, "{name}: {r:?}");
                assert!(r.frames > 0 || bytes.is_empty(), "{name}: {r:?}");
            }
        }
    }
}

#[test]
fn every_corpus_file_decodes_without_panicking() {
    let mut kinds_seen = BTreeSet::new();
    for target in TARGETS {
        let files = corpus_files(target);
        assert!(
            files.len() > seeds().iter().filter(|s| s.0 == target).count(),
            "the {target} corpus holds nothing but the seeds"
        );
        // Reused across files, as the fuzz target (and the server) reuse theirs.
        let mut body = Vec::new();
        for path in &files {
            let data = std::fs::read(path).unwrap();
            let name = path.display();
            if target == "decode_frame" {
                let d = fuzz_checks::decode_frame(&data);
                if is_seed(path) {
                    assert!(d.request || d.reply, "seed {name} does not decode");
                    kinds_seen.insert(data[5]);
                }
            } else {
                let r = fuzz_checks::read_frames(&data, &mut body);
                if is_seed(path) {
                    assert!(r.clean_end, "seed {name} does not end cleanly: {r:?}");
                    assert_eq!(r.decoded, r.frames, "seed {name}: {r:?}");
                }
                // Each input also as a fresh reader, as a new connection's would be.
                assert_eq!(fuzz_checks::read_frames(&data, &mut Vec::new()), r);
            }
        }
    }
    let every_kind: BTreeSet<u8> = (kind::HELLO..=kind::AUTH)
        .flat_map(|k| [k, k | kind::REPLY])
        .chain([kind::ERROR])
        .collect();
    assert_eq!(kinds_seen, every_kind, "seeds missing for some kinds");
}

/// hexdump -C style, as in docs/staging-protocol.md.
fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, line) in bytes.chunks(16).enumerate() {
        let mut hex = String::new();
        for (j, b) in line.iter().enumerate() {
            if j == 8 {
                hex.push(' ');
            }
            hex.push_str(&format!("{b:02x} "));
        }
        let text: String = line
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!("{:08x}  {hex:<49} |{text}|\n", i * 16));
    }
    out.push_str(&format!("{:08x}\n", bytes.len()));
    out
}

#[test]
fn doc_examples_are_exact() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/staging-protocol.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    for (what, bytes) in [
        ("Hello", doc_hello()),
        ("Write", doc_write()),
        ("Lacks", doc_lacks()),
        ("LacksOk", doc_lacks_ok()),
        ("PutChunks", doc_put_chunks()),
    ] {
        assert!(bytes.len() > HEADER_LEN);
        let dump = hex_dump(&bytes);
        assert!(
            doc.contains(&dump),
            "{} does not show the {what} frame as\n{dump}",
            doc_path.display()
        );
    }
}
