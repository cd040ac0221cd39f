//! The SoC table (`soc.rs`), its enforcement by the emulator, the N/K split helpers and per-group
//! int8 weights, against the values `docs/chip.md` documents.

use super::*;
use ork_device::soc::{ElemType, Limits, MatmulType};
use ork_device::split::{arrange, native_order, part_offsets, part_weight, split, PartBytes};
use ork_device::MatmulShape;
use ork_pack::{pack_grouped, MatrixRows};

use ElemType::{Fp16, Fp32, Int16, Int32, Int4, Int8};

fn ty(a: ElemType, b: ElemType, c: ElemType) -> MatmulType {
    MatmulType { a, b, c }
}

#[test]
fn rk3588_table_is_the_documented_one() {
    let caps = Soc::Rk3588.caps();
    let mut want = vec![
        ty(Fp16, Fp16, Fp16),
        ty(Fp16, Fp16, Fp32),
        ty(Int8, Int8, Int32),
        ty(Int8, Int8, Fp32),
        ty(Int8, Int8, Int8),
        ty(Int4, Int4, Int16),
    ];
    assert_eq!(caps.types, want.as_slice());
    // No w8a16, no w4a16, no int8 × int4, no int8 × fp16.
    for (a, b) in [(Fp16, Int8), (Fp16, Int4), (Int8, Int4), (Int8, Fp16)] {
        assert!(Soc::Rk3588.outputs(a, b).is_empty(), "{a} × {b}");
    }
    assert_eq!(Soc::Rk3588.group_sizes(Int8, Int8), &[128, 256, 512]);
    assert!(Soc::Rk3588.group_sizes(Fp16, Int4).is_empty());
    assert_eq!(
        caps.limits,
        Limits {
            name: "rk3588",
            npu_cores: 3,
            k_align: 32,
            k_max: 10240,
            k_segment: 8192,
            n_max_int8: Some(4096),
            n_max_fp16: Some(4096),
            n_max_int4: Some(8192),
        }
    );
    assert_eq!(
        (
            Soc::n_align(Int8),
            Soc::n_align(Fp16),
            Soc::n_align(Int4)
        ),
        (32, 16, 64)
    );
    // The RK3576 adds the mixed types and w4a16 groups; its N limits are not documented.
    want.extend([
        ty(Fp16, Int8, Fp32),
        ty(Fp16, Int4, Fp16),
        ty(Fp16, Int4, Fp32),
        ty(Int8, Int4, Int32),
    ]);
    let c76 = Soc::Rk3576.caps();
    assert_eq!(c76.types, want.as_slice());
    assert_eq!(Soc::Rk3576.group_sizes(Int8, Int8), &[128, 256, 512]);
    assert_eq!(Soc::Rk3576.group_sizes(Fp16, Int4), &[32, 64, 128]);
    assert_eq!(Soc::Rk3576.outputs(Fp16, Int4), vec![Fp16, Fp32]);
    assert_eq!((c76.limits.k_align, c76.limits.k_max), (32, 10240));
    assert_eq!(
        (
            c76.limits.n_max_int8,
            c76.limits.n_max_fp16,
            c76.limits.n_max_int4
        ),
        (None, None, None)
    );
}

#[test]
fn soc_names_parse_and_unknown_ones_are_errors() {
    assert_eq!("rk3588".parse::<Soc>().unwrap(), Soc::Rk3588);
    assert_eq!("RK3576".parse::<Soc>().unwrap(), Soc::Rk3576);
    for bad in ["rk3566", "", "3588", "rk3588 "] {
        assert!(
            matches!(bad.parse::<Soc>(), Err(DeviceError::UnknownSoc { ref name }) if name == bad),
            "{bad:?}"
        );
    }
    assert_eq!(Soc::default(), Soc::Rk3588);
    assert_eq!(EmuDevice::new().soc(), Soc::Rk3588);
}

fn shape(b: ElemType, k: usize, n: usize) -> MatmulShape {
    MatmulShape {
        a: if b == Int4 { Int4 } else { b },
        b,
        k,
        n,
        group: ScaleGroup::PerChannel,
    }
}

fn limit_of(r: Result<(), DeviceError>) -> Option<ChipLimit> {
    match r {
        Ok(()) => None,
        Err(DeviceError::Chip { limit, .. }) => Some(limit),
        Err(e) => panic!("not a chip error: {e}"),
    }
}

