//! Errors that come from bad input: they name where, and the CLI exits 2 on them.

use std::fmt;

/// A problem with something the user gave us, with its location (`file:line` or `--flag`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    pub location: String,
    pub message: String,
}

impl InputError {
    pub fn new(location: impl Into<String>, message: impl Into<String>) -> Self {
        InputError { location: location.into(), message: message.into() }
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.location.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.location, self.message)
        }
    }
}

impl std::error::Error for InputError {}
