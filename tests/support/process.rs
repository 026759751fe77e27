//! Child processes: [`Process`] captures a child's stdout lines and stderr on background
//! threads, and [`run_to_end`] runs a command to completion.
//!
//! A child never blocks on a full pipe, is killed and reaped when its handle drops, and a
//! failure ([`Process::fail`]) panics with its exit status and stderr.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::poll::{eventually, eventually_some};

/// How long a process gets to start serving.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The most stderr kept per child (the tail is kept).
const STDERR_CAP: usize = 256 * 1024;

/// A running child whose stdout lines and stderr are collected by background threads (so
/// the child never blocks on a full pipe). Killed and reaped on drop.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    stdout: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// Set once stderr reached EOF.
    stderr_done: Arc<AtomicBool>,
}

impl Process {
    /// Spawns `command` with stdin closed and stdout/stderr captured.
    pub fn spawn(name: &str, command: &mut Command) -> Process {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {name} ({command:?}): {error}"));
        let (lines, stdout) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    // The receiver may be gone; keep draining regardless.
                    let _ = lines.send(line);
                }
            });
        }
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_done = Arc::new(AtomicBool::new(false));
        if let Some(mut err) = child.stderr.take() {
            let (sink, done) = (Arc::clone(&stderr), Arc::clone(&stderr_done));
            thread::spawn(move || {
                let mut buffer = [0u8; 8192];
                while let Ok(read @ 1..) = err.read(&mut buffer) {
                    let mut kept = sink.lock().unwrap_or_else(|poison| poison.into_inner());
                    kept.extend(&buffer[..read]);
                    let excess = kept.len().saturating_sub(STDERR_CAP);
                    kept.drain(..excess);
                }
                done.store(true, Ordering::Release);
            });
        }
        Process {
            name: name.to_owned(),
            child,
            stdout,
            stderr,
            stderr_done,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// What the child wrote to stderr so far (at most the last 256 KiB).
    pub fn stderr(&self) -> String {
        let kept = self
            .stderr
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let (front, back) = kept.as_slices();
        String::from_utf8_lossy(&[front, back].concat()).into_owned()
    }

    /// Its stderr once it holds `needle`, waiting at most five seconds: stderr is read by its
    /// own thread, so a line written before a stdout line may still be on its way.
    pub fn stderr_with(&self, needle: &str) -> String {
        eventually(Duration::from_secs(5), || self.stderr().contains(needle));
        self.stderr()
    }

    /// The exit status if the child has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The next stdout line, waiting at most `timeout`. Panics (with stderr) if the child
    /// closes stdout or the time runs out.
    pub fn stdout_line(&mut self, timeout: Duration) -> String {
        match self.stdout.recv_timeout(timeout) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                self.fail(&format!("printed no line on stdout within {timeout:?}"))
            }
            Err(RecvTimeoutError::Disconnected) => self.fail("closed stdout"),
        }
    }

    /// Panics with `problem`, the exit status (if the child is gone) and its stderr.
    pub fn fail(&mut self, problem: &str) -> ! {
        // Give a dying child a moment so its status and last words are seen.
        eventually(Duration::from_secs(1), || self.exited().is_some());
        let status = match self.exited() {
            Some(status) => format!("exited with {status}"),
            None => "still running".to_owned(),
        };
        panic!(
            "{} {problem} ({status}); its stderr:\n{}",
            self.name,
            self.stderr()
        );
    }

    /// Sends `signal` (`kill`'s flag: `-TERM`, `-STOP`, `-CONT`, `-KILL`) to the child.
    pub fn signal(&mut self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {}", self.id());
    }

    /// Kills the child and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `command` to completion within `timeout` (killing it otherwise); returns status,
/// stdout and stderr.
pub fn run_to_end(
    name: &str,
    command: &mut Command,
    timeout: Duration,
) -> (ExitStatus, String, String) {
    let mut process = Process::spawn(name, command);
    let Some(status) = eventually_some(timeout, || process.exited()) else {
        process.fail(&format!("did not finish within {timeout:?}"));
    };
    let mut stdout = Vec::new();
    while let Ok(line) = process.stdout.recv_timeout(Duration::from_secs(1)) {
        stdout.push(line);
    }
    // The reader threads may lag the exit a moment.
    eventually(Duration::from_secs(2), || {
        process.stderr_done.load(Ordering::Acquire)
    });
    let stderr = process.stderr();
    (status, stdout.join("\n"), stderr)
}
