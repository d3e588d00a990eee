//! [`IscsiTestCu`]: libiscsi's SCSI/iSCSI conformance suite (`iscsi-test-cu`,
//! Debian package `libiscsi-bin`) run against a target, with per-test results.
//!
//! # How results are read
//!
//! `iscsi-test-cu` is a CUnit program. Its console ("basic", verbose) output
//! is parsed rather than CUnit's XML (`-x`), because a test that finds a
//! feature missing *passes* in CUnit terms (`CU_PASS("[SKIPPED] …")`) and the
//! only trace of the skip is the `[SKIPPED]` line the test logs to the
//! console, which the XML does not carry. The console has, per test:
//!
//! ```text
//! Suite: Read10
//!   Test: Simple ...passed
//!   Test: BeyondEol ...    [FAILED] READ10 successful but should have failed …
//! FAILED
//!     1. test_read10_beyond_eol.c:38  - CU_ASSERT_EQUAL(_r,0)
//!   Test: Unwritten ...    [SKIPPED] Logical unit is fully provisioned. Skipping test
//! passed
//! ```
//!
//! and ends with CUnit's `Run Summary`, whose counts are checked against the
//! parsed tests so that a parser that lost its way is an error, not a wrong
//! answer.
//!
//! A test is [`Outcome::Skipped`] if CUnit says `passed` and the test logged a
//! line starting with `[SKIPPED]` or `[SKIPPING]` (libiscsi's words for "the
//! target lacks this, nothing was checked", or a part of the test was not
//! checked). A handful of libiscsi tests skip silently (e.g. "BlockLimits VPD
//! is not available" with no log line); those read as passed, as CUnit
//! itself counts them.
//!
//! # Options worth knowing (libiscsi 1.19)
//! - `-t FAMILY[.SUITE[.TEST]]` selects tests; families are `ALL` (230 tests:
//!   every SCSI and iSCSI suite), `SCSI`, `iSCSI`, `LINUX`. Without `-t`
//!   *every family* is registered, so tests run several times: always pass it.
//! - `-d`/`--dataloss` allows the tests that write; without it they skip.
//! - `-S`/`--allow-sanitize` allows SANITIZE (erases the LU); without it
//!   the 11 Sanitize tests skip.
//! - `-i`/`-I` name the two initiators; the second one is used by the
//!   reservation tests (a second I_T nexus) and by multipath.
//! - A second URL enables the `MultipathIO` suite (a second session to the
//!   same LU); without it those 4 tests skip.

use std::fmt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use super::process::{display_command, find_program, run_with_limit, tail};
use super::{PeerError, workspace_root};

/// The Debian package that ships `iscsi-test-cu`.
const PACKAGE: &str = "libiscsi-bin";

/// The outcome of one conformance test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Outcome {
    /// Every assertion held and nothing was skipped.
    Passed,
    /// At least one assertion failed, or the test produced no result.
    Failed,
    /// CUnit counted it as passed, but the test reported that it skipped
    /// (the target lacks the feature, or a flag was not given).
    Skipped,
}

impl Outcome {
    /// The word used in result files: `passed`, `FAILED`, `skipped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed => "FAILED",
            Outcome::Skipped => "skipped",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One test's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestResult {
    /// The full name as `iscsi-test-cu -l` prints it: `ALL.Read10.Simple`.
    pub name: String,
    /// What happened.
    pub outcome: Outcome,
    /// What the test logged and CUnit's failure lines (trimmed), one per line.
    pub detail: String,
}

/// CUnit's own `Run Summary` counts for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    /// Tests registered.
    pub total: u32,
    /// Tests run.
    pub ran: u32,
    /// Tests CUnit counts as passed (including skipped ones).
    pub passed: u32,
    /// Tests failed.
    pub failed: u32,
}

