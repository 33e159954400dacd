//! The topology file: sites, the latency between each two of them, and
//! where the backend's members and the clients stand.
//!
//! ```toml
//! sites = ["east", "west", "north"]
//! # Member i of the backend stands in members[i]: one Redlock node, etcd
//! # or ZooKeeper member per site. A one-server engine takes the first.
//! members = ["east", "west", "north"]
//! # Where clients stand; `bench` measures from each [default: every site].
//! clients = ["east", "west"]
//! # Which members an etcd or ZooKeeper client lists: "all", nearest first
//! # [default]; "nearest": all, nearest first, the client sending every
//! # request to the first that answers (`balance=first`); or "site":
//! # those of its own site (all, if none stand there), as behind a
//! # per-site proxy.
//! client_endpoints = "all"
//! # Options every client's URL carries, as the engine's URL takes them
//! # (for example "layout=etcd"); none by default.
//! client_options = "timeout=3s"
//!
//! # Every two sites need a link: the one-way delay (from the first site
//! # to the second; `one_way_back` the other way, if it differs), and an
//! # optional jitter (a uniform random extra per chunk, order kept) and
//! # loss (the share of chunks that arrive a TCP resend late).
//! [[link]]
//! between = ["east", "west"]
//! one_way = "30ms"
//! one_way_back = "45ms"
//! jitter = "2ms"
//! loss = "0.5%"
//! ```

use std::time::Duration;

use serde::Deserialize;

/// The most sites a topology may name (a typo guard: each pair of sites is
/// a link, and each cross-site link a proxy per member and client site).
const MAX_SITES: usize = 16;
/// The most members a topology may place.
const MAX_MEMBERS: usize = 9;
/// The longest one-way delay a link may have.
const MAX_DELAY: Duration = Duration::from_secs(10);
/// The most loss a link may have: past it, TCP itself would hardly carry
/// a request.
const MAX_LOSS_PPM: u32 = 200_000;

/// One direction of a link: every chunk is delayed by `one_way` plus a
/// uniform random extra of up to `jitter`, and a share `loss` of them by
/// a TCP resend more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delay {
    /// The fixed part.
    pub one_way: Duration,
    /// The most a chunk is delayed beyond `one_way`.
    pub jitter: Duration,
    /// The share of chunks lost, in parts per million.
    pub loss_ppm: u32,
}

impl Delay {
    /// Whether the link adds nothing (two places in one site).
    pub fn is_zero(self) -> bool {
        self.one_way.is_zero() && self.jitter.is_zero() && self.loss_ppm == 0
    }

    /// The share of chunks lost, from 0 to 1.
    pub fn loss(self) -> f64 {
        f64::from(self.loss_ppm) / 1e6
    }
}

/// Which members a client of a member-linked engine (etcd, ZooKeeper)
/// lists in its URL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientEndpoints {
    /// Every member, the nearest first.
    #[default]
    All,
    /// Every member, the nearest first, the client sending every request
    /// to the first that answers (etcd and ZooKeeper: `balance=first`).
    Nearest,
    /// The members of the client's own site (every member, if none stands
    /// there): each request then reaches the others only through the
    /// members' own links.
    Site,
}

