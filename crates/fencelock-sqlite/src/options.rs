//! [`SqliteOptions`]: where the lock database is and how it is opened.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use fencelock_core::{parse_duration, Error, Result};

/// How hard SQLite syncs commits to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synchronous {
    /// fsync on every commit (default): a grant survives power loss.
    Full,
    /// WAL's NORMAL: survives process crashes; the last commits before a
    /// power loss may roll back. All holders of a SQLite lock live on the
    /// same host and die with it, but a fence elsewhere may have seen a
    /// token that is then issued again — use `Full` when fences matter.
    Normal,
}

/// Where and how to open a lock database.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    pub(crate) path: PathBuf,
    pub(crate) busy_timeout: Duration,
    pub(crate) synchronous: Synchronous,
    pub(crate) create: bool,
}

impl SqliteOptions {
    /// A database file at `path`, created if missing, with its missing
    /// parent directories (mode 0700).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            busy_timeout: Duration::from_secs(5),
            synchronous: Synchronous::Full,
            create: true,
        }
    }

    /// Parses `sqlite://PATH[?busy_timeout=5s&synchronous=full|normal&create=true|false]`.
    ///
    /// `sqlite:///var/lib/app/locks.db` is an absolute path,
    /// `sqlite://locks.db` a relative one. `create=false` opens an existing
    /// lock database only (see [`Self::create`]).
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url
            .get(..9)
            .filter(|scheme| scheme.eq_ignore_ascii_case("sqlite://"))
            .map(|_| &url[9..])
            .ok_or_else(|| Error::InvalidUrl(format!("{url:?} does not start with sqlite://")))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(Error::InvalidUrl(
                "sqlite:// needs a file path, e.g. sqlite:///var/lib/app/locks.db".into(),
            ));
        }
        let mut options = Self::new(path);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "busy_timeout" => {
                    options.busy_timeout = parse_duration(value)
                        .map_err(|e| Error::InvalidUrl(format!("busy_timeout: {e}")))?;
                }
                "synchronous" => {
                    options.synchronous = match value.to_ascii_lowercase().as_str() {
                        "full" => Synchronous::Full,
                        "normal" => Synchronous::Normal,
                        other => {
                            return Err(Error::InvalidUrl(format!(
                                "synchronous={other:?}: expected full or normal"
                            )))
                        }
                    }
                }
                "create" => {
                    options.create = match value.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        other => {
                            return Err(Error::InvalidUrl(format!(
                                "create={other:?}: expected true or false"
                            )))
                        }
                    }
                }
                other => {
                    return Err(Error::InvalidUrl(format!(
                        "unknown sqlite option {other:?} (known: busy_timeout, synchronous, create)"
                    )))
                }
            }
        }
        Ok(options)
    }

    /// How long a statement waits for another process's write lock before
    /// failing with a transient error (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Commit durability (default [`Synchronous::Full`]).
    pub fn synchronous(mut self, mode: Synchronous) -> Self {
        self.synchronous = mode;
        self
    }

    /// Whether opening may create what is missing: the file, its
    /// directories and fencelock's tables (default `true`). With `false`,
    /// opening a path with no file, or a file without fencelock's tables
    /// (or with tables an older version made, which only an opening that
    /// may create upgrades), fails with a permanent error and changes
    /// nothing: for tools that only read the locks, where a mistyped path
    /// must not leave an empty store behind (`fencelock list`).
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