/// The result of one `iscsi-test-cu` run.
#[derive(Debug, Clone)]
pub struct SuiteResult {
    /// Every test that ran, in run order.
    pub tests: Vec<TestResult>,
    /// CUnit's summary; `None` if the run did not get that far (crash).
    pub summary: Option<RunSummary>,
    /// The command line that produced it.
    pub command: String,
    /// How the program ended.
    pub status: ExitStatus,
    /// The end of what it printed on stderr.
    pub stderr_tail: String,
    /// Everything it printed on stdout.
    pub stdout: String,
}

impl SuiteResult {
    /// The outcome of the test named `name`, if it ran.
    pub fn outcome(&self, name: &str) -> Option<Outcome> {
        self.tests
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.outcome)
    }

    /// How many tests had `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.tests.iter().filter(|t| t.outcome == outcome).count()
    }

    /// Every FAILED test with what it logged and CUnit's failure lines
    /// (`file.c:NN - assertion`), one block per test; empty when none
    /// failed. [`Self::to_table`] names the tests only; this says why.
    pub fn failures(&self) -> String {
        let mut out = String::new();
        for t in self.tests.iter().filter(|t| t.outcome == Outcome::Failed) {
            out.push_str(&format!("FAILED {}\n", t.name));
            for line in t.detail.lines().filter(|l| !l.trim().is_empty()) {
                out.push_str(&format!("    {}\n", line.trim()));
            }
        }
        out
    }

    /// Whether the run reached CUnit's summary (it did not crash or stop).
    pub fn is_complete(&self) -> bool {
        self.summary.is_some()
    }

    /// The results as a text table, one `outcome name` line per test, headed
    /// by `# ` comment lines with the command and counts (the format of
    /// `conformance/*.txt`).
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "# command: {}\n# {} tests: {} passed, {} failed, {} skipped\n",
            self.command,
            self.tests.len(),
            self.count(Outcome::Passed),
            self.count(Outcome::Failed),
            self.count(Outcome::Skipped),
        );
        if let Some(s) = self.summary {
            out.push_str(&format!(
                "# CUnit summary: {} run, {} passed (skips count as passed), {} failed\n",
                s.ran, s.passed, s.failed
            ));
        }
        for t in &self.tests {
            out.push_str(&format!("{:<8} {}\n", t.outcome.as_str(), t.name));
        }
        out
    }

    /// Writes [`Self::to_table`] to `<target>/conformance/<name>.txt` and the
    /// raw console output to `<name>.console` (target = `CARGO_TARGET_DIR`
    /// or `<workspace>/target`), so every conformance run leaves a record
    /// to read or to copy into `conformance/` as a baseline. Returns the
    /// table's path.
    ///
    /// # Errors
    /// [`PeerError::Io`] if the files cannot be written.
    pub fn record(&self, name: &str) -> Result<PathBuf, PeerError> {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .map(|d| {
                if d.is_absolute() {
                    d
                } else {
                    workspace_root().join(d)
                }
            })
            .unwrap_or_else(|| workspace_root().join("target"));
        let dir = target.join("conformance");
        std::fs::create_dir_all(&dir)
            .map_err(|e| PeerError::io(format!("creating {}", dir.display()), e))?;
        let table = dir.join(format!("{name}.txt"));
        std::fs::write(&table, self.to_table())
            .map_err(|e| PeerError::io(format!("writing {}", table.display()), e))?;
        let console = dir.join(format!("{name}.console"));
        std::fs::write(&console, &self.stdout)
            .map_err(|e| PeerError::io(format!("writing {}", console.display()), e))?;
        Ok(table)
    }
}

/// A configured run of `iscsi-test-cu` against one target.
///
/// ```no_run
/// use unifab_testkit::peers::{IscsiTestCu, Outcome};
/// let result = IscsiTestCu::new("iscsi://127.0.0.1:3260/iqn.2026-11.io.unifab:default/0")
///     .tests("ALL.Read10")
///     .run()?;
/// assert_eq!(result.outcome("ALL.Read10.Simple"), Some(Outcome::Passed));
/// # Ok::<(), unifab_testkit::peers::PeerError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct IscsiTestCu {
    url: String,
    multipath_url: Option<String>,
    tests: String,
    dataloss: bool,
    allow_sanitize: bool,
    initiator_names: Option<(String, String)>,
    timeout: Duration,
}