/// A parsed and checked topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    sites: Vec<String>,
    /// `delays[a][b]`: from site `a` to site `b` (zero on the diagonal).
    delays: Vec<Vec<Delay>>,
    /// The site of each member.
    members: Vec<usize>,
    /// The sites clients stand in.
    clients: Vec<usize>,
    client_endpoints: ClientEndpoints,
    client_options: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopologyFile {
    sites: Vec<String>,
    members: Vec<String>,
    #[serde(default)]
    clients: Option<Vec<String>>,
    #[serde(default)]
    client_endpoints: ClientEndpoints,
    #[serde(default)]
    client_options: Option<String>,
    #[serde(default, rename = "link")]
    links: Vec<LinkFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkFile {
    between: [String; 2],
    one_way: String,
    #[serde(default)]
    one_way_back: Option<String>,
    #[serde(default)]
    jitter: Option<String>,
    #[serde(default)]
    loss: Option<String>,
}

impl Topology {
    /// Parses a topology file's text; the error says what is wrong, and
    /// where.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TopologyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.sites.is_empty() || file.sites.len() > MAX_SITES {
            return Err(format!("`sites` must name 1 to {MAX_SITES} sites"));
        }
        for (i, name) in file.sites.iter().enumerate() {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                return Err(format!(
                    "site {name:?}: a site's name is letters, digits and `-`"
                ));
            }
            if file.sites[..i].contains(name) {
                return Err(format!("site {name:?} is named twice"));
            }
        }
        let site = |name: &str, what: &str| {
            file.sites
                .iter()
                .position(|s| s == name)
                .ok_or_else(|| format!("{what}: {name:?} is not one of `sites`"))
        };
        let n = file.sites.len();
        let mut delays = vec![vec![None; n]; n];
        for (a, row) in delays.iter_mut().enumerate() {
            row[a] = Some(Delay::default());
        }
        for link in &file.links {
            let [a, b] = &link.between;
            let (i, j) = (site(a, "link")?, site(b, "link")?);
            if i == j {
                return Err(format!("link {a:?}–{b:?}: a link joins two sites"));
            }
            if delays[i][j].is_some() {
                return Err(format!("link {a:?}–{b:?} is given twice"));
            }
            let duration = |what: &str, text: &str| {
                let d = fencelock::parse_duration(text)
                    .map_err(|e| format!("link {a:?}–{b:?}: {what}: {e}"))?;
                if d > MAX_DELAY {
                    return Err(format!(
                        "link {a:?}–{b:?}: {what} {text} is above {MAX_DELAY:?}"
                    ));
                }
                Ok(d)
            };
            let jitter = link
                .jitter
                .as_deref()
                .map_or(Ok(Duration::ZERO), |j| duration("jitter", j))?;
            let loss_ppm = link.loss.as_deref().map_or(Ok(0), |l| {
                parts_per_million(l).map_err(|e| format!("link {a:?}–{b:?}: loss: {e}"))
            })?;
            let there = Delay {
                one_way: duration("one_way", &link.one_way)?,
                jitter,
                loss_ppm,
            };
            let back = match &link.one_way_back {
                Some(back) => Delay {
                    one_way: duration("one_way_back", back)?,
                    ..there
                },
                None => there,
            };
            delays[i][j] = Some(there);
            delays[j][i] = Some(back);
        }
        let delays = delays
            .into_iter()
            .enumerate()
            .map(|(a, row)| {
                row.into_iter()
                    .enumerate()
                    .map(|(b, d)| {
                        d.ok_or_else(|| {
                            format!(
                                "no link between {:?} and {:?}: every two sites need one",
                                file.sites[a], file.sites[b]
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        if file.members.is_empty() || file.members.len() > MAX_MEMBERS {
            return Err(format!("`members` must place 1 to {MAX_MEMBERS} members"));
        }
        let members = file
            .members
            .iter()
            .map(|m| site(m, "members"))
            .collect::<Result<Vec<_>, _>>()?;
        let clients = match &file.clients {
            None => (0..n).collect(),
            Some(c) if c.is_empty() => return Err("`clients` names no site".into()),
            Some(c) => {
                let mut clients = Vec::with_capacity(c.len());
                for name in c {
                    let s = site(name, "clients")?;
                    if clients.contains(&s) {
                        return Err(format!("clients: {name:?} is named twice"));
                    }
                    clients.push(s);
                }
                clients
            }
        };
        if let Some(options) = &file.client_options {
            check_options(options)?;
        }
        Ok(Self {
            sites: file.sites,
            delays,
            members,
            clients,
            client_endpoints: file.client_endpoints,
            client_options: file.client_options,
        })
    }

    /// The sites' names, in the file's order; a site is its index here.
    pub fn sites(&self) -> &[String] {
        &self.sites
    }

    /// The site named `name`.
    pub fn site(&self, name: &str) -> Option<usize> {
        self.sites.iter().position(|s| s == name)
    }

    /// The delay from site `a` to site `b`.
    pub fn delay(&self, a: usize, b: usize) -> Delay {
        self.delays[a][b]
    }

    /// The link from site `a` to site `b`: the way there, and back.
    pub fn link(&self, a: usize, b: usize) -> (Delay, Delay) {
        (self.delays[a][b], self.delays[b][a])
    }

    /// The round trip from site `a` to site `b` and back, without jitter
    /// or loss.
    pub fn rtt(&self, a: usize, b: usize) -> Duration {
        self.delays[a][b].one_way + self.delays[b][a].one_way
    }

    /// The longest round trip between two sites, without jitter or loss.
    pub fn longest_rtt(&self) -> Duration {
        let n = self.sites.len();
        (0..n)
            .flat_map(|a| (0..n).map(move |b| (a, b)))
            .map(|(a, b)| self.rtt(a, b))
            .max()
            .unwrap_or_default()
    }

    /// The site of each member, in member order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// The sites clients stand in.
    pub fn clients(&self) -> &[usize] {
        &self.clients
    }

    /// Which members a client lists.
    pub fn client_endpoints(&self) -> ClientEndpoints {
        self.client_endpoints
    }

    /// The options every client's URL carries (`a=1&b=2`), if any.
    pub fn client_options(&self) -> Option<&str> {
        self.client_options.as_deref()
    }

    /// The round trip from `site` to the nearest majority of members
    /// standing in the sites `placed` (one member: to it), without jitter:
    /// the physical floor of one operation that needs a majority's answer.
    pub fn nearest_majority_rtt(&self, site: usize, placed: &[usize]) -> Duration {
        let mut rtts: Vec<Duration> = placed.iter().map(|&m| self.rtt(site, m)).collect();
        rtts.sort();
        rtts.get(rtts.len() / 2).copied().unwrap_or_default()
    }

    /// The one delay to put in front of member `m` for the traffic to it
    /// that no router can attribute to a peer (see [`PeerLink`]): the
    /// mean of its one-way delays (and losses) to the other members.
    ///
    /// [`PeerLink`]: fencelock_testkit::servers::members::PeerLink
    pub fn member_ingress(&self, m: usize) -> Delay {
        let others: Vec<Delay> = (0..self.members.len())
            .filter(|&o| o != m)
            .map(|o| self.delay(self.members[m], self.members[o]))
            .collect();
        if others.is_empty() {
            return Delay::default();
        }
        let count = u32::try_from(others.len()).unwrap_or(u32::MAX);
        Delay {
            one_way: others.iter().map(|d| d.one_way).sum::<Duration>() / count,
            jitter: others.iter().map(|d| d.jitter).sum::<Duration>() / count,
            loss_ppm: others.iter().map(|d| d.loss_ppm).sum::<u32>() / count,
        }
    }
}

/// `client_options` is a URL's query: `name=value` pairs joined by `&`,
/// without the `?` (the lab adds it) and without spaces.
fn check_options(options: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("client_options {options:?}: {why}"));
    if options.contains(['?', '#']) || options.chars().any(char::is_whitespace) {
        return bad("a URL's query, `name=value` pairs joined by `&`, without `?`, `#` or spaces");
    }
    for pair in options.split('&') {
        match pair.split_once('=') {
            Some((name, _)) if !name.is_empty() => {}
            _ => return bad(&format!("{pair:?} is not `name=value`")),
        }
    }
    Ok(())
}

/// `"0.5%"` as 5,000 parts per million; at most [`MAX_LOSS_PPM`].
fn parts_per_million(text: &str) -> Result<u32, String> {
    let percent: f64 = text
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse().ok())
        .filter(|p: &f64| p.is_finite() && *p >= 0.0)
        .ok_or_else(|| format!("{text:?} is not a percentage such as \"0.5%\""))?;
    let ppm = (percent * 10_000.0).round();
    if ppm > f64::from(MAX_LOSS_PPM) {
        return Err(format!("{text} is above {}%", MAX_LOSS_PPM / 10_000));
    }
    // In range: checked just above.
    Ok(ppm as u32)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const THREE: &str = r#"
        sites = ["east", "west", "north"]
        members = ["east", "west", "north"]
        clients = ["west"]
        [[link]]
        between = ["east", "west"]
        one_way = "30ms"
        jitter = "2ms"
        [[link]]
        between = ["north", "east"]
        one_way = "80ms"
        [[link]]
        between = ["west", "north"]
        one_way = "150ms"
    "#;

    #[test]
    fn a_topology_reads_its_sites_links_and_places() {
        let t = Topology::parse(THREE).unwrap();
        assert_eq!(t.sites(), ["east", "west", "north"]);
        assert_eq!(t.clients(), [1]);
        let ms = Duration::from_millis;
        assert_eq!(t.delay(0, 1), t.delay(1, 0));
        assert_eq!(t.delay(1, 0).jitter, ms(2));
        assert_eq!(t.delay(2, 0).one_way, ms(80));
        assert!(t.delay(2, 2).is_zero());
        let all = t.members().to_vec();
        // From west: itself 0, east 60, north 300: the majority is 2.
        assert_eq!(t.nearest_majority_rtt(1, &all), ms(60));
        // From north: 0, 160, 300.
        assert_eq!(t.nearest_majority_rtt(2, &all), ms(160));
        // One server in east, from north.
        assert_eq!(t.nearest_majority_rtt(2, &all[..1]), ms(160));
        // east's member: the mean of 30 and 80.
        assert_eq!(t.member_ingress(0).one_way, ms(55));
    }

    #[test]
    fn a_link_may_differ_each_way_and_lose_chunks() {
        let t = Topology::parse(&THREE.replace(
            r#"one_way = "80ms""#,
            "one_way = \"80ms\"\none_way_back = \"20ms\"\nloss = \"0.5%\"",
        ))
        .unwrap();
        let ms = Duration::from_millis;
        // The link is given north first: north to east takes 80 ms.
        assert_eq!(t.delay(2, 0).one_way, ms(80));
        assert_eq!(t.delay(0, 2).one_way, ms(20));
        assert_eq!(t.rtt(0, 2), ms(100));
        assert_eq!(t.rtt(2, 0), ms(100));
        assert_eq!(t.delay(2, 0).loss_ppm, 5_000);
        assert_eq!(t.delay(0, 2).loss_ppm, 5_000);
        assert!((t.delay(0, 2).loss() - 0.005).abs() < 1e-12);
        assert_eq!(t.delay(0, 1).loss_ppm, 0);
        // From north: 0, east 100, west 300.
        assert_eq!(t.nearest_majority_rtt(2, t.members()), ms(100));
        assert_eq!(t.longest_rtt(), ms(300));
    }

    #[test]
    fn every_shipped_topology_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies");
        let mut parsed = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            if let Err(e) = Topology::parse(&text) {
                panic!("{}: {e}", path.display());
            }
            parsed += 1;
        }
        assert!(parsed >= 6, "{parsed} topologies");
    }

    #[test]
    fn client_options_are_a_query_without_its_question_mark() {
        assert_eq!(Topology::parse(THREE).unwrap().client_options(), None);
        let given = format!("client_options = \"layout=etcd&timeout=3s\"\n{THREE}");
        let t = Topology::parse(&given).unwrap();
        assert_eq!(t.client_options(), Some("layout=etcd&timeout=3s"));
        for bad in [
            "?layout=etcd",
            "layout",
            "=etcd",
            "a=1&&b=2",
            "a=1 b",
            "a=1#x",
            "",
        ] {
            let text = format!("client_options = {bad:?}\n{THREE}");
            let e = Topology::parse(&text).unwrap_err();
            assert!(e.contains("client_options"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn clients_default_to_every_site_and_every_member() {
        let t = Topology::parse(&THREE.replace(r#"clients = ["west"]"#, "")).unwrap();
        assert_eq!(t.clients(), [0, 1, 2]);
        assert_eq!(t.client_endpoints(), ClientEndpoints::All);
        let site = format!("client_endpoints = \"site\"\n{THREE}");
        let t = Topology::parse(&site).unwrap();
        assert_eq!(t.client_endpoints(), ClientEndpoints::Site);
        let nearest = format!("client_endpoints = \"nearest\"\n{THREE}");
        let t = Topology::parse(&nearest).unwrap();
        assert_eq!(t.client_endpoints(), ClientEndpoints::Nearest);
        let bad = format!("client_endpoints = \"near\"\n{THREE}");
        assert!(Topology::parse(&bad)
            .unwrap_err()
            .contains("unknown variant"));
    }

    #[test]
    fn a_bad_topology_says_what_is_wrong() {
        let cases = [
            (
                THREE.replace(
                    "[[link]]\n        between = [\"west\", \"north\"]",
                    "[[x]]\n        y = [\"west\", \"north\"]",
                ),
                "unknown field",
            ),
            (
                THREE.replace(r#"one_way = "150ms""#, ""),
                "missing field `one_way`",
            ),
            (
                THREE.replace(r#"["north", "east"]"#, r#"["west", "east"]"#),
                "given twice",
            ),
            (
                THREE.replace(r#"["north", "east"]"#, r#"["north", "north"]"#),
                "joins two sites",
            ),
            (
                THREE.replace(r#"["north", "east"]"#, r#"["north", "south"]"#),
                "\"south\" is not one of `sites`",
            ),
            (
                THREE.replace(r#"one_way = "80ms""#, r#"one_way = "-1ms""#),
                "one_way",
            ),
            (
                THREE.replace(r#"one_way = "80ms""#, r#"one_way = "11s""#),
                "above",
            ),
            (
                THREE.replace(r#"one_way = "80ms""#, "one_way = \"80ms\"\nloss = \"1\""),
                "not a percentage",
            ),
            (
                THREE.replace(r#"one_way = "80ms""#, "one_way = \"80ms\"\nloss = \"-1%\""),
                "not a percentage",
            ),
            (
                THREE.replace(r#"one_way = "80ms""#, "one_way = \"80ms\"\nloss = \"30%\""),
                "above 20%",
            ),
            (
                THREE.replace(
                    r#"one_way = "80ms""#,
                    "one_way = \"80ms\"\none_way_back = \"x\"",
                ),
                "one_way_back",
            ),
            (
                THREE.replace(r#"clients = ["west"]"#, "clients = []"),
                "names no site",
            ),
            (
                THREE.replace(r#"members = ["east", "west", "north"]"#, "members = []"),
                "1 to 9",
            ),
            (
                THREE.replace(
                    r#"sites = ["east", "west", "north"]"#,
                    r#"sites = ["east", "west", "north", "south"]"#,
                ),
                "no link between \"east\" and \"south\"",
            ),
            (
                THREE.replace(
                    r#""north"]
        members"#,
                    r#""east"]
        members"#,
                ),
                "named twice",
            ),
            (
                THREE.replace(r#"sites = ["east""#, r#"sites = ["e st""#),
                "letters, digits",
            ),
        ];
        for (text, expected) in cases {
            let err = Topology::parse(&text).unwrap_err();
            assert!(err.contains(expected), "{expected:?} not in {err:?}");
        }
    }
}
