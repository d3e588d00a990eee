//! Finding, running and watching peer programs.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::PeerError;

/// Directories searched after `PATH`: daemons such as `tgtd` live in
/// `/usr/sbin`, which is not on every user's `PATH`.
const EXTRA_DIRS: &[&str] = &["/usr/sbin", "/sbin", "/usr/local/sbin"];

/// Finds `program` on `PATH` (then `/usr/sbin`, `/sbin`, `/usr/local/sbin`).
///
/// # Errors
/// [`PeerError::MissingProgram`] naming the Debian `package` that ships it.
pub fn find_program(program: &str, package: &str) -> Result<PathBuf, PeerError> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .into_iter()
        .chain(EXTRA_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| PeerError::MissingProgram {
            program: program.to_owned(),
            package: package.to_owned(),
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Renders a command line for messages and records (arguments with spaces
/// quoted).
pub(crate) fn display_command(program: &Path, args: &[impl AsRef<OsStr>]) -> String {
    let mut out = program.display().to_string();
    for arg in args {
        let arg = arg.as_ref().to_string_lossy();
        out.push(' ');
        if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || c == '\'') {
            out.push('\'');
            out.push_str(&arg.replace('\'', r"'\''"));
            out.push('\'');
        } else {
            out.push_str(&arg);
        }
    }
    out
}

/// Runs a short command to completion and returns its stdout; a non-zero exit
/// is [`PeerError::CommandFailed`] with everything it printed.
pub(crate) fn run_checked(command: &mut Command, shown: &str) -> Result<String, PeerError> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|source| PeerError::Spawn {
            program: shown.to_owned(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(PeerError::CommandFailed {
            command: shown.to_owned(),
            status: output.status,
            output: format!("{stdout}{stderr}"),
        })
    }
}

/// What a program printed before it ended (or was killed).
#[derive(Debug)]
pub(crate) struct Finished {
    /// How it ended; `None` when it ran past its limit and was killed.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a child to completion with a time limit, collecting stdout and stderr
/// on threads so neither pipe can fill up and stall it.
pub(crate) fn run_with_limit(
    command: &mut Command,
    shown: &str,
    limit: Duration,
) -> Result<Finished, PeerError> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| PeerError::Spawn {
            program: shown.to_owned(),
            source,
        })?;
    let stdout = child.stdout.take().map(read_on_thread);
    let stderr = child.stderr.take().map(read_on_thread);
    let status = wait_until(&mut child, limit).map_err(|e| PeerError::io(shown, e))?;
    if status.is_none() {
        // Past the limit: kill it; the reader threads then see end-of-file.
        let _ = child.kill();
        let _ = child.wait();
    }
    let join =
        |h: Option<thread::JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
    Ok(Finished {
        status,
        stdout: join(stdout),
        stderr: join(stderr),
    })
}

fn read_on_thread<R: Read + Send + 'static>(mut reader: R) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = reader.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Waits for `child` to exit, at most `limit`. `Ok(None)` means it is still
/// running.
pub(crate) fn wait_until(
    child: &mut Child,
    limit: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The last `max_lines` lines of a text (for error messages).
pub(crate) fn tail(text: &str, max_lines: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(max_lines);
    lines.get(start..).unwrap_or_default().join("\n")
}

/// The last `max_lines` lines of a log file, or a note that it is unreadable.
pub(crate) fn log_tail(path: &Path, max_lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), max_lines),
        Err(e) => format!("(log {} unreadable: {e})", path.display()),
    }
}

/// A daemon child that is killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub(crate) struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// `Some(status)` if the child has already exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.0.try_wait().ok().flatten()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn missing_program_names_its_package() {
        let err = find_program("no-such-program-unifab-xyz", "some-debian-pkg")
            .expect_err("program must not exist");
        let text = err.to_string();
        assert!(text.contains("no-such-program-unifab-xyz"), "{text}");
        assert!(text.contains("some-debian-pkg"), "{text}");
    }

    #[test]
    fn finds_a_program_on_path() {
        let sh = find_program("sh", "dash").expect("sh is on every Debian machine");
        assert!(sh.ends_with("sh"));
    }

    #[test]
    fn display_quotes_awkward_arguments() {
        let shown = display_command(Path::new("/bin/x"), &["-a", "two words", "it's", ""]);
        assert_eq!(shown, r"/bin/x -a 'two words' 'it'\''s' ''");
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc\nd", 2), "c\nd");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 5), "");
    }

    #[test]
    fn run_with_limit_kills_a_hung_child() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; exec sleep 30"]);
        let done = run_with_limit(&mut cmd, "sh", Duration::from_millis(300)).expect("spawn");
        assert!(done.status.is_none(), "must report the time-out");
        assert_eq!(done.stdout, "started\n");
    }

    #[test]
    fn run_checked_reports_failure_output() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let err = run_checked(&mut cmd, "sh -c ...").expect_err("exit 3 is a failure");
        let text = err.to_string();
        assert!(text.contains("out") && text.contains("err"), "{text}");
    }
}