/// Every test the installed `iscsi-test-cu --list` names in `family`
/// (`ALL`: 230 tests in libiscsi 1.19), as `FAMILY.Suite.Test`.
///
/// # Errors
/// [`PeerError::MissingProgram`] without `libiscsi-bin`; the failure of the
/// command; [`PeerError::Unparsable`] if it names no test of `family`.
pub fn list_tests(family: &str) -> Result<Vec<String>, PeerError> {
    let program = find_program("iscsi-test-cu", PACKAGE)?;
    let shown = display_command(&program, &["--list".to_owned()]);
    let mut command = Command::new(&program);
    command.arg("--list");
    let done = run_with_limit(&mut command, &shown, Duration::from_secs(60))?;
    let prefix = format!("{family}.");
    let names = parse_test_list(&prefix, &done.stdout);
    if names.is_empty() {
        return Err(PeerError::Unparsable {
            command: shown,
            reason: format!("no test of family {family} in its output"),
        });
    }
    Ok(names)
}

/// A `--test` selection of every suite of `family` but `excluded` (suite
/// names without the family, e.g. `"Sanitize"`), registered in the
/// family's own order (`iscsi-test-cu` takes a comma list from its end).
///
/// # Errors
/// As [`list_tests`].
pub fn suites_except(family: &str, excluded: &[&str]) -> Result<String, PeerError> {
    Ok(suite_selection(family, &list_tests(family)?, excluded))
}

fn suite_selection(family: &str, tests: &[String], excluded: &[&str]) -> String {
    let mut suites: Vec<&str> = Vec::new();
    for test in tests {
        let Some((suite, _)) = test.rsplit_once('.') else {
            continue;
        };
        let short = suite.strip_prefix(family).and_then(|s| s.strip_prefix('.'));
        if short.is_some_and(|s| excluded.contains(&s)) || suites.contains(&suite) {
            continue;
        }
        suites.push(suite);
    }
    suites.reverse();
    suites.join(",")
}

/// The `FAMILY.Suite.Test` lines (three parts) of `--list` output.
fn parse_test_list(prefix: &str, stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(prefix) && l.split('.').count() == 3)
        .map(str::to_owned)
        .collect()
}

impl IscsiTestCu {
    /// The full suite against `url` (`iscsi://[user%secret@]host:port/iqn/lun`):
    /// the whole `ALL` family (230 tests in libiscsi 1.19) with `--dataloss`
    /// and `--allow-sanitize` (the LU's data is destroyed), with a 20-minute
    /// limit.
    pub fn new(url: impl Into<String>) -> Self {
        IscsiTestCu {
            url: url.into(),
            multipath_url: None,
            tests: "ALL".to_owned(),
            dataloss: true,
            allow_sanitize: true,
            initiator_names: None,
            timeout: Duration::from_secs(20 * 60),
        }
    }

    /// Selects tests: `FAMILY[.SUITE[.TEST]]`; the family must be spelled
    /// out (no wildcard) because it prefixes every result name. Suite and
    /// test parts may use shell wildcards; several selections may be joined
    /// with commas as long as they share the family.
    pub fn tests(mut self, selection: impl Into<String>) -> Self {
        self.tests = selection.into();
        self
    }

    /// A second URL to the same LU, enabling the `MultipathIO` tests.
    pub fn multipath_url(mut self, url: impl Into<String>) -> Self {
        self.multipath_url = Some(url.into());
        self
    }

    /// Allow or forbid writing tests (`--dataloss`; allowed by default).
    pub fn dataloss(mut self, allow: bool) -> Self {
        self.dataloss = allow;
        self
    }