#[test]
fn every_limit_is_checked_at_its_edge() {
    let s = Soc::Rk3588;
    let check = |sh| limit_of(s.check(&sh));
    // K: multiple of 32, at most 10240 (all types).
    for b in [Int8, Fp16, Int4] {
        assert_eq!(check(shape(b, 10240, 64)), None, "{b}");
        assert_eq!(
            check(shape(b, 10272, 64)),
            Some(ChipLimit::KMax { max: 10240 })
        );
        assert_eq!(
            check(shape(b, 48, 64)),
            Some(ChipLimit::KAlign { align: 32 })
        );
    }
    // N alignment per weight type.
    assert_eq!(
        check(shape(Int8, 32, 48)),
        Some(ChipLimit::NAlign { align: 32 })
    );
    assert_eq!(check(shape(Fp16, 32, 48)), None);
    assert_eq!(
        check(shape(Fp16, 32, 24)),
        Some(ChipLimit::NAlign { align: 16 })
    );
    assert_eq!(
        check(shape(Int4, 32, 96)),
        Some(ChipLimit::NAlign { align: 64 })
    );
    // N maxima: 4096 int8 / fp16, 8192 int4.
    assert_eq!(check(shape(Int8, 32, 4096)), None);
    assert_eq!(
        check(shape(Int8, 32, 4128)),
        Some(ChipLimit::NMax { max: 4096 })
    );
    assert_eq!(check(shape(Fp16, 32, 4096)), None);
    assert_eq!(
        check(shape(Fp16, 32, 4112)),
        Some(ChipLimit::NMax { max: 4096 })
    );
    assert_eq!(check(shape(Int4, 32, 8192)), None);
    assert_eq!(
        check(shape(Int4, 32, 8256)),
        Some(ChipLimit::NMax { max: 8192 })
    );
    // The RK3576's N maxima are unknown, so not enforced; its K limits are.
    assert_eq!(limit_of(Soc::Rk3576.check(&shape(Int8, 576, 49152))), None);
    assert_eq!(
        limit_of(Soc::Rk3576.check(&shape(Int8, 11008, 64))),
        Some(ChipLimit::KMax { max: 10240 })
    );
    // Type pairs and groups.
    let mixed = MatmulShape {
        a: Fp16,
        ..shape(Int8, 64, 64)
    };
    assert_eq!(limit_of(s.check(&mixed)), Some(ChipLimit::TypePair));
    assert_eq!(limit_of(Soc::Rk3576.check(&mixed)), None);
    let grouped = |g, a, b| MatmulShape {
        a,
        b,
        k: 1024,
        n: 64,
        group: ScaleGroup::Group(g),
    };
    for g in [128, 256, 512] {
        assert_eq!(limit_of(s.check(&grouped(g, Int8, Int8))), None);
    }
    for g in [32, 64, 1024] {
        assert_eq!(
            limit_of(s.check(&grouped(g, Int8, Int8))),
            Some(ChipLimit::Group { group: g })
        );
    }
    assert_eq!(limit_of(Soc::Rk3576.check(&grouped(32, Fp16, Int4))), None);
    assert_eq!(
        limit_of(s.check(&grouped(128, Fp16, Int4))),
        Some(ChipLimit::TypePair)
    );
    // The error names chip, pair and limit.
    let e = s.check(&shape(Int8, 576, 49152)).unwrap_err();
    assert!(matches!(
        e,
        DeviceError::Chip {
            soc: Soc::Rk3588,
            a: Int8,
            b: Int8,
            k: 576,
            n: 49152,
            limit: ChipLimit::NMax { max: 4096 }
        }
    ));
}

/// A random int8 weight `k × n` with per-channel scales.
fn int8_weight(k: usize, n: usize, seed: u64) -> PackedWeight {
    let mut rng = Rng(seed);
    random_weight(PackDtype::I8, k, n, &mut rng).0
}

fn emu_limits(soc: Soc, enforce_limits: bool) -> EmuDevice {
    EmuDevice::with_config(EmuConfig {
        soc,
        enforce_limits,
        ..EmuConfig::default()
    })
    .unwrap()
}

