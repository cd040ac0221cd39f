//! The RK3588 native B (weight) layouts, from `rknn_matmul_api.h` (SDK 2.3.2), see
//! `docs/chip.md` ("Native operand layouts").
//!
//! A GGUF weight of dims `[K, N]` (ne0 = K contiguous) is `N` rows of `K` values; as the matmul's
//! B operand it is `K × N`. Native layouts tile it as `(N/tn, K/32, tn, 32)`: outer N-tile, then
//! K-tile, then `tn` rows of 32 consecutive k values (n-major inside the tile).

/// Element type of a packed weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PackDtype {
    /// int8 symmetric, one f32 scale per output channel (w8a8).
    I8 = 1,
    /// int4 symmetric, one f32 scale per output channel; two values per byte.
    I4 = 2,
    /// fp16 passthrough (scales all 1.0).
    F16 = 3,
}

impl PackDtype {
    /// Tile height along N for this dtype on RK3588 (int8 32, int4 64, fp16 16).
    pub const fn n_tile(self) -> usize {
        match self {
            PackDtype::I8 => 32,
            PackDtype::I4 => 64,
            PackDtype::F16 => 16,
        }
    }
    /// Tile width along K (32 for all three types).
    pub const fn k_tile(self) -> usize {
        32
    }
    /// Required alignment of N (int8 32, int4 64, fp16 16).
    pub const fn n_align(self) -> usize {
        self.n_tile()
    }
    /// Short name used in the CLI and the file format docs.
    pub const fn name(self) -> &'static str {
        match self {
            PackDtype::I8 => "i8",
            PackDtype::I4 => "i4",
            PackDtype::F16 => "f16",
        }
    }
    /// Parse a CLI / on-disk name.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "i8" | "int8" => Some(PackDtype::I8),
            "i4" | "int4" => Some(PackDtype::I4),
            "f16" | "fp16" => Some(PackDtype::F16),
            _ => None,
        }
    }
    /// Decode the on-disk tag.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(PackDtype::I8),
            2 => Some(PackDtype::I4),
            3 => Some(PackDtype::F16),
            _ => None,
        }
    }
}

/// Identifier of a tiled layout, stored in the .orkpack index so a reader refuses a layout it
/// does not know instead of misreading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LayoutId {
    /// `(N/tn, K/32, tn, 32)` RK3588 native B layout, as in [`TiledLayout`].
    Rk3588NativeB = 1,
}

impl LayoutId {
    /// Decode the on-disk tag.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(LayoutId::Rk3588NativeB),
            _ => None,
        }
    }
}

/// Nibble order of int4 values inside a byte (defined beside the kernels that read it).
pub use ork_kernels::INT4_EVEN_K_IN_LOW_NIBBLE;

/// Geometry of one tiled weight: logical K × N, padded to the dtype's alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TiledLayout {
    /// Element type.
    pub dtype: PackDtype,
    /// Logical reduction dim (GGUF ne0).
    pub k: usize,
    /// Logical output channels (GGUF ne1).
    pub n: usize,
}

impl TiledLayout {
    /// Layout for a logical `k × n` weight.
    pub const fn new(dtype: PackDtype, k: usize, n: usize) -> Self {
        TiledLayout { dtype, k, n }
    }
    /// K padded up to a multiple of 32.
    pub const fn k_pad(&self) -> usize {
        self.k.div_ceil(32) * 32
    }
    /// N padded up to the dtype's N alignment.
    pub const fn n_pad(&self) -> usize {
        let a = self.dtype.n_align();
        self.n.div_ceil(a) * a
    }
    /// Number of padded elements.
    pub const fn elems(&self) -> usize {
        self.k_pad() * self.n_pad()
    }
    /// Bytes of the tiled blob.
    pub const fn blob_bytes(&self) -> usize {
        match self.dtype {
            PackDtype::I8 => self.elems(),
            PackDtype::I4 => self.elems() / 2,
            PackDtype::F16 => self.elems() * 2,
        }
    }
    /// [`TiledLayout::blob_bytes`] with overflow checked; `None` if the padded size does not fit
    /// in `usize`. Call it before trusting any other size method on dimensions from a file.
    pub const fn checked_blob_bytes(&self) -> Option<usize> {
        let (Some(kp), Some(np)) = (
            self.k.checked_add(31),
            self.n.checked_add(self.dtype.n_align() - 1),
        ) else {
            return None;
        };
        let a = self.dtype.n_align();
        let Some(elems) = (kp / 32 * 32).checked_mul(np / a * a) else {
            return None;
        };
        match self.dtype {
            PackDtype::I8 => Some(elems),
            PackDtype::I4 => Some(elems / 2),
            PackDtype::F16 => elems.checked_mul(2),
        }
    }
    /// Number of N-tiles (`n_pad / tn`).
    pub const fn n_tiles(&self) -> usize {
        self.n_pad() / self.dtype.n_tile()
    }
    /// Bytes of one N-tile; the blob is `n_tiles()` of them back to back.
    pub const fn n_tile_bytes(&self) -> usize {
        match self.dtype {
            PackDtype::I8 => self.n_tile_elems(),
            PackDtype::I4 => self.n_tile_elems() / 2,
            PackDtype::F16 => self.n_tile_elems() * 2,
        }
    }
    /// Element index (not byte index) of logical (k, n) in the tiled blob:
    /// `n_tile·(tn·Kpad) + k_tile·(tn·32) + (n % tn)·32 + (k % 32)`.
    #[inline]
    pub const fn index(&self, k: usize, n: usize) -> usize {
        let tn = self.dtype.n_tile();
        (n / tn) * (tn * self.k_pad()) + (k / 32) * (tn * 32) + (n % tn) * 32 + (k % 32)
    }
    /// Elements in one N-tile (a contiguous run of the blob covering `tn` output channels).
    pub const fn n_tile_elems(&self) -> usize {
        self.dtype.n_tile() * self.k_pad()
    }
}
