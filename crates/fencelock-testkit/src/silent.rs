//! A TCP server that accepts connections and never reads from or writes to
//! them: the peer every client-side connect and operation timeout must be
//! tested against, since a server that refuses or resets is the easy case.
//!
//! ```
//! let silent = fencelock_testkit::silent::SilentServer::start().unwrap();
//! let url = format!("redis://{}", silent.addr());
//! # drop(url);
//! ```

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
};

/// A loopback listener that accepts every connection and leaves it silent
/// but open, until dropped. Dropping it closes the listener and every
/// accepted connection and joins its thread.
#[derive(Debug)]
pub struct SilentServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SilentServer {
    /// Listens on a random port of 127.0.0.1.
    pub fn start() -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("silent-server".into())
            .spawn(move || {
                // Held, never touched: the peer sees an open connection that
                // never answers. Closed when the thread ends.
                let mut open: Vec<TcpStream> = Vec::new();
                for stream in listener.incoming() {
                    if stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        open.push(stream);
                    }
                }
            })?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // The accept loop blocks in accept(): one last connection wakes it
        // to see the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

    use std::{
        io::{ErrorKind, Read},
        time::Duration,
    };

    use super::*;

    #[test]
    fn accepts_stays_silent_and_stops_on_drop() {
        let server = SilentServer::start().unwrap();
        let mut client = TcpStream::connect(server.addr()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = [0u8; 1];
        let silent = client.read(&mut buf).unwrap_err();
        assert!(
            matches!(silent.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "{silent:?}"
        );
        let addr = server.addr();
        drop(server);
        // The accepted connection is closed: the client reads end of file.
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(client.read(&mut buf).unwrap(), 0);
        assert!(TcpStream::connect(addr).is_err(), "still listening");
    }
}
