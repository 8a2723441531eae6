//! Compression specs and the per-chunk skip rule: compressible chunks come back smaller and
//! decompress to the original; chunks that would not shrink by at least an eighth are left
//! alone.

use cascade_dedup::compress::max_compressed_len;
use cascade_dedup::Compression;
use cascade_testkit::{counting_doubles, random};

#[test]
fn specs_parse_and_print_back() {
    assert_eq!("none".parse(), Ok(Compression::None));
    assert_eq!("zstd".parse(), Ok(Compression::Zstd { level: 3 }));
    assert_eq!("zstd:1".parse(), Ok(Compression::Zstd { level: 1 }));
    assert_eq!("ZSTD:19".parse(), Ok(Compression::Zstd { level: 19 }));
    assert_eq!("zstd:-3".parse(), Ok(Compression::Zstd { level: -3 }));
    for spec in ["none", "zstd:1", "zstd:3", "zstd:19", "zstd:-1", "zstd:-7"] {
        let c: Compression = spec.parse().expect(spec);
        assert_eq!(c.to_string(), spec);
    }
    assert_eq!(Compression::default(), Compression::None);
    for (spec, why) in [
        ("zstd:0", "1 to 19"),
        ("zstd:20", "1 to 19"),
        ("zstd:-8", "-7 to -1"),
        ("zstd:fast", "1 to 19"),
        ("lz4", "expected none, zstd or zstd:LEVEL"),
        ("none:1", "expected none, zstd or zstd:LEVEL"),
    ] {
        let err = spec.parse::<Compression>().expect_err(spec).to_string();
        assert!(err.contains(&format!("'{spec}'")), "{err}");
        assert!(err.contains(why), "{spec}: {err}");
        assert!(!err.contains('\n'));
    }
}

#[test]
fn the_limit_is_seven_eighths() {
    assert_eq!(max_compressed_len(0), 0);
    assert_eq!(max_compressed_len(8), 7);
    assert_eq!(max_compressed_len(9), 7);
    assert_eq!(max_compressed_len(65_536), 57_344);
}

#[test]
fn compressible_chunks_shrink_and_round_trip() {
    let chunk = counting_doubles(64 << 10, 7, 1000);
    for level in [-7, -1, 1, 3, 19] {
        let codec = Compression::Zstd { level };
        let packed = codec.compress(&chunk).expect("compressible data pays");
        assert!(packed.len() <= max_compressed_len(chunk.len()));
        assert!(
            packed.len() < chunk.len() / 4,
            "level {level}: {}",
            packed.len()
        );
        assert_eq!(codec.compressed_len(&chunk), Some(packed.len()));
        assert_eq!(
            Compression::decompress(&packed, chunk.len()).expect("decompress"),
            chunk
        );
    }
}

#[test]
fn chunks_that_do_not_pay_are_skipped() {
    let codec = Compression::Zstd { level: 3 };
    // Random bytes do not compress at all.
    let noise = random(64 << 10, 1);
    assert_eq!(codec.compress(&noise), None);
    assert_eq!(codec.compressed_len(&noise), None);
    // Half random, half zeros compresses to about half: that pays.
    let mut half = random(32 << 10, 2);
    half.resize(64 << 10, 0);
    let packed = codec.compress(&half).expect("half zeros pays");
    assert!(packed.len() < (40 << 10), "{}", packed.len());
    // 90 % random compresses to about 90 %, more than 7/8: skipped.
    let mut mostly = random(58 << 10, 3);
    mostly.resize(64 << 10, 0);
    assert_eq!(codec.compress(&mostly), None);
    // An empty chunk, a tiny one, and no compression at all are never compressed.
    assert_eq!(codec.compress(&[]), None);
    assert_eq!(codec.compress(b"abc"), None);
    assert_eq!(
        Compression::None.compress(&counting_doubles(4096, 7, 1000)),
        None
    );
    assert_eq!(
        Compression::None.compressed_len(&counting_doubles(4096, 7, 1000)),
        None
    );
}

#[test]
fn levels_can_alternate_on_one_thread() {
    // A skipped chunk leaves zstd's context mid-frame; changing the level must still work.
    let noise = random(64 << 10, 4);
    let data = counting_doubles(64 << 10, 7, 1000);
    for _ in 0..3 {
        for level in [1, 3, 9] {
            let codec = Compression::Zstd { level };
            assert_eq!(codec.compress(&noise), None);
            let packed = codec.compress(&data).expect("pays");
            assert_eq!(
                Compression::decompress(&packed, data.len()).expect("ok"),
                data
            );
        }
    }
}

#[test]
fn corrupt_or_mismatched_frames_are_errors() {
    let data = counting_doubles(16 << 10, 7, 1000);
    let packed = Compression::Zstd { level: 1 }
        .compress(&data)
        .expect("pays");
    let err = Compression::decompress(&packed, data.len() - 1).expect_err("too short");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    let err = Compression::decompress(&packed, data.len() + 1).expect_err("too long");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    let mut broken = packed.clone();
    broken.truncate(packed.len() / 2);
    assert!(Compression::decompress(&broken, data.len()).is_err());
    assert!(Compression::decompress(b"not zstd", 8).is_err());
}

#[test]
fn compression_runs_on_many_threads() {
    let data = counting_doubles(256 << 10, 7, 1000);
    std::thread::scope(|scope| {
        for level in 1..=4 {
            let data = &data;
            scope.spawn(move || {
                let codec = Compression::Zstd { level };
                for _ in 0..10 {
                    let packed = codec.compress(data).expect("pays");
                    assert_eq!(
                        &Compression::decompress(&packed, data.len()).expect("ok"),
                        data
                    );
                }
            });
        }
    });
}