#[test]
fn the_emulator_enforces_limits_only_when_asked() {
    // SmolLM2's lm head: N = 49152 > 4096.
    let pw = int8_weight(576, 49152, 1);
    let a = vec![1i8; 576];
    let mut out = vec![0f32; 49152];
    let on = emu_limits(Soc::Rk3588, true);
    let r = upload(&on, &pw, DomainId(0));
    assert!(
        matches!(
            r,
            Err(DeviceError::Chip {
                limit: ChipLimit::NMax { max: 4096 },
                ..
            })
        ),
        "prepare_weight: {r:?}"
    );
    // A weight placed without prepare (as the cache may) is refused at the task too.
    let off = emu_limits(Soc::Rk3588, false);
    let w = upload(&off, &pw, DomainId(0)).unwrap();
    off.matmul(&task(1, &a, &[1.0], &w), &mut out).unwrap();
    let mut buf = on
        .create_buffer(pw.data.len() as u64, BufferIntent::Weight, DomainId(0))
        .unwrap();
    buf.as_mut_slice().copy_from_slice(&pw.data);
    let wr = ork_device::WeightRef {
        layout: pw.layout,
        bytes: buf.full_view(),
        scales: &pw.scales,
        group: ScaleGroup::PerChannel,
    };
    let t = MatmulTask {
        weight: wr,
        ..task(1, &a, &[1.0], &w)
    };
    let r = on.matmul(&t, &mut out);
    assert!(matches!(
        r,
        Err(DeviceError::Chip {
            limit: ChipLimit::NMax { .. },
            ..
        })
    ));
    assert_eq!(on.stats().tasks, 0);
    // Type pairs are refused whatever the switch says.
    let a16 = vec![f16::ONE; 576];
    let t16 = MatmulTask {
        m: 1,
        activations: Activations::HostF16(&a16),
        act_scales: &[],
        weight: w.as_weight(),
        cores: CoreMask::AUTO,
    };
    assert!(is_type_pair_refusal(&off.matmul(&t16, &mut out)));
    assert!(emu_on(Soc::Rk3576).info().name.contains("RK3576"));
}

/// Run each part on `dev`: N-chunks concatenated into columns, K-segments of one chunk added in
/// f32 in order (the f32 result), and the exact i32 sums the same way (the raw result).
fn run_parts(
    dev: &EmuDevice,
    pw: &PackedWeight,
    a: &[i8],
    m: usize,
    sa: &[f32],
) -> (Vec<f32>, Vec<i32>) {
    let (k, n) = (pw.layout.k, pw.layout.n);
    let parts = split(&pw.layout, pw.group, dev.soc()).unwrap();
    let mut out = vec![0f32; m * n];
    let mut raw = vec![0i32; m * n];
    for p in &parts {
        let part = part_weight(pw, p).unwrap();
        let w = upload(dev, &part, DomainId(0)).unwrap();
        let (pk, pn) = (p.k.len(), p.n.len());
        let ap: Vec<i8> = (0..m)
            .flat_map(|i| a[i * k + p.k.start..i * k + p.k.end].iter().copied())
            .collect();
        let mut o = vec![0f32; m * pn];
        let mut r = vec![0i32; m * pn];
        assert_eq!(ap.len(), m * pk);
        dev.matmul(&task(m, &ap, sa, &w), &mut o).unwrap();
        dev.matmul_raw(&task(m, &ap, sa, &w), &mut r).unwrap();
        for i in 0..m {
            for j in 0..pn {
                out[i * n + p.n.start + j] += o[i * pn + j];
                raw[i * n + p.n.start + j] += r[i * pn + j];
            }
        }
    }
    (out, raw)
}

