//! Checks one bound and prints the figures `docs/safety.md` reports, or
//! prints the tables of `docs/safety.md` themselves:
//!
//! ```text
//! cargo run --release -p fencelock-models --example check -- redlock deep
//! cargo run --release -p fencelock-models --example check -- sharding small 1 skip-handover
//! cargo run --release -p fencelock-models --example check -- --table small
//! cargo run --release -p fencelock-models --example check -- --table deep redlock-fast
//! cargo run --release -p fencelock-models --example check -- --mutants
//! ```
//!
//! Bounds: `bounds::BOUNDS`; sizes: `small` (CI's) or `deep`; a planted
//! bug by its name (`plant::Plant::name`). `--table SIZE [BOUND...]`
//! checks every bound (or those named) at that size on one thread and
//! prints a markdown row for each, the limits (`bounds::LIMITS`, which
//! stop at their counterexample) last;
//! `--mutants` plants every bug of `bounds::MUTANTS` on its bound and
//! prints a row for each. CPU times are the process's (Linux,
//! `/proc/self/stat`).

use std::time::Instant;

use fencelock_models::{
    bounds::{self, BOUNDS, LIMITS, MUTANTS},
    common::Outcome,
    plant::Plant,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--table", size, only @ ..] => table(deep(size), only),
        ["--mutants"] => mutants(),
        [bound, size, rest @ ..] => {
            let threads = rest.first().and_then(|t| t.parse().ok()).unwrap_or(2);
            let plant = rest.get(1).map(|name| {
                plant_named(name).unwrap_or_else(|| fail(&format!("unknown planted bug {name}")))
            });
            one(bound, deep(size), plant, threads);
        }
        _ => {
            fail("usage: check BOUND small|deep [THREADS [PLANT]] | --table small|deep [BOUND...] | --mutants")
        }
    }
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2);
}

fn deep(size: &str) -> bool {
    match size {
        "small" => false,
        "deep" => true,
        other => fail(&format!("unknown size {other}: small or deep")),
    }
}

fn plant_named(name: &str) -> Option<Plant> {
    MUTANTS.iter().map(|m| m.plant).find(|p| p.name() == name)
}

/// Checks `bound`, with the CPU seconds it took.
fn timed(bound: &str, deep: bool, plant: Option<Plant>, threads: usize) -> (Outcome, f64) {
    let before = cpu_seconds();
    let outcome = bounds::check(bound, deep, plant, threads).unwrap_or_else(|| {
        fail(&format!(
            "unknown bound {bound}: one of {}",
            BOUNDS.join(", ")
        ))
    });
    (outcome, cpu_seconds() - before)
}

fn one(bound: &str, deep: bool, plant: Option<Plant>, threads: usize) {
    let started = Instant::now();
    let (outcome, cpu) = timed(bound, deep, plant, threads);
    println!(
        "{bound} {}: {} unique states ({} generated), depth {}, {:.1}s wall, {cpu:.1}s CPU",
        if deep { "deep" } else { "small" },
        outcome.unique_states,
        outcome.states,
        outcome.max_depth,
        started.elapsed().as_secs_f64()
    );
    for (name, path) in &outcome.discoveries {
        println!("discovered \"{name}\":\n{path}\n");
    }
}

fn table(deep: bool, only: &[&str]) {
    println!("| bound | unique states | depth | CPU | found |");
    println!("|---|---|---|---|---|");
    let limits = LIMITS.iter().map(|(bound, _)| *bound);
    for bound in BOUNDS
        .into_iter()
        .chain(limits)
        .filter(|b| only.is_empty() || only.contains(b))
    {
        let (outcome, cpu) = timed(bound, deep, None, 1);
        let found: Vec<String> = outcome
            .discoveries
            .iter()
            .map(|(name, _)| format!("`{name}`"))
            .collect();
        println!(
            "| `{bound}` | {} | {} | {cpu:.1} s | {} |",
            thousands(outcome.unique_states),
            outcome.max_depth,
            found.join(", ")
        );
    }
}

fn mutants() {
    println!("| planted bug | bound | broken | states | steps | CPU |");
    println!("|---|---|---|---|---|---|");
    for m in MUTANTS {
        let (outcome, cpu) = timed(m.bound, false, Some(m.plant), 1);
        let steps = outcome
            .discovery(m.breaks)
            .map_or("**survived**".to_string(), |path| {
                path.lines().count().saturating_sub(1).to_string()
            });
        println!(
            "| `{}` | `{}` | `{}` | {} | {steps} | {cpu:.1} s |",
            m.plant.name(),
            m.bound,
            m.breaks,
            thousands(outcome.unique_states),
        );
    }
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// User and system CPU of the whole process (every checker thread), from
/// `/proc/self/stat` in clock ticks of 1/100 s (Linux's `USER_HZ`).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime, fields 14 and 15 of the line.
    (ticks(11) + ticks(12)) as f64 / 100.0
}
