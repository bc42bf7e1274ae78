//! The little of Markdown the link check needs: the links of a document,
//! its headings, and the anchors GitHub gives those headings.

/// A link of a document: where it points, and the line it is on.
#[derive(Debug, PartialEq, Eq)]
pub struct Link {
    /// The target as written: `chapter.md#anchor`, `#anchor`, `https://…`.
    pub target: String,
    /// Its line, from 1.
    pub line: usize,
}

/// The lines of `text` outside fenced code blocks (```` ``` ```` or `~~~`),
/// with their numbers (from 1) and code spans blanked out.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"]
            .into_iter()
            .find(|marker| trimmed.starts_with(marker));
        match (fence, marker) {
            (None, Some(marker)) => fence = Some(marker),
            (Some(open), Some(marker)) if open == marker => fence = None,
            (None, None) => lines.push((index + 1, without_code_spans(line))),
            _ => {}
        }
    }
    lines
}

/// `line` with every code span (`` `…` ``, ``` `` … `` ```) replaced by a
/// space, so that brackets inside code are not read as links.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => {
                out.push(' ');
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every inline link (`[text](target)`, images included) and reference
/// definition (`[label]: target`) outside code.
pub fn links(text: &str) -> Vec<Link> {
    let mut links = Vec::new();
    for (line_number, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        if let Some(definition) = trimmed
            .strip_prefix('[')
            .and_then(|rest| rest.split_once("]: "))
        {
            links.push(Link {
                target: definition.1.trim().to_owned(),
                line: line_number,
            });
            continue;
        }
        let mut rest = line.as_str();
        while let Some(open) = rest.find("](") {
            let after = &rest[open + 2..];
            let mut depth = 0usize;
            let end = after.char_indices().find_map(|(i, c)| match c {
                '(' => {
                    depth += 1;
                    None
                }
                ')' if depth == 0 => Some(i),
                ')' => {
                    depth -= 1;
                    None
                }
                _ => None,
            });
            let Some(end) = end else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            links.push(Link {
                target: target.to_owned(),
                line: line_number,
            });
            rest = &after[end + 1..];
        }
    }
    links
}

/// The anchors of `text`'s headings, as GitHub makes them: the heading's
/// text lowercased, punctuation but `-` and `_` removed, each space a `-`;
/// the second heading with the same anchor gets `-1`, the third `-2`.
pub fn anchors(text: &str) -> Vec<String> {
    let mut anchors: Vec<String> = Vec::new();
    for (_, line) in prose_lines_keeping_code(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(&link_texts(title));
        let same = anchors
            .iter()
            .filter(|a| **a == base || is_numbered(a, &base))
            .count();
        anchors.push(if same == 0 {
            base
        } else {
            format!("{base}-{same}")
        });
    }
    anchors
}

/// Whether `anchor` is `base` followed by `-<n>`.
fn is_numbered(anchor: &str, base: &str) -> bool {
    anchor
        .strip_prefix(base)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// Like [`prose_lines`], but code spans kept (a heading's code is part of
/// its text).
fn prose_lines_keeping_code(text: &str) -> Vec<(usize, String)> {
    let blanked = prose_lines(text);
    let lines: Vec<&str> = text.lines().collect();
    blanked
        .into_iter()
        .map(|(number, _)| (number, lines[number - 1].to_owned()))
        .collect()
}

/// `title` with each link `[text](target)` replaced by its text.
fn link_texts(title: &str) -> String {
    let mut out = String::new();
    let mut rest = title;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|i| close + i) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// GitHub's anchor of a heading's text.
pub fn slug(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn anchors_follow_github() {
    let text = "# The attribute\n\
                ## Waking on commit (PostgreSQL)\n\
                ```rust\n# hidden line, not a heading\n```\n\
                ## What \"exactly-once effects\" does and does not mean\n\
                ### Claim cost as the inbox grows (`throughput -- growth`)\n\
                ## Notes\n## Notes\n## Notes\n\
                ## See [the guide](docs/src/SUMMARY.md) — twice\n";
    assert_eq!(
        anchors(text),
        [
            "the-attribute",
            "waking-on-commit-postgresql",
            "what-exactly-once-effects-does-and-does-not-mean",
            "claim-cost-as-the-inbox-grows-throughput----growth",
            "notes",
            "notes-1",
            "notes-2",
            "see-the-guide--twice",
        ]
    );
}

#[test]
fn links_outside_code_are_found() {
    let text = "See [a](a.md#x) and ![img](img.png \"title\").\n\
                `[not](a-link.md)` and ``[nor](this.md)``\n\
                ```rust\nlet x = [1](2);\n```\n\
                [label]: https://example.com\n\
                [nested](https://docs.rs/x/fn.f(a).html) end";
    let targets: Vec<(String, usize)> = links(text)
        .into_iter()
        .map(|link| (link.target, link.line))
        .collect();
    assert_eq!(
        targets,
        [
            ("a.md#x".to_owned(), 1),
            ("img.png".to_owned(), 1),
            ("https://example.com".to_owned(), 6),
            ("https://docs.rs/x/fn.f(a).html".to_owned(), 7),
        ]
    );
}
