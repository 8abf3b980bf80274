//! Where case data comes from, and the one place a `DataRef` becomes a path.
//!
//! * `repo:PATH` — the repository's own data (goldens, cases), from the copy built into the
//!   binary (crate::embedded) or a checkout; always there.
//! * `release:PATH` — a file of the Hugging Face release of DeepSeek-V4.1-Flash, read from a
//!   snapshot directory ([`ReleaseSnapshot::locate`]: `--release DIR`, `DS41_RELEASE`, or the
//!   Hugging Face hub cache) and verified against its pin ([`RELEASE_FILES`]) before use.
//! * `upstream:PATH` — the external upstream data set (`--upstream DIR` / `DS41_UPSTREAM`),
//!   read only when it is given.
//!
//! A case whose data root is absent is skipped, saying which option supplies it. Paths are
//! relative without `..` (checked when a case is parsed); `repo:` and `upstream:` paths are
//! also canonicalized and must stay inside their canonical root, so a symlink cannot lead a
//! case outside it. `release:` paths may be symlinks (the hub cache links every snapshot
//! file into `blobs/`); their content is what is checked, against the pin.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::case::{DataRef, ModelRef};
use crate::outcome::Outcome;

/// The Hugging Face repository and the revision the pins come from.
pub const RELEASE_REPO: &str = "deepseek-ai/DeepSeek-V4.1-Flash";
pub const RELEASE_REVISION: &str = "dba1be0a40aa45a94ad051997016db3960a90277";

/// How a release file is recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// sha256 of the file's bytes (the published release hashes).
    Bytes(&'static str),
    /// sha256 of the JSON value re-serialised compactly (keys in file order, no whitespace,
    /// non-ASCII as UTF-8): for files whose known copies are re-serialised, so only their
    /// content, not their bytes, is known.
    JsonContent(&'static str),
}

/// Every release file a case may name, with its pin. Byte pins of the first four are the
/// published sha256 of the release files; the encoding tests are pinned by content (inputs)
/// and bytes (expected prompts, made by the release's `encoding/encoding.py`).
pub const RELEASE_FILES: [(&str, Pin); 14] = [
    (
        "config.json",
        Pin::Bytes("8be45ce0476004a3f529fd896115a4a2e800a129ad2d3ec05b16050f52e21879"),
    ),
    (
        "inference/config.json",
        Pin::Bytes("2e84f45cf1dac8c7fcbb200e96667d4b913275690668ed496f24c7747207a809"),
    ),
    (
        "tokenizer.json",
        Pin::Bytes("c90dfa01249db1be4245780a052ede752e1361c612ac6d08e2bdada7d599476b"),
    ),
    (
        "tokenizer_config.json",
        Pin::Bytes("6ac8c8dc065ed118161d02dd532749ae3f52c243deac27872134fae2f50d8547"),
    ),
    (
        "encoding/tests/test_input_1.json",
        Pin::JsonContent("af58cdfa31f4633e68d598aae966e22081c806353771b6685e8d7f9df02b22c8"),
    ),
    (
        "encoding/tests/test_input_2.json",
        Pin::JsonContent("f76576840356b05863ca6e735be311ef0c1e3e554e54ff0c2e9e1f4aabd505ca"),
    ),
    (
        "encoding/tests/test_input_3.json",
        Pin::JsonContent("6de5d7afd3ed8f4e54160e51d8b2e7c40cb89bba329dde14e20718ec8203a2f7"),
    ),
    (
        "encoding/tests/test_input_4.json",
        Pin::JsonContent("95cc883e86f4c11e3c9eeb94aec87e2781d4dbd81cda171018a65fbbfd5fd999"),
    ),
    (
        "encoding/tests/test_input_5.json",
        Pin::JsonContent("2cb9366da57514b8309455bbad24bf9a46119c7d6a3f708ac85688586cffc363"),
    ),
    (
        "encoding/tests/test_output_1.txt",
        Pin::Bytes("91f79aa955717b414a82aabfb38bcd83ab5a998bd47db89d2a26338e8d3de550"),
    ),
    (
        "encoding/tests/test_output_2.txt",
        Pin::Bytes("9fa162587b73ab9b315be5c88d433f9e0e681b4b36926952f289099ed9bc1dab"),
    ),
    (
        "encoding/tests/test_output_3.txt",
        Pin::Bytes("cf2b801d0738c88abb691bf4a096000c0e0737faab8a54a4ba5243c5513a3711"),
    ),
    (
        "encoding/tests/test_output_4.txt",
        Pin::Bytes("94433b68370dcc69fa61efc5011b5d0e28685e4716fee1ee77fbbfc0c9935b54"),
    ),
    (
        "encoding/tests/test_output_5.txt",
        Pin::Bytes("4d673091746553d1cb2e40a3fc01dc09a7c53c40627096a3e49c97a269a81f64"),
    ),
];

pub fn release_pin(rel: &str) -> Option<Pin> {
    RELEASE_FILES
        .iter()
        .find(|(p, _)| *p == rel)
        .map(|(_, pin)| *pin)
}

/// The sha256 a pin of this kind compares: of the bytes, or of the compact JSON content.
pub fn pinned_digest(pin: Pin, bytes: &[u8]) -> Result<String, String> {
    match pin {
        Pin::Bytes(_) => Ok(hex::encode(Sha256::digest(bytes))),
        Pin::JsonContent(_) => {
            let v: serde_json::Value =
                serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
            let compact = serde_json::to_vec(&v).map_err(|e| e.to_string())?;
            Ok(hex::encode(Sha256::digest(compact)))
        }
    }
}

/// How the snapshot was found (printed in the run header and in errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Flag,
    Env,
    HubCache,
}

