//! The numbers identity of an engine's sessions: what a KV cache kept beyond the process
//! (`ork serve --prefix-cache-dir`, docs/serve.md "Across restarts") is keyed by.
//!
//! It hashes every byte of every tensor once (XXH3-64; ~20 ms for a 98 MB model in the page
//! cache, about a second per 8 GB, more when the file must first be read from flash), so any
//! edit of the numbers changes it. That digest is cached in a small file (`model-digest-*`) in a
//! directory the caller owns, keyed by the model file's device, inode, size, modification time
//! and status-change time (`ctime`, which no program can set back): a restart on an unchanged
//! file reads the digest instead of the model. The cache file is trusted input, as everything in
//! that directory.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::Engine;

/// The first line of a digest cache file (format version 1).
const DIGEST_MAGIC: &str = "ork model digest v1";

/// What identifies one state of a file: device, inode, size, modification and status-change
/// times (nanoseconds).
fn file_key(path: &Path) -> Option<[i128; 5]> {
    let m = std::fs::metadata(path).ok()?;
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    Some([
        i128::from(m.dev()),
        i128::from(m.ino()),
        i128::from(m.size()),
        ns(m.mtime(), m.mtime_nsec()),
        ns(m.ctime(), m.ctime_nsec()),
    ])
}

/// The device text that names what computes: the name of an emulator chosen by `auto` carries a
/// note on why (`emulated RK3588 NPU (avx2 kernel; no rknpu driver …)`), which computes the
/// same numbers as `--device emu`; the note is left out.
pub(crate) fn computing_device(name: &str) -> String {
    match name.split_once("; ") {
        Some((head, _)) if head.contains('(') => format!("{head})"),
        _ => name.to_owned(),
    }
}

impl Engine {
    /// An identity of the keys and values this engine's sessions of `context` positions
    /// compute, for KV caches kept beyond the process (`ork serve --prefix-cache-dir`): two
    /// engines with the same identity compute the same numbers for the same tokens. It hashes
    /// ork's version, the model (its metadata but the tokenizer's, every tensor's name, type,
    /// dims and every byte of its data, after smoothing), the quantization (dtype, activations,
    /// scale groups), the device that computes and the chip it keeps to, the compute threads,
    /// the KV cache type and the context (which picks LongRoPE's factors). What does not change
    /// a number — the budget, domains, prefetch, the pack's path, why `auto` chose the emulator
    /// — is left out.
    ///
    /// With `digest_dir`, the tensors' digest is cached there (module docs), so only the first
    /// start on a model file reads all of it.
    pub fn numbers_identity(&self, context: usize, digest_dir: Option<&Path>) -> u64 {
        let c = &self.config;
        let mut text = format!(
            "ork {} numbers v2\nmodel {} bytes\n",
            env!("CARGO_PKG_VERSION"),
            self.gguf.file_len()
        );
        // The tokenizer's keys map text to tokens; the cache is keyed by tokens already.
        for (k, v) in self
            .gguf
            .metadata_iter()
            .filter(|(k, _)| !k.starts_with("tokenizer."))
        {
            text.push_str(&format!("{k}={v:?}\n"));
        }
        text.push_str(&format!(
            "tensors {:016x}\n",
            self.tensor_digest(digest_dir)
        ));
        text.push_str(&format!(
            "dtype {:?} activations {:?} group {:?} device {} soc {:?} threads {} kv {:?} \
             context {context}\n",
            c.dtype,
            c.activations,
            c.group,
            computing_device(&self.compute_name()),
            c.soc,
            self.threads(),
            c.kv_cache,
        ));
        ork_store::xxh3_64(text.as_bytes())
    }

    /// XXH3-64 over every tensor's name, type, dims and every byte of its data, read from
    /// `digest_dir`'s cache when the model file is unchanged (a smoothed model, computed in
    /// memory, is always hashed).
    fn tensor_digest(&self, digest_dir: Option<&Path>) -> u64 {
        let cached = digest_dir
            .filter(|_| self.config.smooth.is_none())
            .and_then(|dir| Some((dir, file_key(&self.config.model)?)));
        if let Some((dir, key)) = cached {
            if let Some(d) = read_digest(&digest_file(dir, &self.config.model), key) {
                return d;
            }
        }
        let mut text = String::with_capacity(64 * self.gguf.tensors().len());
        for t in self.gguf.tensors() {
            let sum = ork_store::xxh3_64(self.gguf.tensor_data(t));
            text.push_str(&format!(
                "{} {} {:?} {sum:016x}\n",
                t.name,
                t.ty.id(),
                t.dims
            ));
        }
        let digest = ork_store::xxh3_64(text.as_bytes());
        // Stored only if the file did not change while it was hashed.
        if let Some((dir, key)) = cached.filter(|&(_, k)| file_key(&self.config.model) == Some(k)) {
            let body = format!(
                "{DIGEST_MAGIC}\n{} {} {} {} {} {digest:016x}\n",
                key[0], key[1], key[2], key[3], key[4]
            );
            let path = digest_file(dir, &self.config.model);
            if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                if let Err(e) = ork_io::output::write_in_dir(dir, name, body.as_bytes(), &[]) {
                    eprintln!("warning: the model's digest is not cached: {e}");
                }
            }
        }
        digest
    }
}

/// The digest cache file of `model` in `dir` (one per model path).
pub(crate) fn digest_file(dir: &Path, model: &Path) -> PathBuf {
    let real = std::fs::canonicalize(model).unwrap_or_else(|_| model.to_path_buf());
    let id = ork_store::xxh3_64(real.as_os_str().as_encoded_bytes());
    dir.join(format!("model-digest-{id:016x}"))
}

/// The digest `path` holds for a file whose state is `key`; `None` if absent, malformed or
/// made for another state of the file.
fn read_digest(path: &Path, key: [i128; 5]) -> Option<u64> {
    let bytes = ork_io::input::read_input(path, 4096).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    let mut lines = text.lines();
    if lines.next()? != DIGEST_MAGIC {
        return None;
    }
    let fields: Vec<&str> = lines.next()?.split(' ').collect();
    let [a, b, c, d, e, digest] = fields.as_slice() else {
        return None;
    };
    let found: Vec<i128> = [a, b, c, d, e]
        .iter()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    (found == key).then(|| u64::from_str_radix(digest, 16).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_emulator_auto_chose_computes_as_the_one_asked_for() {
        assert_eq!(
            computing_device("emulated RK3588 NPU (avx2 kernel; no /dev/rknpu: emulating)"),
            computing_device("emulated RK3588 NPU (avx2 kernel)")
        );
        assert_ne!(
            computing_device("emulated RK3588 NPU (avx2 kernel)"),
            computing_device("emulated RK3588 NPU (scalar kernel)")
        );
    }

    #[test]
    fn a_digest_is_read_back_only_for_the_same_state_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"numbers").unwrap();
        let key = file_key(&model).unwrap();
        let file = digest_file(dir.path(), &model);
        let body = format!(
            "{DIGEST_MAGIC}\n{} {} {} {} {} {:016x}\n",
            key[0], key[1], key[2], key[3], key[4], 0xabcu64
        );
        std::fs::write(&file, body).unwrap();
        assert_eq!(read_digest(&file, key), Some(0xabc));
        // Rewritten in place, same size, modification time set back: ctime moved.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mtime = std::fs::metadata(&model).unwrap().modified().unwrap();
        std::fs::write(&model, b"NUMBERS").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&model)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let now = file_key(&model).unwrap();
        assert_eq!((now[2], now[3]), (key[2], key[3]));
        assert_eq!(read_digest(&file, now), None);
    }
}
