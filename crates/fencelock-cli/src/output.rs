//! What the commands print: one human form, one JSON form.

use std::time::Duration;

use fencelock::{Leader, LeaderChange, LockInfo, LockMode, Stats};
use serde::Serialize;

/// Where and how to print.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    pub json: bool,
    pub quiet: bool,
}

impl Output {
    /// Prints `value` as JSON (in `--json` mode) or `human` (unless quiet).
    pub fn emit<T: Serialize>(&self, value: &T, human: impl FnOnce() -> String) {
        if self.json {
            match serde_json::to_string(value) {
                Ok(text) => println!("{text}"),
                Err(e) => eprintln!("fencelock: cannot encode output: {e}"),
            }
        } else if !self.quiet {
            println!("{}", human());
        }
    }

    /// In `--json` mode, a failure as one JSON object on stdout, `{"error":
    /// "…", "code": "…"}` plus `extra`'s fields, with the REST API's codes
    /// (`docs/http.md`, [`fencelock::Error::code`]), so that scripts parse
    /// failures as they parse results. The reason goes to stderr as well,
    /// from the caller, in either mode.
    pub fn fail(&self, code: &str, error: impl std::fmt::Display, extra: serde_json::Value) {
        if !self.json {
            return;
        }
        let mut body = serde_json::json!({ "error": error.to_string(), "code": code });
        if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        println!("{body}");
    }

    /// [`Self::fail`] for a library error.
    pub fn fail_with(&self, error: &fencelock::Error) {
        self.fail(error.code(), error, serde_json::Value::Null);
    }

    /// A progress or diagnostic line on stderr, unless quiet.
    pub fn note(&self, line: impl std::fmt::Display) {
        if !self.quiet {
            eprintln!("fencelock: {line}");
        }
    }
}

/// `12.3s`, `4m 5s` — rounded for people.
pub fn human_duration(d: Duration) -> String {
    let rounded = if d >= Duration::from_secs(60) {
        Duration::from_secs(d.as_secs())
    } else {
        Duration::from_millis(d.as_millis() as u64 / 100 * 100)
    };
    humantime::format_duration(rounded).to_string()
}

/// One line describing a lease.
pub fn describe(info: &LockInfo) -> String {
    let kind = info
        .kind
        .as_deref()
        .map(|k| format!(", kind {k}"))
        .unwrap_or_default();
    let reader = match info.mode {
        LockMode::Shared => "read-",
        LockMode::Exclusive => "",
    };
    format!(
        "{} is {reader}held by {} (token {}{kind}), expires in {}",
        info.key,
        info.owner,
        info.token,
        human_duration(info.expires_in)
    )
}

/// A table of leases.
pub fn table(leases: &[LockInfo]) -> String {
    if leases.is_empty() {
        return "no locks held".into();
    }
    let rows: Vec<[String; 6]> = leases
        .iter()
        .map(|l| {
            [
                l.key.to_string(),
                l.owner.to_string(),
                l.token.to_string(),
                l.mode.to_string(),
                l.kind.clone().unwrap_or_else(|| "-".into()),
                human_duration(l.expires_in),
            ]
        })
        .collect();
    let header = ["KEY", "OWNER", "TOKEN", "MODE", "KIND", "EXPIRES IN"].map(String::from);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    std::iter::once(&header)
        .chain(&rows)
        .map(|row| {
            row.iter()
                .zip(widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Statistics for people.
pub fn stats(s: &Stats) -> String {
    let pairs = |m: &std::collections::BTreeMap<String, u64>| {
        if m.is_empty() {
            "-".to_owned()
        } else {
            m.iter()
                .map(|(k, v)| format!("{}={v}", if k.is_empty() { "(none)" } else { k }))
                .collect::<Vec<_>>()
                .join(" ")
        }
    };
    let secs = |s: Option<f64>| {
        s.map(|v| human_duration(Duration::from_secs_f64(v.max(0.0))))
            .unwrap_or_else(|| "-".into())
    };
    format!(
        "held: {}\nby kind: {}\nby owner: {}\nhold time: avg {}, max {}\nexpired, not cleaned: {}",
        s.held,
        pairs(&s.held_by_kind),
        pairs(&s.held_by_owner),
        secs(s.avg_hold_seconds),
        secs(s.max_hold_seconds),
        s.expired_not_cleaned
    )
}

/// One line naming an election's leader.
pub fn leader(name: &str, leader: &Leader) -> String {
    format!(
        "{name} is led by {} (term {}), expires in {}",
        leader.owner,
        leader.term,
        human_duration(leader.expires_in)
    )
}

/// One line (or JSON object) per change of an election's leader.
pub fn leader_change(out: Output, name: &str, change: &LeaderChange) {
    match change {
        LeaderChange::Elected(l) => out.emit(
            &serde_json::json!({
                "event": "elected", "owner": l.owner, "term": l.term, "value": l.value,
                "expires_in_ms": u64::try_from(l.expires_in.as_millis()).unwrap_or(u64::MAX),
            }),
            || leader(name, l),
        ),
        LeaderChange::Vacant {
            previous_term,
            expired,
        } => out.emit(
            &serde_json::json!({
                "event": "vacant", "previous_term": previous_term, "expired": expired,
            }),
            || {
                let how = if *expired {
                    "its lease expired"
                } else {
                    "it resigned"
                };
                format!("{name} has no leader: term {previous_term} ended ({how})")
            },
        ),
        _ => {}
    }
}