/// `path` made absolute against the current directory (not resolved: a link stays a link);
/// unchanged if the current directory cannot be read.
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A release snapshot directory, with the files verified so far.
#[derive(Debug)]
pub struct ReleaseSnapshot {
    pub dir: PathBuf,
    pub found: Found,
    verified: Mutex<BTreeMap<String, Result<PathBuf, String>>>,
}

/// The hub cache's folder of this repository's snapshots.
fn hub_snapshots(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let hub = env("HF_HUB_CACHE").map(PathBuf::from).or_else(|| {
        let home = env("HF_HOME").map(PathBuf::from).or_else(|| {
            env("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| Path::new(&h).join(".cache")))
                .map(|c| c.join("huggingface"))
        })?;
        Some(home.join("hub"))
    })?;
    Some(
        hub.join(format!("models--{}", RELEASE_REPO.replace('/', "--")))
            .join("snapshots"),
    )
}

/// Where a snapshot would be looked for, for the "no snapshot" message.
pub fn search_description() -> String {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let hub = hub_snapshots(&env)
        .map(|p| format!("{}/*", p.display()))
        .unwrap_or_else(|| "(no HOME: no hub cache)".into());
    format!("--release DIR, DS41_RELEASE, {hub}")
}

impl ReleaseSnapshot {
    fn new(dir: PathBuf, found: Found) -> ReleaseSnapshot {
        ReleaseSnapshot {
            // Absolute, so a path handed to an engine (another working directory) or linked
            // from a scratch directory still names the file a relative `--release` meant.
            dir: absolute(&dir),
            found,
            verified: Mutex::new(BTreeMap::new()),
        }
    }

    /// `flag` (`--release DIR`), else `DS41_RELEASE`, else the hub cache
    /// (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`): the snapshot of
    /// the pinned revision, else the one `refs/main` names, else the only one. `Ok(None)` when
    /// there is none; an error when a given directory does not exist or the cache holds
    /// several snapshots and none is preferred.
    pub fn locate(flag: Option<&Path>) -> anyhow::Result<Option<ReleaseSnapshot>> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self::locate_with(flag, &env)
    }

    pub fn locate_with(
        flag: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Option<ReleaseSnapshot>> {
        let given = match (flag, env("DS41_RELEASE")) {
            (Some(d), _) => Some((d.to_path_buf(), Found::Flag, "--release")),
            (None, Some(d)) => Some((PathBuf::from(d), Found::Env, "DS41_RELEASE")),
            (None, None) => None,
        };
        if let Some((dir, found, via)) = given {
            if !dir.is_dir() {
                anyhow::bail!(
                    "{via} {}: not a directory (expected a snapshot of {RELEASE_REPO})",
                    dir.display()
                );
            }
            return Ok(Some(Self::new(dir, found)));
        }
        let Some(snapshots) = hub_snapshots(env) else {
            return Ok(None);
        };
        let Ok(rd) = std::fs::read_dir(&snapshots) else {
            return Ok(None);
        };
        let mut revisions: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        revisions.sort();
        let main = std::fs::read_to_string(snapshots.join("../refs/main"))
            .ok()
            .map(|s| s.trim().to_string());
        let chosen = if revisions.iter().any(|r| r == RELEASE_REVISION) {
            Some(RELEASE_REVISION.to_string())
        } else if let Some(m) = main.filter(|m| revisions.contains(m)) {
            Some(m)
        } else if revisions.len() == 1 {
            revisions.pop()
        } else if revisions.is_empty() {
            None
        } else {
            anyhow::bail!(
                "{}: several snapshots ({}) and none is the pinned revision {RELEASE_REVISION} \
                 or refs/main: choose one with --release DIR",
                snapshots.display(),
                revisions.join(", ")
            );
        };
        Ok(chosen.map(|r| Self::new(snapshots.join(r), Found::HubCache)))
    }

    /// The verified path of release file `rel` (hashed once per run).
    pub fn file(&self, rel: &str) -> Result<PathBuf, String> {
        let mut verified = self
            .verified
            .lock()
            .map_err(|_| "release verification lock poisoned".to_string())?;
        verified
            .entry(rel.to_string())
            .or_insert_with(|| self.verify(rel))
            .clone()
    }

    fn verify(&self, rel: &str) -> Result<PathBuf, String> {
        let pin = release_pin(rel).ok_or_else(|| {
            format!(
                "release:{rel}: not a release file this harness knows (it pins {})",
                known()
            )
        })?;
        let path = self.dir.join(rel);
        let bytes = std::fs::read(&path).map_err(|e| {
            format!(
                "release:{rel}: {} cannot be read ({e}); the snapshot {} lacks it \
                 (download it: huggingface-cli download {RELEASE_REPO} {rel} --revision {RELEASE_REVISION})",
                path.display(),
                self.dir.display()
            )
        })?;
        let got = pinned_digest(pin, &bytes)
            .map_err(|e| format!("release:{rel}: {}: {e}", path.display()))?;
        let (want, what) = match pin {
            Pin::Bytes(w) => (w, "sha256"),
            Pin::JsonContent(w) => (w, "sha256 of the compact JSON content"),
        };
        if got != want {
            return Err(format!(
                "release:{rel}: {} has {what} {got}, not the pinned {want} of {RELEASE_REPO} \
                 (revision {RELEASE_REVISION}); is {} a snapshot of another model or revision?",
                path.display(),
                self.dir.display()
            ));
        }
        Ok(path)
    }
}

fn known() -> String {
    RELEASE_FILES
        .iter()
        .map(|(p, _)| *p)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a case reading `release:` data is skipped without a snapshot.
pub fn no_release_reason() -> String {
    format!(
        "no release snapshot (this case reads files of {RELEASE_REPO}): point --release DIR or \
         DS41_RELEASE at a snapshot directory (searched: {})",
        search_description()
    )
}

/// Why a case reading `upstream:` data is skipped without it.
pub const NO_UPSTREAM_REASON: &str =
    "the external upstream data set is not given (this case reads it): --upstream DIR or DS41_UPSTREAM";

/// The data roots of a run.
pub struct DataRoots<'a> {
    pub repo: &'a Path,
    pub release: Option<&'a ReleaseSnapshot>,
    pub upstream: Option<&'a Path>,
}

impl DataRoots<'_> {
    /// The path of `d`: Skipped when its root is absent, Error when it does not exist, leaves
    /// its root, or (release) does not match its pin.
    pub fn data(&self, d: &DataRef) -> Result<PathBuf, Outcome> {
        match d {
            DataRef::Repo(rel) => contained(self.repo, rel, d),
            DataRef::Upstream(rel) => {
                let root = self
                    .upstream
                    .ok_or_else(|| Outcome::skipped(NO_UPSTREAM_REASON))?;
                contained(root, rel, d)
            }
            DataRef::Release(rel) => {
                let snap = self
                    .release
                    .ok_or_else(|| Outcome::skipped(no_release_reason()))?;
                snap.file(rel).map_err(Outcome::error)
            }
        }
    }

    /// The directory of an `upstream:` model (other models are generated by the run).
    pub fn upstream_model(&self, m: &ModelRef) -> Option<Result<PathBuf, Outcome>> {
        let ModelRef::Upstream(rel) = m else {
            return None;
        };
        Some(match self.upstream {
            None => Err(Outcome::skipped(NO_UPSTREAM_REASON)),
            Some(root) => contained(root, rel, m),
        })
    }
}

