//! Exit statuses: 2 when a command is refused because of a flag's value (a
//! setting the scheduler or engine refuses, a KV cache that cannot fit in
//! memory, a missing `--prompt`), 1 when it fails otherwise (a model that
//! cannot be loaded or downloaded, an error while running). 2 is also
//! clap's status for a flag it cannot parse and `replay`'s for a malformed
//! trace, so "fix the command line" reads the same everywhere.

use std::fmt;
use std::process::ExitCode;

/// Exit status of a refused configuration.
pub const BAD_CONFIG: u8 = 2;

/// An error caused by the configuration, not by the run. Its message is
/// the wrapped error's whole chain, so printing it with `{:#}` reads as
/// before.
#[derive(Debug)]
pub struct ConfigError(anyhow::Error);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Marks `e` as a configuration error (for `map_err`).
pub fn config_error(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(ConfigError(e))
}

/// A configuration error with this message.
pub fn bad_config(message: impl fmt::Display) -> anyhow::Error {
    config_error(anyhow::anyhow!("{message}"))
}

/// The exit status for a command that failed with `e`.
pub fn exit_code(e: &anyhow::Error) -> ExitCode {
    if e.chain().any(|c| c.is::<ConfigError>()) {
        ExitCode::from(BAD_CONFIG)
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn configuration_errors_exit_2_and_read_as_before() {
        let inner: anyhow::Result<()> = Err(anyhow::anyhow!("too large")).context("--flag");
        let e = config_error(inner.unwrap_err());
        assert_eq!(format!("{e:#}"), "--flag: too large");
        assert_eq!(exit_code(&e), ExitCode::from(2));
        // Context added on top keeps the mark.
        let e = Err::<(), _>(e).context("outer").unwrap_err();
        assert_eq!(exit_code(&e), ExitCode::from(2));
        assert_eq!(exit_code(&anyhow::anyhow!("io")), ExitCode::FAILURE);
    }
}
