//! Minimal logging to stderr or the configured `logFile`, never stdout (which belongs to the
//! CNI answer). One `write` per line so concurrent plugin processes appending to the same
//! file do not interleave within a line.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use lace::wire::LogLevel;

/// Where log lines go and which ones are kept.
#[derive(Debug)]
pub struct Logger {
    level: LogLevel,
    file: Option<File>,
}

impl Logger {
    /// Logs to stderr at `level`.
    pub fn stderr(level: LogLevel) -> Self {
        Self { level, file: None }
    }

    /// Logs to `file` (appending) if given and openable; otherwise to stderr, returning the
    /// open error so the caller can report it there.
    pub fn open(level: LogLevel, file: Option<&Path>) -> (Self, Option<(String, io::Error)>) {
        let Some(path) = file else {
            return (Self::stderr(level), None);
        };
        match OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o640)
            .open(path)
        {
            Ok(file) => (
                Self {
                    level,
                    file: Some(file),
                },
                None,
            ),
            Err(e) => (Self::stderr(level), Some((path.display().to_string(), e))),
        }
    }

    /// Whether lines at `level` are written.
    pub fn enabled(&self, level: LogLevel) -> bool {
        level <= self.level
    }

    /// Writes one line at `level`. Failures to log are ignored: logging must never change
    /// the outcome of a CNI operation.
    pub fn log(&self, level: LogLevel, args: fmt::Arguments<'_>) {
        if !self.enabled(level) {
            return;
        }
        let line = format!(
            "{} {} lace[{}]: {}\n",
            rfc3339(SystemTime::now()),
            level.label(),
            std::process::id(),
            args
        );
        let _ = match &self.file {
            // `Write` is implemented for `&File`: no `mut` binding of the logger needed.
            Some(file) => {
                let mut file: &File = file;
                file.write_all(line.as_bytes())
            }
            None => io::stderr().lock().write_all(line.as_bytes()),
        };
    }
}

/// UTC timestamp with milliseconds, e.g. `2026-11-30T07:30:01.123Z`.
fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm, restricted to dates after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps() {
        let at = |s: u64, ms: u64| {
            rfc3339(UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(1_700_000_000, 5), "2023-11-14T22:13:20.005Z");
        // Leap day and the day after.
        assert_eq!(at(951_782_400, 0), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(951_868_800, 999), "2000-03-01T00:00:00.999Z");
        assert_eq!(at(4_102_444_799, 0), "2099-12-31T23:59:59.000Z");
    }
}
