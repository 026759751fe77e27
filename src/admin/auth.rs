//! The bearer token of the admin listener (`--admin-token-file`): read from its file, kept
//! current while serving, and checked on every admin request.
//!
//! The file holds the token alone; whitespace around it (a trailing newline) is ignored.
//! A request passes with `Authorization: Bearer <token>` (the scheme in any case); without
//! it, or with another token, it is answered 401 with `WWW-Authenticate: Bearer` and a JSON
//! error saying which. `GET /ui` (the dashboard's static page, which holds no data) is the
//! one exception: the page sends the token itself on its requests (see [`super::ui`]).
//!
//! Invariants:
//! - The comparison takes the same time wherever the tokens differ (`subtle`); only a
//!   length mismatch returns early, and the length is not the secret.
//! - Read only what was meant: a regular file (a symlink to one, as in a Kubernetes Secret
//!   mount), at most [`MAX_TOKEN_BYTES`], visible ASCII (what an HTTP header can carry).
//! - The file is read again every [`RECHECK`]; a file that cannot be read or holds no valid
//!   token keeps the token in use, and the problem is logged once (until it changes). At
//!   start a bad file is an error naming the flag and the file. The token is never logged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// The flag naming the file, for error messages.
pub const TOKEN_FLAG: &str = "--admin-token-file";

/// A token file larger than this is refused (a JWT is a few KiB).
pub const MAX_TOKEN_BYTES: u64 = 16 * 1024;

/// How often the file is read again while serving.
pub const RECHECK: Duration = Duration::from_secs(1);

/// Why a token file gives no token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{TOKEN_FLAG} {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{TOKEN_FLAG} {}: not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("{TOKEN_FLAG} {}: larger than {MAX_TOKEN_BYTES} bytes", path.display())]
    TooLarge { path: PathBuf },
    #[error("{TOKEN_FLAG} {}: holds no token (empty or only whitespace)", path.display())]
    Empty { path: PathBuf },
    #[error(
        "{TOKEN_FLAG} {}: byte {at} of the token is not visible ASCII (an Authorization header cannot carry it)",
        path.display()
    )]
    Invalid { path: PathBuf, at: usize },
}

/// A token, kept out of `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Box<[u8]>);

impl Token {
    /// Whether `presented` is this token, in time independent of where they differ.
    fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.as_ref().ct_eq(presented))
    }

    /// The `Authorization` header value that carries this token.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", String::from_utf8_lossy(&self.0))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({} bytes)", self.0.len())
    }
}

/// Reads the token in `path` (see the module docs for what is accepted). Blocking.
pub fn read_token(path: &Path) -> Result<Token, TokenError> {
    let read_error = |source| TokenError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes = crate::files::read_regular(path, MAX_TOKEN_BYTES).map_err(|error| match error {
        crate::files::ReadError::Io(source) => read_error(source),
        crate::files::ReadError::NotAFile => TokenError::NotAFile {
            path: path.to_owned(),
        },
        crate::files::ReadError::TooLarge { .. } => TokenError::TooLarge {
            path: path.to_owned(),
        },
    })?;
    let token = bytes.trim_ascii();
    if token.is_empty() {
        return Err(TokenError::Empty {
            path: path.to_owned(),
        });
    }
    if let Some(at) = token.iter().position(|byte| !byte.is_ascii_graphic()) {
        return Err(TokenError::Invalid {
            path: path.to_owned(),
            at,
        });
    }
    Ok(Token(token.into()))
}

/// The token the admin listener checks, and the file it comes from. Clones share it.
#[derive(Clone, Debug)]
pub struct TokenFile {
    path: PathBuf,
    live: Arc<ArcSwap<Token>>,
}

