//! The S3 backend against a real versitygw server (posix backend) started on 127.0.0.1.
//! scripts/test.sh installs versitygw; the test finds it through $VERSITYGW, $PATH, $GOBIN,
//! $(go env GOPATH)/bin or ~/go/bin.

mod common;

use std::time::Duration;

use cascade_durable::{DurableStore, Error, Options, Spec};
use cascade_testkit::versitygw::SECRET;
use cascade_testkit::{free_port, CuttingProxy, Versitygw};

#[test]
fn s3_checkpoint_layout_errors_and_verification() {
    let server = Versitygw::start();
    server.create_bucket("cascade");

    let store = DurableStore::open(&server.spec("cascade/jobs/job1", SECRET)).unwrap();
    assert_eq!(store.name(), "s3://cascade/jobs/job1");
    // The objects are plain files under root/bucket/prefix.
    let disk_root = server.root.join("cascade/jobs/job1");
    common::checkpoint_round_trip(&store, &disk_root);
    common::failed_reupload_is_not_complete(&store);
    common::checksums_read_together(&store);
    // The prefix isolates stores in one bucket.
    let other = DurableStore::open(&server.spec("cascade/jobs/job2", SECRET)).unwrap();
    assert!(other.list("").unwrap().is_empty());
    assert!(!other.is_complete("ckpt.0001").unwrap());

    // Wrong secret: one clear line, EACCES.
    let e = DurableStore::open(&server.spec("cascade", "wrong-secret")).unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    let msg = e.to_string();
    eprintln!("wrong secret: {msg}");
    assert!(
        msg.contains("access denied") && msg.contains("s3://cascade"),
        "{msg}"
    );
    assert!(
        !msg.contains('\n') && !msg.contains("wrong-secret"),
        "{msg}"
    );
    assert_eq!(e.errno(), 13);

    // Missing bucket.
    let e = DurableStore::open(&server.spec("no-such-bucket/x", SECRET)).unwrap_err();
    assert!(matches!(e, Error::NoBucket { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "durable store s3://no-such-bucket/x: bucket \"no-such-bucket\" does not exist"
    );
}

/// `sign_payload=no` (the default over HTTPS) sends multipart parts as UNSIGNED-PAYLOAD
/// instead of with the body's SHA-256: the server takes them, and the data reads back bit
/// for bit.
#[test]
fn s3_unsigned_payloads_round_trip() {
    let server = Versitygw::start();
    server.create_bucket("cascade");
    let spec = format!(
        "{}&sign_payload=no",
        server.spec("cascade/unsigned", SECRET)
    );
    match Spec::parse(&spec).unwrap() {
        Spec::S3(s3) => assert!(!s3.sign_payload),
        other => panic!("{other:?}"),
    }
    let store = DurableStore::open(&spec).unwrap();
    common::checkpoint_round_trip(&store, &server.root.join("cascade/unsigned"));
}

/// A single PUT whose body is cut off (its client killed mid-upload; here a proxy that
/// closes both connections) never replaces the older object of the name, with
/// `sign_payload=yes` and `no`: single PUTs are signed either way, because versitygw took
/// an unsigned body cut short for a whole one (docs/durable-layout.md). A multipart upload
/// (a file larger than one part) whose part is cut short is not completed either.
#[test]
fn s3_single_puts_cut_short_leave_the_older_object() {
    let server = Versitygw::start();
    server.create_bucket("cascade");
    let proxy = CuttingProxy::start(server.port);
    let opts = Options {
        max_retries: 1,
        retry_timeout: Duration::from_secs(5),
        ..Options::default()
    };
    let older = cascade_testkit::random(20 << 20, 1);
    let newer = cascade_testkit::random(20 << 20, 2);
    for (prefix, extra) in [("signed", ""), ("unsigned", "&sign_payload=no")] {
        let direct = DurableStore::open(&format!(
            "{}{extra}",
            server.spec(&format!("cascade/{prefix}"), SECRET)
        ))
        .unwrap();
        let through_proxy = format!(
            "{}{extra}",
            server.spec_via(proxy.port, &format!("cascade/{prefix}"), SECRET)
        );
        let cut =
            DurableStore::open_with(Spec::parse(&through_proxy).unwrap(), opts.clone()).unwrap();
        // Five single PUTs of 6 MiB cut at 1..5 MiB, and a multipart upload of 20 MiB.
        for round in 0..6 {
            let name = format!("f{round}.bin");
            let len = if round < 5 { 6 << 20 } else { 20 << 20 };
            let (older, newer) = (&older[..len], &newer[..len]);
            direct.put_bytes(&name, older).unwrap();
            let cuts = proxy.cuts();
            proxy.cut_puts(&format!("/{prefix}/{name}"), (1 << 20) * (round % 5 + 1));
            let e = cut.put_bytes(&name, newer).unwrap_err();
            assert!(proxy.cuts() > cuts, "{prefix}: the proxy cut nothing: {e}");
            let stored = direct.get_bytes(&name).unwrap();
            assert!(
                stored[..] == older[..],
                "{prefix}: a PUT cut short replaced the older object with {} bytes",
                stored.len()
            );
        }
    }
}

/// Buffers uploaded in one request are streamed to S3 (signed chunk by chunk while they
/// are sent, so the first byte leaves before the whole body is hashed) and arrive bit for
/// bit; a stream that fails is sent again as one PUT, and the store streams no more.
#[test]
fn s3_streamed_buffers_arrive_whole_and_a_failed_stream_is_sent_again() {
    let server = Versitygw::start();
    server.create_bucket("cascade");
    let proxy = CuttingProxy::start(server.port);
    let direct = DurableStore::open(&server.spec("cascade/streamed", SECRET)).unwrap();
    let store =
        DurableStore::open(&server.spec_via(proxy.port, "cascade/streamed", SECRET)).unwrap();
    let data = bytes::Bytes::from(cascade_testkit::random((6 << 20) + 777, 3));
    // Pieces that straddle the 1 MiB signed chunks, one of them several chunks long.
    let parts = |d: &bytes::Bytes| {
        vec![
            d.slice(..5),
            d.slice(5..(3 << 20) + 1),
            d.slice((3 << 20) + 1..(4 << 20)),
            d.slice(4 << 20..),
        ]
    };
    store.put_buffers_streamed("a.bin", parts(&data)).unwrap();
    assert_eq!(direct.get_bytes("a.bin").unwrap(), data);
    let streamed = |heads: &[String]| {
        heads
            .iter()
            .filter(|h| h.contains("STREAMING-AWS4-HMAC-SHA256-PAYLOAD"))
            .count()
    };
    assert_eq!(streamed(&proxy.put_heads()), 1, "{:?}", proxy.put_heads());

    let newer = bytes::Bytes::from(cascade_testkit::random(data.len(), 4));
    proxy.cut_next_put("/streamed/a.bin", 2 << 20);
    store.put_buffers_streamed("a.bin", parts(&newer)).unwrap();
    assert_eq!(proxy.cuts(), 1, "the proxy cut nothing");
    assert_eq!(direct.get_bytes("a.bin").unwrap(), newer);
    let heads = proxy.put_heads();
    assert_eq!(heads.len(), 3, "the stream, then one PUT: {heads:?}");
    assert_eq!(streamed(&heads), 2, "{heads:?}");
    // Streaming is off for this store now.
    store.put_buffers_streamed("b.bin", parts(&data)).unwrap();
    assert_eq!(direct.get_bytes("b.bin").unwrap(), data);
    assert_eq!(streamed(&proxy.put_heads()), 2, "{:?}", proxy.put_heads());
}

#[test]
fn s3_unreachable_endpoint_is_one_clear_error() {
    // A port nothing listens on (bound and released).
    let port = free_port();
    let spec = Spec::parse(&format!(
        "s3://b?endpoint=http://127.0.0.1:{port}&access_key=a&secret_key=b"
    ))
    .unwrap();
    let opts = Options {
        max_retries: 1,
        retry_timeout: Duration::from_secs(2),
        ..Options::default()
    };
    let e = DurableStore::open_with(spec, opts).unwrap_err();
    eprintln!("unreachable: {e}");
    assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
    assert!(!e.to_string().contains('\n'));
}

/// A streaming upload (one PUT whose body is fed while it is sent) reaches the store bit for
/// bit, with `sign_payload` (the default over http://) and without (its chunks are signed
/// either way); an upload aborted or ended short leaves no object, and an older object of
/// the name stays as it was.
#[test]
fn s3_streaming_uploads_are_whole_or_absent() {
    let mut server = Versitygw::start();
    server.create_bucket("cascade");
    for (prefix, extra) in [("signed", ""), ("unsigned", "&sign_payload=no")] {
        let spec = format!(
            "{}{extra}",
            server.spec(&format!("cascade/{prefix} dir"), SECRET)
        );
        let store = DurableStore::open(&spec).unwrap();
        assert!(store.can_stream());
        // Pieces of uneven sizes that straddle the 1 MiB signed chunks.
        let data = cascade_testkit::random((3 << 20) + 12_345, 7);
        let name = "dir a/f+1 (x).bin";
        let mut put = store.put_stream(name, data.len() as u64).unwrap();
        let mut at = 0;
        for (i, n) in [1usize, 999_999, 48_577, 1 << 20, 77, 5_000_000]
            .iter()
            .cycle()
            .enumerate()
        {
            if at == data.len() || i > 100 {
                break;
            }
            let n = (*n).min(data.len() - at);
            assert!(put.send(bytes::Bytes::copy_from_slice(&data[at..at + n])));
            at += n;
        }
        store.finish_stream(put).unwrap();
        assert_eq!(&store.get_bytes(name).unwrap()[..], &data[..], "{prefix}");
        // Empty and exactly-one-chunk bodies.
        for len in [0usize, 1 << 20] {
            let rel = format!("len{len}");
            let mut put = store.put_stream(&rel, len as u64).unwrap();
            put.send(bytes::Bytes::from(data[..len].to_vec()));
            store.finish_stream(put).unwrap();
            assert_eq!(
                &store.get_bytes(&rel).unwrap()[..],
                &data[..len],
                "{prefix}"
            );
        }

        // Aborted mid-body: the older object stays; a new name never appears. Many times:
        // a body sent without framing was taken for whole now and then (stream.rs).
        for _ in 0..20 {
            for rel in [name, "aborted.bin"] {
                let mut put = store.put_stream(rel, data.len() as u64).unwrap();
                assert!(put.send(bytes::Bytes::from(vec![0u8; 2 << 20])));
                put.abort();
            }
        }
        // Ended short: an error, and nothing written.
        let mut put = store.put_stream("short.bin", 1000).unwrap();
        put.send(bytes::Bytes::from(vec![1u8; 999]));
        assert!(store.finish_stream(put).is_err());
        // Dropped without finishing: the same as aborted.
        let mut put = store.put_stream("dropped.bin", 1000).unwrap();
        put.send(bytes::Bytes::from(vec![1u8; 500]));
        drop(put);
        // A later request on the same store sees none of them (each abort has ended its
        // request before returning or is ended by the server's read of the closed body).
        let listed: Vec<String> = store
            .list("")
            .unwrap()
            .into_iter()
            .map(|o| o.path)
            .collect();
        for absent in ["aborted.bin", "short.bin", "dropped.bin"] {
            assert!(!listed.iter().any(|p| p == absent), "{prefix}: {listed:?}");
        }
        assert_eq!(&store.get_bytes(name).unwrap()[..], &data[..], "{prefix}");
    }
    // The store goes away mid-body: finishing fails (the caller falls back), no hang.
    let store = DurableStore::open(&server.spec("cascade/cut", SECRET)).unwrap();
    let mut put = store.put_stream("cut.bin", 4 << 20).unwrap();
    put.send(bytes::Bytes::from(vec![2u8; 1 << 20]));
    server.stop();
    put.send(bytes::Bytes::from(vec![2u8; 3 << 20]));
    let e = store.finish_stream(put).unwrap_err();
    eprintln!("store gone mid-body: {e}");
}
