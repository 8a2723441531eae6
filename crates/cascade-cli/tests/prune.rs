//! `cascade prune`, run as the real binary: checkpoints drained with dedup into a directory
//! durable store are pruned to the newest N; the kept ones restore bit for bit, the packs
//! only forgotten ones used are deleted (exactly those bytes), a dry run changes nothing, and
//! bad input is one line.

use std::collections::BTreeSet;
use std::path::Path;

mod support;
use cascade_testkit::{files_below, pattern};
use support::{s, Sandbox};

/// The pack ids a manifest records.
fn manifest_packs(durable: &Path, ckpt: &str) -> BTreeSet<String> {
    let path = durable.join(format!(".cascade-dedup/manifests/{ckpt}.json"));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("manifest")).expect("json");
    json["packs"]
        .as_array()
        .expect("packs")
        .iter()
        .flat_map(|g| g["packs"].as_array().expect("group").clone())
        .map(|p| p.as_str().expect("pack id").to_string())
        .collect()
}

fn pack_size(durable: &Path, id: &str) -> u64 {
    std::fs::metadata(durable.join(format!(".cascade-dedup/packs/{}/{id}", &id[..2])))
        .expect("pack file")
        .len()
}

#[test]
fn prune_keeps_the_newest_checkpoints_and_frees_what_only_the_others_used() {
    let sb = Sandbox::new("prune");
    sb.ok(&[
        "init",
        "--capacity",
        "32MiB",
        "--max-files",
        "64",
        "--prefault",
        "off",
    ]);
    // Every checkpoint: a file they all share, and one of its own. 16 MiB packs: each drain
    // writes one pack, and ck1's holds the shared file too.
    let shared = pattern(1 << 20, 1);
    let local = sb.dir.path().join("in");
    std::fs::create_dir_all(&local).expect("mkdir");
    std::fs::write(local.join("shared"), &shared).expect("write");
    let durable = sb.dir.path().join("durable");
    let url = format!("file://{}", durable.display());
    let mut own = Vec::new();
    for i in 1..=4u64 {
        let data = pattern(512 << 10, 10 + i);
        let file = local.join(format!("own{i}"));
        std::fs::write(&file, &data).expect("write");
        own.push(data);
        let ckpt = format!("/ck{i}");
        sb.ok(&["mkdir", "-p", &ckpt]);
        sb.ok(&[
            "put",
            s(&local.join("shared")),
            &format!("{ckpt}/shared.dat"),
        ]);
        sb.ok(&["put", s(&file), &format!("{ckpt}/own.dat")]);
        sb.ok(&["drain", &ckpt, "--to", &url, "--dedup", "fixed:64KiB"]);
    }
    let packs: Vec<BTreeSet<String>> = (1..=4)
        .map(|i| manifest_packs(&durable, &format!("ck{i}")))
        .collect();
    let kept: BTreeSet<String> = packs[2].union(&packs[3]).cloned().collect();
    let dead: BTreeSet<String> = packs[0]
        .union(&packs[1])
        .filter(|p| !kept.contains(*p))
        .cloned()
        .collect();
    let shared_packs: BTreeSet<String> = packs[0]
        .union(&packs[1])
        .filter(|p| kept.contains(*p))
        .cloned()
        .collect();
    assert!(!dead.is_empty() && !shared_packs.is_empty(), "{packs:?}");
    let freed: u64 = dead.iter().map(|p| pack_size(&durable, p)).sum();
    let unreclaimed: u64 = shared_packs.iter().map(|p| pack_size(&durable, p)).sum();

    // A dry run names what would go and changes nothing.
    let before = files_below(&durable);
    let out = sb.ok(&["prune", "--keep", "2", "--dry-run", "--durable", &url]);
    assert!(
        out.contains("would forget ck1\nwould forget ck2\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "would forget 2 of 4 checkpoints, would delete {} packs, free ",
            dead.len()
        )) && out.contains(&format!("({freed} bytes)")),
        "{out}"
    );
    assert_eq!(files_below(&durable), before, "a dry run changed the store");

    let out = sb.ok(&["prune", "--keep", "2", "--durable", &url]);
    assert_eq!(out.lines().count(), 1, "{out}");
    let expected = format!(
        "prune: forgot 2 of 4 checkpoints, deleted {} packs, freed ",
        dead.len()
    );
    assert!(out.starts_with(&expected), "{out}");
    assert!(out.contains(&format!("({freed} bytes)")), "{out}");
    assert!(
        out.contains(&format!(
            "({unreclaimed} bytes) unreclaimed in {} packs kept checkpoints share, 0 packs \
             waiting for 0 writers",
            shared_packs.len()
        )),
        "{out}"
    );
    for p in &dead {
        assert!(
            !durable
                .join(format!(".cascade-dedup/packs/{}/{p}", &p[..2]))
                .exists(),
            "pack {p} survived"
        );
    }

    // The kept checkpoints restore bit for bit; the forgotten ones are gone.
    for i in [3usize, 4] {
        let dest = sb.dir.path().join(format!("r{i}"));
        sb.ok(&["restore", &format!("ck{i}"), s(&dest), "--from", &url]);
        assert!(std::fs::read(dest.join("shared.dat")).expect("shared") == shared);
        assert!(std::fs::read(dest.join("own.dat")).expect("own") == own[i - 1]);
    }
    let line = sb.fails(
        &[
            "restore",
            "ck1",
            s(&sb.dir.path().join("r1")),
            "--from",
            &url,
        ],
        1,
    );
    assert!(line.contains("not complete"), "{line}");

    // Forgetting one by name.
    let out = sb.ok(&["prune", "ck3", "--durable", &url]);
    assert!(out.starts_with("prune: forgot 1 of 2 checkpoints"), "{out}");
    let dest = sb.dir.path().join("r4b");
    sb.ok(&["restore", "ck4", s(&dest), "--from", &url]);
    assert!(std::fs::read(dest.join("own.dat")).expect("own") == own[3]);

    // Bad input: one line each.
    let line = sb.fails(&["prune", "nope", "--durable", &url], 1);
    assert!(line.contains("no checkpoint nope"), "{line}");
    let line = sb.fails(&["prune", "--keep", "0", "--durable", &url], 2);
    assert!(line.contains("--keep"), "{line}");
    let line = sb.fails(&["prune", "--keep", "x", "--durable", &url], 2);
    assert!(line.contains("--keep"), "{line}");
    sb.fails(&["prune", "--durable", &url], 2);
    sb.fails(&["prune", "--keep", "1", "ck4", "--durable", &url], 2);
    let line = sb.fails(&["prune", "--keep", "1"], 1);
    assert!(line.contains("no durable store"), "{line}");
    let empty = sb.dir.path().join("empty-durable");
    let line = sb.fails(&["prune", "--keep-last", "1", "--durable", s(&empty)], 1);
    assert!(line.contains("no such directory"), "{line}");
    assert!(!empty.exists(), "a prune created the durable directory");
    std::fs::create_dir(&empty).expect("empty durable dir");
    let line = sb.fails(&["prune", "--keep-last", "1", "--durable", s(&empty)], 1);
    assert!(line.contains("no dedup repository"), "{line}");
    let help = sb.ok(&["prune", "--help"]);
    assert!(
        help.contains("--keep") && help.contains("unreclaimed") && help.contains("2^20"),
        "{help}"
    );

    // A sweep for packs no index names needs no checkpoint; every pack is indexed here.
    let out = sb.ok(&["prune", "--orphans", "--durable", &url]);
    assert!(out.starts_with("prune: forgot 0 of 1 checkpoints"), "{out}");
    assert!(!out.contains("orphaned"), "{out}");
    assert!(help.contains("--orphans"), "{help}");
}
