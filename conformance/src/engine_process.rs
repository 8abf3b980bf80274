//! Engine processes under the harness's control (CONTRACT.md §2): the one place where the
//! harness starts an engine, writes to it and reads from it, shared by protocol adapters and
//! command profiles.
//!
//! An engine may hang, flood its output, stop reading its input or leave processes behind;
//! none of that may hang, exhaust or outlive the harness. So:
//! * every engine runs in its **own process group**, ended as a whole (SIGKILL) on timeout,
//!   on garbage, when the command has finished and when the handle is dropped; a harness
//!   ended by a signal ends the groups still running first ([`crate::interrupt`]);
//! * every pipe is read by its own thread in bounded chunks into a bounded queue, and the
//!   harness waits on that queue with the caller's **deadline**; writes go through a writer
//!   thread, so an engine that stops reading cannot block the harness either;
//! * stdout is read against a byte **budget** (a reply line, a command's whole output) and
//!   stderr is kept as a bounded tail.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::interrupt::{kill_group, register_group, unregister_group};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes one protocol reply may take on stdout, blank lines included.
pub const MAX_REPLY_BYTES: usize = 64 << 20;
/// Bytes a command-profile command may write on stdout (ids, a prompt, a parsed message).
pub const MAX_STDOUT_BYTES: usize = 64 << 20;
/// How long a finished command's leftover processes may keep its stdout open.
const LEFTOVER_GRACE: Duration = Duration::from_secs(1);
const STDERR_TAIL_BYTES: usize = 16 << 10;
const STDERR_TAIL_LINES: usize = 40;
const STDERR_LINE_CHARS: usize = 400;
/// How long, after the group ended, the stderr reader may take to reach end of file.
const STDERR_DRAIN: Duration = Duration::from_millis(200);
const CHUNK_BYTES: usize = 64 << 10;
const QUEUED_CHUNKS: usize = 16;
/// How often a wait looks at the process while no output arrives.
const POLL: Duration = Duration::from_millis(20);

/// Why a read returned no (complete) data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The deadline passed first.
    Timeout,
    /// stdout reached end of file (the engine exited or closed it) before the data was complete.
    Closed,
    /// More bytes than the budget allowed.
    OverBudget,
    /// stdout could not be read (the message says why).
    Io(String),
}

enum Chunk {
    Data(Vec<u8>),
    End,
    Error(String),
}

/// How a finished command ended, with its stdout.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
}

/// Why a command run to completion produced no [`Finished`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    Timeout,
    /// More than this many bytes on stdout.
    StdoutOverBudget(usize),
    /// The command exited (with this description) but processes it started kept its stdout
    /// open.
    LeftoverHoldsStdout(String),
    Io(String),
}

/// A running engine: its process group, its pipes and its stderr tail.
pub struct EngineProcess {
    child: Child,
    group: i32,
    input: Option<Sender<Vec<u8>>>,
    /// Bytes queued for stdin and bytes the engine has taken, so a hang can be told apart
    /// from an engine that stopped reading.
    input_progress: Arc<InputProgress>,
    output: Receiver<Chunk>,
    /// Bytes read from stdout not yet returned: `pending[start..]`.
    pending: Vec<u8>,
    start: usize,
    output_ended: bool,
    stderr: Arc<Mutex<Tail>>,
    stderr_ended: Receiver<()>,
    status: Option<ExitStatus>,
}