    /// Allow SANITIZE tests (`--allow-sanitize`; allowed by default).
    pub fn allow_sanitize(mut self, allow: bool) -> Self {
        self.allow_sanitize = allow;
        self
    }

    /// The two initiator names (`-i`, `-I`); libiscsi's defaults otherwise.
    pub fn initiator_names(mut self, first: impl Into<String>, second: impl Into<String>) -> Self {
        self.initiator_names = Some((first.into(), second.into()));
        self
    }

    /// The time limit for the whole run; past it the program is killed and
    /// the run is a [`PeerError::Timeout`].
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = limit;
        self
    }

    fn family(&self) -> Result<&str, PeerError> {
        let families: Vec<&str> = self
            .tests
            .split(',')
            .map(|sel| sel.split('.').next().unwrap_or_default())
            .collect();
        let first = families.first().copied().unwrap_or_default();
        let valid = !first.is_empty()
            && !first.contains(['*', '?', '['])
            && families.iter().all(|f| *f == first);
        if valid {
            Ok(first)
        } else {
            Err(PeerError::Unparsable {
                command: format!("iscsi-test-cu -t {}", self.tests),
                reason: "the test selection must name one family (ALL, SCSI, iSCSI or LINUX) \
                         without wildcards"
                    .to_owned(),
            })
        }
    }

    fn args(&self) -> Vec<String> {
        let mut args = vec!["--test".to_owned(), self.tests.clone()];
        if self.dataloss {
            args.push("--dataloss".to_owned());
        }
        if self.allow_sanitize {
            args.push("--allow-sanitize".to_owned());
        }
        if let Some((first, second)) = &self.initiator_names {
            args.push(format!("--initiator-name={first}"));
            args.push(format!("--initiator-name-2={second}"));
        }
        args.push(self.url.clone());
        if let Some(second) = &self.multipath_url {
            args.push(second.clone());
        }
        args
    }

    /// The command line this run uses (for records such as
    /// `conformance/tgtd-1.0.85.txt`).
    ///
    /// # Errors
    /// [`PeerError::MissingProgram`] if `libiscsi-bin` is not installed.
    pub fn command_line(&self) -> Result<String, PeerError> {
        let program = find_program("iscsi-test-cu", PACKAGE)?;
        Ok(display_command(&program, &self.args()))
    }

    /// Runs the suite and returns every test's outcome.
    ///
    /// A run that ends early (a crash after some tests) is still returned,
    /// with [`SuiteResult::summary`] `None`; the ratchet reports the tests
    /// that never ran.
    ///
    /// # Errors
    /// - [`PeerError::MissingProgram`] if `libiscsi-bin` is not installed;
    /// - [`PeerError::CommandFailed`] if no test ran at all (login failed,
    ///   the target refused the LU, …), with the program's output;
    /// - [`PeerError::Timeout`] past the time limit;
    /// - [`PeerError::Unparsable`] if the output does not add up.
    pub fn run(&self) -> Result<SuiteResult, PeerError> {
        let family = self.family()?.to_owned();
        let program = find_program("iscsi-test-cu", PACKAGE)?;
        let args = self.args();
        let shown = display_command(&program, &args);
        // Line-buffer stdout when coreutils' stdbuf is there, so that a run
        // killed at its time limit still shows which test hung.
        let mut command = match find_program("stdbuf", "coreutils") {
            Ok(stdbuf) => {
                let mut c = Command::new(stdbuf);
                c.arg("-oL").arg(&program);
                c
            }
            Err(_) => Command::new(&program),
        };
        command.args(&args);
        let done = run_with_limit(&mut command, &shown, self.timeout)?;
        let Some(status) = done.status else {
            return Err(PeerError::Timeout {
                command: shown,
                limit: self.timeout,
                output: tail(&format!("{}{}", done.stdout, done.stderr), 60),
            });
        };
        let parsed =
            parse_console(&family, &done.stdout).map_err(|reason| PeerError::Unparsable {
                command: shown.clone(),
                reason,
            })?;
        if parsed.tests.is_empty() {
            return Err(PeerError::CommandFailed {
                command: shown,
                status,
                output: tail(&format!("{}{}", done.stdout, done.stderr), 60),
            });
        }
        Ok(SuiteResult {
            tests: parsed.tests,
            summary: parsed.summary,
            command: shown,
            status,
            stderr_tail: tail(&done.stderr, 40),
            stdout: done.stdout,
        })
    }
}

