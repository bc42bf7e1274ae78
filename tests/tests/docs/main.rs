//! The documentation's own checks: every relative link of the README,
//! CONTRIBUTING.md and the guide (`docs/src/`) reaches a file, and every
//! `#anchor` a heading there (GitHub's anchors); every chapter is compiled
//! by `inbox_tests::guide` and listed in `SUMMARY.md`; the guide's code
//! blocks say their language; the README lists every feature of
//! `inbox-runtime` and stays short.
//!
//! Run: `cargo test -p inbox-tests --test docs` (no server, no feature).
#![allow(missing_docs)]

mod markdown;

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The workspace's root directory.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// The guide's directory of chapters.
fn guide() -> PathBuf {
    root().join("docs/src")
}

/// The file names of `docs/src/*.md`, `SUMMARY.md` left out.
fn chapter_files() -> BTreeSet<String> {
    std::fs::read_dir(guide())
        .expect("docs/src")
        .map(|entry| entry.expect("a directory entry").file_name())
        .map(|name| name.into_string().expect("a UTF-8 file name"))
        .filter(|name| name.ends_with(".md") && name != "SUMMARY.md")
        .collect()
}

/// The Markdown files whose links are checked: the README,
/// CONTRIBUTING.md, BENCHMARKS.md and every file of the guide.
fn checked_files() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("CONTRIBUTING.md"),
        root().join("BENCHMARKS.md"),
    ];
    files.push(guide().join("SUMMARY.md"));
    files.extend(chapter_files().into_iter().map(|name| guide().join(name)));
    files
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with the relative links of `file` (whose text is `text`),
/// one line per broken link.
fn broken_links(file: &Path, text: &str) -> Vec<String> {
    let shown = file.strip_prefix(root()).unwrap_or(file).display();
    let mut broken = Vec::new();
    for link in markdown::links(text) {
        let target = link.target.as_str();
        if target.is_empty() {
            broken.push(format!("{shown}:{}: an empty link", link.line));
            continue;
        }
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target, None),
        };
        let destination = if path.is_empty() {
            file.to_path_buf()
        } else {
            normalize(&file.parent().expect("a file has a directory").join(path))
        };
        if !destination.exists() {
            broken.push(format!(
                "{shown}:{}: `{target}`: {} does not exist",
                link.line,
                destination.display()
            ));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        let anchors = if path.is_empty() {
            markdown::anchors(text)
        } else if destination.extension().is_some_and(|ext| ext == "md") {
            let text = std::fs::read_to_string(&destination).expect("a Markdown file");
            markdown::anchors(&text)
        } else {
            Vec::new()
        };
        if !anchors.iter().any(|a| a == anchor) {
            broken.push(format!(
                "{shown}:{}: `{target}`: no heading of {} has the anchor `#{anchor}`",
                link.line,
                destination.display()
            ));
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for file in checked_files() {
        let text = std::fs::read_to_string(&file).expect("a Markdown file");
        broken.extend(broken_links(&file, &text));
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The check itself: a link to a missing file, to a missing anchor of an
/// existing file, and to a missing anchor of the same file are caught.
#[test]
fn a_broken_link_is_caught() {
    let file = guide().join("attribute.md");
    let text = "# Title\n\
                [fine](#title), [fine too](errors.md), [also](../../README.md#try-it)\n\
                [gone](no-such-chapter.md)\n\
                [bad anchor](errors.md#no-such-heading)\n\
                [bad here](#no-such-heading)\n";
    let broken = broken_links(&file, text);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("no-such-chapter.md"), "{broken:#?}");
    assert!(
        broken[1].contains("errors.md#no-such-heading"),
        "{broken:#?}"
    );
    assert!(broken[2].contains(":5:"), "{broken:#?}");
}

/// A chapter that `inbox_tests::guide` does not include would have its
/// Rust blocks never compiled; one that `SUMMARY.md` does not list is left
/// out of the book.
#[test]
fn every_chapter_is_compiled_and_in_the_summary() {
    let files = chapter_files();
    let compiled: BTreeSet<String> = inbox_tests::guide::CHAPTERS
        .iter()
        .map(|name| (*name).to_owned())
        .collect();
    assert_eq!(
        files, compiled,
        "docs/src/ and the chapters tests/src/guide.rs includes differ"
    );
    let summary = std::fs::read_to_string(guide().join("SUMMARY.md")).expect("SUMMARY.md");
    let listed: Vec<String> = markdown::links(&summary)
        .into_iter()
        .map(|link| link.target)
        .collect();
    assert_eq!(
        listed,
        inbox_tests::guide::CHAPTERS,
        "SUMMARY.md lists the chapters in another order, or not all of them"
    );
}

/// Rustdoc compiles a fence without a language as Rust, and silently drops
/// a `#[test]` function of a doctest (doctests are not built as tests):
/// each block says what it is, and a Rust block calls its checks itself.
#[test]
fn the_guide_s_code_blocks_say_what_they_are() {
    let mut problems = Vec::new();
    for name in chapter_files() {
        let text = std::fs::read_to_string(guide().join(&name)).expect("a chapter");
        let mut in_rust: Option<bool> = None;
        for (index, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            match (in_rust, trimmed.strip_prefix("```")) {
                (None, Some(info)) => {
                    let language = info.split(',').next().unwrap_or("").trim();
                    if language.is_empty() {
                        problems.push(format!("{name}:{}: a fence without a language", index + 1));
                    }
                    in_rust = Some(language == "rust");
                }
                (Some(_), Some(_)) => in_rust = None,
                (Some(true), None) if trimmed.starts_with("#[test]") => problems.push(format!(
                    "{name}:{}: a `#[test]` in a doctest is never compiled",
                    index + 1
                )),
                _ => {}
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The README's "Install" section names every feature of `inbox-runtime`,
/// one line each.
#[test]
fn the_readme_lists_every_feature() {
    let manifest =
        std::fs::read_to_string(root().join("inbox-runtime/Cargo.toml")).expect("manifest");
    let features = manifest
        .split("\n[features]\n")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [features] table");
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let missing: Vec<&str> = features
        .lines()
        .filter_map(|line| line.split_once(" = "))
        .map(|(name, _)| name.trim())
        .filter(|name| !name.starts_with('#') && *name != "default")
        .filter(|name| !readme.contains(&format!("\n- `{name}`: ")))
        .collect();
    assert!(
        missing.is_empty(),
        "features the README does not list: {missing:?}"
    );
}

/// The README is read in five minutes; the rest is the guide's.
#[test]
fn the_readme_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "the README has {lines} lines; move the detail to docs/src/"
    );
}