impl EngineProcess {
    /// Start `cmd` in a new process group with piped stdout and stderr; stdin is piped when
    /// `with_stdin` (then feed it with [`EngineProcess::send`]), else `/dev/null`.
    pub fn spawn(cmd: &mut Command, with_stdin: bool) -> std::io::Result<EngineProcess> {
        crate::interrupt::install();
        cmd.process_group(0)
            .stdin(if with_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let group = child.id() as i32;
        register_group(group);
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let (tx, output) = mpsc::sync_channel(QUEUED_CHUNKS);
        std::thread::spawn(move || pump_stdout(stdout, tx));
        let tail = Arc::new(Mutex::new(Tail::default()));
        let t = Arc::clone(&tail);
        let (ended, stderr_ended) = mpsc::channel();
        std::thread::spawn(move || {
            pump_stderr(stderr, t);
            let _ = ended.send(());
        });
        let input_progress = Arc::new(InputProgress::default());
        let input = child.stdin.take().map(|stdin| {
            let (tx, rx) = mpsc::channel::<Vec<u8>>();
            let progress = Arc::clone(&input_progress);
            std::thread::spawn(move || feed_stdin(stdin, rx, &progress));
            tx
        });
        Ok(EngineProcess {
            child,
            group,
            input,
            input_progress,
            output,
            pending: Vec::new(),
            start: 0,
            output_ended: false,
            stderr: tail,
            stderr_ended,
            status: None,
        })
    }

    /// Queue bytes for the engine's stdin; never blocks (a writer thread feeds the pipe), so
    /// an engine that stops reading shows as silence until the deadline.
    pub fn send(&mut self, bytes: Vec<u8>) {
        if let Some(tx) = &self.input {
            let n = bytes.len() as u64;
            if tx.send(bytes).is_ok() {
                self.input_progress.queued.fetch_add(n, Ordering::SeqCst);
            }
        }
    }

    /// Bytes sent with [`EngineProcess::send`] that the engine has not taken from its stdin
    /// yet (beyond what the pipe buffers): nonzero at a timeout means it stopped reading.
    pub fn unread_input(&self) -> u64 {
        let p = &self.input_progress;
        p.queued
            .load(Ordering::SeqCst)
            .saturating_sub(p.written.load(Ordering::SeqCst))
    }

    /// Close the engine's stdin once everything queued is written (end of input).
    pub fn close_stdin(&mut self) {
        self.input = None;
    }

    /// The next stdout line that is not blank (without its `\n`), waiting at most until
    /// `deadline`. Every byte consumed, blank lines included, counts against `budget`; more
    /// is [`ReadError::OverBudget`], so neither a line without end nor endless blank lines
    /// outlast the budget or the deadline. An engine that has exited and written nothing more
    /// for a moment is [`ReadError::Closed`], even while a process it started holds stdout.
    pub fn read_line(&mut self, deadline: Instant, budget: usize) -> Result<Vec<u8>, ReadError> {
        // `used`: bytes of earlier (blank) lines; `seen`: bytes of the current line known
        // to hold no newline (offsets relative to `start`, which moves when chunks arrive).
        let (mut used, mut seen) = (0, 0);
        loop {
            let rest = &self.pending[self.start..];
            let Some(i) = rest[seen..].iter().position(|&b| b == b'\n') else {
                seen = rest.len();
                if used + seen > budget {
                    return Err(ReadError::OverBudget);
                }
                self.next_chunk_while_alive(deadline)?;
                continue;
            };
            let len = seen + i;
            used += len + 1;
            if used > budget {
                return Err(ReadError::OverBudget);
            }
            let line = self.start..self.start + len;
            self.start += len + 1;
            seen = 0;
            if !self.pending[line.clone()]
                .iter()
                .all(u8::is_ascii_whitespace)
            {
                return Ok(self.pending[line].to_vec());
            }
        }
    }

    /// [`EngineProcess::next_chunk`], but an engine found exited while no output arrives
    /// ends the wait as [`ReadError::Closed`].
    fn next_chunk_while_alive(&mut self, deadline: Instant) -> Result<(), ReadError> {
        loop {
            let slice = deadline.min(Instant::now() + POLL * 5);
            match self.next_chunk(slice) {
                Err(ReadError::Timeout) if Instant::now() < deadline => {
                    if self.try_status().is_some() {
                        return Err(ReadError::Closed);
                    }
                }
                other => return other,
            }
        }
    }

    /// Everything up to end of file, within `budget` bytes and before `deadline`.
    fn read_to_end(&mut self, deadline: Instant, budget: usize) -> Result<Vec<u8>, ReadError> {
        loop {
            if self.pending.len() - self.start > budget {
                return Err(ReadError::OverBudget);
            }
            match self.next_chunk(deadline) {
                Ok(()) => {}
                Err(ReadError::Closed) => {
                    let rest = self.pending.split_off(self.start);
                    self.pending.clear();
                    self.start = 0;
                    return Ok(rest);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Append the next chunk of stdout to `pending`.
    fn next_chunk(&mut self, deadline: Instant) -> Result<(), ReadError> {
        if self.output_ended {
            return Err(ReadError::Closed);
        }
        // Checked before every chunk, so a flood of output cannot postpone the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Timeout);
        }
        match self.output.recv_timeout(left) {
            Ok(Chunk::Data(d)) => {
                // What was returned already goes before more is appended.
                self.pending.drain(..self.start);
                self.start = 0;
                self.pending.extend_from_slice(&d);
                Ok(())
            }
            Ok(Chunk::End) | Err(RecvTimeoutError::Disconnected) => {
                self.output_ended = true;
                Err(ReadError::Closed)
            }
            Ok(Chunk::Error(e)) => {
                self.output_ended = true;
                Err(ReadError::Io(e))
            }
            Err(RecvTimeoutError::Timeout) => Err(ReadError::Timeout),
        }
    }

    /// The exit status if the engine has exited (without waiting).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Wait for the engine to exit, at most until `deadline`.
    pub fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(s) = self.try_status() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
        }
    }

    /// Run a command (spawned without stdin) to completion: its stdout within
    /// [`MAX_STDOUT_BYTES`], its exit status, all before `deadline`. Processes it leaves
    /// behind are ended with its group; if they hold its stdout open past a short grace
    /// after it exits, that is [`RunError::LeftoverHoldsStdout`].
    pub fn run_to_completion(&mut self, deadline: Instant) -> Result<Finished, RunError> {
        let mut deadline = deadline;
        let mut exited_at: Option<Instant> = None;
        let result = loop {
            // Read in short slices so the exit of the command itself is noticed while a
            // leftover process keeps the pipe open.
            let slice = deadline.min(Instant::now() + POLL * 5);
            match self.read_to_end(slice, MAX_STDOUT_BYTES) {
                Ok(stdout) => break Ok(stdout),
                Err(ReadError::Timeout) if Instant::now() < deadline => {
                    if exited_at.is_none() && self.try_status().is_some() {
                        let now = Instant::now();
                        exited_at = Some(now);
                        deadline = deadline.min(now + LEFTOVER_GRACE);
                    }
                }
                Err(ReadError::Timeout) => match exited_at.and(self.status) {
                    Some(s) => break Err(RunError::LeftoverHoldsStdout(describe_status(s))),
                    None => break Err(RunError::Timeout),
                },
                Err(ReadError::OverBudget) => {
                    break Err(RunError::StdoutOverBudget(MAX_STDOUT_BYTES))
                }
                Err(ReadError::Closed) => unreachable!("read_to_end ends at end of file"),
                Err(ReadError::Io(e)) => break Err(RunError::Io(e)),
            }
        };
        let result = result.and_then(|stdout| match self.wait_until(deadline) {
            Some(status) => Ok(Finished { status, stdout }),
            None => Err(RunError::Timeout),
        });
        self.kill();
        result
    }

    /// The last lines of stderr, or "" when it said nothing.
    pub fn stderr_tail(&self) -> String {
        self.stderr.lock().map(|t| t.render()).unwrap_or_default()
    }

    /// End the whole process group (SIGKILL) and reap the engine; what it wrote to stderr
    /// before is then in the tail. Idempotent.
    pub fn kill(&mut self) {
        self.input = None;
        if self.group > 0 {
            kill_group(self.group);
            unregister_group(self.group);
            self.group = 0;
            if self.status.is_none() {
                self.status = self.child.wait().ok();
            }
            // The pipe closes with the group (unless a process escaped it into a session of
            // its own): let the reader take what is left in it.
            let _ = self.stderr_ended.recv_timeout(STDERR_DRAIN);
        }
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// "exited with status 3", "was killed by signal 11 (SIGSEGV)".
pub fn describe_status(s: ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!(
            "was killed by signal {sig} ({}){}",
            signal_name(sig),
            if s.core_dumped() { ", core dumped" } else { "" }
        ),
        (None, None) => format!("ended ({s})"),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => "unnamed signal",
    }
}

/// "invalid UTF-8 at byte 12 of 40" for a message about text the engine wrote.
pub fn utf8_problem(bytes: &[u8]) -> Option<String> {
    std::str::from_utf8(bytes).err().map(|e| {
        format!(
            "not UTF-8 (invalid byte 0x{:02x} at offset {} of {})",
            bytes[e.valid_up_to()],
            e.valid_up_to(),
            bytes.len()
        )
    })
}

fn pump_stdout(mut from: impl Read, to: SyncSender<Chunk>) {
    loop {
        let mut buf = vec![0u8; CHUNK_BYTES];
        let msg = match from.read(&mut buf) {
            Ok(0) => Chunk::End,
            Ok(n) => {
                buf.truncate(n);
                Chunk::Data(buf)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => Chunk::Error(e.to_string()),
        };
        let last = !matches!(msg, Chunk::Data(_));
        // Fails once the reader is gone (the engine was discarded): stop reading then.
        if to.send(msg).is_err() || last {
            return;
        }
    }
}

fn pump_stderr(mut from: impl Read, tail: Arc<Mutex<Tail>>) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if let Ok(mut t) = tail.lock() {
                    t.push(&buf[..n]);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[derive(Default)]
struct InputProgress {
    queued: AtomicU64,
    written: AtomicU64,
}

fn feed_stdin(mut to: impl Write, from: Receiver<Vec<u8>>, progress: &InputProgress) {
    // Ends when the engine stops taking input (its group was killed) or the sender is gone.
    // Written in chunks so the progress shows how far an engine that stopped reading got.
    for bytes in from {
        for chunk in bytes.chunks(CHUNK_BYTES) {
            if to.write_all(chunk).and_then(|_| to.flush()).is_err() {
                return;
            }
            progress
                .written
                .fetch_add(chunk.len() as u64, Ordering::SeqCst);
        }
    }
}

/// The last [`STDERR_TAIL_BYTES`] of a stream.
#[derive(Default)]
struct Tail {
    bytes: std::collections::VecDeque<u8>,
    dropped: u64,
}

impl Tail {
    fn push(&mut self, b: &[u8]) {
        self.bytes.extend(b);
        let over = self.bytes.len().saturating_sub(STDERR_TAIL_BYTES);
        self.bytes.drain(..over);
        self.dropped += over as u64;
    }

    fn render(&self) -> String {
        let (a, b) = self.bytes.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(STDERR_TAIL_LINES);
        let shown: Vec<String> = lines[start..]
            .iter()
            .map(|l| {
                let n = l.chars().count();
                if n > STDERR_LINE_CHARS {
                    let tail: String = l.chars().skip(n - STDERR_LINE_CHARS).collect();
                    format!("[{} chars cut]…{tail}", n - STDERR_LINE_CHARS)
                } else {
                    l.to_string()
                }
            })
            .collect();
        if shown.is_empty() {
            return String::new();
        }
        let cut = match (self.dropped, start) {
            (0, 0) => String::new(),
            (0, lines) => format!(", {lines} earlier lines not shown"),
            (bytes, _) => format!(", more than {bytes} earlier bytes not shown"),
        };
        format!(
            "\n--- engine stderr (last {} lines{cut}) ---\n{}",
            shown.len(),
            shown.join("\n")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, stdin: bool) -> EngineProcess {
        EngineProcess::spawn(Command::new("sh").arg("-c").arg(script), stdin).unwrap()
    }

    fn soon(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[test]
    fn blank_lines_are_skipped_and_charged_to_the_budget() {
        let mut p = sh("printf 'a\\n\\n \\nbc\\nrest'", false);
        assert_eq!(p.read_line(soon(5000), 100).unwrap(), b"a");
        assert_eq!(p.read_line(soon(5000), 100).unwrap(), b"bc");
        assert_eq!(p.read_line(soon(5000), 100), Err(ReadError::Closed));
        let mut p = sh("printf '\\n\\n\\n\\nabc\\n'", false);
        assert_eq!(p.read_line(soon(5000), 7), Err(ReadError::OverBudget));
        let mut p = sh("printf '\\n\\n\\n\\nabc\\n'", false);
        assert_eq!(p.read_line(soon(5000), 8).unwrap(), b"abc");
    }

    #[test]
    fn endless_blank_lines_exhaust_the_budget() {
        let mut p = sh("yes ''", false);
        let started = Instant::now();
        assert_eq!(p.read_line(soon(5000), 1 << 20), Err(ReadError::OverBudget));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_line_without_end_is_over_budget() {
        let mut p = sh("exec cat /dev/zero", false);
        assert_eq!(p.read_line(soon(5000), 1 << 20), Err(ReadError::OverBudget));
    }

    #[test]
    fn silence_times_out_at_the_deadline() {
        let mut p = sh("sleep 30", false);
        let started = Instant::now();
        assert_eq!(p.read_line(soon(200), 100), Err(ReadError::Timeout));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn stderr_is_a_bounded_tail() {
        let mut p = sh(
            "head -c 3000000 /dev/zero | tr '\\0' x >&2; echo; echo last words >&2",
            false,
        );
        let f = p.run_to_completion(soon(10_000)).unwrap();
        assert!(f.status.success());
        let tail = p.stderr_tail();
        assert!(
            tail.contains("last words") && tail.len() < 2 * STDERR_TAIL_BYTES,
            "{}",
            tail.len()
        );
        assert!(tail.contains("earlier bytes not shown"), "{tail}");
    }

    #[test]
    fn a_leftover_process_holding_stdout_is_named_and_ended() {
        let mut p = sh("sleep 30 & echo started", false);
        let started = Instant::now();
        let r = p.run_to_completion(soon(20_000));
        assert_eq!(
            r.err(),
            Some(RunError::LeftoverHoldsStdout("exited with status 0".into()))
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_writer_blocked_on_a_deaf_engine_does_not_block_the_harness() {
        let mut p = sh("sleep 30", true);
        p.send(vec![b'x'; 2 << 20]);
        assert_eq!(p.read_line(soon(300), 100), Err(ReadError::Timeout));
        p.kill();
    }

    #[test]
    fn signals_are_described_by_name() {
        let mut p = sh("kill -SEGV $$", false);
        let f = p.run_to_completion(soon(5000)).unwrap();
        assert_eq!(
            describe_status(f.status),
            "was killed by signal 11 (SIGSEGV)"
        );
        assert_eq!(
            utf8_problem(b"ok\xff").as_deref(),
            Some("not UTF-8 (invalid byte 0xff at offset 2 of 3)")
        );
    }
}
