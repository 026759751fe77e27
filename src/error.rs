//! The error model of a rate limit check: every error knows its [`ErrorKind`], and the kind
//! knows its answer once for every transport (gRPC code, HTTP status, and the peer
//! protocol's error code), so no front end maps errors by hand.
//!
//! Bad input is `INVALID_ARGUMENT` / 400 with a message naming the field; overload, a full
//! store, a store or peer that cannot answer, and internal trouble are `UNAVAILABLE` / 503,
//! so Envoy's `failure_mode_deny` (and nginx's `error_page`) decide what the client sees.
//! Never `UNKNOWN`, never a panic.

use std::sync::Arc;

use axum::http::StatusCode;

/// What went wrong, as far as a caller can act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed; the message names the field.
    InvalidArgument,
    /// Too much work queued right now: try again.
    Overloaded,
    /// The store holds as many keys (or waiters) as it may.
    Full,
    /// The store, or the node owning the key, could not answer.
    Unavailable,
    /// A bug or an impossible answer (e.g. a peer answering too few decisions).
    Internal,
}

impl ErrorKind {
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorKind::Overloaded
            | ErrorKind::Full
            | ErrorKind::Unavailable
            | ErrorKind::Internal => tonic::Code::Unavailable,
        }
    }

    pub fn http_status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
            ErrorKind::Overloaded
            | ErrorKind::Full
            | ErrorKind::Unavailable
            | ErrorKind::Internal => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// A short stable name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Full => "full",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }
}

/// Why a rate limit check got no answer.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Error {
        Error::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid { .. } => ErrorKind::InvalidArgument,
            Error::Store(error) => error.kind(),
        }
    }

    /// The gRPC status answering this error.
    pub fn to_grpc(&self) -> tonic::Status {
        tonic::Status::new(self.kind().grpc_code(), self.to_string())
    }

    pub fn http_status(&self) -> StatusCode {
        self.kind().http_status()
    }
}

/// Why a store could not decide a request's checks.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("shard {shard} is full: it holds its maximum of {max_keys} keys")]
    KeyCapacity { shard: usize, max_keys: usize },
    /// A rule's new key past its key budget (see `store::memory::shard`).
    #[error(
        "rule {rule:08x} holds its budget of {max_keys} keys on shard {shard}: its new keys are refused until some expire"
    )]
    RuleKeyBudget {
        shard: usize,
        rule: u32,
        max_keys: usize,
    },
    #[error("the store stopped")]
    Stopped,
    /// An external store (Redis) could not answer; only explanations see this (requests
    /// get the store's failure policy instead).
    #[error("{store} did not answer: {problem}")]
    Remote { store: String, problem: String },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The store offers no such operation (a reset on a store that cannot forget).
    #[error("this store does not support {what}")]
    Unsupported { what: &'static str },
}

impl StoreError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::KeyCapacity { .. } | StoreError::RuleKeyBudget { .. } => ErrorKind::Full,
            StoreError::Stopped | StoreError::Remote { .. } => ErrorKind::Unavailable,
            StoreError::Unsupported { .. } => ErrorKind::Internal,
            StoreError::Cluster(error) => error.kind(),
        }
    }
}

/// Why a check routed to another node got no decision (an owner that cannot be reached
/// is not an error: the cluster's fallback policy decides then).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ClusterError {
    /// The key's owner answered with an error of its own (overloaded, full, ...); `kind`
    /// came over the wire as a code, so it keeps its meaning across the hop.
    #[error("owner {peer}: {message}")]
    Owner {
        peer: Arc<str>,
        kind: ErrorKind,
        message: String,
    },
    /// The owner could not be reached, where no fallback may stand in for it (an
    /// explanation must report the owner's state or nothing).
    #[error("owner {peer} did not answer")]
    Unreachable { peer: Arc<str> },
    /// The owner's answer did not fit the question, or the forward was lost.
    #[error("owner {peer}: {problem}")]
    Protocol { peer: Arc<str>, problem: String },
}

impl ClusterError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            // Our own check being invalid for the owner is a bug (or a version skew) here,
            // not the client's fault.
            ClusterError::Owner {
                kind: ErrorKind::InvalidArgument,
                ..
            } => ErrorKind::Internal,
            ClusterError::Owner { kind, .. } => *kind,
            ClusterError::Unreachable { .. } => ErrorKind::Unavailable,
            ClusterError::Protocol { .. } => ErrorKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_knows_its_answer_on_each_transport() {
        let invalid = Error::invalid("descriptors[0].entries", "must not be empty");
        assert_eq!(invalid.to_grpc().code(), tonic::Code::InvalidArgument);
        assert_eq!(
            invalid.to_grpc().message(),
            "descriptors[0].entries: must not be empty"
        );
        assert_eq!(invalid.http_status(), StatusCode::BAD_REQUEST);
        let full = Error::from(StoreError::KeyCapacity {
            shard: 1,
            max_keys: 10,
        });
        assert_eq!(full.kind(), ErrorKind::Full);
        assert_eq!(full.to_grpc().code(), tonic::Code::Unavailable);
        assert_eq!(full.http_status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn an_owners_error_keeps_its_kind_except_blaming_the_client() {
        let owner = |kind| {
            Error::from(StoreError::from(ClusterError::Owner {
                peer: Arc::from("10.0.0.2:8083"),
                kind,
                message: "shard 0 is full".to_owned(),
            }))
        };
        assert_eq!(owner(ErrorKind::Full).kind(), ErrorKind::Full);
        assert_eq!(owner(ErrorKind::Overloaded).kind(), ErrorKind::Overloaded);
        // The client's request was valid here; the owner refusing our check is our fault.
        let refused = owner(ErrorKind::InvalidArgument);
        assert_eq!(refused.kind(), ErrorKind::Internal);
        assert_eq!(refused.to_grpc().code(), tonic::Code::Unavailable);
        assert_eq!(refused.to_string(), "owner 10.0.0.2:8083: shard 0 is full");
    }
}
