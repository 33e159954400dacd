//! A set of server processes of one engine on loopback: a single server or
//! the members of a replicated cluster, each killable, pausable and
//! restartable on its own ports and data directory.
//!
//! The lifecycle is the same for every engine; what differs (the command
//! line, when a member serves, which one leads) is the [`Engine`]'s. A
//! type alias per engine (`EtcdCluster`, `ZkServer`) names the set, and the
//! engine's own helpers are inherent methods on that alias. Redis is one
//! engine in three layouts (one server, independent `redlock://` nodes, a
//! cluster), each its own [`Engine`] around one command line.

use std::{
    fmt,
    fs::File,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;

use super::{
    free_ports, url_factory::UrlServer, wait_for_port, with_log_tail, ChildProcess, ExitedAtStart,
    START_ATTEMPTS,
};
use crate::TestResult;

/// Where a member listens and keeps its files, fixed for its whole life so
/// that a restarted member comes back as itself.
#[derive(Debug)]
pub struct Slot {
    /// The member's position in the set, from 0.
    pub index: usize,
    /// The port clients connect to, on 127.0.0.1.
    pub client_port: u16,
    /// [`Engine::PEER_PORTS`] more ports for the member's own listeners
    /// (peer and election ports), distinct from every other port of the set.
    pub peer_ports: Vec<u16>,
    /// The member's own directory (configuration, data, log).
    pub dir: PathBuf,
}

impl Slot {
    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }
}

/// Where a member reaches a peer's listener: at the listener itself, or
/// through something in between (a lab's delayed link between two sites).
///
/// Called while a set is laid out, before any member starts, with the
/// member that dials, the member dialled and the address of the listener;
/// answers the address to dial instead. The dialling member is `None`
/// where the engine gives every peer the one address a member advertises
/// (etcd), so that one link carries every peer's traffic to it.
pub type PeerLink<'a> = dyn Fn(Option<usize>, usize, SocketAddr) -> TestResult<SocketAddr> + 'a;

/// The [`PeerLink`] of members that reach each other directly.
pub fn direct(_from: Option<usize>, _to: usize, addr: SocketAddr) -> TestResult<SocketAddr> {
    Ok(addr)
}

/// What one engine contributes to a [`MemberSet`].
pub trait Engine: fmt::Debug + Send + Sync + 'static {
    /// The engine's name in messages and logs (`etcd`, `zookeeper`).
    const NAME: &'static str;
    /// The URL scheme of a set's client URL (`etcd`, `zk`).
    const SCHEME: &'static str;
    /// How long a member may take to serve, or a cluster to elect a
    /// leader, after starting.
    const START_TIMEOUT: Duration;
    /// How many ports each member listens on besides its client port
    /// ([`Slot::peer_ports`]).
    const PEER_PORTS: usize = 0;

    /// The command that runs member `slot` (its stdout is discarded and its
    /// stderr goes to a log in its directory).
    fn command(&self, slot: &Slot) -> Command;

    /// Whether the member at `slot` serves requests (not only accepts
    /// connections: a cluster member serves once it knows a leader).
    fn serves(&self, slot: &Slot) -> bool;

    /// Whether the member at `slot` leads its cluster (a lone server leads).
    fn leads(&self, slot: &Slot) -> bool;

    /// Deletes what the stopped member at `slot` keeps on disk, as a lost
    /// or replaced disk would, leaving what identifies it: by default its
    /// `data` directory, emptied.
    fn wipe(&self, slot: &Slot) -> TestResult {
        let data = slot.dir.join("data");
        if data.exists() {
            std::fs::remove_dir_all(&data)?;
        }
        std::fs::create_dir_all(&data)?;
        Ok(())
    }
}

#[derive(Debug)]
struct Member {
    slot: Slot,
    process: Mutex<Option<ChildProcess>>,
}