/// Tests and summary read from `iscsi-test-cu`'s console output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedConsole {
    /// The tests, in run order.
    pub tests: Vec<TestResult>,
    /// CUnit's summary, if present.
    pub summary: Option<RunSummary>,
}

/// A test whose result line has not been seen yet.
struct OpenTest {
    name: String,
    detail: Vec<String>,
    skipped: bool,
}

/// Parses `iscsi-test-cu`'s verbose console output (stdout). `family` is the
/// family the run selected; it prefixes every name (`ALL.Read10.Simple`).
///
/// # Errors
/// A description of what did not fit: a test outside any suite, a summary
/// line that does not parse, or counts that disagree with CUnit's summary.
pub fn parse_console(family: &str, stdout: &str) -> Result<ParsedConsole, String> {
    let mut tests: Vec<TestResult> = Vec::new();
    let mut suite: Option<&str> = None;
    let mut open: Option<OpenTest> = None;
    // Index of the last FAILED test, to attach CUnit's numbered failure lines.
    let mut last_failed: Option<usize> = None;
    let mut lines = stdout.lines();

    let close_unfinished = |open: &mut Option<OpenTest>, tests: &mut Vec<TestResult>| {
        if let Some(t) = open.take() {
            let mut detail = t.detail;
            detail.push("(no passed/FAILED result was printed for this test)".to_owned());
            tests.push(TestResult {
                name: t.name,
                outcome: Outcome::Failed,
                detail: detail.join("\n"),
            });
        }
    };

    let mut summary_seen = false;
    for line in lines.by_ref() {
        if line.starts_with("Run Summary:") {
            close_unfinished(&mut open, &mut tests);
            summary_seen = true;
            break;
        }
        if let Some(name) = line.strip_prefix("Suite: ") {
            close_unfinished(&mut open, &mut tests);
            last_failed = None;
            suite = Some(name.trim());
            continue;
        }
        if let Some(rest) = line.strip_prefix("  Test: ") {
            close_unfinished(&mut open, &mut tests);
            last_failed = None;
            let Some((name, after)) = rest.split_once(" ...") else {
                return Err(format!("a test line without ` ...`: {line:?}"));
            };
            let Some(suite) = suite else {
                return Err(format!("test {name:?} outside any suite"));
            };
            open = Some(OpenTest {
                name: format!("{family}.{suite}.{name}"),
                detail: Vec::new(),
                skipped: false,
            });
            feed(after, &mut open, &mut tests, &mut last_failed);
            continue;
        }
        if open.is_some() {
            feed(line, &mut open, &mut tests, &mut last_failed);
        } else if let Some(index) = last_failed {
            // CUnit's "    1. file.c:NN  - assertion" lines after FAILED.
            if is_failure_record(line)
                && let Some(t) = tests.get_mut(index)
            {
                t.detail.push('\n');
                t.detail.push_str(line.trim());
            }
        }
    }
    if !summary_seen {
        close_unfinished(&mut open, &mut tests);
        return Ok(ParsedConsole {
            tests,
            summary: None,
        });
    }

    let summary = parse_summary(lines)?;
    let ran = tests.len();
    let failed = tests
        .iter()
        .filter(|t| t.outcome == Outcome::Failed)
        .count();
    if u32::try_from(ran).ok() != Some(summary.ran)
        || u32::try_from(failed).ok() != Some(summary.failed)
    {
        return Err(format!(
            "parsed {ran} tests ({failed} failed) but CUnit's summary says {} ran ({} failed)",
            summary.ran, summary.failed
        ));
    }
    Ok(ParsedConsole {
        tests,
        summary: Some(summary),
    })
}

