//! Deterministic check data for matmul self-tests: the backend conformance suite (feature
//! `testing`) and `ork doctor` on a board both build their weights and activations here, so that
//! a check means the same thing in CI and on the board.

use half::f16;
use ork_pack::{PackDtype, PackedWeight, ScaleGroup, TiledLayout};

/// A seeded linear congruential generator (Knuth's MMIX constants, upper 31 bits): no check
/// may depend on the OS's randomness, and the same seed gives the same data on every machine.
#[derive(Debug, Clone)]
pub struct CheckRng(u64);

impl CheckRng {
    /// A generator seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 31 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A random `i8` over its whole range.
    pub fn i8(&mut self) -> i8 {
        self.next_u64() as i8
    }

    /// A random value in `[-half_width, half_width]` on a grid of `steps` values.
    pub fn centered(&mut self, half_width: f32, steps: u64) -> f32 {
        let steps = steps.max(2);
        (self.next_u64() % steps) as f32 / (steps - 1) as f32 * 2.0 * half_width - half_width
    }
}

/// A `k × n` weight of `dtype` with random integer element values (int4: −8…7, int8 and fp16:
/// −128…127, exact in fp16), tiled natively, with `group`'s count of random positive scales.
/// Also returns the untiled element values `q[n·k + k]` for references.
pub fn random_weight(
    dtype: PackDtype,
    k: usize,
    n: usize,
    group: ScaleGroup,
    rng: &mut CheckRng,
) -> (PackedWeight, Vec<i8>) {
    let layout = TiledLayout::new(dtype, k, n);
    let q: Vec<i8> = (0..n * k)
        .map(|_| match dtype {
            PackDtype::I4 => (rng.next_u64() % 16) as i8 - 8,
            _ => rng.i8(),
        })
        .collect();
    let data = tile_values(layout, &q);
    let count = group.scales_len(k, n).unwrap_or(n);
    let scales = (0..count)
        .map(|j| 0.001 + (rng.next_u64() % 1000) as f32 * 1e-5 + j as f32 * 1e-8)
        .collect();
    (
        PackedWeight {
            layout,
            data,
            scales,
            group,
        },
        q,
    )
}

/// Tile an untiled `n × k` matrix of element values `q[n·k + k]` into the native blob of
/// `layout` (int4 values must lie in −8…7).
pub fn tile_values(layout: TiledLayout, q: &[i8]) -> Vec<u8> {
    let (k, n) = (layout.k, layout.n);
    let mut data = vec![0u8; layout.blob_bytes()];
    for nn in 0..n {
        for kk in 0..k {
            let v = q[nn * k + kk];
            let e = layout.index(kk, nn);
            match layout.dtype {
                PackDtype::I8 => data[e] = v as u8,
                PackDtype::I4 => {
                    let nib = (v as u8) & 0x0F;
                    let low = e.is_multiple_of(2) == ork_pack::INT4_EVEN_K_IN_LOW_NIBBLE;
                    data[e / 2] |= if low { nib } else { nib << 4 };
                }
                PackDtype::F16 => data[2 * e..2 * e + 2]
                    .copy_from_slice(&f16::from_f32(f32::from(v)).to_le_bytes()),
            }
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_data_and_values_round_trip() {
        for dtype in [PackDtype::I8, PackDtype::I4, PackDtype::F16] {
            let (a, qa) =
                random_weight(dtype, 64, 32, ScaleGroup::PerChannel, &mut CheckRng::new(9));
            let (b, qb) =
                random_weight(dtype, 64, 32, ScaleGroup::PerChannel, &mut CheckRng::new(9));
            assert_eq!(a.data, b.data);
            assert_eq!(qa, qb);
            assert_eq!(a.scales.len(), 32);
            // Each tiled element decodes to the untiled value it was made from.
            for nn in 0..32 {
                for kk in 0..64 {
                    let e = a.layout.index(kk, nn);
                    let v = match dtype {
                        PackDtype::I8 => a.data[e] as i8,
                        PackDtype::I4 => {
                            let low = e.is_multiple_of(2) == ork_pack::INT4_EVEN_K_IN_LOW_NIBBLE;
                            let byte = a.data[e / 2];
                            let nib = if low { byte & 0x0F } else { byte >> 4 };
                            ((nib << 4) as i8) >> 4
                        }
                        PackDtype::F16 => {
                            f16::from_le_bytes([a.data[2 * e], a.data[2 * e + 1]]).to_f32() as i8
                        }
                    };
                    assert_eq!(v, qa[nn * 64 + kk], "{dtype:?} k={kk} n={nn}");
                }
            }
        }
        let (c, _) = random_weight(
            PackDtype::I8,
            64,
            32,
            ScaleGroup::PerChannel,
            &mut CheckRng::new(10),
        );
        let (d, _) = random_weight(
            PackDtype::I8,
            64,
            32,
            ScaleGroup::PerChannel,
            &mut CheckRng::new(9),
        );
        assert_ne!(c.data, d.data, "another seed gives other data");
    }
}
