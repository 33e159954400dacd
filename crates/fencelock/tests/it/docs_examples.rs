//! Every Rust example in README.md and docs/*.md must run to completion in
//! `cargo test --doc -p fencelock --all-features`, not only compile: an
//! example that compiles and then hangs or fails is a broken example. This
//! test keeps that true as the docs change. It fails when
//!
//! - a ```` ```rust ```` block is marked `no_run`, `ignore` or `should_panic`
//!   (or `compile_fail`) without an entry in [`NOT_RUN`], or an entry there no
//!   longer matches a block;
//! - a file with Rust examples is not compiled as doctests by `src/lib.rs`
//!   (its examples would be checked by nobody);
//! - a fenced block in such a file has no language, which rustdoc compiles
//!   as Rust while GitHub shows it as plain text.
//!
//! Blocks that need a real server (a PostgreSQL, Redis, etcd or ZooKeeper
//! at a fixed address) cannot run here; they are the allow-list below, each
//! with its reason, and are still compiled.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::path::{Path, PathBuf};

/// Examples that are compiled but not run: (file, text the block contains,
/// why it cannot run in the doc tests).
const NOT_RUN: &[(&str, &str, &str)] = &[
    (
        "docs/postgres.md",
        "fence.admit_in(&mut tx",
        "needs a PostgreSQL server and the caller's own table",
    ),
    (
        "docs/redis.md",
        "RedisBackend::connect",
        "connects to a Redis server at a fixed address",
    ),
    (
        "docs/etcd.md",
        "EtcdBackend::connect",
        "connects to an etcd cluster at fixed addresses",
    ),
    (
        "docs/zookeeper.md",
        "ZkBackend::connect",
        "connects to a ZooKeeper ensemble at fixed addresses",
    ),
];

/// Code block attributes that keep rustdoc from running (or from running
/// to success) an example.
const NOT_RUN_ATTRS: &[&str] = &["no_run", "ignore", "should_panic", "compile_fail"];

struct Block {
    file: String,
    line: usize,
    info: String,
    body: String,
}

fn repo_root() -> PathBuf {
    // crates/fencelock → the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// README.md and every docs/*.md, as paths relative to the root.
fn doc_files(root: &Path) -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The fenced code blocks of a Markdown file (``` or ~~~ fences, as
/// CommonMark: a closing fence is the same character, at least as long).
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(char, usize, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let fence_char = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let fence_len = fence_char.map_or(0, |c| trimmed.chars().take_while(|x| *x == c).count());
        match &mut open {
            None => {
                if let Some(c) = fence_char.filter(|_| fence_len >= 3) {
                    let info = trimmed[fence_len..].trim().to_string();
                    let block = Block {
                        file: file.to_string(),
                        line: i + 1,
                        info,
                        body: String::new(),
                    };
                    open = Some((c, fence_len, block));
                }
            }
            Some((c, len, block)) => {
                let closes = fence_char == Some(*c)
                    && fence_len >= *len
                    && trimmed[fence_len..].trim().is_empty();
                if closes {
                    out.push(open.take().unwrap().2);
                } else {
                    block.body.push_str(line);
                    block.body.push('\n');
                }
            }
        }
    }
    out
}

/// The comma- or space-separated attributes of an info string.
fn attrs(info: &str) -> Vec<&str> {
    info.split([',', ' ', '\t'])
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect()
}

fn is_rust(block: &Block) -> bool {
    attrs(&block.info).first() == Some(&"rust")
}

#[test]
fn every_docs_example_runs_or_is_allowed_not_to() {
    let root = repo_root();
    let lib = std::fs::read_to_string(root.join("crates/fencelock/src/lib.rs")).unwrap();
    let mut problems = Vec::new();
    let mut used = vec![false; NOT_RUN.len()];

    for file in doc_files(&root) {
        let text = std::fs::read_to_string(root.join(&file)).unwrap();
        let blocks = blocks(&file, &text);
        let rust: Vec<&Block> = blocks.iter().filter(|b| is_rust(b)).collect();
        if rust.is_empty() {
            continue;
        }
        let include = format!("include_str!(\"../../../{file}\")");
        if !lib.contains(&include) {
            problems.push(format!(
                "{file} has Rust examples but crates/fencelock/src/lib.rs does not compile it as doctests ({include})"
            ));
        }
        for block in &blocks {
            if block.info.is_empty() {
                problems.push(format!(
                    "{}:{}: a code block without a language is compiled as Rust by rustdoc; say `rust` or `text`",
                    block.file, block.line
                ));
            }
        }
        for block in rust {
            let not_run: Vec<&str> = attrs(&block.info)
                .into_iter()
                .filter(|a| NOT_RUN_ATTRS.contains(a))
                .collect();
            if not_run.is_empty() {
                continue;
            }
            let allowed = NOT_RUN
                .iter()
                .position(|(f, needle, _)| *f == block.file && block.body.contains(needle));
            match allowed {
                Some(i) => used[i] = true,
                None => problems.push(format!(
                    "{}:{}: a Rust example marked {} does not run in the doc tests; make it run \
                     (memory backend, or SQLite in a temp dir, with hidden `# ` setup lines) \
                     or add it to NOT_RUN in {} with the reason",
                    block.file,
                    block.line,
                    not_run.join(","),
                    file!()
                )),
            }
        }
    }
    for ((file, needle, _), used) in NOT_RUN.iter().zip(used) {
        if !used {
            problems.push(format!(
                "NOT_RUN entry ({file}, {needle:?}) matches no example that is kept from running; remove it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_scanner_finds_marked_blocks() {
    let text =
        "x\n```rust,no_run\nlet a = 1;\n```\n\n````text\n```\n````\n~~~rust ignore\nb\n~~~\n";
    let found = blocks("t.md", text);
    assert_eq!(found.len(), 3);
    assert_eq!(found[0].info, "rust,no_run");
    assert_eq!(found[0].line, 2);
    assert_eq!(found[0].body, "let a = 1;\n");
    assert_eq!(found[1].body, "```\n");
    assert_eq!(attrs(&found[2].info), ["rust", "ignore"]);
    assert!(found.iter().filter(|b| is_rust(b)).count() == 2);
}
