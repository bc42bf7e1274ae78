//! Renders user tokens back to compact source-like text for error messages.
//!
//! `TokenStream::to_string` spaces every token (`Uuid :: new_v4 ()`); messages
//! read better with the code as a person writes it (`Uuid::new_v4()`). The
//! output is only ever shown to people, so a few heuristics suffice.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use quote::ToTokens;

/// The tokens of `node` as compact text, e.g. `Uuid::new_v4()` or `msg.id`.
pub(crate) fn code(node: &impl ToTokens) -> String {
    let mut out = String::new();
    write_stream(node.to_token_stream(), &mut out);
    out
}

/// What the previous token was, as far as spacing is concerned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prev {
    /// Start of a stream: never a space.
    Start,
    /// An identifier or literal: a following word needs a space.
    Word,
    /// A closing delimiter: a following word needs a space.
    Group,
    /// Punctuation followed by a space (`,`, `=`, `+`, ...).
    SpacedPunct,
    /// Punctuation glued to what follows (`.`, `::`, `&`, `!`, ...).
    GluedPunct,
}

fn write_stream(stream: TokenStream, out: &mut String) {
    let mut prev = Prev::Start;
    for tree in stream {
        prev = match tree {
            TokenTree::Ident(ident) => {
                write_word(&ident.to_string(), prev, out);
                Prev::Word
            }
            TokenTree::Literal(literal) => {
                write_word(&literal.to_string(), prev, out);
                Prev::Word
            }
            TokenTree::Punct(punct) => write_punct(punct.as_char(), punct.spacing(), prev, out),
            TokenTree::Group(group) => {
                write_group(group.delimiter(), group.stream(), prev, out);
                Prev::Group
            }
        };
    }
}

fn write_word(word: &str, prev: Prev, out: &mut String) {
    if matches!(prev, Prev::Word | Prev::Group | Prev::SpacedPunct) {
        out.push(' ');
    }
    out.push_str(word);
}

fn write_punct(ch: char, spacing: Spacing, prev: Prev, out: &mut String) -> Prev {
    let spaced = matches!(ch, ',' | ';' | '=' | '+' | '|' | '^' | '%' | '/' | '@');
    let space_before =
        spaced && ch != ',' && ch != ';' && prev != Prev::Start && prev != Prev::GluedPunct;
    if space_before {
        out.push(' ');
    }
    out.push(ch);
    if spaced && spacing == Spacing::Alone {
        Prev::SpacedPunct
    } else {
        Prev::GluedPunct
    }
}

fn write_group(delimiter: Delimiter, inner: TokenStream, prev: Prev, out: &mut String) {
    let (open, close, padded) = match delimiter {
        Delimiter::Parenthesis => ("(", ")", false),
        Delimiter::Bracket => ("[", "]", false),
        Delimiter::Brace => ("{", "}", true),
        Delimiter::None => ("", "", false),
    };
    let space_before = match delimiter {
        Delimiter::Brace => prev != Prev::Start && prev != Prev::GluedPunct,
        Delimiter::None => matches!(prev, Prev::Word | Prev::Group | Prev::SpacedPunct),
        _ => prev == Prev::SpacedPunct,
    };
    if space_before {
        out.push(' ');
    }
    out.push_str(open);
    let mut body = String::new();
    write_stream(inner, &mut body);
    if padded && !body.is_empty() {
        out.push(' ');
        out.push_str(&body);
        out.push(' ');
    } else {
        out.push_str(&body);
    }
    out.push_str(close);
}

#[cfg(test)]
mod tests {
    use super::code;

    fn render(source: &str) -> String {
        code(&source.parse::<proc_macro2::TokenStream>().unwrap())
    }

    #[test]
    fn renders_common_id_expressions_compactly() {
        assert_eq!(render("Uuid :: new_v4 ()"), "Uuid::new_v4()");
        assert_eq!(render("msg . id . to_string ()"), "msg.id.to_string()");
        assert_eq!(render("& * msg . ids [0]"), "&*msg.ids[0]");
        assert_eq!(render("msg.seq as u64"), "msg.seq as u64");
        assert_eq!(
            render("format!(\"{}-{}\", a.b, c)"),
            "format!(\"{}-{}\", a.b, c)"
        );
        assert_eq!(render("x == y"), "x == y");
        assert_eq!(render("|| { 1 }"), "|| { 1 }");
        assert_eq!(render("f(a, b)?"), "f(a, b)?");
    }
}
