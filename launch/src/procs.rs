//! Child processes of the launcher and the transport benchmark: spawn the real binaries, read
//! their stdout line by line, keep the last lines of their stderr, and kill every one of them
//! when the group is dropped, on failure or on Ctrl-C.
//!
//! Children cannot outlive the launcher: each is spawned with `kill_on_drop`, every
//! [`ProcGroup`] kills its children when dropped, and on Linux each child also gets
//! `PR_SET_PDEATHSIG = SIGKILL`, so even a `kill -9` of the launcher takes them down. (The
//! death signal fires when the *thread* that spawned the child exits, so spawn from a thread
//! that lives as long as the launcher: the launcher uses a current-thread runtime on `main`.)

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, watch};

use pushpull_node::error::{CliError, CliResult};

/// How many stderr lines of each child are kept for error reports.
pub const STDERR_TAIL_LINES: usize = 30;

/// Where the node binaries are.
#[derive(Debug, Clone)]
pub struct Programs {
    /// Runs the scheduler: program and leading arguments.
    pub scheduler: (PathBuf, Vec<String>),
    /// Runs a server.
    pub server: (PathBuf, Vec<String>),
    /// Runs a worker.
    pub worker: (PathBuf, Vec<String>),
    /// The `pushpull` binary itself (for `bench` helpers).
    pub pushpull: PathBuf,
}

impl Programs {
    /// The sibling executables `pushpull-scheduler`, `pushpull-server`, `pushpull-worker` next
    /// to the running executable; where one doesn't exist (`cargo run --bin pushpull` builds
    /// only that one), `pushpull scheduler|server|worker`.
    pub fn from_current_exe() -> CliResult<Programs> {
        let exe = std::env::current_exe()
            .map_err(|e| CliError::failed(format!("cannot find the running executable: {e}")))?;
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        let is_pushpull = exe
            .file_stem()
            .is_some_and(|s| s.to_string_lossy() == "pushpull");
        let pushpull = if is_pushpull {
            exe.clone()
        } else {
            dir.join(format!("pushpull{}", std::env::consts::EXE_SUFFIX))
        };
        let pick = |role: &str| {
            let sibling = dir.join(format!("pushpull-{role}{}", std::env::consts::EXE_SUFFIX));
            if sibling.is_file() {
                (sibling, Vec::new())
            } else {
                (pushpull.clone(), vec![role.to_string()])
            }
        };
        Ok(Programs {
            scheduler: pick("scheduler"),
            server: pick("server"),
            worker: pick("worker"),
            pushpull,
        })
    }

    /// `pushpull` at `pushpull` running the scheduler and servers (`pushpull scheduler|server`)
    /// and the workers at `worker` (tests use `CARGO_BIN_EXE_*`, which names only this
    /// package's binaries).
    pub fn explicit(pushpull: &Path, worker: &Path) -> Programs {
        let sub = |role: &str| (pushpull.to_path_buf(), vec![role.to_string()]);
        Programs {
            scheduler: sub("scheduler"),
            server: sub("server"),
            worker: (worker.to_path_buf(), Vec::new()),
            pushpull: pushpull.to_path_buf(),
        }
    }
}

/// Something that happened to a child.
#[derive(Debug)]
pub enum Event {
    /// A line on the child's stdout.
    Line {
        /// Index of the child in its group.
        proc: usize,
        /// The line, without the newline.
        line: String,
    },
    /// The child exited (after all its stdout and stderr was read).
    Exit {
        /// Index of the child.
        proc: usize,
        /// How it exited.
        status: ExitStatus,
    },
}

struct Child {
    name: String,
    pid: u32,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    exited: Option<ExitStatus>,
}

/// Called with (child name, stderr line) for every stderr line when forwarding is on.
pub type StderrSink = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// A set of child processes that live and die together.
pub struct ProcGroup {
    children: Vec<Child>,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    pending: VecDeque<Event>,
    kill: watch::Sender<bool>,
    forward: Option<StderrSink>,
}

impl Default for ProcGroup {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcGroup {
    /// An empty group.
    pub fn new() -> ProcGroup {
        let (tx, rx) = mpsc::unbounded_channel();
        let (kill, _) = watch::channel(false);
        ProcGroup {
            children: Vec::new(),
            tx,
            rx,
            pending: VecDeque::new(),
            kill,
            forward: None,
        }
    }

    /// Forward every child's stderr lines to `sink` (they are kept for error reports anyway).
    pub fn forward_stderr(&mut self, sink: StderrSink) {
        self.forward = Some(sink);
    }

    /// Starts `program args` as child `name`; returns its index.
    pub fn spawn(&mut self, name: &str, program: &Path, args: &[String]) -> CliResult<usize> {
        self.spawn_with_env(name, program, args, &[])
    }

