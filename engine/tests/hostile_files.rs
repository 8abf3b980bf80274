//! Inputs that are not what they claim to be: FIFOs, devices and symlinks to them where a
//! checkpoint, tokenizer or state file is expected; mapped files truncated or overwritten
//! while in use; sequences beyond the model's maximum position; temporaries left by a killed
//! save. Each is refused with a typed error naming the file, never a hang, an abort or a
//! silent success.

use std::path::{Path, PathBuf};
use std::process::Command;

use ds41_engine::checkpoint::{self, Layout as CkptLayout};
use ds41_engine::model::{Model, Options, Session};
use ds41_engine::tokenizer::Tokenizer;
use ds41_engine::trace::Trace;
use ds41_engine::{io, state, Error};

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain mkfifo(3) call on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn replace_with_fifo(path: &Path) {
    std::fs::remove_file(path).unwrap();
    mkfifo(path);
}

fn replace_with_symlink(path: &Path, target: &str) {
    std::fs::remove_file(path).unwrap();
    std::os::unix::fs::symlink(target, path).unwrap();
}

fn expect_not_regular(r: Result<impl Sized, Error>, name: &str) {
    match r {
        Err(e @ Error::NotRegularFile { .. }) => {
            assert!(e.to_string().contains(name), "{e}")
        }
        Err(e) => panic!("expected NotRegularFile naming {name}, got {e}"),
        Ok(_) => panic!("{name}: a non-regular file was accepted"),
    }
}

fn tiny(layout: CkptLayout) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ckpt");
    ds41_synthetic::generate("tiny", layout, 3, &out).unwrap();
    (dir, out)
}

#[test]
fn tokenizer_json_that_is_a_fifo_or_dev_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("tokenizer.json");
    mkfifo(&fifo);
    expect_not_regular(Tokenizer::from_file(&fifo), "tokenizer.json");
    expect_not_regular(Tokenizer::from_file(Path::new("/dev/zero")), "/dev/zero");
}

#[test]
fn release_shard_symlinked_to_dev_zero_is_refused_not_missing() {
    let (_d, out) = tiny(CkptLayout::Release);
    let shard = out.join("model.safetensors");
    replace_with_symlink(&shard, "/dev/zero");
    expect_not_regular(checkpoint::open(&out), "model.safetensors");
    replace_with_fifo(&shard);
    expect_not_regular(checkpoint::open(&out), "model.safetensors");
    replace_with_fifo(&out.join("config.json"));
    expect_not_regular(checkpoint::open(&out), "config.json");
}

#[test]
fn container_files_that_are_fifos_are_refused() {
    let (_d, out) = tiny(CkptLayout::Container);
    let banks: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("experts-L"))
        .collect();
    let bank = &banks[0];
    replace_with_fifo(bank);
    let name = bank.file_name().unwrap().to_string_lossy().into_owned();
    expect_not_regular(checkpoint::open(&out), &name);
    for name in ["codebooks.bin", "engram-tokmap.bin", "manifest.json"] {
        let (_d, out) = tiny(CkptLayout::Container);
        replace_with_fifo(&out.join(name));
        expect_not_regular(checkpoint::open(&out), name);
    }
}

#[test]
fn state_file_that_is_a_fifo_is_refused() {
    let (_d, out) = tiny(CkptLayout::Release);
    let model = Model::open(&out).unwrap();
    let mut session = Session::new(&model, Options::default());
    let fifo = out.join("session.state");
    mkfifo(&fifo);
    expect_not_regular(state::restore(&model, &mut session, &fifo), "session.state");
}

/// The synthetic release states `max_position_embeddings` 4096; lower it to 8.
fn tiny_with_max_position(max: usize) -> (tempfile::TempDir, PathBuf) {
    let (d, out) = tiny(CkptLayout::Release);
    let cfg = out.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("\"max_position_embeddings\": 4096"));
    let text = text.replace(
        "\"max_position_embeddings\": 4096",
        &format!("\"max_position_embeddings\": {max}"),
    );
    std::fs::write(&cfg, text).unwrap();
    (d, out)
}

#[test]
fn forwards_beyond_the_maximum_position_are_refused() {
    let (_d, out) = tiny_with_max_position(8);
    let model = Model::open(&out).unwrap();
    assert_eq!(model.config().max_position, Some(8));
    let mut trace = Trace::disabled();
    let mut session = Session::new(&model, Options::default());
    let err = session.prefill(&[5; 9], &mut trace).unwrap_err();
    assert!(
        matches!(err, Error::PositionLimit { end: 9, max: 8 }),
        "{err}"
    );
    // Exactly the maximum is allowed; one decode step more is not.
    let mut session = Session::new(&model, Options::default());
    session.prefill(&[5; 8], &mut trace).unwrap();
    let err = session.decode(5, &mut trace).unwrap_err();
    assert!(
        matches!(err, Error::PositionLimit { end: 9, max: 8 }),
        "{err}"
    );
}