impl Member {
    fn process(&self) -> MutexGuard<'_, Option<ChildProcess>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The member's process id while it runs (`None` once it has exited or
    /// was killed).
    fn running_pid(&self) -> TestResult<Option<u32>> {
        self.process()
            .as_mut()
            .map_or(Ok(None), ChildProcess::running_pid)
    }
}

/// Members of one engine on loopback with temporary directories, killed on
/// drop.
#[derive(Debug)]
pub struct MemberSet<E: Engine> {
    engine: E,
    members: Vec<Member>,
    _root: tempfile::TempDir,
}

impl<E: Engine> MemberSet<E> {
    /// Lays out `n` members (a free client port and a directory each), lets
    /// `engine` see the layout (peer addresses, configuration files), starts
    /// every member and returns once each serves.
    ///
    /// A port from [`super::free_ports`] is free when it is chosen, not
    /// necessarily when the server binds it: another test can be handed the
    /// same port in between, and a port the server derives from it (a Redis
    /// cluster node's bus port, 10000 above its client port) can be any
    /// connection's local port. A member that exits before it serves is
    /// taken for such a clash: the whole set is laid out again on fresh
    /// ports, up to [`START_ATTEMPTS`] times.
    pub fn start_with(
        n: usize,
        mut engine: impl FnMut(&[Slot]) -> TestResult<E>,
    ) -> TestResult<Self> {
        let mut attempt = 1;
        loop {
            let set = Self::lay_out(n, &mut engine)?;
            match set.start_all() {
                Ok(()) => return Ok(set),
                Err(e) if attempt < START_ATTEMPTS && set.any_exited() => {
                    eprintln!(
                        "{} set, attempt {attempt} of {START_ATTEMPTS}: {e}; laying it out again",
                        E::NAME
                    );
                    crate::report::retry(&format!("{} set laid out again ({e})", E::NAME));
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn lay_out(n: usize, engine: &mut impl FnMut(&[Slot]) -> TestResult<E>) -> TestResult<Self> {
        let root = tempfile::tempdir()?;
        // Every port of the set at once, so that no two members (nor a
        // member's client and peer ports) share one.
        let ports = free_ports(n * (1 + E::PEER_PORTS))?;
        let mut slots = Vec::with_capacity(n);
        for (index, ports) in ports.chunks(1 + E::PEER_PORTS).enumerate() {
            let dir = root.path().join(format!("m{index}"));
            std::fs::create_dir_all(&dir)?;
            slots.push(Slot {
                index,
                client_port: ports[0],
                peer_ports: ports[1..].to_vec(),
                dir,
            });
        }
        let engine = engine(&slots)?;
        Ok(Self {
            engine,
            members: slots
                .into_iter()
                .map(|slot| Member {
                    slot,
                    process: Mutex::new(None),
                })
                .collect(),
            _root: root,
        })
    }

    /// Whether a member that was started has exited on its own.
    fn any_exited(&self) -> bool {
        self.members.iter().any(|m| {
            m.process()
                .as_mut()
                .is_some_and(|p| !p.is_running().unwrap_or(false))
        })
    }

    fn start_all(&self) -> TestResult {
        for i in 0..self.members.len() {
            self.spawn(i)?;
        }
        for i in 0..self.members.len() {
            self.wait_serving(i)?;
        }
        Ok(())
    }

    fn spawn(&self, i: usize) -> TestResult {
        let m = &self.members[i];
        let log = File::create(self.log(i))?;
        let child = self
            .engine
            .command(&m.slot)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        *m.process() = Some(ChildProcess::new(format!("{} m{i}", E::NAME), child));
        Ok(())
    }

    fn wait_accepting(&self, i: usize) -> TestResult {
        let m = &self.members[i];
        wait_for_port(m.slot.addr(), E::START_TIMEOUT, || m.running_pid())
            .map_err(|e| with_log_tail(e, &self.log(i)))
    }

    fn log(&self, i: usize) -> PathBuf {
        self.members[i].slot.dir.join(format!("{}.log", E::NAME))
    }

    fn wait_serving(&self, i: usize) -> TestResult {
        self.wait_accepting(i)?;
        // An open port is not a quorum: ask the engine until it serves.
        let deadline = Instant::now() + E::START_TIMEOUT;
        while !self.engine.serves(&self.members[i].slot) {
            // A member can listen and still exit before it serves (a Redis
            // cluster node whose bus port, 10000 above its client port, is
            // taken): say so now rather than at the deadline.
            if self.members[i].running_pid()?.is_none() {
                let exited = ExitedAtStart(format!("{} m{i} exited before it served", E::NAME));
                return Err(with_log_tail(exited.into(), &self.log(i)));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} m{i} did not serve within {:?}",
                    E::NAME,
                    E::START_TIMEOUT
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The engine, for its own helpers.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the set has no members (never, once started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s layout.
    pub fn slot(&self, i: usize) -> &Slot {
        &self.members[i].slot
    }

    /// `127.0.0.1:PORT` of member `i`'s client port.
    pub fn endpoint(&self, i: usize) -> String {
        self.slot(i).addr().to_string()
    }

    /// The client URL naming every member.
    pub fn url(&self) -> String {
        let all: Vec<String> = (0..self.len()).map(|i| self.endpoint(i)).collect();
        format!("{}://{}", E::SCHEME, all.join(","))
    }

    /// Whether member `i` is running (not killed).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].process().is_some()
    }

    /// SIGKILL member `i`: a crash, as far as its peers and clients can tell.
    pub fn kill(&self, i: usize) -> TestResult {
        if let Some(mut p) = self.members[i].process().take() {
            p.kill()?;
        }
        Ok(())
    }

    /// SIGSTOP member `i` (a stalled server: connections stay open, nothing
    /// answers).
    pub fn pause(&self, i: usize) -> TestResult {
        self.signal(i, Signal::SIGSTOP)
    }

    /// SIGCONT member `i`.
    pub fn resume(&self, i: usize) -> TestResult {
        self.signal(i, Signal::SIGCONT)
    }

    fn signal(&self, i: usize, signal: Signal) -> TestResult {
        match self.members[i].process().as_ref() {
            Some(p) => p.signal(signal),
            None => Err(format!("{} m{i} is not running", E::NAME).into()),
        }
    }

    /// Starts member `i` again on its ports and directory; returns once it
    /// accepts connections (not necessarily serving: its peers may be down).
    pub fn start_again(&self, i: usize) -> TestResult {
        if self.is_running(i) {
            return Err(format!("{} m{i} is still running", E::NAME).into());
        }
        self.spawn(i)?;
        self.wait_accepting(i)
    }

    /// Deletes the data of member `i`, which must not be running (kill it
    /// first): the next [`start_again`](Self::start_again) starts it
    /// without its data, on its ports and with its identity.
    pub fn wipe(&self, i: usize) -> TestResult {
        if self.is_running(i) {
            return Err(format!("{} m{i} is still running", E::NAME).into());
        }
        self.engine.wipe(self.slot(i))
    }

    /// The member that leads now, asking the running members in turn;
    /// `None` while there is none (an election, or a majority down).
    pub fn leader(&self) -> Option<usize> {
        (0..self.len()).find(|&i| self.is_running(i) && self.engine.leads(self.slot(i)))
    }

    /// Stops every member cleanly (SIGTERM), starts them again, and waits
    /// until each serves.
    pub fn restart(&self) -> TestResult {
        for m in &self.members {
            if let Some(mut p) = m.process().take() {
                p.terminate(Duration::from_secs(10))?;
            }
        }
        self.start_all()
    }

    /// The directory of member `i` (its configuration, data and log).
    pub fn dir(&self, i: usize) -> &Path {
        &self.slot(i).dir
    }
}

/// A one-member set serves the conformance suite's URL factory.
pub trait SingleServer: Engine + Sized {
    /// Starts one member.
    fn start_single() -> TestResult<MemberSet<Self>>;

    /// Starts one member whose clean restart keeps every lease (the restart
    /// cases need it); an engine that always persists keeps the default.
    fn start_single_durable() -> TestResult<MemberSet<Self>> {
        Self::start_single()
    }

    /// The URL option bounding each request
    /// ([`UrlServer::REQUEST_TIMEOUT_OPTION`]): `timeout` for every engine
    /// served this way (Redis, etcd, ZooKeeper).
    const REQUEST_TIMEOUT_OPTION: Option<&'static str> = Some("timeout");
}

impl<E: SingleServer> UrlServer for MemberSet<E> {
    fn start_shared() -> TestResult<Self> {
        E::start_single()
    }
    fn start_dedicated() -> TestResult<Self> {
        E::start_single_durable()
    }
    fn url(&self) -> String {
        MemberSet::url(self)
    }
    fn restart_server(&self) -> TestResult {
        self.restart()
    }
    const REQUEST_TIMEOUT_OPTION: Option<&'static str> = E::REQUEST_TIMEOUT_OPTION;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::servers::redis::Redis;

    /// A real `redis-server` that, while `failing`, gets an argument it
    /// rejects at once: a member that exits before it serves, as one
    /// whose port was taken does.
    #[derive(Debug)]
    struct Flaky {
        redis: Redis,
        failing: bool,
    }

    impl Engine for Flaky {
        const NAME: &'static str = "redis-server";
        const SCHEME: &'static str = "redis";
        const START_TIMEOUT: Duration = Duration::from_secs(20);

        fn command(&self, slot: &Slot) -> Command {
            let mut command = self.redis.command(slot);
            if self.failing {
                command.args(["--no-such-directive", "yes"]);
            }
            command
        }

        fn serves(&self, slot: &Slot) -> bool {
            self.redis.serves(slot)
        }

        fn leads(&self, slot: &Slot) -> bool {
            self.redis.leads(slot)
        }
    }

    #[test]
    fn a_set_whose_member_exits_at_start_is_laid_out_again() -> TestResult {
        let mut layouts = 0;
        let set = MemberSet::start_with(2, |_| {
            layouts += 1;
            Ok(Flaky {
                redis: Redis::new(false)?,
                failing: layouts == 1,
            })
        })?;
        assert_eq!(layouts, 2, "the set was not laid out again");
        assert!((0..set.len()).all(|i| set.engine().serves(set.slot(i))));
        Ok(())
    }

    #[test]
    fn a_member_that_always_exits_fails_with_what_it_logged() {
        let mut layouts = 0;
        let result = MemberSet::start_with(1, |_| {
            layouts += 1;
            Ok(Flaky {
                redis: Redis::new(false)?,
                failing: true,
            })
        });
        let Err(e) = result else {
            panic!("a server that cannot start was reported started");
        };
        assert_eq!(layouts, START_ATTEMPTS);
        let message = e.to_string();
        assert!(
            message.contains("exited before accepting connections")
                && message.contains("no-such-directive"),
            "the error does not say why: {message}"
        );
    }
}
