//! A session's KV cache as bytes and back: what `ork serve --prefix-cache-dir` keeps on disk
//! (docs/serve.md, "Prefix reuse"). The image holds the positions and every layer's keys and
//! values as they are held (f16 or f32, little-endian, a sliding-window layer's first held
//! position); it says nothing of the model or backend, which the caller keys it by. Loading
//! checks every count against the session, so a short or foreign image is an error, never a
//! panic or a cache of the wrong shape.
use super::kv::{Heads, KvType};
use super::Session;
use crate::ExecError;
use half::f16;

const F16_TAG: u8 = 1;
const F32_TAG: u8 = 2;

fn put_u64(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&(v as u64).to_le_bytes());
}

fn put_heads(out: &mut Vec<u8>, h: &Heads) {
    /// Each head: its value count, then its values' little-endian bytes.
    fn each<T, const N: usize>(out: &mut Vec<u8>, heads: &[Vec<T>], le: impl Fn(&T) -> [u8; N]) {
        put_u64(out, heads.len());
        for head in heads {
            put_u64(out, head.len());
            out.extend(head.iter().flat_map(&le));
        }
    }
    match h {
        Heads::F16(h) => each(out, h, |v| v.to_bits().to_le_bytes()),
        Heads::F32(h) => each(out, h, |v| v.to_le_bytes()),
    }
}

/// A reader over an image that names what it misses.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ExecError> {
        if self.bytes.len() < n {
            return Err(ExecError::KvImage(format!("cut short in {what}")));
        }
        let (a, b) = self.bytes.split_at(n);
        self.bytes = b;
        Ok(a)
    }

    fn u64(&mut self, what: &str) -> Result<usize, ExecError> {
        let b = self.take(8, what)?;
        let v = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        usize::try_from(v).map_err(|_| ExecError::KvImage(format!("{what} {v} is too large")))
    }

    /// `want` heads of `values` values each.
    fn heads(
        &mut self,
        kind: KvType,
        want: usize,
        values: usize,
        what: &str,
    ) -> Result<Heads, ExecError> {
        let n = self.u64(what)?;
        if n != want {
            return Err(ExecError::KvImage(format!(
                "{what}: {n} heads, the model has {want}"
            )));
        }
        let span = values
            .checked_mul(kind.bytes())
            .ok_or_else(|| ExecError::KvImage(format!("{what}: {values} values")))?;
        // Each head: its value count (the positions held need `values`), then the values.
        let mut raw = Vec::with_capacity(n);
        for _ in 0..n {
            let got = self.u64(what)?;
            if got != values {
                return Err(ExecError::KvImage(format!(
                    "{what}: a head of {got} values where the positions held need {values}"
                )));
            }
            raw.push(self.take(span, what)?);
        }
        fn decode<T, const N: usize>(raw: &[&[u8]], le: impl Fn([u8; N]) -> T) -> Vec<Vec<T>> {
            raw.iter()
                .map(|b| {
                    b.chunks_exact(N)
                        .map(|c| le(c.try_into().expect("N bytes")))
                        .collect()
                })
                .collect()
        }
        Ok(match kind {
            KvType::F16 => Heads::F16(decode(&raw, |b| f16::from_bits(u16::from_le_bytes(b)))),
            KvType::F32 => Heads::F32(decode(&raw, f32::from_le_bytes)),
        })
    }
}

impl Session {
    /// The cached positions' keys and values as bytes, for [`Session::load_kv`] into a session
    /// of the same model, backend, cache type and context ([`Session::same_numbers`]), which
    /// the caller must ensure (the image does not name the model).
    pub fn save_kv(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.kv_bytes() + 64 * self.kv.len() + 32);
        out.push(match self.kv_type {
            KvType::F16 => F16_TAG,
            KvType::F32 => F32_TAG,
        });
        put_u64(&mut out, self.len);
        put_u64(&mut out, self.kv.len());
        for l in &self.kv {
            put_u64(&mut out, l.start);
            put_heads(&mut out, &l.keys);
            put_heads(&mut out, &l.values);
        }
        out
    }

    /// Replace what this session caches with the image `bytes` made by [`Session::save_kv`].
    ///
    /// # Errors
    /// [`ExecError::KvImage`] naming what does not fit: another cache type, layer or head count,
    /// more positions than the context, a sliding-window layer's first position out of place,
    /// a head whose length is not its positions', bytes missing or left over. The session is
    /// then unchanged.
    pub fn load_kv(&mut self, bytes: &[u8]) -> Result<(), ExecError> {
        let mut r = Reader { bytes };
        let kind = match r.take(1, "the cache type")?[0] {
            F16_TAG => KvType::F16,
            F32_TAG => KvType::F32,
            t => return Err(ExecError::KvImage(format!("unknown cache type {t}"))),
        };
        if kind != self.kv_type {
            return Err(ExecError::KvImage(format!(
                "a {kind:?} cache, this session holds {:?}",
                self.kv_type
            )));
        }
        let len = r.u64("the position count")?;
        if len == 0 || len > self.context {
            return Err(ExecError::KvImage(format!(
                "{len} positions, the context is {}",
                self.context
            )));
        }
        let layers = r.u64("the layer count")?;
        if layers != self.kv.len() {
            return Err(ExecError::KvImage(format!(
                "{layers} layers, the model has {}",
                self.kv.len()
            )));
        }
        let c = self.model.config();
        let mut kv = self.kv.clone();
        for (il, l) in kv.iter_mut().enumerate() {
            let what = |x: &str| format!("layer {il} {x}");
            let start = r.u64(&what("first position"))?;
            // A layer without a window holds every position; a sliding-window one at least the
            // window of the next position (`len - window + 1 ..`).
            let fits = match l.window {
                None => start == 0,
                Some(w) => start <= len.saturating_sub(w - 1),
            };
            if !fits {
                return Err(ExecError::KvImage(format!(
                    "layer {il} starts at position {start} of {len} (window {:?})",
                    l.window
                )));
            }
            let held = len - start;
            l.start = start;
            l.keys = r.heads(kind, c.n_head_kv, held * c.head_dim_k, &what("keys"))?;
            l.values = r.heads(kind, c.n_head_kv, held * c.head_dim_v, &what("values"))?;
        }
        if !r.bytes.is_empty() {
            return Err(ExecError::KvImage(format!(
                "{} bytes after the last layer",
                r.bytes.len()
            )));
        }
        self.kv = kv;
        self.len = len;
        Ok(())
    }
}
