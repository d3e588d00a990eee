//! A child process's output, line by line, with bounded waits.
//!
//! Reading a pipe blocks until the child writes or exits; a child that
//! hangs before printing what a test waits for (its portal, "ready") would
//! hang the test with it, deadline checks between lines notwithstanding.
//! A thread reads the lines into a channel instead, and a wait for one
//! gives up at its limit.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Lines of a child's output (its stdout or stderr), read on a thread.
#[derive(Debug)]
pub struct Lines {
    rx: Receiver<String>,
}

/// Why [`Lines::wait_for`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinesError {
    /// No matching line within the limit.
    TimedOut(Duration),
    /// The output ended (the child exited or closed it) first.
    Ended,
}

impl fmt::Display for LinesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinesError::TimedOut(d) => write!(f, "no such line within {d:?}"),
            LinesError::Ended => f.write_str("the output ended first"),
        }
    }
}

impl std::error::Error for LinesError {}

impl Lines {
    /// Starts reading `output` (a child's piped stdout or stderr).
    pub fn new(output: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(output).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines { rx }
    }

    /// The first line (from here on) for which `f` gives `Some`, within
    /// `limit`.
    pub fn wait_for<T>(
        &mut self,
        limit: Duration,
        mut f: impl FnMut(&str) -> Option<T>,
    ) -> Result<T, LinesError> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(t) = f(&line) {
                        return Ok(t);
                    }
                }
                Err(RecvTimeoutError::Timeout) => return Err(LinesError::TimedOut(limit)),
                Err(RecvTimeoutError::Disconnected) => return Err(LinesError::Ended),
            }
        }
    }

    /// Discards the rest of the output as it comes (the child never blocks
    /// on a full pipe).
    pub fn drain(self) {
        std::thread::spawn(move || for _ in self.rx {});
    }
}

/// The target and portal of a gateway's line `iSCSI target IQN on ADDR`.
pub fn portal(line: &str) -> Option<(String, std::net::SocketAddr)> {
    let (iqn, addr) = line.strip_prefix("iSCSI target ")?.split_once(" on ")?;
    Some((iqn.to_owned(), addr.trim().parse().ok()?))
}

/// Waits up to `limit` for a gateway's piped stdout to name its portal
/// (`iSCSI target IQN on ADDR`), then drains the rest of it. On failure
/// the child is killed, and the error says why and how it ended.
pub fn child_portal(
    child: &mut std::process::Child,
    limit: Duration,
) -> Result<(String, std::net::SocketAddr), String> {
    let stdout = child
        .stdout
        .take()
        .ok_or("the child's stdout is not piped, or already taken")?;
    let mut lines = Lines::new(stdout);
    match lines.wait_for(limit, portal) {
        Ok(p) => {
            lines.drain();
            Ok(p)
        }
        Err(e) => {
            let _ = child.kill();
            Err(format!("{e} ({:?})", child.wait()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_at_its_limit_on_silent_output() {
        // A pipe nobody writes to: the read blocks for ever.
        let (r, _w) = std::io::pipe().unwrap();
        let mut lines = Lines::new(r);
        let got = lines.wait_for(Duration::from_millis(200), |_| Some(()));
        assert_eq!(got, Err(LinesError::TimedOut(Duration::from_millis(200))));
    }

    #[test]
    fn lines_before_the_match_are_skipped_and_the_end_is_reported() {
        let text: &[u8] = b"starting\niSCSI target iqn.x:y on 127.0.0.1:3260\nmore\n";
        let mut lines = Lines::new(text);
        let (iqn, addr) = lines
            .wait_for(Duration::from_secs(10), portal)
            .expect("the portal line");
        assert_eq!((iqn.as_str(), addr.port()), ("iqn.x:y", 3260));
        assert_eq!(
            lines.wait_for(Duration::from_secs(10), |l| (l == "never").then_some(())),
            Err(LinesError::Ended)
        );
    }

    #[test]
    fn a_portal_line_needs_an_address() {
        assert_eq!(portal("iSCSI target iqn.x:y on nowhere"), None);
        assert_eq!(portal("FC port up"), None);
    }
}
