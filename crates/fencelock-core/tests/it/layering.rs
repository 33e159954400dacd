//! The modules of the core crate form layers, read bottom-up like the
//! crates of the workspace: no module reaches, directly or through others,
//! back to a module that reaches it. (`lease.rs` sits below both the guard
//! and the renewer, `deadline.rs` and `clock.rs` below everything that bounds
//! calls or trusts leases, and the election, semaphore and multi-key modules
//! above the client.)
//!
//! The graph is read from the sources: every `crate::MODULE` path outside
//! comments and `#[cfg(test)]` modules (unit tests may reach anything), with
//! names the crate root re-exports (`crate::LockClient`) resolved to the
//! module that defines them.
//!
//! `error` and `types` are one layer, the bottom one: an error names the key
//! and token it is about, and building a key or a token from input can fail
//! with an error. They are read as one node.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The source of `text` without line comments and without everything from
/// its `#[cfg(test)]` module on (every file keeps its tests at the end).
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first path segments after each `crate::` in `code`, including every
/// top-level item of a `use crate::{…}` group.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let preceded_by_ident = rest[..i]
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        rest = &rest[i + "crate::".len()..];
        if preceded_by_ident {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Split the group's top level at commas.
            let (mut depth, mut start) = (0usize, 0usize);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.push(ident(group[start..j].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(ident(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.push(ident(rest));
        }
    }
    found.retain(|s| !s.is_empty());
    found
}

/// Module of each name `lib.rs` re-exports with `pub use MODULE::{…}` or
/// `pub use MODULE::Name`.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for item in lib.split("pub use ").skip(1) {
        let item = item.split(';').next().unwrap_or_default();
        let Some((module, rest)) = item.split_once("::") else {
            continue;
        };
        let list = rest.trim().trim_start_matches('{').trim_end_matches('}');
        for name in list.split(',') {
            let name = name.split(" as ").last().unwrap_or_default().trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    names
}

/// The node a module is read as (see the top of this file).
fn layer(module: &str) -> String {
    match module {
        "error" | "types" => "error+types".to_owned(),
        other => other.to_owned(),
    }
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let read = |name: &str| fs::read_to_string(src.join(name)).expect("a source file of the crate");
    let lib = code_of(&read("lib.rs"));
    let names = reexports(&lib);
    let modules: BTreeSet<String> = fs::read_dir(&src)
        .expect("the crate's src directory")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".rs")
                .filter(|m| *m != "lib")
                .map(str::to_owned)
        })
        .collect();
    let mut graph = Graph::new();
    for module in &modules {
        let code = code_of(&read(&format!("{module}.rs")));
        let uses: Vec<String> = crate_paths(&code)
            .into_iter()
            .filter_map(|segment| {
                if modules.contains(&segment) {
                    Some(segment)
                } else {
                    names.get(&segment).cloned()
                }
            })
            .map(|target| layer(&target))
            .filter(|target| *target != layer(module))
            .collect();
        graph.entry(layer(module)).or_default().extend(uses);
    }
    graph
}

/// A cycle of `graph`, if it has one, as the modules along it.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = path.iter().position(|n| n == node).unwrap_or(0);
                let mut found = path[from..].to_vec();
                found.push(node.to_owned());
                return Some(found);
            }
            None => {}
        }
        marks.insert(node.to_owned(), Mark::Open);
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, marks, path) {
                return Some(found);
            }
        }
        path.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut marks, &mut Vec::new()))
}

#[test]
fn the_core_modules_have_no_import_circle() {
    let graph = graph();
    // The reader sees what it read: the edges the old circle was made of
    // must be found, or a change of syntax could make this test blind.
    for (from, to) in [
        ("client", "guard"),
        ("guard", "renewer"),
        ("election", "client"),
    ] {
        assert!(
            graph[from].contains(to),
            "{from} -> {to} was not found: the import reader is broken ({graph:?})"
        );
    }
    if let Some(cycle) = cycle(&graph) {
        panic!("import circle in fencelock-core: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_reader_finds_a_circle_where_there_is_one() {
    let mut graph = graph();
    graph
        .entry("renewer".to_owned())
        .or_default()
        .insert("client".to_owned());
    assert!(
        cycle(&graph).is_some(),
        "renewer -> client -> renewer missed"
    );
}

#[test]
fn group_imports_and_reexported_names_are_read() {
    let code = code_of(
        "use crate::{\n    backend::{Backend, Grant},\n    metrics as m,\n};\n// crate::commented\nfn f() { crate::poll::x(); other_crate::y(); }\n",
    );
    assert_eq!(crate_paths(&code), ["backend", "metrics", "poll"]);
    let names =
        reexports("pub use client::{LockClient, LockRequest};\npub use clock::ClockPolicy;\n");
    assert_eq!(names["LockRequest"], "client");
    assert_eq!(names["ClockPolicy"], "clock");
}
