//! Every `fail/<group>/*.rs` must fail to compile with exactly the
//! diagnostics in the `.stderr` file next to it. The groups are the
//! features a case needs (`any`, `sqlite`, `sqlite_serde`, `postgres_async`,
//! `all_backends`), all of which this package has. trybuild checks them all
//! in one `cargo check --keep-going`.

#[test]
fn fail_cases_fail_with_their_diagnostics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/fail");
    let mut groups: Vec<String> = std::fs::read_dir(&root)
        .expect("the case directories")
        .map(|entry| {
            let name = entry.expect("a case directory").file_name();
            name.to_str().expect("a UTF-8 directory name").to_owned()
        })
        .collect();
    groups.sort();
    assert!(
        !groups.is_empty(),
        "no case directory under {}",
        root.display()
    );
    let t = trybuild::TestCases::new();
    for group in groups {
        t.compile_fail(format!("tests/ui/fail/{group}/*.rs"));
    }
}