    /// [`ProcGroup::spawn`] with these environment variables added to the launcher's.
    pub fn spawn_with_env(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, std::ffi::OsString)],
    ) -> CliResult<usize> {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe; the closure touches nothing else.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            CliError::failed(format!("cannot start {name} ({}): {e}", program.display()))
        })?;
        let idx = self.children.len();
        let pid = child.id().unwrap_or(0);
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL_LINES)));
        let err_task = {
            let tail = tail.clone();
            let forward = self.forward.clone();
            let name = name.to_string();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(f) = &forward {
                        f(&name, &line);
                    }
                    let mut t = tail.lock().unwrap();
                    if t.len() == STDERR_TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            })
        };
        let tx = self.tx.clone();
        let mut kill = self.kill.subscribe();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut killed = *kill.borrow();
            loop {
                tokio::select! {
                    line = lines.next_line() => match line {
                        Ok(Some(line)) => { let _ = tx.send(Event::Line { proc: idx, line }); }
                        _ => break,
                    },
                    _ = kill.changed(), if !killed => {
                        killed = true;
                        let _ = child.start_kill();
                    }
                }
            }
            let status = loop {
                tokio::select! {
                    status = child.wait() => break status,
                    _ = kill.changed(), if !killed => {
                        killed = true;
                        let _ = child.start_kill();
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), err_task).await;
            if let Ok(status) = status {
                let _ = tx.send(Event::Exit { proc: idx, status });
            }
        });
        self.children.push(Child {
            name: name.to_string(),
            pid,
            stderr_tail: tail,
            exited: None,
        });
        Ok(idx)
    }

    /// Number of children.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether the group has no children.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Child `idx`'s name.
    pub fn name(&self, idx: usize) -> &str {
        &self.children[idx].name
    }

    /// Child `idx`'s process id.
    pub fn pid(&self, idx: usize) -> u32 {
        self.children[idx].pid
    }

    /// Whether every child has exited.
    pub fn all_exited(&self) -> bool {
        self.children.iter().all(|c| c.exited.is_some())
    }

    /// The last stderr lines of child `idx`.
    pub fn stderr_tail(&self, idx: usize) -> Vec<String> {
        self.children[idx]
            .stderr_tail
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .collect()
    }

    /// The next event of any child (`None` when no child can produce one any more).
    pub async fn next_event(&mut self) -> Option<Event> {
        let ev = match self.pending.pop_front() {
            Some(ev) => ev,
            None => {
                if self.all_exited() {
                    return None;
                }
                self.rx.recv().await?
            }
        };
        if let Event::Exit { proc, status } = &ev {
            self.children[*proc].exited = Some(*status);
        }
        Some(ev)
    }

    /// Waits until child `idx` prints a line starting with `prefix` and returns the rest of
    /// it. Other events are kept for [`ProcGroup::next_event`]. Fails if the child exits first
    /// (with its exit status and last stderr lines) or after `timeout`.
    pub async fn wait_line(
        &mut self,
        idx: usize,
        prefix: &str,
        timeout: Duration,
    ) -> CliResult<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut kept = VecDeque::new();
        let result = loop {
            let ev = match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => break Err(CliError::failed("child output channel closed")),
                Err(_) => {
                    break Err(CliError::failed(format!(
                        "{} did not print \"{prefix}...\" within {:.0} s{}",
                        self.children[idx].name,
                        timeout.as_secs_f64(),
                        self.tail_text(idx)
                    )))
                }
            };
            match &ev {
                Event::Line { proc, line } if *proc == idx && line.starts_with(prefix) => {
                    break Ok(line[prefix.len()..].trim().to_string())
                }
                Event::Exit { proc, status } if *proc == idx => {
                    let msg = self.failure_message(idx, *status);
                    self.children[idx].exited = Some(*status);
                    break Err(CliError::failed(msg));
                }
                Event::Exit { proc, status } => {
                    self.children[*proc].exited = Some(*status);
                    kept.push_back(ev);
                }
                _ => kept.push_back(ev),
            }
        };
        // Re-queue what we skipped, in order, ahead of anything still pending.
        kept.extend(self.pending.drain(..));
        self.pending = kept;
        result
    }

    /// Kills every child that is still running (SIGKILL).
    pub fn kill_all(&self) {
        let _ = self.kill.send(true);
    }

    /// Kills every child that is still running and waits, at most `limit`, until all have
    /// exited (their remaining events dropped), so that what they held (ports, a network
    /// namespace) is free when it returns.
    pub async fn kill_and_reap(&mut self, limit: Duration) {
        self.kill_all();
        let _ =
            tokio::time::timeout(limit, async { while self.next_event().await.is_some() {} }).await;
    }

    fn tail_text(&self, idx: usize) -> String {
        let tail = self.stderr_tail(idx);
        if tail.is_empty() {
            String::new()
        } else {
            format!(
                "; its last stderr lines:\n    {}",
                tail.iter()
                    .rev()
                    .take(12)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n    ")
            )
        }
    }

    /// "NAME (pid P) exited with code N; its last stderr lines: ...".
    pub fn failure_message(&self, idx: usize, status: ExitStatus) -> String {
        let how = match (status.code(), signal_of(status)) {
            (Some(c), _) => format!("exited with code {c}"),
            (None, Some(s)) => format!("was killed by signal {s}"),
            (None, None) => format!("exited with {status}"),
        };
        format!(
            "{} (pid {}) {how}{}",
            self.children[idx].name,
            self.children[idx].pid,
            self.tail_text(idx)
        )
    }
}

impl Drop for ProcGroup {
    fn drop(&mut self) {
        // Each child's task kills it; if the runtime shuts down first, dropping the task drops
        // the `tokio::process::Child`, whose `kill_on_drop` kills it.
        let _ = self.kill.send(true);
    }
}

fn signal_of(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}
