//! The one LISTEN connection per backend that feeds its [`WakeHub`].

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use fencelock_core::{Backoff, WakeHub};
use sqlx::{postgres::PgListener, PgPool};
use tokio::task::JoinHandle;

/// The background task; it stops when this handle is dropped.
pub(crate) struct Listener(JoinHandle<()>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Listener {
    /// Starts listening on `channel`; each attempt to connect may take
    /// `connect_timeout`.
    pub(crate) fn spawn(
        pool: PgPool,
        channel: String,
        hub: WakeHub,
        listening: Arc<AtomicBool>,
        connect_timeout: Duration,
    ) -> Self {
        Self(tokio::spawn(run(
            pool,
            channel,
            hub,
            listening,
            connect_timeout,
        )))
    }
}

async fn run(
    pool: PgPool,
    channel: String,
    hub: WakeHub,
    listening: Arc<AtomicBool>,
    connect_timeout: Duration,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let attempt = fencelock_sql_common::bounded(connect_timeout, listen(&pool, &channel));
        match attempt.await {
            Ok(mut listener) => {
                backoff.reset();
                listening.store(true, Ordering::SeqCst);
                // Releases may have happened while nobody listened.
                hub.notify_all();
                // `Ok(None)` or an error: the connection dropped. We
                // reconnect ourselves so that the hub learns about the gap.
                while let Ok(Some(notice)) = listener.try_recv().await {
                    hub.notify(notice.payload());
                }
                listening.store(false, Ordering::SeqCst);
                tracing::debug!(channel, "wake-up listener lost its connection");
                // Waiters fall back to jittered backoff until we are back.
                hub.close_all();
            }
            Err(e) => {
                tracing::debug!(channel, error = %e, "wake-up listener cannot connect");
                // Subscriptions taken while it started would never fire.
                hub.close_all();
            }
        }
        tokio::time::sleep(backoff.next_pause()).await;
    }
}

async fn listen(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}
