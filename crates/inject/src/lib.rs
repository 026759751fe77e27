//! Kubernetes sidecar injection, a crate of its own (it needs none of the limiter):
//! `ratekeeper inject` adds the ratekeeper container (and its volumes, and the peers'
//! headless Service in cluster mode) to the pod templates of a YAML stream, `--uninject`
//! takes exactly that away, and `ratekeeper webhook` (the server's `webhook` module, which
//! shares its TLS and metrics) does the same to pods as they are created, answering each
//! AdmissionReview with [`review`].
//!
//! The parts, all pure: [`node`] (an ordered YAML/JSON value, so field order survives),
//! [`settings`] (flags and the `ratekeeper.io/*` annotations, one table), [`sidecar`] (what
//! is added to one pod, and its removal), [`workload`] (documents, kinds, pod templates),
//! [`patch`] (JSONPatch from a pod to its injected self) and [`review`] (one
//! AdmissionReview answered).
//!
//! What it must not know: a transport, a store, the limiter. Its `Cargo.toml` is that
//! contract (ARCHITECTURE.md, "Crates").
//!
//! Invariants: the sidecar is deploy/kubernetes/deployment.yaml's; a pod is injected once
//! (twice changes nothing); nothing is written unless all of the input was understood; the
//! webhook never refuses a pod.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

pub mod node;
pub mod patch;
pub mod review;
pub mod settings;
pub mod sidecar;
pub mod workload;

#[cfg(test)]
mod tests;

pub use self::settings::SettingsArgs;

/// `ratekeeper inject`.
#[derive(Args)]
pub struct InjectArgs {
    /// Kubernetes YAML to read (several documents, `List`s too); `-` or nothing: stdin.
    pub input: Option<PathBuf>,
    /// Remove the sidecar that `inject` added (and the peers Services it wrote).
    #[arg(long)]
    pub uninject: bool,
    /// Refuse objects without a pod template (Services, ConfigMaps, custom resources, ...)
    /// instead of copying them unchanged.
    #[arg(long, conflicts_with = "pass_through")]
    pub strict: bool,
    /// Copy objects without a pod template unchanged: the default now, accepted so that
    /// older scripts keep working.
    #[arg(long)]
    pub pass_through: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

impl InjectArgs {
    /// Reads the input, rewrites it, writes it to stdout (all of it, or nothing on error);
    /// what was done to each document goes to stderr.
    pub fn run(&self) -> ExitCode {
        let text = match self.read() {
            Ok(text) => text,
            Err(error) => return fail(&error),
        };
        let options = workload::Options {
            mode: if self.uninject {
                workload::Mode::Uninject
            } else {
                workload::Mode::Inject
            },
            strict: self.strict,
            settings: self.settings.clone(),
        };
        let rewritten = match workload::rewrite(&text, &options) {
            Ok(rewritten) => rewritten,
            Err(error) => return fail(&format!("{}: {error}", self.input_name())),
        };
        let mut stdout = std::io::stdout().lock();
        if let Err(error) = stdout
            .write_all(rewritten.yaml.as_bytes())
            .and_then(|()| stdout.flush())
        {
            return fail(&format!("cannot write the output: {error}"));
        }
        for line in rewritten.report {
            eprintln!("{line}");
        }
        ExitCode::SUCCESS
    }

    fn input_name(&self) -> String {
        match &self.input {
            Some(path) if path.as_os_str() != "-" => path.display().to_string(),
            _ => "stdin".to_owned(),
        }
    }

    fn read(&self) -> Result<String, String> {
        let max = workload::MAX_INPUT_BYTES;
        let bytes = match &self.input {
            Some(path) if path.as_os_str() != "-" => {
                ratekeeper_core::files::read_regular(path, max)
                    .map_err(|error| format!("{}: {error}", path.display()))?
            }
            _ => {
                let mut bytes = Vec::new();
                std::io::stdin()
                    .lock()
                    .take(max + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|error| format!("stdin: {error}"))?;
                if bytes.len() as u64 > max {
                    return Err(format!("stdin: larger than {max} bytes"));
                }
                bytes
            }
        };
        String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", self.input_name()))
    }
}

fn fail(error: &str) -> ExitCode {
    eprintln!("{error}");
    ExitCode::FAILURE
}