#[test]
fn the_lm_head_splits_into_contiguous_n_chunks_that_reproduce_it() {
    let (k, n, m) = (576, 49152, 3);
    let pw = int8_weight(k, n, 2);
    let parts = split(&pw.layout, pw.group, Soc::Rk3588).unwrap();
    assert_eq!(parts.len(), 12);
    for (i, p) in parts.iter().enumerate() {
        assert_eq!((p.n.clone(), p.k.clone()), (i * 4096..(i + 1) * 4096, 0..k));
        assert_eq!(p.bytes, PartBytes::Range(i * 4096 * k..(i + 1) * 4096 * k));
        assert_eq!(
            limit_of(Soc::Rk3588.check(&shape(Int8, p.layout.k, p.layout.n))),
            None
        );
    }
    let dev = emu_limits(Soc::Rk3588, true);
    let whole = emu_limits(Soc::Rk3588, false);
    let mut rng = Rng(3);
    let a: Vec<i8> = (0..m * k).map(|_| rng.i8()).collect();
    let sa = [0.5, 0.25, 0.125];
    let (out, raw) = run_parts(&dev, &pw, &a, m, &sa);
    let w = upload(&whole, &pw, DomainId(0)).unwrap();
    let mut want = vec![0f32; m * n];
    let mut want_raw = vec![0i32; m * n];
    whole.matmul(&task(m, &a, &sa, &w), &mut want).unwrap();
    whole
        .matmul_raw(&task(m, &a, &sa, &w), &mut want_raw)
        .unwrap();
    assert_eq!(raw, want_raw);
    // Each column is computed alone either way: the f32 results are identical too.
    assert!(out
        .iter()
        .zip(&want)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn a_long_k_splits_into_segments_whose_sums_reproduce_it() {
    // A 7B-style ffn_down: K = 11008 > 10240, cut into 8192 + 2816.
    let (k, n, m) = (11008, 96, 5);
    let mut rng = Rng(4);
    let a: Vec<i8> = (0..m * k).map(|_| rng.i8()).collect();
    let sa: Vec<f32> = (0..m).map(|i| 0.01 + i as f32 * 1e-3).collect();
    let dev = emu_limits(Soc::Rk3588, true);
    let whole = emu_limits(Soc::Rk3588, false);
    // Per channel, and per group of 128 (the segments carry their own groups' scales).
    let src: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let rows = MatrixRows::new(&src, k, n).unwrap();
    let grouped = pack_grouped(&rows, PackDtype::I8, 128).unwrap();
    for pw in [int8_weight(k, n, 5), grouped] {
        let parts = split(&pw.layout, pw.group, Soc::Rk3588).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!((parts[0].k.clone(), parts[1].k.clone()), (0..8192, 8192..k));
        assert!(parts.iter().all(|p| p.bytes == PartBytes::Repack));
        let (out, raw) = run_parts(&dev, &pw, &a, m, &sa);
        let w = upload(&whole, &pw, DomainId(0)).unwrap();
        let mut want = vec![0f32; m * n];
        let mut want_raw = vec![0i32; m * n];
        whole.matmul(&task(m, &a, &sa, &w), &mut want).unwrap();
        whole
            .matmul_raw(&task(m, &a, &sa, &w), &mut want_raw)
            .unwrap();
        assert_eq!(raw, want_raw, "{:?}: integer sums", pw.group);
        let q = ork_pack::untile(&pw).unwrap();
        for i in 0..m {
            for j in 0..n {
                let mag: f64 = (0..k)
                    .map(|kk| (f64::from(a[i * k + kk]) * f64::from(q[j * k + kk])).abs())
                    .sum::<f64>()
                    * f64::from(sa[i]);
                let (got, exp) = (out[i * n + j], want[i * n + j]);
                // Both are within f32 rounding of the same value: 2⁻²² of the magnitude.
                assert!(
                    (f64::from(got) - f64::from(exp)).abs() <= mag * 2f64.powi(-20) + 1e-30,
                    "{:?} [{i},{j}] {got} vs {exp}",
                    pw.group
                );
            }
        }
    }
}

#[test]
fn split_refuses_what_it_cannot_cut_and_bad_parts() {
    let l = TiledLayout::new(PackDtype::I8, 11008, 64);
    // 11008 = 43 · 256; a 8192-segment cuts no 256-group, but would cut a 768-group (not a
    // chip size, so only the helper's own check speaks).
    assert!(split(&l, ScaleGroup::Group(256), Soc::Rk3588).is_ok());
    assert!(matches!(
        split(
            &TiledLayout::new(PackDtype::I8, 11520, 64),
            ScaleGroup::Group(768),
            Soc::Rk3588
        ),
        Err(DeviceError::Shape { .. })
    ));
    assert!(matches!(
        split(
            &TiledLayout::new(PackDtype::I8, 0, 64),
            ScaleGroup::PerChannel,
            Soc::Rk3588
        ),
        Err(DeviceError::Shape { .. })
    ));
    // A weight within the limits is one part: its whole blob.
    let small = TiledLayout::new(PackDtype::I4, 576, 1536);
    assert_eq!(
        split(&small, ScaleGroup::PerChannel, Soc::Rk3588).unwrap()[0].bytes,
        PartBytes::Range(0..small.blob_bytes())
    );
    let pw = int8_weight(64, 64, 6);
    let mut p = split(&pw.layout, pw.group, Soc::Rk3588).unwrap().remove(0);
    p.n = 16..48; // not on a tile boundary
    assert!(matches!(
        part_weight(&pw, &p),
        Err(DeviceError::Shape { .. })
    ));
    let mut short = pw.clone();
    short.scales.pop();
    let p = split(&pw.layout, pw.group, Soc::Rk3588).unwrap().remove(0);
    assert!(matches!(
        part_weight(&short, &p),
        Err(DeviceError::Length {
            operand: "weight scales",
            ..
        })
    ));
}

#[test]
fn per_group_weights_from_the_pack_layer_match_their_dequantization() {
    let (k, n, m) = (1536, 96, 4);
    let src: Vec<f32> = (0..n * k)
        .map(|i| {
            (((i * 2_654_435_761) % 4001) as f32 / 2000.0 - 1.0) * (1.0 + (i % k) as f32 / 64.0)
        })
        .collect();
    let rows = MatrixRows::new(&src, k, n).unwrap();
    let dev = emu_limits(Soc::Rk3588, true);
    let mut rng = Rng(7);
    let a: Vec<i8> = (0..m * k).map(|_| rng.i8()).collect();
    let sa: Vec<f32> = (0..m).map(|i| 0.02 + i as f32 * 1e-3).collect();
    for g in [128, 256, 512] {
        let pw = pack_grouped(&rows, PackDtype::I8, g).unwrap();
        pw.check().unwrap();
        assert_eq!(pw.scales.len(), n * k / g);
        let deq = ork_pack::untile(&pw).unwrap();
        let w = upload(&dev, &pw, DomainId(0)).unwrap();
        let mut out = vec![0f32; m * n];
        let st = dev.matmul(&task(m, &a, &sa, &w), &mut out).unwrap();
        assert_eq!(st.kernel, dev.isa().name());
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut mag) = (0f64, 0f64);
                for kk in 0..k {
                    let p = f64::from(a[i * k + kk]) * f64::from(deq[j * k + kk]);
                    exact += p;
                    mag += p.abs();
                }
                let s = f64::from(sa[i]);
                let got = f64::from(out[i * n + j]);
                let bound = (k / g + 2) as f64 * mag * 2f64.powi(-24) * 1.01 * s;
                assert!(
                    (got - exact * s).abs() <= bound,
                    "g{g} [{i},{j}] {got} vs {}",
                    exact * s
                );
            }
        }
    }
}

