//! Config errors: what went wrong, in which file, and where inside it.
//!
//! Invariants: every [`ConfigError`] names its file; a YAML or type error carries the
//! parser's line and column, a validation error carries a place path such as
//! `domain edge > descriptors[1] (key api_key, value vip) > rate_limits[0].unit`.
//! Problems are lowercase and have no trailing period. Keys and values that could make a
//! place ambiguous (spaces, separators, control characters, empty) are quoted and escaped,
//! so a message is always one line.

use std::fmt;

/// A line and column (both 1-based) inside a file, as reported by the YAML parser.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub line: u64,
    pub column: u64,
}

/// One problem in the limits configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    file: String,
    position: Option<Position>,
    place: String,
    problem: String,
}

impl ConfigError {
    /// A problem with the file as a whole (unreadable, too large, missing domain).
    pub(crate) fn whole_file(file: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::at(file, String::new(), problem)
    }

    /// A validation problem at `place` inside `file`.
    pub(crate) fn at(
        file: impl Into<String>,
        place: impl Into<String>,
        problem: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: file.into(),
            position: None,
            place: place.into(),
            problem: one_line(problem.into()),
        }
    }

    /// A YAML syntax or type problem at a parser position.
    pub(crate) fn parse(
        file: impl Into<String>,
        position: Option<Position>,
        problem: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: file.into(),
            position,
            place: String::new(),
            problem: one_line(problem.into()),
        }
    }

    /// The file (or directory) the problem is in, as it was named to the loader.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The parser position, for YAML syntax and type errors.
    pub fn position(&self) -> Option<Position> {
        self.position
    }

    /// The path inside the file (`domain edge > descriptors[0] (key a) > rate_limit.unit`);
    /// empty for problems with the whole file and for YAML errors (see [`Self::position`]).
    pub fn place(&self) -> &str {
        &self.place
    }

    /// What is wrong.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(Position { line, column }) = self.position {
            write!(f, ":{line}:{column}")?;
        }
        if !self.place.is_empty() {
            write!(f, ": {}", self.place)?;
        }
        write!(f, ": {}", self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found while loading a limits configuration (never empty).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", Lines(.errors))]
pub struct ConfigErrors {
    errors: Vec<ConfigError>,
}

impl ConfigErrors {
    pub(crate) fn new(errors: Vec<ConfigError>) -> ConfigErrors {
        ConfigErrors { errors }
    }

    pub fn errors(&self) -> &[ConfigError] {
        &self.errors
    }

    pub fn into_errors(self) -> Vec<ConfigError> {
        self.errors
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(error: ConfigError) -> ConfigErrors {
        ConfigErrors::new(vec![error])
    }
}

/// Displays errors one per line.
struct Lines<'a>(&'a [ConfigError]);

impl fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// `problem` with its control characters escaped: the parser quotes what it read (an unknown
/// field's name may hold line breaks), and a message stays on one line.
fn one_line(problem: String) -> String {
    if !problem.chars().any(char::is_control) {
        return problem;
    }
    problem
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Writes a key, value or domain name for a place or a node path: as is when it is plain,
/// quoted and escaped when it is empty or has characters that would blur the place.
pub(crate) fn name(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_alphanumeric() || "_-.:/*@+#%&?~^!$'".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("{text:?}")
    }
}

/// `a > b`, or just `b` when `a` is empty.
pub(crate) fn join(prefix: &str, segment: &str) -> String {
    if prefix.is_empty() {
        segment.to_owned()
    } else {
        format!("{prefix} > {segment}")
    }
}
