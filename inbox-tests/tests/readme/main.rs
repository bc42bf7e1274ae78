//! The README's first example, as written: it compiles without a warning
//! (this file denies them), and it does what the README says against a real
//! PostgreSQL server. `tests/readme/first_example.rs` is that block of the
//! README, character for character (checked below).
#![deny(warnings)]

#[cfg(feature = "postgres")]
mod first_example;
#[cfg(feature = "postgres")]
mod postgres;

#[test]
fn the_readme_shows_the_example_file_verbatim() {
    let readme = include_str!("../../../README.md");
    let block = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README's first rust block");
    assert_eq!(block, include_str!("first_example.rs"));
}