#[test]
fn per_group_misuse_is_a_typed_error() {
    let (k, n) = (512, 64);
    let src: Vec<f32> = (0..n * k).map(|i| (i % 97) as f32 - 48.0).collect();
    let rows = MatrixRows::new(&src, k, n).unwrap();
    // A group that does not divide K, or is not a multiple of 32, or an fp16 weight.
    for (g, d) in [
        (384, PackDtype::I8),
        (48, PackDtype::I8),
        (128, PackDtype::F16),
    ] {
        assert!(
            matches!(
                pack_grouped(&rows, d, g),
                Err(ork_pack::PackError::Group { group, .. }) if group == g
            ),
            "g{g} {d:?}"
        );
    }
    let dev = EmuDevice::new();
    let pw = pack_grouped(&rows, PackDtype::I8, 128).unwrap();
    // A scale group that does not fit K is refused at upload.
    let mut bad = pw.clone();
    bad.group = ScaleGroup::Group(384);
    assert!(matches!(
        upload(&dev, &bad, DomainId(0)),
        Err(DeviceError::Shape { .. })
    ));
    // The scale count must be N · K/g.
    let mut short = pw.clone();
    short.scales.truncate(n);
    assert!(matches!(
        upload(&dev, &short, DomainId(0)),
        Err(DeviceError::Length {
            operand: "weight scales",
            ..
        })
    ));
    // w4a16-g32 is not a chip type on the RK3588: refused before anything runs.
    let p4 = pack_grouped(&rows, PackDtype::I4, 32).unwrap();
    let a16 = vec![f16::ONE; k];
    let mut out = vec![0f32; n];
    let d = emu_on(Soc::Rk3588);
    let w = upload(&d, &p4, DomainId(0)).unwrap();
    let t = MatmulTask {
        m: 1,
        activations: Activations::HostF16(&a16),
        act_scales: &[],
        weight: w.as_weight(),
        cores: CoreMask::AUTO,
    };
    let r = d.matmul(&t, &mut out);
    assert!(is_type_pair_refusal(&r), "{r:?}");
}

