//! The README and `docs/` hold together: the README stays a newcomer's page (at most
//! [`README_MAX_LINES`], the quick start within its first [`QUICK_START_BY`] lines), and
//! every relative link of the README, `docs/` and BENCHMARKS.md names a file that exists
//! and, with a `#fragment`, one of its headings.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 300;
const QUICK_START_BY: usize = 60;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// GitHub's anchor of a heading: lower case, spaces to dashes, most punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |l| {
        if l.starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// Headings outside fenced code blocks, as anchors.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .filter(|l| l.starts_with('#'))
        .map(anchor)
        .collect()
}

/// The targets of `[text](target)` links outside fenced code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for l in prose(text) {
        let mut rest = l;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    pages
}

#[test]
fn the_readme_is_a_newcomers_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    assert!(
        lines.len() <= README_MAX_LINES,
        "README.md has {} lines",
        lines.len()
    );
    let quick = lines.iter().position(|l| *l == "## Quick start");
    assert!(
        quick.is_some_and(|i| i < QUICK_START_BY),
        "quick start at line {quick:?}"
    );
    for doc in [
        "docs/design.md",
        "docs/operating.md",
        "docs/deployment.md",
        "docs/security.md",
        "docs/testing.md",
    ] {
        assert!(readme.contains(&format!("]({doc})")), "README links {doc}");
    }
}

#[test]
fn every_relative_link_names_a_file_and_a_heading_that_exist() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            checked += 1;
            let Ok(target_text) = std::fs::read_to_string(&target) else {
                broken.push(format!("{}: {link} (no file)", page.display()));
                continue;
            };
            if !fragment.is_empty() && !anchors(&target_text).contains(fragment) {
                broken.push(format!("{}: {link} (no heading)", page.display()));
            }
        }
    }
    assert!(checked >= 10, "{checked} links checked");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
