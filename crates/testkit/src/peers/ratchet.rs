//! The conformance ratchet: a checked-in list of tests that must pass.
//!
//! A list (`conformance/<suite>.pass`) holds one full test name per line
//! (`ALL.Read10.Simple`); blank lines and `#` comments are ignored. A run is
//! checked against it with [`PassList::check`]: every listed test must have
//! [`Outcome::Passed`] — a failure, a skip, or a test that did not run at
//! all breaks the ratchet. Tests that pass but are not listed are reported
//! so that they can be added: the list only ever grows
//! (`scripts/check-ratchet.sh` enforces that over the git history).

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use super::PeerError;
use super::iscsi_test_cu::{Outcome, SuiteResult};

/// Asserts a conformance run of record: the suite reached its end, no test
/// FAILED, and every test of `conformance/<list_name>` passed (the
/// ratchet); prints the ratchet's report (tests that pass and are not
/// listed yet). Panics saying which of these did not hold.
pub fn assert_run_passes(list_name: &str, result: &SuiteResult) {
    assert!(
        result.is_complete(),
        "the suite did not reach its end ({}):\n{}",
        result.status,
        result.stderr_tail
    );
    let failed: Vec<&str> = result
        .tests
        .iter()
        .filter(|t| t.outcome == Outcome::Failed)
        .map(|t| t.name.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "tests FAILED: {failed:?}\n{}",
        result.to_table()
    );
    let list = match PassList::load(super::conformance_dir().join(list_name)) {
        Ok(l) => l,
        Err(e) => panic!("pass list {list_name}: {e}"),
    };
    match list.check(result) {
        Ok(report) => println!("{report}"),
        Err(f) => panic!("{f}"),
    }
}

/// A list of tests that must pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassList {
    /// Where the list came from (for messages).
    pub source: PathBuf,
    /// The test names.
    pub names: BTreeSet<String>,
}

impl PassList {
    /// Reads a list file.
    ///
    /// # Errors
    /// [`PeerError::Io`] if it cannot be read; [`PeerError::Unparsable`] if
    /// a line is not a test name or a name is listed twice.
    pub fn load(path: impl AsRef<Path>) -> Result<PassList, PeerError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| PeerError::io(format!("reading pass list {}", path.display()), e))?;
        Self::parse(path, &text).map_err(|reason| PeerError::Unparsable {
            command: format!("pass list {}", path.display()),
            reason,
        })
    }

    /// Parses list text; `source` only labels messages.
    ///
    /// # Errors
    /// A message naming the first bad line.
    pub fn parse(source: impl Into<PathBuf>, text: &str) -> Result<PassList, String> {
        let mut names = BTreeSet::new();
        for (number, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let valid = line.split('.').count() == 3
                && line.split('.').all(|part| !part.is_empty())
                && !line.contains(char::is_whitespace);
            if !valid {
                return Err(format!(
                    "line {}: {line:?} is not a test name like ALL.Read10.Simple",
                    number + 1
                ));
            }
            if !names.insert(line.to_owned()) {
                return Err(format!("line {}: {line} is listed twice", number + 1));
            }
        }
        Ok(PassList {
            source: source.into(),
            names,
        })
    }

    /// Checks a run against the list.
    ///
    /// # Errors
    /// [`RatchetFailure`] listing every listed test that did not pass; its
    /// `Display` is the message to show.
    pub fn check(&self, result: &SuiteResult) -> Result<RatchetReport, Box<RatchetFailure>> {
        let mut broken = Vec::new();
        for name in &self.names {
            match result.tests.iter().find(|t| &t.name == name) {
                Some(t) if t.outcome == Outcome::Passed => {}
                Some(t) => broken.push(Broken {
                    name: name.clone(),
                    outcome: Some(t.outcome),
                    detail: t.detail.clone(),
                }),
                None => broken.push(Broken {
                    name: name.clone(),
                    outcome: None,
                    detail: String::new(),
                }),
            }
        }
        let newly_passing: Vec<String> = result
            .tests
            .iter()
            .filter(|t| t.outcome == Outcome::Passed && !self.names.contains(&t.name))
            .map(|t| t.name.clone())
            .collect();
        let report = RatchetReport {
            source: self.source.clone(),
            listed: self.names.len(),
            newly_passing,
        };
        if broken.is_empty() {
            Ok(report)
        } else {
            Err(Box::new(RatchetFailure {
                report,
                broken,
                command: result.command.clone(),
                complete: result.is_complete(),
                status: result.status.to_string(),
                stderr_tail: result.stderr_tail.clone(),
            }))
        }
    }
}

/// A ratchet check that held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatchetReport {
    /// The list checked.
    pub source: PathBuf,
    /// How many tests it lists.
    pub listed: usize,
    /// Tests that passed but are not listed yet: add them.
    pub newly_passing: Vec<String>,
}

impl fmt::Display for RatchetReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "all {} tests listed in {} passed",
            self.listed,
            self.source.display()
        )?;
        if !self.newly_passing.is_empty() {
            write!(
                f,
                "\n{} more tests pass and are not listed yet; add them to {}:",
                self.newly_passing.len(),
                self.source.display()
            )?;
            for name in &self.newly_passing {
                write!(f, "\n{name}")?;
            }
        }
        Ok(())
    }
}