/// RK3576 w4a16-g32/g64/g128: fp16 activations (with outlier channels) × int4 weights with
/// per-group scales from the pack layer equal their dequantization within f32 rounding, prefill
/// and decode shapes, N not a multiple of the int4 tile (padding channels dropped); the same
/// weight with a group the chip lacks (g192) is a `ChipLimit::Group` refusal.
#[test]
fn per_group_int4_with_fp16_activations_matches_its_dequantization_on_the_rk3576() {
    let (k, n) = (1152, 96);
    let src: Vec<f32> = (0..n * k)
        .map(|i| {
            (((i * 2_654_435_761) % 4001) as f32 / 2000.0 - 1.0) * (1.0 + (i % k) as f32 / 64.0)
        })
        .collect();
    let rows = MatrixRows::new(&src, k, n).unwrap();
    let dev = emu_limits(Soc::Rk3576, true);
    for m in [1, 5, 40] {
        let a: Vec<f16> = (0..m * k)
            .map(|i| {
                let u = ((i * 7919) % 2001) as f32 / 1000.0 - 1.0;
                f16::from_f32(if i % k == 17 { u * 900.0 } else { u })
            })
            .collect();
        for g in [32, 64, 128, 192] {
            let pw = pack_grouped(&rows, PackDtype::I4, g).unwrap();
            pw.check().unwrap();
            assert_eq!(pw.scales.len(), n * k / g);
            let deq = ork_pack::untile(&pw).unwrap();
            let w = upload(&dev, &pw, DomainId(0)).unwrap();
            let t = MatmulTask {
                m,
                activations: Activations::HostF16(&a),
                act_scales: &[],
                weight: w.as_weight(),
                cores: CoreMask::AUTO,
            };
            let mut out = vec![0f32; m * n];
            let r = dev.matmul(&t, &mut out);
            if g == 192 {
                // 192 divides K but is not one of the chip's w4a16 groups.
                assert!(
                    matches!(
                        r,
                        Err(DeviceError::Chip {
                            limit: ChipLimit::Group { group: 192 },
                            ..
                        })
                    ),
                    "{r:?}"
                );
                continue;
            }
            assert!(r.unwrap().kernel.starts_with("f32-"), "the float path runs");
            for i in 0..m {
                for j in 0..n {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for kk in 0..k {
                        let p = f64::from(a[i * k + kk].to_f32()) * f64::from(deq[j * k + kk]);
                        exact += p;
                        mag += p.abs();
                    }
                    let got = f64::from(out[i * n + j]);
                    let bound = (g / 8 + 8 + k / g + 2) as f64 * mag * 2f64.powi(-24) * 1.01;
                    assert!(
                        (got - exact).abs() <= bound,
                        "m {m} g{g} [{i},{j}] {got} vs {exact}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_split_order_stores_each_part_as_its_own_blob() {
    // N-chunks and K-segments at once: K 10272 > 10240 (8192 + 2080), N 4160 > 4096.
    let (k, n) = (10272, 4160);
    let layout = TiledLayout::new(PackDtype::I8, k, n);
    let mut rng = Rng(9);
    let pw = PackedWeight {
        layout,
        data: rng.bytes(layout.blob_bytes()),
        scales: (0..n).map(|i| i as f32).collect(),
        group: ScaleGroup::PerChannel,
    };
    let parts = split(&layout, pw.group, Soc::Rk3588).unwrap();
    assert_eq!(parts.len(), 4);
    assert!(!native_order(&parts));
    let mut dst = vec![0u8; layout.blob_bytes()];
    arrange(&layout, &pw.data, &parts, &mut dst).unwrap();
    let offsets = part_offsets(&parts);
    for (p, &o) in parts.iter().zip(&offsets) {
        let own = part_weight(&pw, p).unwrap();
        assert_eq!(
            &dst[o..o + own.data.len()],
            &own.data[..],
            "{:?} {:?}",
            p.n,
            p.k
        );
    }
    let last = parts.last().unwrap();
    assert_eq!(
        offsets.last().unwrap() + last.layout.blob_bytes(),
        layout.blob_bytes()
    );
    // N-chunks alone are the native blob unchanged.
    let head = TiledLayout::new(PackDtype::I8, 576, 49152);
    let head_parts = split(&head, ScaleGroup::PerChannel, Soc::Rk3588).unwrap();
    assert!(native_order(&head_parts));
    assert!(matches!(
        arrange(&layout, &pw.data, &parts, &mut dst[1..]),
        Err(DeviceError::Length { .. })
    ));
}

/// RK3576 w4a16-gN with affine groups (step and offset per group): the emulator's two matmuls
/// (fp16 × int4 per group, plus fp16 group sums × fp16 offsets) equal the weight's
/// dequantization `s · q + b` within f32 rounding plus the fp16 rounding of the group sums and
/// offsets the chip's second matmul takes; prefill and decode shapes, N not a multiple of the
/// int4 tile.
#[test]
fn affine_int4_groups_match_their_dequantization_on_the_rk3576() {
    let (k, n) = (1152, 96);
    // Groups that are not centred on zero (offsets far from 0), as Q4_1 weights are.
    let src: Vec<f32> = (0..n * k)
        .map(|i| {
            let u = ((i * 2_654_435_761) % 4001) as f32 / 2000.0 - 1.0;
            (u + ((i / 32) % 5) as f32 * 0.3) * (1.0 + (i % k) as f32 / 256.0)
        })
        .collect();
    let rows = MatrixRows::new(&src, k, n).unwrap();
    let dev = emu_limits(Soc::Rk3576, true);
    for m in [1, 5, 40] {
        let a: Vec<f16> = (0..m * k)
            .map(|i| {
                let u = ((i * 7919) % 2001) as f32 / 1000.0 - 1.0;
                f16::from_f32(if i % k == 17 { u * 900.0 } else { u })
            })
            .collect();
        for g in [32, 64, 128] {
            let pw = ork_pack::pack_affine(&rows, g).unwrap();
            assert_eq!(pw.scales.len(), 2 * n * k / g);
            let deq = ork_pack::untile(&pw).unwrap();
            let (_, offsets) = pw.group.split(&pw.scales);
            let w = upload(&dev, &pw, DomainId(0)).unwrap();
            let t = MatmulTask {
                m,
                activations: Activations::HostF16(&a),
                act_scales: &[],
                weight: w.as_weight(),
                cores: CoreMask::AUTO,
            };
            let mut out = vec![0f32; m * n];
            assert!(dev.matmul(&t, &mut out).unwrap().kernel.starts_with("f32-"));
            let groups = k / g;
            for i in 0..m {
                for j in 0..n {
                    let (mut exact, mut mag, mut off_mag) = (0f64, 0f64, 0f64);
                    for kk in 0..k {
                        let p = f64::from(a[i * k + kk].to_f32()) * f64::from(deq[j * k + kk]);
                        exact += p;
                        mag += p.abs();
                    }
                    for jj in 0..groups {
                        let sum: f64 = (jj * g..(jj + 1) * g)
                            .map(|kk| f64::from(a[i * k + kk].to_f32()))
                            .sum();
                        off_mag += (sum * f64::from(offsets[j * groups + jj])).abs();
                    }
                    let got = f64::from(out[i * n + j]);
                    // f32 rounding of both matmuls, plus fp16 rounding of the group sum and of
                    // the offset (2⁻¹¹ each) in every product of the second.
                    let bound = (g / 8 + 8 + 2 * groups + 4) as f64
                        * (mag + off_mag)
                        * 2f64.powi(-24)
                        * 1.01
                        + off_mag * 2f64.powi(-10) * 1.01;
                    assert!(
                        (got - exact).abs() <= bound,
                        "m {m} g{g} [{i},{j}] {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }
}

/// Affine groups the chip cannot run are typed refusals naming the chip: on the RK3588 (no
/// fp16 × int4), with int8 activations, with an offset or a group sum beyond fp16; a K-segment
/// or N-chunk part carries its own steps and offsets.
#[test]
fn affine_int4_refusals_and_parts() {
    let (k, n) = (256, 128);
    let src: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 * 0.25 + 3.0).collect();
    let pw = ork_pack::pack_affine(&MatrixRows::new(&src, k, n).unwrap(), 32).unwrap();
    match upload(&emu_on(Soc::Rk3588), &pw, DomainId(0)) {
        Err(DeviceError::Chip {
            soc: Soc::Rk3588,
            limit: ChipLimit::TypePair,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let dev = emu_limits(Soc::Rk3576, true);
    let w = upload(&dev, &pw, DomainId(0)).unwrap();
    let mut out = vec![0f32; n];
    let a8 = vec![1i8; k];
    let t = MatmulTask {
        m: 1,
        activations: Activations::Host(&a8),
        act_scales: &[1.0],
        weight: w.as_weight(),
        cores: CoreMask::AUTO,
    };
    assert!(matches!(
        dev.matmul(&t, &mut out),
        Err(DeviceError::Chip {
            soc: Soc::Rk3576,
            limit: ChipLimit::AffineActivations,
            ..
        })
    ));
    // 32 activations of 60000: their sum leaves the fp16 range.
    let big = vec![f16::from_f32(60000.0); k];
    let t = MatmulTask {
        m: 1,
        activations: Activations::HostF16(&big),
        act_scales: &[],
        weight: w.as_weight(),
        cores: CoreMask::AUTO,
    };
    assert!(matches!(
        dev.matmul(&t, &mut out),
        Err(DeviceError::Chip {
            limit: ChipLimit::Fp16Range(ork_device::Fp16Operand::GroupSum),
            ..
        })
    ));
    // An offset of 1e5 is not an fp16 value. The packer refuses weights beyond fp16's range
    // (so it never writes one); a weight from elsewhere may hold one.
    let far: Vec<f32> = src.iter().map(|x| x + 1e5).collect();
    assert!(matches!(
        ork_pack::pack_affine(&MatrixRows::new(&far, k, n).unwrap(), 32),
        Err(ork_pack::PackError::F16Overflow { .. })
    ));
    let mut pf = pw.clone();
    let half = pf.scales.len() / 2;
    pf.scales[half..].iter_mut().for_each(|o| *o += 1e5);
    assert!(matches!(
        upload(&dev, &pf, DomainId(0)),
        Err(DeviceError::Chip {
            limit: ChipLimit::Fp16Range(ork_device::Fp16Operand::Offset),
            ..
        })
    ));
    // A part (channels 64..128, the second int4 tile; k 64..192) carries its channels' steps,
    // then their offsets.
    let l = pw.layout;
    let part = ork_device::split::Part {
        n: 64..128,
        k: 64..192,
        layout: TiledLayout::new(l.dtype, 128, 64),
        bytes: PartBytes::Repack,
    };
    let pp = part_weight(&pw, &part).unwrap();
    assert_eq!(pp.group, ScaleGroup::Affine(32));
    pp.check().unwrap();
    let whole = ork_pack::untile(&pw).unwrap();
    let got = ork_pack::untile(&pp).unwrap();
    for (r, row) in got.chunks(128).enumerate() {
        assert_eq!(
            row,
            &whole[(64 + r) * k + 64..(64 + r) * k + 192],
            "row {r}"
        );
    }
}

/// `check_as_run`, the rule the emulator applies to every task and `ork plan` / `convert` /
/// `run` to every weight part before converting: the padded shape is what the limits see, and
/// affine groups bring the offsets matmul's own limits (an 8-expert router, N = 8, as int4
/// affine g32 on the RK3576: its offsets matmul needs N a multiple of 16).
#[test]
fn check_as_run_applies_the_padded_limits_and_the_offsets_matmul() {
    let layout = |b, k, n| ork_pack::TiledLayout::new(b, k, n);
    let router = MatmulShape {
        a: Fp16,
        b: Int4,
        k: 576,
        n: 8,
        group: ScaleGroup::Affine(32),
    };
    let l = layout(ork_pack::PackDtype::I4, 576, 8);
    assert_eq!(
        limit_of(Soc::Rk3576.check_as_run(&router, l.k_pad(), l.n_pad())),
        Some(ChipLimit::NAlign { align: 16 })
    );
    // The same router, per channel (no offsets matmul): its padded N fits.
    let per_channel = MatmulShape {
        group: ScaleGroup::PerChannel,
        ..router
    };
    assert_eq!(
        limit_of(Soc::Rk3576.check_as_run(&per_channel, l.k_pad(), l.n_pad())),
        None
    );
    // Types are checked too: no w4a16 on the RK3588.
    assert_eq!(
        limit_of(Soc::Rk3588.check_as_run(&per_channel, l.k_pad(), l.n_pad())),
        Some(ChipLimit::TypePair)
    );
}
