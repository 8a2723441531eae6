//! The S3 backend against a real versitygw server (posix backend) started on 127.0.0.1.
//! scripts/test.sh installs versitygw; the test finds it through $VERSITYGW, $PATH, $GOBIN,
//! $(go env GOPATH)/bin or ~/go/bin.

mod common;

use std::time::Duration;

use cascade_durable::{DurableStore, Error, Options, Spec};
use cascade_testkit::versitygw::SECRET;
use cascade_testkit::{free_port, Versitygw};

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

/// `sign_payload=no` (the default over HTTPS) sends UNSIGNED-PAYLOAD instead of the body's
/// SHA-256: the server takes it, and the data reads back bit for bit.
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
