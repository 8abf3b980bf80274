//! Opening the files the engine reads: one place that refuses what must not be read.
//!
//! * [`read_file`]: a regular file, read whole, at most `limit` bytes (the bound its format
//!   allows). A FIFO, a device, a directory or a socket is refused with
//!   [`Error::NotRegularFile`] naming it *before* anything blocks on it: the file is opened
//!   with `O_NONBLOCK` (so opening a FIFO does not wait for a writer) and checked with
//!   `fstat` on the opened descriptor (so a symlink to `/dev/zero` is judged by what it points
//!   to, and nothing can swap the file between the check and the read).
//! * [`map_file`]: the same checks, then a read-only memory map ([`MappedFile`]) that
//!   remembers the file's identity (device, inode), length and modification time, so a caller
//!   can ask before publishing results whether the file changed under it
//!   ([`MappedFile::check_unchanged`]).
//!
//! ## A mapped file truncated while in use
//!
//! Reading a page of a mapping beyond the end of a file that shrank after it was mapped
//! raises `SIGBUS`; by default the process dies with no message. Every [`MappedFile`]
//! registers its address range in a fixed table together with a message formatted in
//! advance. A `SIGBUS` handler (installed once, with the first mapping) looks the fault
//! address up in that table; when it falls inside a registered mapping it writes that one
//! line to stderr with `write(2)` and ends the process with `_exit(`[`EXIT_MAPPED_FILE_CHANGED`]`)`.
//! Everything the handler does is async-signal-safe: atomic loads, `write`, `_exit`; no
//! allocation, no lock, no formatting. A fault elsewhere is passed on to the handler that was
//! installed before (Rust's own stack-overflow handler, or the default action).
//!
//! Messages are never freed (one per distinct path, reused when the same file is mapped
//! again), so the handler can never read freed memory even if it races with a drop on another
//! thread. With more than [`REGISTRY_SLOTS`] mappings alive at once the
//! extra ones are unregistered and a truncation of one of them ends the process the default
//! way.

use std::fs::{File, Metadata};
use std::io::Read;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::{Error, Result};

/// Exit status of a process whose memory-mapped input file was truncated while in use
/// (`EX_IOERR` of sysexits.h).
pub const EXIT_MAPPED_FILE_CHANGED: i32 = 74;

/// Bound for the JSON metadata files (config.json, manifest.json, engram.json,
/// specials.json, a safetensors index). The largest real one, the release index, is a few MB.
pub const MAX_JSON_BYTES: u64 = 256 << 20;

/// Bound for a tokenizer.json (the DS41 one is about 8 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What kind of file `meta` describes, for [`Error::NotRegularFile`].
fn kind_name(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Whether anything (a file, a FIFO, a device, a dangling symlink) exists at `path`. Use this
/// rather than `Path::is_file` to decide whether an optional input is present: `is_file` is
/// false for a FIFO or a symlink to a device, which would then be reported as missing instead
/// of refused for what it is.
pub fn present(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Open `path` for reading if it is a regular file (following symlinks), without blocking on
/// a FIFO. Returns the file and its metadata.
pub fn open_regular(path: &Path) -> Result<(File, Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        // O_NONBLOCK: opening a FIFO must not wait for a writer; for a regular file it has
        // no effect on reads.
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| io_err(path, e))?;
    let meta = file.metadata().map_err(|e| io_err(path, e))?;
    if !meta.file_type().is_file() {
        return Err(Error::NotRegularFile {
            path: path.to_path_buf(),
            found: kind_name(&meta),
        });
    }
    Ok((file, meta))
}

fn too_large(path: &Path, len: u64, limit: u64, what: &'static str) -> Error {
    Error::TooLarge {
        path: path.to_path_buf(),
        len,
        limit,
        what,
    }
}

/// Read a whole regular file of at most `limit` bytes; `what` names the format in the error.
/// The length is checked before reading, and the read itself stops after `limit + 1` bytes
/// (a file growing while it is read is refused too).
pub fn read_file(path: &Path, limit: u64, what: &'static str) -> Result<Vec<u8>> {
    let (file, meta) = open_regular(path)?;
    if meta.len() > limit {
        return Err(too_large(path, meta.len(), limit, what));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io_err(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(path, bytes.len() as u64, limit, what));
    }
    Ok(bytes)
}

/// Read a whole regular file into a string (UTF-8 checked), at most `limit` bytes.
pub fn read_to_string(path: &Path, limit: u64, what: &'static str) -> Result<String> {
    let bytes = read_file(path, limit, what)?;
    String::from_utf8(bytes).map_err(|e| Error::Format {
        file: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to() as u64,
        reason: "not valid UTF-8".into(),
    })
}

/// Device, inode, length and modification time of a file: what tells that it changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    /// Modification time, seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
}

