use fencelock_models::{
    common::run,
    redlock_fast::{Config, RedlockFast},
};
fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let mut c = Config::small();
    c.clients = a[0].parse().unwrap();
    c.restarts = a[1].parse().unwrap();
    c.horizon = a[2].parse().unwrap();
    c.knowing = a[3].parse().unwrap();
    c.rounds = a[4].parse().unwrap();
    c.token_check = a[5] == "1";
    c.quarantine = a[6] == "1";
    c.releases = a[8] == "1";
    if a[9] == "1" {
        c.unproven_fresh_join = true;
        c.probes = 2;
    }
    let t = std::time::Instant::now();
    let o = run(RedlockFast(c), 1, a[7] == "1");
    println!(
        "{} states depth {} {:?}",
        o.unique_states,
        o.max_depth,
        t.elapsed()
    );
    for (n, p) in &o.discoveries {
        println!("{n}:\n{p}\n");
    }
}
