//! A real headless Chromium for tests of web pages (the dashboard of
//! `fencelock serve`), driven over WebDriver by `chromedriver`.
//!
//! Debian's `chromium` and `chromium-driver` come from one source package,
//! so the driver always speaks the browser's protocol version. The browser
//! runs with a temporary profile, no extensions, no background network
//! services, and `--no-sandbox` only when the test runs as root (where
//! Chromium refuses to start with its sandbox). A missing binary is an error
//! naming its package, never a skip.
//!
//! Waiting is done by [`Browser::wait_for`], which evaluates a script in the
//! page until it returns something truthy, within a deadline: tests wait for
//! what the page shows, never for a fixed time.

use std::{
    future::Future,
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use fantoccini::{
    elements::Element,
    error::{CmdError, ErrorStatus},
    Client, ClientBuilder, Locator,
};
use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::{
    servers::{find_binary, running_as_root, ChildProcess},
    TestResult,
};

/// How long chromedriver may take to say which port it listens on.
const DRIVER_START: Duration = Duration::from_secs(30);
/// How often [`Browser::wait_for`] asks the page again.
const POLL: Duration = Duration::from_millis(50);

/// A headless Chromium session; the browser and its driver end when this is
/// dropped (or, cleanly, with [`Browser::close`]).
pub struct Browser {
    client: Client,
    // Dropped after the client, in field order: the browser's processes, the
    // driver's, then the profile directory they used.
    _group: ProcessGroup,
    _driver: ChildProcess,
    _profile: TempDir,
}

impl Browser {
    /// Starts `chromedriver` on a free loopback port and a headless Chromium
    /// session through it, with a window of `width` × `height` CSS pixels.
    pub async fn launch(width: u32, height: u32) -> TestResult<Self> {
        let chromium = find_binary("chromium", &["/usr/lib/chromium"], "chromium")?;
        let chromedriver = find_binary("chromedriver", &["/usr/lib/chromium"], "chromium-driver")?;
        let profile = tempfile::tempdir()?;

        // `--port=0` lets the OS choose; the driver prints what it got, so no
        // other process can take the port between choosing and binding.
        // Its own process group, so that dropping the session kills the
        // browser's processes too: ending the WebDriver session does not
        // always outlive a failed test, and a killed driver leaves Chromium
        // running.
        let mut child = Command::new(&chromedriver)
            .arg("--port=0")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", chromedriver.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or("chromedriver's stdout was not captured")?;
        let group = ProcessGroup(Pid::from_raw(i32::try_from(child.id())?));
        let mut driver = ChildProcess::new("chromedriver", child);
        let (port_tx, port_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut announced = false;
            // Read to the end, so that the driver never blocks on a full pipe.
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !announced {
                    if let Some(port) = started_port(&line) {
                        announced = true;
                        let _ = port_tx.send(port);
                    }
                }
            }
        });
        let port = match port_rx.recv_timeout(DRIVER_START) {
            Ok(port) => port,
            Err(_) => {
                let running = driver.is_running()?;
                return Err(format!(
                    "chromedriver did not announce its port within {DRIVER_START:?} (running: {running})"
                )
                .into());
            }
        };

        let mut args = vec![
            "--headless".to_owned(),
            format!("--user-data-dir={}", profile.path().display()),
            format!("--window-size={width},{height}"),
            "--disable-gpu".to_owned(),
            // Containers often have a tiny /dev/shm.
            "--disable-dev-shm-usage".to_owned(),
            "--no-first-run".to_owned(),
            "--no-default-browser-check".to_owned(),
            "--disable-extensions".to_owned(),
            // Tests talk to loopback only: no update checks, sync or
            // safe-browsing lists.
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
        ];
        if running_as_root() {
            args.push("--no-sandbox".to_owned());
        }
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": args,
            },
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            return Err("capabilities are a JSON object".into());
        };
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .map_err(|e| format!("chromedriver could not start {}: {e}", chromium.display()))?;
        Ok(Self {
            client,
            _group: group,
            _driver: driver,
            _profile: profile,
        })
    }

    /// The WebDriver client, for navigation, clicks, dialogs and screenshots.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Evaluates `script` (the body of a function receiving `args` as
    /// `arguments`) in the page until it returns a truthy value, which is
    /// returned; fails after `timeout` naming `what` and the last value seen.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        script: &str,
        args: Vec<Value>,
    ) -> TestResult<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.client.execute(script, args.clone()).await?;
            if truthy(&value) {
                return Ok(value);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "timed out after {timeout:?} waiting for {what} (last: {value})"
                )
                .into());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Finds the element `css` selects and runs `act` on it, finding it again
    /// while the page answers that it is stale (the page re-rendered it
    /// between the find and the act: a table row redrawn by a renewal's
    /// event, a `<select>`'s options rebuilt), up to `timeout`.
    ///
    /// A fixed handle is a race with the page's own rendering, which no wait
    /// for what the page shows can close; finding it again is the fix
    /// WebDriver's specification gives for a stale element.
    pub async fn on_element<T, F, Fut>(
        &self,
        css: &str,
        timeout: Duration,
        mut act: F,
    ) -> TestResult<T>
    where
        F: FnMut(Element) -> Fut,
        Fut: Future<Output = Result<T, CmdError>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let tried = match self.client.find(Locator::Css(css)).await {
                Ok(element) => act(element).await,
                Err(e) => Err(e),
            };
            match tried {
                Ok(value) => return Ok(value),
                Err(CmdError::Standard(e))
                    if e.error == ErrorStatus::StaleElementReference
                        && Instant::now() < deadline => {}
                Err(e) => return Err(format!("{css}: {e}").into()),
            }
        }
    }

    /// Accepts the `confirm()`/`alert()` dialog the page opens, waiting for it
    /// up to `timeout`; returns its text.
    pub async fn accept_dialog(&self, timeout: Duration) -> TestResult<String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.client.get_alert_text().await {
                Ok(text) => {
                    self.client.accept_alert().await?;
                    return Ok(text);
                }
                Err(CmdError::Standard(e))
                    if e.error == ErrorStatus::NoSuchAlert && Instant::now() < deadline =>
                {
                    tokio::time::sleep(POLL).await;
                }
                Err(e) => return Err(format!("no dialog to accept: {e}").into()),
            }
        }
    }

    /// Ends the WebDriver session (the browser quits), then the driver.
    pub async fn close(self) -> TestResult {
        self.client.clone().close().await?;
        Ok(())
    }
}

/// The process group of the driver and every browser process it started,
/// killed on drop (also when the launch fails half-way).
struct ProcessGroup(Pid);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // The group may be gone already; the driver is reaped by its handle.
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

/// The port in chromedriver's "ChromeDriver was started successfully on port
/// 12345." line.
fn started_port(line: &str) -> Option<u16> {
    let rest = line.split("started successfully on port ").nth(1)?;
    rest.trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()
}

fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_port_chromedriver_announces() {
        assert_eq!(
            started_port("ChromeDriver was started successfully on port 32921."),
            Some(32921)
        );
        assert_eq!(started_port("Only local connections are allowed."), None);
    }

    #[test]
    fn truthiness_follows_javascript() {
        assert!(!truthy(&json!(null)));
        assert!(!truthy(&json!(false)));
        assert!(!truthy(&json!(0)));
        assert!(!truthy(&json!("")));
        assert!(truthy(&json!([])));
        assert!(truthy(&json!("x")));
        assert!(truthy(&json!(2)));
    }
}
