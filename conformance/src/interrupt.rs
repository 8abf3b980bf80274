//! What a harness ended by a signal (Ctrl-C, `kill`, a closed terminal or pipe) leaves behind:
//! nothing. The engines' process groups it started no longer receive the terminal's signals
//! themselves (CONTRACT.md §2), and its scratch directories (written-out cases and goldens,
//! synthetic checkpoints) would otherwise stay in the temporary directory at every interrupted
//! run.
//!
//! * Engine groups: the signal handler kills the registered groups (a fixed table of atomics,
//!   `kill(2)`: what a handler may do) and ends the process by the same signal with its
//!   default action. Signals the process ignores stay ignored.
//! * Scratch directories: a handler may not list and remove directories, and a thread doing it
//!   would race the harness, which goes on writing into them (and would stop with an error
//!   about its vanished files rather than by the signal). So the first scratch directory starts
//!   a small cleaner process in a process group of its own (out of reach of the terminal's
//!   Ctrl-C) that is told each directory's path through a pipe and removes them once that pipe
//!   closes, i.e. once the harness has ended, however it ended (a signal, `kill -9`, a normal
//!   exit after which they are gone already).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

/// Process groups of running engines (a signal handler may not lock or allocate).
static GROUPS: [AtomicI32; 64] = [const { AtomicI32::new(0) }; 64];
/// The write end of the cleaner's pipe: one path per line; closed when the harness ends.
static CLEANER: Mutex<Option<ChildStdin>> = Mutex::new(None);

const SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE];

/// Removes every directory named on its standard input once that input ends (sh and rm are
/// POSIX; the harness already runs engines through `sh -c`).
const CLEANER_SCRIPT: &str =
    r#"while IFS= read -r dir; do set -- "$@" "$dir"; done; [ "$#" -eq 0 ] || exec rm -rf -- "$@""#;

/// Puts the engine process group `g` (its leader's pid) under the signal cleanup.
pub fn register_group(g: i32) {
    // A full table only loses the cleanup on a signal; the handle's Drop still ends it.
    for slot in &GROUPS {
        if slot
            .compare_exchange(0, g, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

pub fn unregister_group(g: i32) {
    for slot in &GROUPS {
        let _ = slot.compare_exchange(g, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Ends the whole process group `g` (SIGKILL).
pub fn kill_group(g: i32) {
    // SAFETY: kill(2) with a negative pid signals the process group `g`, which the engine
    // handle created (process_group(0) makes the engine the leader of a group with its own
    // pid). kill(2) is async-signal-safe.
    unsafe {
        libc::kill(-g, libc::SIGKILL);
    }
}

/// A temporary directory removed when dropped, as [`tempfile::TempDir`], and also after a
/// harness that ended without dropping it (a signal, `kill -9`).
#[derive(Debug)]
pub struct ScratchDir {
    dir: tempfile::TempDir,
}

impl ScratchDir {
    /// A new directory `<prefix>XXXXXX` in the system's temporary directory.
    pub fn new(prefix: &str) -> std::io::Result<ScratchDir> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        remove_after_exit(dir.path());
        Ok(ScratchDir { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Tells the cleaner (started on first use) to remove `dir` once the harness has ended. Best
/// effort: without a cleaner (no `sh`), or for a path a line cannot carry, only Drop removes it.
fn remove_after_exit(dir: &Path) {
    let Some(line) = dir.to_str().filter(|p| !p.contains('\n')) else {
        return;
    };
    let mut cleaner = CLEANER.lock().unwrap_or_else(|e| e.into_inner());
    if cleaner.is_none() {
        *cleaner = Command::new("sh")
            .args(["-c", CLEANER_SCRIPT, "ds41-scratch-cleaner"])
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
            .and_then(|mut child| child.stdin.take());
    }
    if let Some(pipe) = cleaner.as_mut() {
        if writeln!(pipe, "{line}")
            .and_then(|()| pipe.flush())
            .is_err()
        {
            *cleaner = None;
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    for slot in &GROUPS {
        let g = slot.swap(0, Ordering::SeqCst);
        if g > 0 {
            kill_group(g);
        }
    }
    // SAFETY: signal(2) and raise(3) are async-signal-safe; `sig` is blocked while this
    // handler runs, so the default action ends the process as the handler returns.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Installs the handlers, once per process; before the harness starts what a signal must
/// undo.
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in SIGNALS {
            // SAFETY: installs an async-signal-safe handler; the previous disposition is
            // restored when it was "ignore".
            unsafe {
                let handler = on_signal as extern "C" fn(libc::c_int);
                let old = libc::signal(sig, handler as libc::sighandler_t);
                if old == libc::SIG_IGN {
                    libc::signal(sig, libc::SIG_IGN);
                }
            }
        }
    });
}