/// One listed test that did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// Its name.
    pub name: String,
    /// What it did instead; `None` if it did not run.
    pub outcome: Option<Outcome>,
    /// What it logged.
    pub detail: String,
}

/// A ratchet check that failed: listed tests that did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatchetFailure {
    /// The rest of the check (including newly passing tests).
    pub report: RatchetReport,
    /// Every listed test that did not pass.
    pub broken: Vec<Broken>,
    /// The command that ran the suite.
    pub command: String,
    /// Whether the run reached its end.
    pub complete: bool,
    /// How the program ended.
    pub status: String,
    /// The end of its stderr.
    pub stderr_tail: String,
}

impl fmt::Display for RatchetFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} of the {} tests listed in {} did not pass:",
            self.broken.len(),
            self.report.listed,
            self.report.source.display()
        )?;
        for b in &self.broken {
            match b.outcome {
                Some(outcome) => writeln!(f, "  {outcome:<8} {}", b.name)?,
                None => writeln!(f, "  NOT RUN  {}", b.name)?,
            }
            for line in b.detail.lines() {
                writeln!(f, "             {line}")?;
            }
        }
        writeln!(f, "command: {}", self.command)?;
        if !self.complete {
            writeln!(
                f,
                "the run did not reach its end ({}); stderr ended with:\n{}",
                self.status, self.stderr_tail
            )?;
        }
        if !self.report.newly_passing.is_empty() {
            writeln!(
                f,
                "(also: {} unlisted tests now pass: {})",
                self.report.newly_passing.len(),
                self.report.newly_passing.join(" ")
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for RatchetFailure {}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;
    use crate::peers::TestResult;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    fn result(tests: &[(&str, Outcome)]) -> SuiteResult {
        SuiteResult {
            tests: tests
                .iter()
                .map(|(name, outcome)| TestResult {
                    name: (*name).to_owned(),
                    outcome: *outcome,
                    detail: format!("log of {name}"),
                })
                .collect(),
            summary: None,
            command: "iscsi-test-cu -t ALL".to_owned(),
            status: ExitStatus::from_raw(0),
            stderr_tail: String::new(),
            stdout: String::new(),
        }
    }

    const LIST: &str = "# tests that must pass\nALL.Read10.Simple\n\nALL.Read10.BeyondEol  # comment\nALL.Write10.Simple\n";

    #[test]
    fn parses_names_and_ignores_comments() {
        let list = PassList::parse("x.pass", LIST).expect("parses");
        assert_eq!(list.names.len(), 3);
        assert!(list.names.contains("ALL.Read10.BeyondEol"));
    }

    #[test]
    fn rejects_bad_lines_and_duplicates() {
        assert!(PassList::parse("x", "Read10.Simple\n").is_err());
        assert!(PassList::parse("x", "ALL.Read10.Simple extra\n").is_err());
        let dup = PassList::parse("x", "ALL.A.B\nALL.A.B\n").expect_err("duplicate");
        assert!(dup.contains("line 2"), "{dup}");
    }

    #[test]
    fn holds_when_every_listed_test_passes_and_reports_new_ones() {
        let list = PassList::parse("x.pass", LIST).expect("parses");
        let run = result(&[
            ("ALL.Read10.Simple", Outcome::Passed),
            ("ALL.Read10.BeyondEol", Outcome::Passed),
            ("ALL.Write10.Simple", Outcome::Passed),
            ("ALL.Write10.Fua", Outcome::Passed),
            ("ALL.Write10.Dpo", Outcome::Skipped),
        ]);
        let report = list.check(&run).expect("holds");
        assert_eq!(report.newly_passing, vec!["ALL.Write10.Fua".to_owned()]);
        assert!(report.to_string().contains("ALL.Write10.Fua"));
    }

    #[test]
    fn fails_on_failed_skipped_and_missing_tests() {
        let list = PassList::parse("x.pass", LIST).expect("parses");
        let run = result(&[
            ("ALL.Read10.Simple", Outcome::Failed),
            ("ALL.Read10.BeyondEol", Outcome::Skipped),
        ]);
        let failure = list.check(&run).expect_err("must fail");
        let names: Vec<(&str, Option<Outcome>)> = failure
            .broken
            .iter()
            .map(|b| (b.name.as_str(), b.outcome))
            .collect();
        assert_eq!(
            names,
            vec![
                ("ALL.Read10.BeyondEol", Some(Outcome::Skipped)),
                ("ALL.Read10.Simple", Some(Outcome::Failed)),
                ("ALL.Write10.Simple", None),
            ]
        );
        let text = failure.to_string();
        assert!(text.contains("3 of the 3 tests listed in x.pass"), "{text}");
        assert!(text.contains("NOT RUN  ALL.Write10.Simple"), "{text}");
        assert!(text.contains("log of ALL.Read10.Simple"), "{text}");
        assert!(text.contains("did not reach its end"), "{text}");
    }
}
