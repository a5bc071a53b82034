//! The ways a command fails, and the exit code each maps to.

use std::fmt;

/// A command's failure: bad input (exit code 2), a run that went wrong (exit code 1), or a
/// user's command that failed (its own exit code).
#[derive(Debug)]
pub enum CliError {
    /// Bad input: a config key, a flag value, an address, a port in use, an unreadable
    /// certificate. The message names the offending thing. Exit code 2.
    Usage(String),
    /// The command started but failed (a lost node, a check that failed). Exit code 1.
    Failed(String),
    /// A child process that stands for the command failed with exit code `code` (a user's
    /// script under `pushpull local -- COMMAND`): the launcher exits with the same code.
    Status {
        /// The exit code to pass on (1..=255).
        code: u8,
        /// What failed.
        message: String,
    },
}

impl CliError {
    /// Bad input (exit code 2).
    pub fn usage(msg: impl fmt::Display) -> CliError {
        CliError::Usage(msg.to_string())
    }

    /// A failed run (exit code 1).
    pub fn failed(msg: impl fmt::Display) -> CliError {
        CliError::Failed(msg.to_string())
    }

    /// A child's failure passed on with its exit code.
    pub fn status(code: u8, msg: impl fmt::Display) -> CliError {
        CliError::Status {
            code,
            message: msg.to_string(),
        }
    }

    /// The process exit code: 2 for bad input, 1 for a failed run, a child's own code.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
            CliError::Status { code, .. } => *code,
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            CliError::Usage(m) | CliError::Failed(m) => m,
            CliError::Status { message, .. } => message,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for CliError {}

/// `Result` with a [`CliError`].
pub type CliResult<T> = Result<T, CliError>;