impl TokenFile {
    /// Reads the file once; a bad file is an error naming the flag and the file.
    pub fn load(path: PathBuf) -> Result<TokenFile, TokenError> {
        let token = read_token(&path)?;
        Ok(TokenFile {
            path,
            live: Arc::new(ArcSwap::from_pointee(token)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again and swaps its token in: `Ok(true)` when the token changed. On
    /// error the token in use stays. Blocking.
    pub fn reload_now(&self) -> Result<bool, TokenError> {
        let token = read_token(&self.path)?;
        if **self.live.load() == token {
            return Ok(false);
        }
        self.live.store(Arc::new(token));
        tracing::info!(path = %self.path.display(), "admin token reloaded");
        Ok(true)
    }

    /// Re-reads the file every [`RECHECK`] on the current tokio runtime until the returned
    /// handle drops.
    pub fn watch(&self) -> TokenWatch {
        let file = self.clone();
        TokenWatch(tokio::spawn(file.run()).abort_handle())
    }

    async fn run(self) {
        let mut tick = tokio::time::interval(RECHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once; the start-up read was just done.
        tick.tick().await;
        let mut last_problem: Option<String> = None;
        loop {
            tick.tick().await;
            let file = self.clone();
            let outcome = match tokio::task::spawn_blocking(move || file.reload_now()).await {
                Ok(outcome) => outcome.map(|_| ()).map_err(|error| error.to_string()),
                Err(error) => Err(format!("the read did not finish: {error}")),
            };
            match outcome {
                Ok(()) => last_problem = None,
                Err(problem) => {
                    // Logged once per distinct problem, not every second.
                    if last_problem.as_ref() != Some(&problem) {
                        tracing::warn!(
                            "cannot reload the admin token, keeping the one in use: {problem}"
                        );
                        last_problem = Some(problem);
                    }
                }
            }
        }
    }

    /// Whether `authorization` (the request's header) carries the live token.
    fn check(&self, authorization: Option<&HeaderValue>) -> Result<(), Refusal> {
        let Some(value) = authorization else {
            return Err(Refusal::Missing);
        };
        let presented = match value.as_bytes().split_at_checked(7) {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case(b"bearer ") => token.trim_ascii(),
            _ => return Err(Refusal::NotBearer),
        };
        if self.live.load().matches(presented) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }
}

/// Why a request does not pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header of another scheme.
    NotBearer,
    /// A bearer token other than the live one.
    Wrong,
}

impl Refusal {
    /// The `WWW-Authenticate` challenge and the message of the 401 (RFC 6750: no error code
    /// when no credentials were sent, `invalid_token` for a wrong one).
    fn answer(self) -> Response {
        let (challenge, message) = match self {
            Refusal::Missing => (
                "Bearer realm=\"ratekeeper admin\"",
                format!(
                    "this admin listener needs a token: send Authorization: Bearer <token>, \
                     the token in its {TOKEN_FLAG}"
                ),
            ),
            Refusal::NotBearer => (
                "Bearer realm=\"ratekeeper admin\"",
                "the Authorization header is not a bearer token: send Authorization: \
                 Bearer <token>"
                    .to_owned(),
            ),
            Refusal::Wrong => (
                "Bearer realm=\"ratekeeper admin\", error=\"invalid_token\"",
                format!("the bearer token is not the one in this admin listener's {TOKEN_FLAG}"),
            ),
        };
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge)],
            axum::Json(serde_json::json!({ "error": message })),
        )
            .into_response()
    }
}

/// A running re-read of the token file; dropping it stops it.
#[derive(Debug)]
pub struct TokenWatch(tokio::task::AbortHandle);

impl Drop for TokenWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Middleware of the admin listener: passes requests carrying the token, answers the rest
/// 401 (see the module docs).
pub(super) async fn require_token(
    State(token): State<TokenFile>,
    request: Request,
    next: Next,
) -> Response {
    match token.check(request.headers().get(header::AUTHORIZATION)) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.answer(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(dir: &Path, text: &[u8]) -> PathBuf {
        let path = dir.join("token");
        std::fs::write(&path, text).expect("write");
        path
    }

    fn temp_dir(label: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ratekeeper-auth-{label}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    fn header(text: &str) -> HeaderValue {
        HeaderValue::from_str(text).expect("header")
    }

    #[test]
    fn the_token_is_the_file_without_surrounding_whitespace_and_only_it_passes() {
        let dir = temp_dir("passes");
        let file = TokenFile::load(file_with(&dir, b"  s3cret-token\n")).expect("loads");
        assert_eq!(file.check(Some(&header("Bearer s3cret-token"))), Ok(()));
        assert_eq!(file.check(Some(&header("bearer s3cret-token"))), Ok(()));
        assert_eq!(file.check(None), Err(Refusal::Missing));
        assert_eq!(
            file.check(Some(&header("Basic czNjcmV0"))),
            Err(Refusal::NotBearer)
        );
        for wrong in [
            "Bearer s3cret-toke",
            "Bearer s3cret-token2",
            "Bearer ",
            "Bearer x",
        ] {
            assert_eq!(
                file.check(Some(&header(wrong))),
                Err(Refusal::Wrong),
                "{wrong}"
            );
        }
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_flag_and_a_reload_keeps_the_old_token() {
        let dir = temp_dir("bad");
        let path = file_with(&dir, b"first");
        let file = TokenFile::load(path.clone()).expect("loads");
        for (text, problem) in [
            (&b"\n \n"[..], "holds no token"),
            (&b"two words"[..], "not visible ASCII"),
            (&[b'a'; 16 * 1024 + 1][..], "larger than"),
        ] {
            std::fs::write(&path, text).expect("write");
            let error = file.reload_now().expect_err("refused").to_string();
            assert!(error.starts_with("--admin-token-file "), "{error}");
            assert!(error.contains(problem), "{error}");
            assert_eq!(file.check(Some(&header("Bearer first"))), Ok(()));
        }
        std::fs::write(&path, "second\n").expect("write");
        assert!(file.reload_now().expect("reloads"));
        assert_eq!(file.check(Some(&header("Bearer second"))), Ok(()));
        assert_eq!(
            file.check(Some(&header("Bearer first"))),
            Err(Refusal::Wrong)
        );
        let error = TokenFile::load(dir.clone())
            .expect_err("a directory")
            .to_string();
        assert!(error.contains("not a regular file"), "{error}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let dir = temp_dir("debug");
        let file = TokenFile::load(file_with(&dir, b"hidden-value")).expect("loads");
        assert!(!format!("{file:?}").contains("hidden-value"));
        std::fs::remove_dir_all(dir).ok();
    }
}
