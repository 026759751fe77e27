//! Wildcard descriptor values: `*` matches zero or more characters, anywhere in the value.
//!
//! A pattern is compiled once into its literal pieces (`/api/*/users/*` is prefix `/api/`,
//! middle `/users/` and an empty suffix). Matching checks the prefix and suffix, then finds
//! each middle piece leftmost-first in what is left: with `*` as the only metacharacter the
//! leftmost choice never loses a match, so there is no backtracking, no recursion and no
//! allocation, and a match costs at most O(value length * pattern length).
//!
//! Invariants: a [`Glob`] always came from a pattern with at least one `*`; matching works
//! on bytes, which is exact for UTF-8 because literal pieces can only match at character
//! boundaries, and it never panics (slicing goes through `str::get`).

/// A compiled wildcard pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Glob {
    prefix: Box<str>,
    middle: Box<[Box<str>]>,
    suffix: Box<str>,
}

impl Glob {
    /// Compiles `pattern`; `None` when it has no `*` (it is then an exact value).
    pub(crate) fn new(pattern: &str) -> Option<Glob> {
        let mut pieces = pattern.split('*');
        let prefix = pieces.next().unwrap_or_default();
        let mut rest: Vec<&str> = pieces.collect();
        let suffix = rest.pop()?;
        Some(Glob {
            prefix: prefix.into(),
            middle: rest
                .into_iter()
                .filter(|piece| !piece.is_empty())
                .map(Box::from)
                .collect(),
            suffix: suffix.into(),
        })
    }

    pub(crate) fn matches(&self, value: &str) -> bool {
        let (prefix, suffix) = (self.prefix.len(), self.suffix.len());
        if value.len() < prefix + suffix
            || !value.starts_with(&*self.prefix)
            || !value.ends_with(&*self.suffix)
        {
            return false;
        }
        let Some(mut rest) = value.get(prefix..value.len() - suffix) else {
            return false;
        };
        for piece in &self.middle {
            let Some(at) = rest.find(&**piece) else {
                return false;
            };
            let Some(after) = rest.get(at + piece.len()..) else {
                return false;
            };
            rest = after;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    fn check(pattern: &str, value: &str, expected: bool) {
        let glob = Glob::new(pattern);
        let glob = glob.as_ref().map(|g| g.matches(value));
        assert_eq!(
            glob,
            Some(expected),
            "pattern {pattern:?} against {value:?}"
        );
    }

    #[test]
    fn star_matches_zero_or_more_characters_anywhere() {
        let table = [
            ("*", "", true),
            ("*", "anything at all", true),
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("foo*", "fo", false),
            ("foo*", "xfoo", false),
            ("*bar", "bar", true),
            ("*bar", "foobar", true),
            ("*bar", "barx", false),
            ("/api/*/users", "/api/v1/users", true),
            ("/api/*/users", "/api//users", true),
            ("/api/*/users", "/api/v1/v2/users", true),
            ("/api/*/users", "/api/v1/users/7", false),
            ("/api/*/users", "/api/users", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("a**b", "ab", true),
            ("*a*", "bab", true),
            ("*a*", "bbb", false),
            ("ab*ba", "aba", false),
            ("*aab", "aaab", true),
            ("*é*", "café au lait", true),
            ("caf*", "café", true),
            ("*ß", "straß", true),
        ];
        for (pattern, value, expected) in table {
            check(pattern, value, expected);
        }
    }

    #[test]
    fn a_value_without_a_star_is_not_a_pattern() {
        assert_eq!(Glob::new("plain"), None);
        assert_eq!(Glob::new(""), None);
    }

    #[test]
    fn adversarial_patterns_finish_quickly() {
        let value = "a".repeat(100_000);
        let pattern = format!("{}*b*", "*a".repeat(500));
        check(&pattern, &value, false);
        let pattern = format!("*{}b*", "a".repeat(1_000));
        check(&pattern, &value, false);
        let pattern = format!("*{}*", "a".repeat(1_000));
        check(&pattern, &value, true);
    }
}