/// Feeds one segment of console text to the open test: a result word ends
/// it, anything else is its log.
fn feed(
    segment: &str,
    open: &mut Option<OpenTest>,
    tests: &mut Vec<TestResult>,
    last_failed: &mut Option<usize>,
) {
    let outcome = if segment.starts_with("passed") {
        Some(Outcome::Passed)
    } else if segment.starts_with("FAILED") {
        Some(Outcome::Failed)
    } else {
        None
    };
    match (outcome, open.take()) {
        (Some(outcome), Some(t)) => {
            let outcome = match outcome {
                Outcome::Passed if t.skipped => Outcome::Skipped,
                other => other,
            };
            if outcome == Outcome::Failed {
                *last_failed = Some(tests.len());
            }
            tests.push(TestResult {
                name: t.name,
                outcome,
                detail: t.detail.join("\n"),
            });
        }
        (None, Some(mut t)) => {
            let text = segment.trim();
            if text.starts_with("[SKIPPED]") || text.starts_with("[SKIPPING]") {
                t.skipped = true;
            }
            if !text.is_empty() {
                t.detail.push(text.to_owned());
            }
            *open = Some(t);
        }
        (_, None) => {}
    }
}

/// `    1. test_read10_beyond_eol.c:38  - CU_ASSERT_EQUAL(_r,0)`
fn is_failure_record(line: &str) -> bool {
    let trimmed = line.trim_start();
    let digits = trimmed.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0
        && trimmed.get(digits..).is_some_and(|r| r.starts_with(". "))
        && line.contains("  - ")
}

fn parse_summary<'a>(lines: impl Iterator<Item = &'a str>) -> Result<RunSummary, String> {
    for line in lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() != Some(&"tests") {
            continue;
        }
        let number = |i: usize| -> Result<u32, String> {
            fields
                .get(i)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| format!("CUnit's summary line does not parse: {line:?}"))
        };
        return Ok(RunSummary {
            total: number(1)?,
            ran: number(2)?,
            passed: number(3)?,
            failed: number(4)?,
        });
    }
    Err("`Run Summary:` has no `tests` line".to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    /// Where a recorded console output lives for the parser's tests.
    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("src/peers/testdata")
            .join(name)
    }

    const SMALL: &str = "

     CUnit - A unit testing framework for C - Version 2.1-3
     http://cunit.sourceforge.net/


Suite: CompareAndWrite
  Test: Simple ...    [SKIPPED] COMPAREANDWRITE is not implemented.
    [SKIPPED] COMPAREANDWRITE is not implemented.
passed
  Test: Miscompare ...passed
Suite: GetLBAStatus
  Test: BeyondEol ...    [FAILED] GET_LBA_STATUS successful but should have failed
FAILED
    1. test_get_lba_status_beyond_eol.c:38  - CU_ASSERT_EQUAL(_r,0)
  Test: UnmapVPD ...    [FAILED] WRITESAME10 command failed with status 2
passed
Suite: iSCSIdatasn
  Test: iSCSIDataSnInvalid ...FAILED
    1. test_iscsi_datasn_invalid.c:98  - CU_ASSERT_NOT_EQUAL(ret,0)
    2. test_iscsi_datasn_invalid.c:116  - CU_ASSERT_NOT_EQUAL(ret,0)
  Test: LUNReset ...passed    [FAILED] PRIN command: failed with sense.

Run Summary:    Type  Total    Ran Passed Failed Inactive
              suites      3      3    n/a      0        0
               tests      6      6      4      2        0
             asserts     20     20     17      3      n/a

