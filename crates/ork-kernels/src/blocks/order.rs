//! The fixed float order every block kernel shares, so that each SIMD kernel equals its scalar
//! twin bit for bit (`docs/kernels.md`, "Block kernels").
//!
//! * Quantized types: block `b`'s value (see `legacy.rs`) goes into lane `b % 8` of eight f32
//!   accumulators (`lane += value`, starting at +0.0); the row's result is [`reduce8`] of them.
//! * Float types: element `i`'s product goes into lane `i % 16` of sixteen accumulators; the
//!   result is [`reduce16`].
//!
//! Every step is a separate IEEE multiply or add (never fused), so x86 and aarch64 agree.

/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`: the eight lanes folded as a 256-bit
/// register is (high half onto low half, then high pair onto low pair, then the last two).
#[inline]
pub(super) fn reduce8(a: &[f32; 8]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// The sixteen lanes folded to eight (`a[j] + a[j + 8]`), then [`reduce8`].
#[inline]
pub(super) fn reduce16(a: &[f32; 16]) -> f32 {
    reduce8(&std::array::from_fn(|j| a[j] + a[j + 8]))
}
