//! The command's error: one line of text and the exit status that goes with it.

use std::fmt;

/// A one-line, user-facing error with an exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    msg: String,
    status: i32,
}

/// Result alias of the command.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with exit status 1.
    pub fn new(msg: impl Into<String>) -> Error {
        Error {
            msg: msg.into(),
            status: 1,
        }
    }

    /// An error that was already reported (by a child process): exit with `status`, print
    /// nothing.
    pub fn silent(status: i32) -> Error {
        Error {
            msg: String::new(),
            status,
        }
    }

    /// Whether the error has nothing left to print.
    pub fn is_silent(&self) -> bool {
        self.msg.is_empty()
    }

    /// The same error with another exit status.
    pub fn with_status(mut self, status: i32) -> Error {
        self.status = status;
        self
    }

    /// The process exit status for this error.
    pub fn status(&self) -> i32 {
        self.status
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}