/// `root/rel`, canonicalized, which must exist and stay inside the canonical `root`.
fn contained(root: &Path, rel: &str, what: &dyn std::fmt::Display) -> Result<PathBuf, Outcome> {
    crate::case::resolve_inside(root, rel).map_err(|e| Outcome::error(format!("{what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_release_directory_is_kept_absolute() {
        let d = tempfile::tempdir().unwrap();
        // The temporary directory, named relative to the current one (`../..` up to `/`).
        let cwd = std::env::current_dir().unwrap();
        let mut rel = PathBuf::new();
        for _ in 1..cwd.components().count() {
            rel.push("..");
        }
        let rel = rel.join(d.path().strip_prefix("/").unwrap());
        assert!(rel.is_relative());
        let snap = ReleaseSnapshot::locate_with(Some(&rel), &|_| None)
            .unwrap()
            .unwrap();
        assert!(snap.dir.is_absolute(), "{}", snap.dir.display());
        assert_eq!(
            std::fs::canonicalize(&snap.dir).unwrap(),
            std::fs::canonicalize(d.path()).unwrap()
        );
    }

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |k: &str| m.get(k).cloned()
    }

    /// A snapshot holding `files` (release path, bytes).
    fn snapshot(dir: &Path, files: &[(&str, &[u8])]) {
        for (rel, bytes) in files {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes).unwrap();
        }
    }

    #[test]
    fn flag_then_env_then_hub_cache() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let env = env_of(&[("DS41_RELEASE", b.display().to_string())]);
        let s = ReleaseSnapshot::locate_with(Some(&a), &env)
            .unwrap()
            .unwrap();
        assert_eq!((s.dir.as_path(), &s.found), (a.as_path(), &Found::Flag));
        let s = ReleaseSnapshot::locate_with(None, &env).unwrap().unwrap();
        assert_eq!((s.dir.as_path(), &s.found), (b.as_path(), &Found::Env));
        let missing = d.path().join("nope");
        let e = ReleaseSnapshot::locate_with(Some(&missing), &env).unwrap_err();
        assert!(
            e.to_string().contains("--release") && e.to_string().contains("nope"),
            "{e}"
        );

        // hub cache: HF_HOME/hub/models--deepseek-ai--DeepSeek-V4.1-Flash/snapshots/REV
        let home = d.path().join("hf");
        let snaps = home.join("hub/models--deepseek-ai--DeepSeek-V4.1-Flash/snapshots");
        let env = env_of(&[("HF_HOME", home.display().to_string())]);
        assert!(ReleaseSnapshot::locate_with(None, &env).unwrap().is_none());
        std::fs::create_dir_all(snaps.join("1111")).unwrap();
        let s = ReleaseSnapshot::locate_with(None, &env).unwrap().unwrap();
        assert_eq!(
            (s.dir.clone(), s.found),
            (snaps.join("1111"), Found::HubCache)
        );
        std::fs::create_dir_all(snaps.join("2222")).unwrap();
        let e = ReleaseSnapshot::locate_with(None, &env).unwrap_err();
        assert!(e.to_string().contains("several snapshots"), "{e}");
        std::fs::create_dir_all(snaps.join("../refs")).unwrap();
        std::fs::write(snaps.join("../refs/main"), "2222\n").unwrap();
        let s = ReleaseSnapshot::locate_with(None, &env).unwrap().unwrap();
        assert_eq!(s.dir, snaps.join("2222"));
        std::fs::create_dir_all(snaps.join(RELEASE_REVISION)).unwrap();
        let s = ReleaseSnapshot::locate_with(None, &env).unwrap().unwrap();
        assert_eq!(s.dir, snaps.join(RELEASE_REVISION));
        // HOME alone: ~/.cache/huggingface/hub
        let env = env_of(&[("HOME", d.path().display().to_string())]);
        let p = hub_snapshots(&env).unwrap();
        assert!(p.ends_with(
            ".cache/huggingface/hub/models--deepseek-ai--DeepSeek-V4.1-Flash/snapshots"
        ));
    }

    #[test]
    fn release_files_are_verified_against_their_pins() {
        let d = tempfile::tempdir().unwrap();
        snapshot(
            d.path(),
            &[("tokenizer_config.json", b"{\"forged\": true}\n")],
        );
        let s = ReleaseSnapshot::new(d.path().to_path_buf(), Found::Flag);
        let e = s.file("tokenizer_config.json").unwrap_err();
        assert!(
            e.contains("tokenizer_config.json")
                && e.contains("6ac8c8dc065ed118161d02dd532749ae3f52c243deac27872134fae2f50d8547")
                && e.contains("another model or revision"),
            "{e}"
        );
        let e = s.file("config.json").unwrap_err();
        assert!(
            e.contains("lacks it") && e.contains("huggingface-cli download"),
            "{e}"
        );
        let e = s.file("model.py").unwrap_err();
        assert!(e.contains("not a release file"), "{e}");
    }

    #[test]
    fn json_content_pins_ignore_the_serialisation_only() {
        let pin = Pin::JsonContent("");
        let compact = pinned_digest(pin, br#"{"b":[1,2.5],"a":"\u00e9t\u00e9"}"#).unwrap();
        let pretty = pinned_digest(
            pin,
            "{\n    \"b\": [1, 2.5],\n    \"a\": \"été\"\n}\n".as_bytes(),
        );
        assert_eq!(pretty.unwrap(), compact);
        let reordered = pinned_digest(pin, br#"{"a":"\u00e9t\u00e9","b":[1,2.5]}"#).unwrap();
        assert_ne!(
            reordered, compact,
            "key order is content (schemas are rendered in order)"
        );
        assert!(pinned_digest(pin, b"{").is_err());
    }

    #[test]
    fn repo_and_upstream_paths_stay_inside_their_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f.json"), "{}").unwrap();
        std::fs::write(d.path().join("secret"), "x").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(d.path().join("secret"), root.join("sub/link")).unwrap();
        let roots = DataRoots {
            repo: &root,
            release: None,
            upstream: None,
        };
        assert!(roots.data(&DataRef::Repo("sub/f.json".into())).is_ok());
        let missing = roots.data(&DataRef::Repo("sub/none".into())).unwrap_err();
        assert!(matches!(missing, Outcome::Error { .. }), "{missing:?}");
        #[cfg(unix)]
        {
            let out = roots.data(&DataRef::Repo("sub/link".into())).unwrap_err();
            assert!(
                matches!(&out, Outcome::Error { reason } if reason.contains("outside")),
                "{out:?}"
            );
        }
        let up = roots.data(&DataRef::Upstream("x".into())).unwrap_err();
        assert!(
            matches!(&up, Outcome::Skipped { reason } if reason.contains("--upstream")),
            "{up:?}"
        );
        let rel = roots
            .data(&DataRef::Release("tokenizer.json".into()))
            .unwrap_err();
        assert!(
            matches!(&rel, Outcome::Skipped { reason } if reason.contains("--release")),
            "{rel:?}"
        );
    }

    /// A release snapshot (CI: the data-only ../shared/release) passes every pin.
    #[test]
    #[cfg_attr(
        not(ds41_release),
        ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
    )]
    fn every_pin_matches_the_release_snapshot() {
        let release = ds41_engine::testing::release();
        let s = ReleaseSnapshot::new(release.clone(), Found::Env);
        for (rel, _) in RELEASE_FILES {
            s.file(rel).unwrap();
        }
        // A copy of an input re-serialised (4-space indentation, other whitespace) still
        // passes; one with a changed value does not.
        let rel = "encoding/tests/test_input_2.json";
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(release.join(rel)).unwrap()).unwrap();
        let mut pretty = Vec::new();
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
        serde::Serialize::serialize(
            &v,
            &mut serde_json::Serializer::with_formatter(&mut pretty, fmt),
        )
        .unwrap();
        let d = tempfile::tempdir().unwrap();
        snapshot(d.path(), &[(rel, &pretty)]);
        ReleaseSnapshot::new(d.path().to_path_buf(), Found::Flag)
            .file(rel)
            .unwrap();
        let mut changed = v.clone();
        changed[0]["content"] = "You are a harmful assistant.".into();
        let e = tempfile::tempdir().unwrap();
        snapshot(e.path(), &[(rel, &serde_json::to_vec(&changed).unwrap())]);
        let err = ReleaseSnapshot::new(e.path().to_path_buf(), Found::Flag)
            .file(rel)
            .unwrap_err();
        assert!(err.contains("compact JSON content"), "{err}");
    }
}