impl FileIdentity {
    pub fn of(meta: &Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }

    /// What differs from `earlier`, in words (`None` when nothing does).
    pub fn difference(&self, earlier: &FileIdentity) -> Option<String> {
        if (self.dev, self.ino) != (earlier.dev, earlier.ino) {
            Some("it was replaced by another file (device/inode differ)".into())
        } else if self.len != earlier.len {
            Some(format!(
                "its length went from {} to {} bytes",
                earlier.len, self.len
            ))
        } else if self.mtime != earlier.mtime {
            Some("its modification time changed (bytes overwritten in place?)".into())
        } else {
            None
        }
    }
}

/// A read-only memory map of a regular file, registered for the `SIGBUS` message (module
/// docs). Dereferences to the file's bytes.
pub struct MappedFile {
    map: Mmap,
    path: PathBuf,
    identity: FileIdentity,
    slot: Option<usize>,
}

/// Map `path` read-only (a regular file only).
pub fn map_file(path: &Path) -> Result<MappedFile> {
    let (file, meta) = open_regular(path)?;
    // SAFETY: the map is read-only. Another process may still change the file: a truncation
    // is turned into a one-line error by the SIGBUS handler below, any other change is found
    // by `check_unchanged` before results are published.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
    let slot = if map.is_empty() {
        None
    } else {
        sigbus::register(map.as_ptr() as usize, map.len(), path)
    };
    Ok(MappedFile {
        map,
        path: path.to_path_buf(),
        identity: FileIdentity::of(&meta),
        slot,
    })
}

impl MappedFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The identity recorded when the file was mapped.
    pub fn identity(&self) -> FileIdentity {
        self.identity
    }

    /// Check that the file at the mapped path is still the one that was mapped, with the same
    /// length and modification time ([`Error::Changed`] otherwise).
    pub fn check_unchanged(&self) -> Result<()> {
        check_unchanged(&self.path, &self.identity)
    }
}

/// Check that `path` still has `identity` ([`Error::Changed`] naming what differs).
pub fn check_unchanged(path: &Path, identity: &FileIdentity) -> Result<()> {
    let now = std::fs::metadata(path).map_err(|e| Error::Changed {
        path: path.to_path_buf(),
        reason: format!("it can no longer be read: {e}"),
    })?;
    match FileIdentity::of(&now).difference(identity) {
        None => Ok(()),
        Some(reason) => Err(Error::Changed {
            path: path.to_path_buf(),
            reason,
        }),
    }
}

impl Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            sigbus::unregister(slot);
        }
    }
}

/// The table of mapped ranges and the `SIGBUS` handler (module docs).
mod sigbus {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
    use std::sync::{Mutex, Once};

    use super::EXIT_MAPPED_FILE_CHANGED;

    pub(super) const SLOTS: usize = 4096;

    struct Slot {
        claimed: AtomicBool,
        /// Mapped range `[start, end)`; `start == 0` means the slot is not published.
        start: AtomicUsize,
        end: AtomicUsize,
        message: AtomicPtr<u8>,
        message_len: AtomicUsize,
    }

    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Slot = Slot {
        claimed: AtomicBool::new(false),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        message: AtomicPtr::new(std::ptr::null_mut()),
        message_len: AtomicUsize::new(0),
    };

    static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
    /// The `SIGBUS` action installed before ours (leaked, set once before ours is installed).
    static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
    static INSTALL: Once = Once::new();
    /// Set by the first thread that reports a truncated mapping.
    static REPORTING: AtomicBool = AtomicBool::new(false);

    /// At most this many bytes of a path appear in the message.
    const PATH_SHOWN: usize = 512;

