//! What the sharded tests share: an opener for shard URLs (memory shards
//! shared by URL, so that every connect of a case sees the same store, as
//! separate processes on a server would), and the conformance factory over
//! two-shard maps.

#![allow(dead_code)] // each test binary uses a part

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
};

use fencelock_core::{Backend, Driver, MemoryBackend};
use fencelock_sharded::{OpenFuture, Phase, Shard, ShardMap, ShardedBackend};
use fencelock_testkit::{
    async_trait, servers::redis::RedisServer, Store, StoreFactory, TestResult,
};

/// Opens `mem://NAME` (one backend per name for the whole binary),
/// `sqlite://…` and `redis://…` through their drivers.
pub fn open(url: String) -> OpenFuture {
    Box::pin(async move {
        if url.starts_with("mem://") {
            static SHARED: OnceLock<Mutex<HashMap<String, Arc<dyn Backend>>>> = OnceLock::new();
            let mut shared = SHARED
                .get_or_init(Default::default)
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let backend = shared
                .entry(url)
                .or_insert_with(|| Arc::new(MemoryBackend::new()));
            return Ok(Arc::clone(backend));
        }
        if url.starts_with("sqlite://") {
            return fencelock_sqlite::SqliteDriver.open_backend(&url).await;
        }
        fencelock_redis::RedisDriver.open_backend(&url).await
    })
}

/// The two-shard maps the suite runs on.
#[derive(Clone, Copy, Debug)]
pub enum Layout {
    /// Stable: a SQLite shard and a memory shard.
    SqliteMemory,
    /// Shard `b` joins `a` on one Redis server (two key prefixes): keys
    /// that `b` wins move, their previous owner issuing tokens.
    RedisJoin,
    /// The same move one step later: the current owner issues tokens.
    RedisHandover,
}

pub struct Factory {
    layout: Layout,
    redis: tokio::sync::OnceCell<Arc<RedisServer>>,
    cases: AtomicUsize,
}

impl Factory {
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            redis: tokio::sync::OnceCell::new(),
            cases: AtomicUsize::new(0),
        }
    }
}

struct ShardedStore {
    map: ShardMap,
    _dir: Option<tempfile::TempDir>,
    _redis: Option<Arc<RedisServer>>,
}

#[async_trait]
impl Store for ShardedStore {
    async fn connect(&self) -> TestResult<Arc<dyn Backend>> {
        Ok(Arc::new(
            ShardedBackend::open(self.map.clone(), open).await?,
        ))
    }
}

#[async_trait]
impl StoreFactory for Factory {
    fn name(&self) -> &'static str {
        match self.layout {
            Layout::SqliteMemory => "sharded-sqlite-memory",
            Layout::RedisJoin => "sharded-redis-join",
            Layout::RedisHandover => "sharded-redis-handover",
        }
    }
    fn can_restart(&self) -> bool {
        false
    }
    fn has_fence(&self) -> bool {
        false
    }
    async fn store(&self, _dedicated: bool) -> TestResult<Box<dyn Store>> {
        let n = self.cases.fetch_add(1, Ordering::SeqCst);
        let phase = match self.layout {
            Layout::SqliteMemory => {
                let dir = tempfile::tempdir()?;
                let sqlite = format!("sqlite://{}", dir.path().join("a.db").display());
                let map = ShardMap::new(
                    1,
                    vec![
                        Shard::new("a", sqlite),
                        Shard::new("b", format!("mem://case{n}")),
                    ],
                )?;
                return Ok(Box::new(ShardedStore {
                    map,
                    _dir: Some(dir),
                    _redis: None,
                }));
            }
            Layout::RedisJoin => Phase::Join,
            Layout::RedisHandover => Phase::Handover,
        };
        let start = || async {
            TestResult::Ok(Arc::new(
                tokio::task::spawn_blocking(RedisServer::start).await??,
            ))
        };
        let redis = Arc::clone(self.redis.get_or_try_init(start).await?);
        let base = redis.url();
        let a = Shard::new("a", format!("{base}?prefix=c{n}a:"));
        let b = Shard::new("b", format!("{base}?prefix=c{n}b:"));
        let map = ShardMap::new(2, vec![a.clone(), b])?.in_transition(phase, vec![a])?;
        Ok(Box::new(ShardedStore {
            map,
            _dir: None,
            _redis: Some(redis),
        }))
    }
}
