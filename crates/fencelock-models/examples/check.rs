//! Checks one model at a bound given on the command line and prints the
//! figures `docs/safety.md` reports:
//!
//! ```text
//! cargo run --release -p fencelock-models --example check -- redlock deep
//! ```
//!
//! Models: `bounds::MODELS` (`redlock`, `redlock-fast`, `sharding`,
//! `election`, and their broken twins, named `…-broken`); bounds: `small`
//! (the tests') or `deep`.

use std::time::Instant;

use fencelock_models::bounds;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(model), Some(bound)) = (args.first(), args.get(1)) else {
        eprintln!("usage: check MODEL small|deep [THREADS]");
        std::process::exit(2);
    };
    let threads = args.get(2).and_then(|t| t.parse().ok()).unwrap_or(2);
    let deep = match bound.as_str() {
        "small" => false,
        "deep" => true,
        other => {
            eprintln!("unknown bound {other}: small or deep");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let Some(outcome) = bounds::check(model, deep, threads) else {
        eprintln!(
            "unknown model {model}: one of {}",
            bounds::MODELS.join(", ")
        );
        std::process::exit(2);
    };
    println!(
        "{model} {bound}: {} unique states ({} generated), depth {}, {:.1}s",
        outcome.unique_states,
        outcome.states,
        outcome.max_depth,
        started.elapsed().as_secs_f64()
    );
    for (name, path) in &outcome.discoveries {
        println!("discovered \"{name}\":\n{path}\n");
    }
}
