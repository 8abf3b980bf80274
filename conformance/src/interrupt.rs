//! What a harness ended by a signal (Ctrl-C, `kill`, a closed terminal or pipe) undoes before
//! it goes: the engines' process groups it started, which no longer receive the terminal's
//! signals themselves (CONTRACT.md §2), and the scratch directories it made (written-out
//! cases and goldens, synthetic checkpoints), which would otherwise stay behind in the
//! temporary directory at every interrupted run.
//!
//! The handler itself only wakes a watcher thread through a pipe (a handler may not allocate
//! or list directories). The watcher removes the scratch directories, kills the registered
//! groups (a fixed table of atomics) and ends the process by the same signal with its
//! default action. A second signal, or one arriving before the watcher exists, kills the
//! groups and ends the process from the handler at once. Signals the process ignores stay
//! ignored.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

/// Process groups of running engines (a signal handler may not lock or allocate).
static GROUPS: [AtomicI32; 64] = [const { AtomicI32::new(0) }; 64];
/// The signal that ended the harness, 0 while none has.
static ENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The write end of the watcher's pipe, -1 until the watcher runs.
static WAKE_WATCHER: AtomicI32 = AtomicI32::new(-1);
/// Scratch directories to remove when a signal ends the harness.
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

const SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE];

/// Puts the engine process group `g` (its leader's pid) under the signal cleanup. A group
/// started after a signal arrived is ended at once.
pub fn register_group(g: i32) {
    // A full table only loses the cleanup on a signal; the handle's Drop still ends it.
    for slot in &GROUPS {
        if slot
            .compare_exchange(0, g, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            break;
        }
    }
    if ENDING_SIGNAL.load(Ordering::SeqCst) != 0 {
        kill_group(g);
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

fn end_groups() {
    for slot in &GROUPS {
        let g = slot.swap(0, Ordering::SeqCst);
        if g > 0 {
            kill_group(g);
        }
    }
}

/// A temporary directory removed when dropped, as [`tempfile::TempDir`], and also when a
/// signal ends the harness.
#[derive(Debug)]
pub struct ScratchDir {
    dir: tempfile::TempDir,
}

impl ScratchDir {
    /// A new directory `<prefix>XXXXXX` in the system's temporary directory.
    pub fn new(prefix: &str) -> std::io::Result<ScratchDir> {
        install();
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        lock_scratch().push(dir.path().to_path_buf());
        Ok(ScratchDir { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        lock_scratch().retain(|p| p != self.dir.path());
        // The TempDir field then removes the directory.
    }
}

fn lock_scratch() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    // A panic elsewhere while holding the list leaves it intact (pushes and retains only).
    SCRATCH
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

extern "C" fn on_signal(sig: libc::c_int) {
    let first = ENDING_SIGNAL
        .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok();
    let wake = WAKE_WATCHER.load(Ordering::SeqCst);
    if first && wake >= 0 {
        // SAFETY: write(2) is async-signal-safe; the byte only wakes the watcher, which
        // reads the signal from ENDING_SIGNAL.
        let written = unsafe { libc::write(wake, [1u8].as_ptr().cast(), 1) };
        if written == 1 {
            return;
        }
    }
    end_groups();
    end_by(sig);
}

/// Ends the process as `sig` with its default action would: at once from a thread, or, from
/// the handler (where `sig` is blocked), as the handler returns.
fn end_by(sig: libc::c_int) {
    // SAFETY: signal(2) and raise(3) are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn watch(read_end: libc::c_int) {
    let mut byte = 0u8;
    loop {
        // SAFETY: reads one byte into a local buffer from the pipe this thread owns.
        let n = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            break;
        }
        if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
    // The engines keep running (and the harness waiting on them) until the directories are
    // gone: a harness that saw its engines die would go on with its run meanwhile, and might
    // even finish it and exit with a verdict instead of the signal.
    let sig = ENDING_SIGNAL.load(Ordering::SeqCst);
    for dir in lock_scratch().iter() {
        let _ = std::fs::remove_dir_all(dir);
    }
    end_groups();
    end_by(sig);
    // Not reached: the four signals handled here end a process by default.
    std::process::exit(128 + sig);
}

/// Installs the handlers and starts the watcher, once per process; before the harness
/// starts what a signal must undo.
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut ends = [-1; 2];
        // SAFETY: pipe2 fills `ends` with two new descriptors, closed on exec so engines do
        // not inherit them.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
            let read_end = ends[0];
            let started = std::thread::Builder::new()
                .name("ds41-signal-cleanup".into())
                .spawn(move || watch(read_end));
            if started.is_ok() {
                WAKE_WATCHER.store(ends[1], Ordering::SeqCst);
            }
        }
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
