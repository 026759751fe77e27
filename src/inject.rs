//! Kubernetes sidecar injection: `ratekeeper inject` adds the ratekeeper container (and its
//! volumes, and the peers' headless Service in cluster mode) to the pod templates of a YAML
//! stream, `--uninject` takes exactly that away, and `ratekeeper webhook` does the same to
//! pods as they are created, as a mutating admission webhook.
//!
//! The parts: [`node`] (an ordered YAML/JSON value, so field order survives), [`settings`]
//! (flags and the `ratekeeper.io/*` annotations, one table), [`sidecar`] (what is added to
//! one pod, and its removal), [`workload`] (documents, kinds, pod templates), [`patch`]
//! (JSONPatch from a pod to its injected self), [`review`] (one AdmissionReview answered,
//! pure) and [`webhook`] (the HTTPS server).
//!
//! Invariants: the sidecar is deploy/kubernetes/deployment.yaml's; a pod is injected once
//! (twice changes nothing); nothing is written unless all of the input was understood; the
//! webhook never refuses a pod.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::transport::tls::TlsOptions;

pub mod node;
pub mod patch;
pub mod review;
pub mod settings;
pub mod sidecar;
pub mod webhook;
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
    /// Copy objects without a pod template (Services, ConfigMaps, ...) unchanged instead of
    /// refusing them.
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
            pass_through: self.pass_through,
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
            Some(path) if path.as_os_str() != "-" => crate::files::read_regular(path, max)
                .map_err(|error| format!("{}: {error}", path.display()))?,
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

/// `ratekeeper webhook`.
#[derive(Args)]
pub struct WebhookArgs {
    /// The HTTPS listener the API server calls.
    #[arg(long, env = "RATEKEEPER_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    /// Plain HTTP: /healthcheck and /metrics.
    #[arg(
        long,
        env = "RATEKEEPER_WEBHOOK_HTTP_ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub http_addr: SocketAddr,
    /// The server's certificate chain (PEM), reloaded when it changes.
    #[arg(long, env = "RATEKEEPER_WEBHOOK_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "RATEKEEPER_WEBHOOK_TLS_KEY")]
    pub tls_key: PathBuf,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

impl WebhookArgs {
    /// Serves until `shutdown` resolves; prints `ratekeeper webhook serving https=.. http=..`
    /// once bound.
    pub fn run(
        &self,
        runtime: &tokio::runtime::Runtime,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> ExitCode {
        // The defaults must make valid settings, else every pod would be refused.
        if let Err(error) = self.settings.for_pod(None) {
            return fail(&error);
        }
        let options = webhook::WebhookOptions {
            addr: self.addr,
            http_addr: self.http_addr,
            tls: TlsOptions {
                cert: self.tls_cert.clone(),
                key: self.tls_key.clone(),
                client_ca: None,
                client_san: None,
            },
            settings: self.settings.clone(),
        };
        let result = runtime.block_on(async {
            let server = webhook::Webhook::bind(&options).await?;
            let (https, http) = (server.https_addr(), server.http_addr());
            if let (Ok(https), Ok(http)) = (https, http) {
                println!("ratekeeper webhook serving https={https} http={http}");
                let _ = std::io::stdout().flush();
                tracing::info!(%https, %http, "webhook serving");
            }
            server.run(shutdown).await
        });
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => fail(&error.to_string()),
        }
    }
}

fn fail(error: &str) -> ExitCode {
    eprintln!("{error}");
    ExitCode::FAILURE
}