Elapsed time =    0.100 seconds
Tests completed with return value: 0
";

    #[test]
    fn parses_each_outcome() {
        let parsed = parse_console("ALL", SMALL).expect("parses");
        let got: Vec<(&str, Outcome)> = parsed
            .tests
            .iter()
            .map(|t| (t.name.as_str(), t.outcome))
            .collect();
        assert_eq!(
            got,
            vec![
                ("ALL.CompareAndWrite.Simple", Outcome::Skipped),
                ("ALL.CompareAndWrite.Miscompare", Outcome::Passed),
                ("ALL.GetLBAStatus.BeyondEol", Outcome::Failed),
                // Logged "[FAILED]" but CUnit passed it: CUnit decides.
                ("ALL.GetLBAStatus.UnmapVPD", Outcome::Passed),
                ("ALL.iSCSIdatasn.iSCSIDataSnInvalid", Outcome::Failed),
                // Text after the result belongs to no test.
                ("ALL.iSCSIdatasn.LUNReset", Outcome::Passed),
            ]
        );
        assert_eq!(
            parsed.summary,
            Some(RunSummary {
                total: 6,
                ran: 6,
                passed: 4,
                failed: 2
            })
        );
    }

    #[test]
    fn failure_detail_keeps_log_and_assertions() {
        let parsed = parse_console("ALL", SMALL).expect("parses");
        let beyond = &parsed.tests[2];
        assert!(
            beyond.detail.contains("[FAILED] GET_LBA_STATUS"),
            "{}",
            beyond.detail
        );
        assert!(
            beyond
                .detail
                .contains("test_get_lba_status_beyond_eol.c:38"),
            "{}",
            beyond.detail
        );
        let datasn = &parsed.tests[4];
        assert!(
            datasn.detail.contains("datasn_invalid.c:98"),
            "{}",
            datasn.detail
        );
        assert!(
            datasn.detail.contains("datasn_invalid.c:116"),
            "{}",
            datasn.detail
        );
    }

    #[test]
    fn failures_say_why_each_failed_test_failed() {
        use std::os::unix::process::ExitStatusExt;
        let parsed = parse_console("ALL", SMALL).expect("parses");
        let run = SuiteResult {
            tests: parsed.tests,
            summary: parsed.summary,
            command: "iscsi-test-cu".to_owned(),
            status: ExitStatus::from_raw(0),
            stderr_tail: String::new(),
            stdout: SMALL.to_owned(),
        };
        let report = run.failures();
        let blocks: Vec<&str> = report
            .lines()
            .filter(|l| l.starts_with("FAILED "))
            .collect();
        assert_eq!(
            blocks,
            [
                "FAILED ALL.GetLBAStatus.BeyondEol",
                "FAILED ALL.iSCSIdatasn.iSCSIDataSnInvalid"
            ]
        );
        assert!(
            report.contains("    [FAILED] GET_LBA_STATUS successful"),
            "{report}"
        );
        assert!(
            report.contains("test_iscsi_datasn_invalid.c:116"),
            "{report}"
        );
        // A test CUnit passed is not reported, whatever it logged.
        assert!(!report.contains("WRITESAME10"), "{report}");

        let clean = SuiteResult {
            tests: run
                .tests
                .into_iter()
                .filter(|t| t.outcome != Outcome::Failed)
                .collect(),
            ..run
        };
        assert_eq!(clean.failures(), "");
    }

    #[test]
    fn count_mismatch_with_summary_is_an_error() {
        let broken = SMALL.replace("  Test: Miscompare ...passed\n", "");
        let err = parse_console("ALL", &broken).expect_err("counts disagree");
        assert!(err.contains("summary"), "{err}");
    }

    #[test]
    fn a_crashed_run_has_no_summary_and_fails_the_open_test() {
        let cut = SMALL
            .split("  Test: UnmapVPD")
            .next()
            .expect("prefix")
            .to_owned()
            + "  Test: UnmapVPD ...    [FAILED] WRITESAME10";
        let parsed = parse_console("ALL", &cut).expect("parses");
        assert_eq!(parsed.summary, None);
        let last = parsed.tests.last().expect("tests");
        assert_eq!(last.name, "ALL.GetLBAStatus.UnmapVPD");
        assert_eq!(last.outcome, Outcome::Failed);
        assert!(last.detail.contains("no passed/FAILED result"));
    }

    #[test]
    fn a_test_outside_a_suite_is_an_error() {
        assert!(parse_console("ALL", "  Test: X ...passed\n").is_err());
    }

    #[test]
    fn test_list_keeps_three_part_names_of_the_family() {
        let out = "ALL\nALL.Read10\nALL.Read10.Simple\nALL.Read10.BeyondEol\nSCSI.Read10.Simple\n";
        assert_eq!(
            parse_test_list("ALL.", out),
            ["ALL.Read10.Simple", "ALL.Read10.BeyondEol"]
        );
    }

    #[test]
    fn suite_selection_leaves_out_and_reverses() {
        let tests: Vec<String> = [
            "ALL.Read10.Simple",
            "ALL.Read10.BeyondEol",
            "ALL.Sanitize.Reset",
            "ALL.Write10.Simple",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            suite_selection("ALL", &tests, &["Sanitize"]),
            "ALL.Write10,ALL.Read10"
        );
        assert_eq!(
            suite_selection("ALL", &tests, &[]),
            "ALL.Write10,ALL.Sanitize,ALL.Read10"
        );
    }

    #[test]
    fn family_must_be_explicit() {
        assert!(IscsiTestCu::new("u").tests("*.Read10").family().is_err());
        assert!(
            IscsiTestCu::new("u")
                .tests("ALL.Read10,SCSI.Read12")
                .family()
                .is_err()
        );
        assert_eq!(
            IscsiTestCu::new("u")
                .tests("ALL.Read1*,ALL.Write10")
                .family()
                .expect("ok"),
            "ALL"
        );
    }

    #[test]
    fn args_carry_dataloss_names_and_multipath() {
        let args = IscsiTestCu::new("iscsi://a/b/0")
            .initiator_names("iqn.x:1", "iqn.x:2")
            .multipath_url("iscsi://a/b/0")
            .args();
        assert_eq!(
            args,
            [
                "--test",
                "ALL",
                "--dataloss",
                "--allow-sanitize",
                "--initiator-name=iqn.x:1",
                "--initiator-name-2=iqn.x:2",
                "iscsi://a/b/0",
                "iscsi://a/b/0"
            ]
        );
        let quiet = IscsiTestCu::new("iscsi://a/b/0")
            .dataloss(false)
            .allow_sanitize(false)
            .args();
        assert!(
            !quiet
                .iter()
                .any(|a| a == "--dataloss" || a == "--allow-sanitize")
        );
    }

    /// A full `-t ALL -d` run recorded against tgtd 1.0.85.
    #[test]
    fn parses_a_full_recorded_run() {
        let text =
            std::fs::read_to_string(fixture("tgtd-1.0.85-all.console")).expect("fixture present");
        let parsed = parse_console("ALL", &text).expect("parses");
        let summary = parsed.summary.expect("complete run");
        assert_eq!(summary.total, 230);
        assert_eq!(parsed.tests.len(), 230);
        let failed: Vec<&str> = parsed
            .tests
            .iter()
            .filter(|t| t.outcome == Outcome::Failed)
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(failed.len() as u32, summary.failed);
        let skipped = parsed
            .tests
            .iter()
            .filter(|t| t.outcome == Outcome::Skipped)
            .count();
        assert!(
            skipped > 0,
            "tgtd lacks COMPARE AND WRITE, so some tests skip"
        );
        assert!(
            parsed
                .tests
                .iter()
                .any(|t| t.name == "ALL.Read10.Simple" && t.outcome == Outcome::Passed)
        );
    }
}