#[test]
fn restored_states_beyond_the_maximum_position_are_refused() {
    // Saved by a model that allows 16 positions, at position 12; restored into the same
    // weights with a maximum of 8.
    let (_d, wide) = tiny_with_max_position(16);
    let model = Model::open(&wide).unwrap();
    let mut session = Session::new(&model, Options::default());
    session.prefill(&[7; 12], &mut Trace::disabled()).unwrap();
    let saved = wide.join("at-12.state");
    state::save(&model, &session, &saved).unwrap();

    let (_d2, narrow) = tiny_with_max_position(8);
    let model = Model::open(&narrow).unwrap();
    let mut session = Session::new(&model, Options::default());
    let err = state::restore(&model, &mut session, &saved).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, Error::Format { .. })
            && text.contains("at-12.state")
            && text.contains("position: 12 is beyond the model's maximum of 8"),
        "{text}"
    );
}

#[test]
fn stale_temporaries_of_a_killed_save_are_removed_on_the_next_save() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("s.state");
    // A PID that cannot be alive (above the kernel's pid_max limit of 2^22), one that is
    // (this process's parent), and names that are not ours.
    let dead = dir.path().join(".s.state.tmp-4194305");
    let live = dir.path().join(format!(
        ".s.state.tmp-{}",
        std::os::unix::process::parent_id()
    ));
    let other = [
        dir.path().join(".s.state.tmp-12x"),
        dir.path().join(".t.state.tmp-4194305"),
        dir.path().join("s.state.tmp-4194305"),
    ];
    for p in [&dead, &live].into_iter().chain(&other) {
        std::fs::write(p, b"partial").unwrap();
    }
    state::write_atomic(&target, b"new state").unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"new state");
    assert!(!dead.exists(), "the dead writer's temporary is left behind");
    assert!(live.exists(), "a live writer's temporary was removed");
    for p in &other {
        assert!(p.exists(), "{} is not ours and must stay", p.display());
    }
}

/// Re-run this test binary as a child that maps a file, truncates it and reads the mapping:
/// the child must end with the documented exit status and one line naming the file.
const CHILD_ENV: &str = "DS41_TEST_SIGBUS_CHILD";

#[test]
fn a_mapped_file_truncated_while_in_use_ends_with_one_line_naming_it() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        let path = PathBuf::from(path);
        let map = io::map_file(&path).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        // SAFETY: a volatile read of a byte inside the mapping (its page is gone: SIGBUS).
        let byte = unsafe { std::ptr::read_volatile(map.as_ptr().add(5000)) };
        println!("read {byte} from a truncated mapping");
        std::process::exit(0);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trunk.bin");
    std::fs::write(&path, vec![7u8; 3 << 16]).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_mapped_file_truncated_while_in_use_ends_with_one_line_naming_it",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(io::EXIT_MAPPED_FILE_CHANGED),
        "status {:?}, stderr:\n{stderr}",
        out.status
    );
    let line = stderr
        .lines()
        .find(|l| l.starts_with("ds41: "))
        .unwrap_or_else(|| panic!("no message on stderr:\n{stderr}"));
    assert!(
        line.contains(&path.display().to_string()) && line.contains("truncated"),
        "{line}"
    );
}

#[test]
fn engram_token_maps_with_ids_outside_the_compressed_vocabulary_are_refused() {
    let (_tmp, dir) = tiny(CkptLayout::Release);
    let cfg = Model::open(&dir).unwrap().config().clone();
    let ids = cfg.engram_compressed_vocab_size as i32;
    let good: Vec<i32> = (0..cfg.vocab_size as i32).map(|t| t % ids).collect();
    assert!(Model::open_with_token_map(&dir, Some(good.clone())).is_ok());
    // Shorter than the vocabulary is a map of a tokenizer with gaps: accepted.
    assert!(Model::open_with_token_map(&dir, Some(good[..ids as usize + 1].to_vec())).is_ok());
    for (token, id) in [(7, -1), (9, -3), (11, ids), (13, i32::MAX)] {
        let mut map = good.clone();
        map[token] = id;
        let e = Model::open_with_token_map(&dir, Some(map))
            .err()
            .expect("accepted");
        assert!(
            e.to_string()
                .contains(&format!("token {token} maps to {id}")),
            "{e}"
        );
    }
    // One that never reaches the config's count of compressed ids.
    let short: Vec<i32> = good.iter().map(|&c| c % (ids - 1)).collect();
    let e = Model::open_with_token_map(&dir, Some(short))
        .err()
        .expect("accepted");
    assert!(
        e.to_string().contains("engram_compressed_vocab_size"),
        "{e}"
    );
}