    /// The message naming `path`, formatted once per distinct path and never freed (the
    /// handler may read it at any time), so reopening the same files does not grow memory.
    fn message(path: &Path) -> &'static [u8] {
        static MESSAGES: Mutex<BTreeMap<PathBuf, &'static [u8]>> = Mutex::new(BTreeMap::new());
        let mut messages = MESSAGES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = messages.get(path) {
            return m;
        }
        let shown = path.display().to_string();
        let shown = match shown.char_indices().nth(PATH_SHOWN) {
            Some((cut, _)) => format!("{}…", &shown[..cut]),
            None => shown,
        };
        let text = format!(
            "ds41: {shown}: the file shrank while memory-mapped (truncated by another process); \
             its bytes can no longer be read (exit {EXIT_MAPPED_FILE_CHANGED})\n"
        );
        let leaked: &'static [u8] = Box::leak(text.into_bytes().into_boxed_slice());
        messages.insert(path.to_path_buf(), leaked);
        leaked
    }

    /// Publish `[start, start + len)` with the message naming `path`; `None` when the table
    /// is full or the handler could not be installed.
    pub(super) fn register(start: usize, len: usize, path: &Path) -> Option<usize> {
        INSTALL.call_once(install);
        if PREVIOUS.load(Ordering::Acquire).is_null() {
            return None; // the handler is not installed: nothing would read the table
        }
        let msg = message(path);
        for (i, slot) in TABLE.iter().enumerate() {
            if slot
                .claimed
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                slot.message
                    .store(msg.as_ptr() as *mut u8, Ordering::Relaxed);
                slot.message_len.store(msg.len(), Ordering::Relaxed);
                slot.end.store(start + len, Ordering::Relaxed);
                slot.start.store(start, Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    pub(super) fn unregister(i: usize) {
        let slot = &TABLE[i];
        slot.start.store(0, Ordering::Release);
        slot.end.store(0, Ordering::Relaxed);
        slot.claimed.store(false, Ordering::Release);
    }

    fn install() {
        // SAFETY: plain sigaction(2) calls with zero-initialised, then filled, structs.
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return;
            }
            PREVIOUS.store(Box::into_raw(Box::new(previous)), Ordering::Release);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
                PREVIOUS.store(std::ptr::null_mut(), Ordering::Release);
            }
        }
    }

    /// Async-signal-safe: atomic loads, write(2), _exit(2), sigaction(2) only.
    extern "C" fn on_sigbus(
        signal: libc::c_int,
        info: *mut libc::siginfo_t,
        context: *mut libc::c_void,
    ) {
        // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() } as usize;
        for slot in TABLE.iter() {
            let start = slot.start.load(Ordering::Acquire);
            if start != 0 && addr >= start && addr < slot.end.load(Ordering::Relaxed) {
                // Several threads may fault at once (rayon workers reading the same file):
                // the first one reports, the others wait for its _exit.
                if REPORTING.swap(true, Ordering::AcqRel) {
                    loop {
                        // SAFETY: pause(2) is async-signal-safe.
                        unsafe { libc::pause() };
                    }
                }
                let msg = slot.message.load(Ordering::Relaxed);
                let len = slot.message_len.load(Ordering::Relaxed);
                // SAFETY: the message is leaked, never freed; write and _exit are
                // async-signal-safe.
                unsafe {
                    libc::write(2, msg as *const libc::c_void, len);
                    libc::_exit(EXIT_MAPPED_FILE_CHANGED);
                }
            }
        }
        // Not one of ours: hand over to the previous action.
        // SAFETY: PREVIOUS was set before this handler was installed and is never freed.
        unsafe {
            let previous = &*PREVIOUS.load(Ordering::Acquire);
            let handler = previous.sa_sigaction;
            if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
                // Restore the default action; returning re-executes the faulting access,
                // which then ends the process the default way.
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
            } else if previous.sa_flags & libc::SA_SIGINFO != 0 {
                let f = std::mem::transmute::<
                    libc::sighandler_t,
                    extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
                >(handler);
                f(signal, info, context);
            } else {
                let f =
                    std::mem::transmute::<libc::sighandler_t, extern "C" fn(libc::c_int)>(handler);
                f(signal);
            }
        }
    }
}

/// How many mappings can be registered for the `SIGBUS` message at once.
pub const REGISTRY_SLOTS: usize = sigbus::SLOTS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("tokenizer.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_file(&fifo, 100, "test file").unwrap_err();
        assert_eq!(err.kind(), "NotRegularFile", "{err}");
        assert!(err.to_string().contains("a FIFO"), "{err}");
        let err = map_file(&fifo).err().unwrap();
        assert_eq!(err.kind(), "NotRegularFile", "{err}");
    }

    #[test]
    fn a_symlink_to_a_device_is_refused_for_what_it_points_to() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("model.safetensors");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(present(&link) && !link.is_file());
        let err = map_file(&link).err().unwrap();
        assert_eq!(err.kind(), "NotRegularFile");
        assert!(
            err.to_string()
                .contains("model.safetensors: is a character device"),
            "{err}"
        );
    }

    #[test]
    fn reads_are_capped_by_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, [b' '; 101]).unwrap();
        let err = read_file(&p, 100, "config file").unwrap_err();
        assert_eq!(err.kind(), "TooLarge");
        assert_eq!(read_file(&p, 101, "config file").unwrap().len(), 101);
    }

    #[test]
    fn an_overwrite_in_place_changes_the_identity() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trunk.bin");
        std::fs::write(&p, [1u8; 4096]).unwrap();
        let m = map_file(&p).unwrap();
        m.check_unchanged().unwrap();
        // Same length, same inode, new bytes: only the modification time tells.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, &[2u8; 16], 100).unwrap();
        f.set_modified(later).unwrap();
        let err = m.check_unchanged().unwrap_err();
        assert_eq!(err.kind(), "Changed");
        assert!(err.to_string().contains("modification time"), "{err}");
    }
}
