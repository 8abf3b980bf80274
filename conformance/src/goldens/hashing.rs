//! sha256 of a file and of a directory tree, as recorded in provenance records
//! (goldens/README.md, "Hashes").

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::GoldenError;

/// Lower-case hex sha256 of a file's bytes, streamed (goldens and checkpoints can be large).
pub fn sha256_file(path: &Path) -> Result<String, GoldenError> {
    let mut file = File::open(path).map_err(|e| GoldenError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(|e| GoldenError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Hash of a directory: sha256 over the `sha256sum`-style listing of every regular file
/// below it, `"<hex sha256>  <relative/path>\n"`, sorted by path (with `/` separators).
/// Reproducible from a shell: `(cd DIR && find . -type f | sed 's|^\./||' | LC_ALL=C sort |
/// xargs -d '\n' sha256sum) | sha256sum`.
pub fn tree_sha256(dir: &Path) -> Result<String, GoldenError> {
    let mut files = Vec::new();
    collect_files(dir, dir, &mut files)?;
    files.sort();
    let mut listing = String::new();
    for rel in files {
        let digest = sha256_file(&dir.join(&rel))?;
        listing.push_str(&format!("{digest}  {rel}\n"));
    }
    Ok(sha256_bytes(listing.as_bytes()))
}

/// Hash a path that is either a file (its bytes) or a directory ([`tree_sha256`]).
pub fn sha256_path(path: &Path) -> Result<String, GoldenError> {
    let meta = std::fs::metadata(path).map_err(|e| GoldenError::io(path, e))?;
    if meta.is_dir() {
        tree_sha256(path)
    } else {
        sha256_file(path)
    }
}

fn collect_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), GoldenError> {
    let entries = std::fs::read_dir(dir).map_err(|e| GoldenError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| GoldenError::io(dir, e))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| GoldenError::io(&path, e))?;
        if kind.is_dir() {
            collect_files(root, &path, out)?;
        } else if kind.is_file() {
            let rel = path
                .strip_prefix(root)
                .expect("walked path is below its root")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push(rel);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_bytes() {
        assert_eq!(
            sha256_bytes(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn tree_hash_matches_sorted_listing_and_sees_renames() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("b.txt"), b"b").unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), b"a").unwrap();
        let listing = format!(
            "{}  b.txt\n{}  sub/a.txt\n",
            sha256_bytes(b"b"),
            sha256_bytes(b"a")
        );
        let first = tree_sha256(dir.path()).unwrap();
        assert_eq!(first, sha256_bytes(listing.as_bytes()));
        std::fs::rename(dir.path().join("b.txt"), dir.path().join("c.txt")).unwrap();
        assert_ne!(tree_sha256(dir.path()).unwrap(), first);
    }
}
