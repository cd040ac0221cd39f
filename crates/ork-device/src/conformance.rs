//! The conformance suite every [`Device`] backend passes (feature `testing`).
//!
//! [`device_conformance!`](crate::device_conformance) stamps one `#[test]` per check for a
//! backend, given an expression that opens a fresh instance of it:
//!
//! ```ignore
//! ork_device::device_conformance!(emu, || Ok(std::sync::Arc::new(EmuDevice::new())));
//! ```
//!
//! A constructor that returns [`DeviceError::NotFound`] (no board, no driver, no runtime library)
//! makes every test print why it was skipped and pass; any other open error fails the test.
//! Checks that submit matmuls are skipped, with a printed reason, on a backend whose
//! [`DeviceInfo::computes`](crate::DeviceInfo::computes) is `false`. Exact integer results are
//! compared bit for bit where the backend offers an [`IntegerOracle`](crate::IntegerOracle);
//! every backend's f32 results are compared with an f64 reference within the f32 summation bound.

use std::sync::Arc;

use half::f16;
use ork_pack::{PackDtype, ScaleGroup};

use crate::check_data::{random_weight, CheckRng};
use crate::soc::{ChipLimit, ElemType};
use crate::{
    upload, ActPrecision, Activations, BufferIntent, CoreMask, Device, DeviceError, DeviceWeight,
    DomainId, MatmulTask,
};

/// Opens a fresh instance of the backend under test.
pub type Ctor = dyn Fn() -> Result<Arc<dyn Device>, DeviceError>;

/// Stamp the conformance tests for one backend: `device_conformance!(module_name, ctor)`, where
/// `ctor` is an expression of a closure `|| -> Result<Arc<dyn Device>, DeviceError>` (it is
/// expanded inside the new module, which `use`s its parent's items).
#[macro_export]
macro_rules! device_conformance {
    ($name:ident, $ctor:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn ctor() -> ::std::result::Result<
                ::std::sync::Arc<dyn $crate::Device>,
                $crate::DeviceError,
            > {
                ($ctor)()
            }
            $crate::device_conformance!(@tests
                buffers_per_intent_and_domain,
                bad_allocations_are_typed_errors,
                window_full_then_recovers,
                view_bounds,
                footprint_is_what_the_window_holds,
                buffers_outlive_the_device,
                integer_weights_match_f64_reference,
                fp16_activations_match_f64_reference,
                integer_oracle_is_exact,
                per_group_int8_matches_f64_reference,
                cross_domain_operand_rejected,
                foreign_buffer_rejected,
                operand_lengths_are_checked,
                stats_count_tasks_and_switches,
                prepare_weight_then_rewrite,
                batch_equals_one_by_one,
            );
        }
    };
    (@tests $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                $crate::conformance::run(stringify!($test), &ctor, $crate::conformance::$test);
            }
        )*
    };
}

/// Run `body` on the backend `ctor` opens, or print why it is skipped (`NotFound`).
///
/// # Panics
/// If the backend fails to open with another error, or `body` fails.
pub fn run(test: &str, ctor: &Ctor, body: fn(&Ctor)) {
    match ctor() {
        Ok(dev) => {
            drop(dev);
            body(ctor);
        }
        Err(DeviceError::NotFound { what }) => {
            eprintln!("{test}: skipped, backend not present: {what}");
        }
        Err(e) => panic!("{test}: the backend failed to open: {e}"),
    }
}

fn open(ctor: &Ctor) -> Arc<dyn Device> {
    ctor().unwrap_or_else(|e| panic!("the backend opened once, then failed: {e}"))
}

/// The device if it computes; else prints why the check is skipped.
fn computing(ctor: &Ctor, test: &str) -> Option<Arc<dyn Device>> {
    let dev = open(ctor);
    let info = dev.info();
    if info.computes {
        Some(dev)
    } else {
        eprintln!("{test}: skipped, {} does not submit matmuls", info.name);
        None
    }
}

/// Whether the device can run `activations` × `dtype` weights by its chip table (`true` for a
/// backend that models no chip). Where it cannot, the checks expect [`DeviceError::Chip`] with
/// [`ChipLimit::TypePair`] instead of a result.
fn chip_has(dev: &dyn Device, activations: ActPrecision, dtype: PackDtype) -> bool {
    dev.info().soc.is_none_or(|soc| {
        !soc.outputs(
            ElemType::of_activations(activations),
            ElemType::of_weight(dtype),
        )
        .is_empty()
    })
}

/// Assert that `r` is the chip refusing the type pair (and nothing ran).
fn assert_type_pair_refused<T: std::fmt::Debug>(r: Result<T, DeviceError>, what: &str) {
    assert!(
        matches!(
            r,
            Err(DeviceError::Chip {
                limit: ChipLimit::TypePair,
                ..
            })
        ),
        "{what}: the chip lacks the type pair, expected DeviceError::Chip(TypePair), got {r:?}"
    );
}

/// Compare `out` with the f64 reference `(Σ_k a[m,k]·q[n,k]) · row_scale[m] · w_scale[n]` within
/// the f32 summation bound (`Kpad · 2⁻²⁴ · Σ|a·q|`) plus the roundings of the scale multiplies.
#[allow(clippy::too_many_arguments)]
fn assert_close(
    what: &str,
    out: &[f32],
    a: &[f64],
    q: &[i8],
    row_scale: &[f64],
    w_scale: &[f32],
    (m, k, n): (usize, usize, usize),
    kpad: usize,
) {
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut mag) = (0f64, 0f64);
            for kk in 0..k {
                let p = a[i * k + kk] * f64::from(q[j * k + kk]);
                exact += p;
                mag += p.abs();
            }
            let s = row_scale[i] * f64::from(w_scale[j]);
            let want = exact * s;
            let bound = (kpad as f64 * mag * 2f64.powi(-24) * 1.01 + exact.abs() * 2f64.powi(-21))
                * s.abs()
                + f64::from(f32::MIN_POSITIVE);
            let got = f64::from(out[i * n + j]);
            assert!(
                (got - want).abs() <= bound,
                "{what} m={m} k={k} n={n} [{i},{j}]: {got} vs {want} (bound {bound})"
            );
        }
    }
}

fn task<'a>(
    m: usize,
    activations: Activations<'a>,
    sa: &'a [f32],
    w: &'a DeviceWeight,
) -> MatmulTask<'a> {
    MatmulTask {
        m,
        activations,
        act_scales: sa,
        weight: w.as_weight(),
        cores: CoreMask::AUTO,
    }
}

/// Shapes at every tile edge of `dtype`: M = 1 (decode), odd M, M across the partitions; K and N
/// one below, at and one above a tile (and 1).
fn edge_shapes(dtype: PackDtype) -> Vec<(usize, usize, usize)> {
    let (kt, nt) = (dtype.k_tile(), dtype.n_tile());
    let mut v = Vec::new();
    for &m in &[1, 3, 17, 33] {
        for &k in &[1, kt - 1, kt, kt + 1, 3 * kt + 5] {
            for &n in &[1, nt - 1, nt, nt + 1] {
                v.push((m, k, n));
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------
// buffers

/// Every intent in the first and last domain: size, domain, intent, placement inside the window,
/// host bytes round-trip through both syncs, disjoint ranges, stats up by the footprint and back.
pub fn buffers_per_intent_and_domain(ctor: &Ctor) {
    let dev = open(ctor);
    let info = dev.info();
    let mut domains = vec![DomainId(0), DomainId(info.domains - 1)];
    domains.dedup();
    for &d in &domains {
        for intent in BufferIntent::ALL {
            let before = dev.stats();
            let mut b = dev.create_buffer(10_000, intent, d).unwrap();
            let c = dev.create_buffer(5_000, intent, d).unwrap();
            assert_eq!((b.size(), b.domain(), b.intent()), (10_000, d, intent));
            for x in [&b, &c] {
                assert!(x.iova() + x.size() <= info.window_bytes, "{intent:?}");
            }
            assert!(
                b.iova() + b.size() <= c.iova() || c.iova() + c.size() <= b.iova(),
                "{intent:?}: overlapping buffers {b:?} {c:?}"
            );
            b.as_mut_slice()
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (i * 7) as u8);
            b.sync_to_device().unwrap();
            b.sync_from_device().unwrap();
            assert!(b
                .as_slice()
                .iter()
                .enumerate()
                .all(|(i, &x)| x == (i * 7) as u8));
            let s = dev.stats();
            assert_eq!(s.buffers_live, before.buffers_live + 2, "{intent:?}");
            assert_eq!(
                s.resident_per_domain[d.0 as usize],
                before.resident_per_domain[d.0 as usize]
                    + dev.footprint(10_000)
                    + dev.footprint(5_000),
                "{intent:?} in {d}"
            );
            assert!(s.peak_resident >= s.resident_total());
            drop((b, c));
            let s = dev.stats();
            assert_eq!(s.buffers_live, before.buffers_live, "{intent:?}");
            assert_eq!(
                s.resident_per_domain, before.resident_per_domain,
                "{intent:?}"
            );
        }
    }
}

/// Zero size, larger than a window, an unknown domain: typed errors, nothing allocated.
pub fn bad_allocations_are_typed_errors(ctor: &Ctor) {
    let dev = open(ctor);
    let info = dev.info();
    for intent in BufferIntent::ALL {
        let r = dev.create_buffer(0, intent, DomainId(0));
        assert!(matches!(r, Err(DeviceError::ZeroSize { .. })), "{r:?}");
        let r = dev.create_buffer(info.window_bytes + 1, intent, DomainId(0));
        assert!(matches!(r, Err(DeviceError::Oversize { .. })), "{r:?}");
        for d in [info.domains, 16, u32::MAX] {
            let r = dev.create_buffer(4096, intent, DomainId(d));
            assert!(
                matches!(r, Err(DeviceError::UnknownDomain { .. })),
                "{d}: {r:?}"
            );
        }
    }
    assert_eq!(dev.stats().buffers_live, 0);
}

/// Filling domain 0's window ends in `WindowFull` naming domain 0; another domain still has
/// room; one free makes room again; freeing everything returns the window.
pub fn window_full_then_recovers(ctor: &Ctor) {
    let dev = open(ctor);
    let info = dev.info();
    let size = (info.window_bytes / 64).max(dev.footprint(1));
    let mut held = Vec::new();
    let err = loop {
        match dev.create_buffer(size, BufferIntent::Weight, DomainId(0)) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
        assert!(
            held.len() <= 64,
            "a window of {} bytes held more than 64 buffers of {size}",
            info.window_bytes
        );
    };
    assert!(
        matches!(
            err,
            DeviceError::WindowFull {
                domain: DomainId(0),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!held.is_empty());
    let other = (info.domains > 1).then(|| {
        dev.create_buffer(size, BufferIntent::Weight, DomainId(1))
            .expect("another domain has its own window")
    });
    drop(held.pop());
    held.push(
        dev.create_buffer(size, BufferIntent::Weight, DomainId(0))
            .expect("a freed range is reused"),
    );
    drop((held, other));
    let s = dev.stats();
    assert_eq!((s.buffers_live, s.resident_total()), (0, 0));
}

/// Views: inside the buffer or `OutOfRange` (overflow included); addresses and bytes offset.
pub fn view_bounds(ctor: &Ctor) {
    let dev = open(ctor);
    let mut b = dev
        .create_buffer(8192, BufferIntent::Activation, DomainId(0))
        .unwrap();
    b.as_mut_slice()[4096] = 42;
    for (off, len) in [(4096, 4097), (8193, 0), (u64::MAX, 2), (1, u64::MAX)] {
        let r = b.view(off, len);
        assert!(
            matches!(r, Err(DeviceError::OutOfRange { .. })),
            "{off}+{len}: {r:?}"
        );
    }
    let v = b.view(4096, 4096).unwrap();
    assert_eq!(
        (v.iova(), v.len(), v.domain()),
        (b.iova() + 4096, 4096, DomainId(0))
    );
    assert_eq!(v.as_slice()[0], 42);
    assert!(b.view(8192, 0).unwrap().is_empty());
    assert_eq!(b.full_view().len(), 8192);
}

/// `footprint` is at least the size, monotone, and exactly what a buffer adds to its domain's
/// resident bytes.
pub fn footprint_is_what_the_window_holds(ctor: &Ctor) {
    let dev = open(ctor);
    let window = dev.info().window_bytes;
    let mut last = 0;
    for size in [1, 4095, 4096, 4097, 10_000, 65_536, (1 << 20) + 1] {
        let f = dev.footprint(size);
        assert!(f >= size && f >= last, "footprint({size}) = {f}");
        last = f;
        let before = dev.stats().resident_per_domain[0];
        let b = dev
            .create_buffer(size, BufferIntent::Weight, DomainId(0))
            .unwrap();
        assert_eq!(
            dev.stats().resident_per_domain[0],
            before + f,
            "size {size}"
        );
        drop(b);
    }
    assert!(dev.footprint(window + 1) > window);
    assert!(dev.footprint(u64::MAX) >= window);
}

/// Buffers stay usable (bytes, syncs) after the device value is dropped, and free cleanly.
pub fn buffers_outlive_the_device(ctor: &Ctor) {
    let dev = open(ctor);
    let mut b = dev
        .create_buffer(10_000, BufferIntent::Output, DomainId(0))
        .unwrap();
    let v = dev
        .create_buffer(4096, BufferIntent::Weight, DomainId(0))
        .unwrap();
    drop(dev);
    b.as_mut_slice()[9_999] = 9;
    b.sync_to_device().unwrap();
    b.sync_from_device().unwrap();
    assert_eq!(b.as_slice()[9_999], 9);
    assert_eq!(v.view(0, 4096).unwrap().len(), 4096);
    drop((b, v));
}

// ---------------------------------------------------------------------------------------------
// matmul

/// int8 activations × int8 / int4 / fp16 weights at every tile edge equal the f64 reference.
pub fn integer_weights_match_f64_reference(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "integer_weights_match_f64_reference") else {
        return;
    };
    let mut rng = CheckRng::new(1);
    for dtype in [PackDtype::I8, PackDtype::I4, PackDtype::F16] {
        for (m, k, n) in edge_shapes(dtype) {
            let (pw, q) = random_weight(dtype, k, n, ScaleGroup::PerChannel, &mut rng);
            let w = upload(dev.as_ref(), &pw, DomainId(0)).unwrap();
            let a: Vec<i8> = (0..m * k).map(|_| rng.i8()).collect();
            let sa: Vec<f32> = (0..m).map(|i| 0.5 + i as f32 * 0.01).collect();
            let mut out = vec![0f32; m * n];
            let what = format!("{dtype:?} weights, int8 activations");
            let r = dev.matmul(&task(m, Activations::Host(&a), &sa, &w), &mut out);
            if !chip_has(dev.as_ref(), ActPrecision::Int8, dtype) {
                assert_type_pair_refused(r, &what);
                continue;
            }
            r.unwrap();
            let af: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
            let rs: Vec<f64> = sa.iter().map(|&x| f64::from(x)).collect();
            assert_close(
                &what,
                &out,
                &af,
                &q,
                &rs,
                &pw.scales,
                (m, k, n),
                pw.layout.k_pad(),
            );
        }
    }
}

/// fp16 activations (host and device buffer) × every weight dtype equal the f64 reference.
pub fn fp16_activations_match_f64_reference(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "fp16_activations_match_f64_reference") else {
        return;
    };
    let mut rng = CheckRng::new(2);
    for dtype in [PackDtype::I8, PackDtype::I4, PackDtype::F16] {
        for (i, (m, k, n)) in edge_shapes(dtype).into_iter().enumerate() {
            let (pw, q) = random_weight(dtype, k, n, ScaleGroup::PerChannel, &mut rng);
            let w = upload(dev.as_ref(), &pw, DomainId(0)).unwrap();
            // Every 5th channel an outlier, as in real activations.
            let a: Vec<f16> = (0..m * k)
                .map(|j| {
                    let u = (rng.next_u64() % 20001) as f32 / 10000.0 - 1.0;
                    f16::from_f32(if j % 5 == 2 { u * 3000.0 } else { u * 2.0 })
                })
                .collect();
            let abuf;
            let acts = if i % 2 == 0 {
                Activations::HostF16(&a)
            } else {
                let mut b = dev
                    .create_buffer(2 * a.len() as u64, BufferIntent::Activation, DomainId(0))
                    .unwrap();
                for (d, v) in b.as_mut_slice().chunks_exact_mut(2).zip(&a) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
                b.sync_to_device().unwrap();
                abuf = b;
                Activations::DeviceF16(abuf.full_view())
            };
            let mut out = vec![0f32; m * n];
            let what = format!("{dtype:?} weights, fp16 activations");
            let r = dev.matmul(&task(m, acts, &[], &w), &mut out);
            if !chip_has(dev.as_ref(), ActPrecision::F16, dtype) {
                assert_type_pair_refused(r, &what);
                continue;
            }
            r.unwrap();
            let af: Vec<f64> = a.iter().map(|&x| f64::from(x.to_f32())).collect();
            assert_close(
                &what,
                &out,
                &af,
                &q,
                &vec![1.0; m],
                &pw.scales,
                (m, k, n),
                pw.layout.k_pad(),
            );
        }
    }
}

/// Where the backend offers exact integer accumulators, they equal the untiled i32 product at
/// every tile edge, and non-integer operands are `NotInteger`.
pub fn integer_oracle_is_exact(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "integer_oracle_is_exact") else {
        return;
    };
    let Some(oracle) = dev.as_integer() else {
        eprintln!(
            "integer_oracle_is_exact: skipped, {} offers no integer oracle",
            dev.info().name
        );
        return;
    };
    let mut rng = CheckRng::new(3);
    for dtype in [PackDtype::I8, PackDtype::I4] {
        for (m, k, n) in edge_shapes(dtype) {
            let (pw, q) = random_weight(dtype, k, n, ScaleGroup::PerChannel, &mut rng);
            let w = upload(dev.as_ref(), &pw, DomainId(0)).unwrap();
            let a: Vec<i8> = (0..m * k).map(|_| rng.i8()).collect();
            let mut raw = vec![0i32; m * n];
            let r = oracle.matmul_raw(&task(m, Activations::Host(&a), &vec![1.0; m], &w), &mut raw);
            if !chip_has(dev.as_ref(), ActPrecision::Int8, dtype) {
                assert_type_pair_refused(r, &format!("raw {dtype:?}"));
                continue;
            }
            r.unwrap();
            for i in 0..m {
                for j in 0..n {
                    let want: i32 = (0..k)
                        .map(|kk| i32::from(a[i * k + kk]) * i32::from(q[j * k + kk]))
                        .sum();
                    assert_eq!(
                        raw[i * n + j],
                        want,
                        "{dtype:?} m={m} k={k} n={n} [{i},{j}]"
                    );
                }
            }
        }
    }
    let (pf, _) = random_weight(PackDtype::F16, 32, 16, ScaleGroup::PerChannel, &mut rng);
    let wf = upload(dev.as_ref(), &pf, DomainId(0)).unwrap();
    let a = vec![1i8; 32];
    let mut raw = vec![0i32; 16];
    let r = oracle.matmul_raw(&task(1, Activations::Host(&a), &[1.0], &wf), &mut raw);
    assert!(matches!(r, Err(DeviceError::NotInteger { .. })), "{r:?}");
}

/// Per-group int8 weights (int8 activations; the chip's per-group mode) equal the f64 reference
/// `Σ_j (Σ_{k in j} a·q) · s[n, j] · sa[m]` for every group size the chip accepts (128, 256 and
/// 512 on a backend that models no chip), with M across both work partitions; a group size the
/// chip lacks (64) is [`DeviceError::Chip`] with [`ChipLimit::Group`].
pub fn per_group_int8_matches_f64_reference(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "per_group_int8_matches_f64_reference") else {
        return;
    };
    let soc = dev.info().soc;
    let sizes: Vec<usize> = match soc {
        Some(soc) => soc.group_sizes(ElemType::Int8, ElemType::Int8).to_vec(),
        None => vec![128, 256, 512],
    };
    let mut rng = CheckRng::new(4);
    for &g in &sizes {
        for (m, groups, n) in [(1, 1, 32), (3, 3, 64), (33, 2, 96)] {
            let k = g * groups;
            let (mut pw, q) = random_weight(PackDtype::I8, k, n, ScaleGroup::PerChannel, &mut rng);
            pw.scales = (0..n * groups)
                .map(|i| 0.001 + (rng.next_u64() % 1000) as f32 * 1e-5 + i as f32 * 1e-7)
                .collect();
            pw.group = ScaleGroup::Group(g);
            let w = upload(dev.as_ref(), &pw, DomainId(0)).unwrap();
            let a: Vec<i8> = (0..m * k).map(|_| rng.i8()).collect();
            let sa: Vec<f32> = (0..m).map(|i| 0.25 + i as f32 * 0.01).collect();
            let mut out = vec![0f32; m * n];
            dev.matmul(&task(m, Activations::Host(&a), &sa, &w), &mut out)
                .unwrap();
            for i in 0..m {
                for j in 0..n {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for kk in 0..k {
                        let p = f64::from(a[i * k + kk])
                            * f64::from(q[j * k + kk])
                            * f64::from(pw.scales[j * groups + kk / g]);
                        exact += p;
                        mag += p.abs();
                    }
                    let s = f64::from(sa[i]);
                    // A rounding per group product and sum, and the final scale multiply.
                    let bound = ((groups + 2) as f64 * mag * 2f64.powi(-24) * 1.01) * s
                        + f64::from(f32::MIN_POSITIVE);
                    let got = f64::from(out[i * n + j]);
                    assert!(
                        (got - exact * s).abs() <= bound,
                        "g{g} m={m} k={k} n={n} [{i},{j}]: {got} vs {} (bound {bound})",
                        exact * s
                    );
                }
            }
        }
    }
    if soc.is_some() {
        let (mut pw, _) = random_weight(PackDtype::I8, 128, 32, ScaleGroup::PerChannel, &mut rng);
        pw.scales = vec![0.01; 32 * 2];
        pw.group = ScaleGroup::Group(64);
        let w = upload(dev.as_ref(), &pw, DomainId(0)).unwrap();
        let a = vec![1i8; 128];
        let mut out = vec![0f32; 32];
        let r = dev.matmul(&task(1, Activations::Host(&a), &[1.0], &w), &mut out);
        assert!(
            matches!(
                r,
                Err(DeviceError::Chip {
                    limit: ChipLimit::Group { group: 64 },
                    ..
                })
            ),
            "group 64 with int8 × int8: {r:?}"
        );
    }
}

/// An activation buffer in another domain than the weight is `CrossDomain`.
pub fn cross_domain_operand_rejected(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "cross_domain_operand_rejected") else {
        return;
    };
    if dev.info().domains < 2 {
        eprintln!("cross_domain_operand_rejected: skipped, one domain");
        return;
    }
    let mut rng = CheckRng::new(4);
    let (pw, _) = random_weight(PackDtype::I8, 64, 32, ScaleGroup::PerChannel, &mut rng);
    let w = upload(dev.as_ref(), &pw, DomainId(1)).unwrap();
    let a = dev
        .create_buffer(3 * 64, BufferIntent::Activation, DomainId(0))
        .unwrap();
    let a16 = dev
        .create_buffer(2 * 3 * 64, BufferIntent::Activation, DomainId(0))
        .unwrap();
    let mut out = vec![0f32; 3 * 32];
    for (acts, sa) in [
        (Activations::Device(a.full_view()), &[1.0f32; 3][..]),
        (Activations::DeviceF16(a16.full_view()), &[][..]),
    ] {
        let r = dev.matmul(&task(3, acts, sa, &w), &mut out);
        assert!(
            matches!(
                r,
                Err(DeviceError::CrossDomain {
                    task_domain: DomainId(1),
                    operand_domain: DomainId(0),
                    ..
                })
            ),
            "{r:?}"
        );
    }
    assert_eq!(dev.stats().tasks, 0);
}

/// A weight or activations created by another instance of the backend are `ForeignBuffer`.
pub fn foreign_buffer_rejected(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "foreign_buffer_rejected") else {
        return;
    };
    let other = open(ctor);
    let mut rng = CheckRng::new(5);
    let (pw, _) = random_weight(PackDtype::I8, 64, 32, ScaleGroup::PerChannel, &mut rng);
    let w_other = upload(other.as_ref(), &pw, DomainId(0)).unwrap();
    let w = upload(dev.as_ref(), &pw, DomainId(0)).unwrap();
    let a = vec![1i8; 64];
    let mut out = vec![0f32; 32];
    let r = dev.matmul(&task(1, Activations::Host(&a), &[1.0], &w_other), &mut out);
    assert!(
        matches!(r, Err(DeviceError::ForeignBuffer { operand: "weight" })),
        "{r:?}"
    );
    let abuf = other
        .create_buffer(64, BufferIntent::Activation, DomainId(0))
        .unwrap();
    let r = dev.matmul(
        &task(1, Activations::Device(abuf.full_view()), &[1.0], &w),
        &mut out,
    );
    assert!(
        matches!(
            r,
            Err(DeviceError::ForeignBuffer {
                operand: "activations"
            })
        ),
        "{r:?}"
    );
    assert_eq!(dev.stats().tasks, 0);
}

/// Operands that do not match the task's shape are `Length` errors naming the operand.
pub fn operand_lengths_are_checked(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "operand_lengths_are_checked") else {
        return;
    };
    let mut rng = CheckRng::new(6);
    let (pw, _) = random_weight(PackDtype::I8, 64, 32, ScaleGroup::PerChannel, &mut rng);
    let w = upload(dev.as_ref(), &pw, DomainId(0)).unwrap();
    let a = vec![0i8; 2 * 64];
    let mut out = vec![0f32; 2 * 32];
    let check = |r: Result<_, DeviceError>, which: &str| match r {
        Err(DeviceError::Length { operand, .. }) => assert_eq!(operand, which),
        other => panic!("{which}: {other:?}"),
    };
    check(
        dev.matmul(
            &task(2, Activations::Host(&a[1..]), &[1.0; 2], &w),
            &mut out,
        ),
        "activations",
    );
    check(
        dev.matmul(&task(2, Activations::Host(&a), &[1.0; 3], &w), &mut out),
        "activation scales",
    );
    check(
        dev.matmul(
            &task(2, Activations::Host(&a), &[1.0; 2], &w),
            &mut out[1..],
        ),
        "output",
    );
    let short = crate::WeightRef {
        scales: &pw.scales[1..],
        ..w.as_weight()
    };
    let t = MatmulTask {
        weight: short,
        ..task(2, Activations::Host(&a), &[1.0; 2], &w)
    };
    check(dev.matmul(&t, &mut out), "weight scales");
    assert_eq!(dev.stats().tasks, 0);
}

/// Tasks and domain switches are counted; the attached domain is the last task's.
pub fn stats_count_tasks_and_switches(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "stats_count_tasks_and_switches") else {
        return;
    };
    let last = DomainId(dev.info().domains - 1);
    let mut rng = CheckRng::new(7);
    let (pw, _) = random_weight(PackDtype::I8, 32, 32, ScaleGroup::PerChannel, &mut rng);
    let w0 = upload(dev.as_ref(), &pw, DomainId(0)).unwrap();
    let wl = upload(dev.as_ref(), &pw, last).unwrap();
    let a = vec![1i8; 32];
    let mut out = vec![0f32; 32];
    let before = dev.stats();
    let mut attached = before.attached;
    let mut switches = 0;
    for w in [&w0, &w0, &wl, &wl, &w0] {
        let st = dev
            .matmul(&task(1, Activations::Host(&a), &[1.0], w), &mut out)
            .unwrap();
        let d = w.buffer.domain();
        assert_eq!((st.domain, st.switched), (d, d != attached));
        switches += u64::from(d != attached);
        attached = d;
    }
    let s = dev.stats();
    assert_eq!(s.tasks - before.tasks, 5);
    assert_eq!(s.domain_switches - before.domain_switches, switches);
    assert_eq!(s.attached, DomainId(0));
}

/// `prepare_weight` before tasks, twice, and again after the weight's bytes were rewritten in
/// place: every task sees the bytes it was prepared with.
pub fn prepare_weight_then_rewrite(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "prepare_weight_then_rewrite") else {
        return;
    };
    let mut rng = CheckRng::new(8);
    let (m, k, n) = (3, 96, 40);
    let (pw, q) = random_weight(PackDtype::I8, k, n, ScaleGroup::PerChannel, &mut rng);
    let mut w = upload(dev.as_ref(), &pw, DomainId(0)).unwrap();
    dev.prepare_weight(&w.as_weight()).unwrap();
    dev.prepare_weight(&w.as_weight()).unwrap();
    let a: Vec<i8> = (0..m * k).map(|_| rng.i8()).collect();
    let af: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
    let mut out = vec![0f32; m * n];
    dev.matmul(&task(m, Activations::Host(&a), &[1.0; 3], &w), &mut out)
        .unwrap();
    assert_close(
        "prepared",
        &out,
        &af,
        &q,
        &[1.0; 3],
        &pw.scales,
        (m, k, n),
        pw.layout.k_pad(),
    );
    // New bytes in the same buffer (the weight cache reuses buffers this way).
    let (pw2, q2) = random_weight(PackDtype::I8, k, n, ScaleGroup::PerChannel, &mut rng);
    w.buffer.as_mut_slice().copy_from_slice(&pw2.data);
    w.buffer.sync_to_device().unwrap();
    w.scales.clone_from(&pw2.scales);
    dev.prepare_weight(&w.as_weight()).unwrap();
    dev.matmul(&task(m, Activations::Host(&a), &[1.0; 3], &w), &mut out)
        .unwrap();
    assert_close(
        "rewritten",
        &out,
        &af,
        &q2,
        &[1.0; 3],
        &pw2.scales,
        (m, k, n),
        pw2.layout.k_pad(),
    );
}

/// [`Device::matmul_batch`] gives each task's output bit for bit as [`Device::matmul`] alone
/// does and counts every task: single-row int8 batches (one shared activation row, as q/k/v;
/// widths at the tile edges; int4 where the chip has it), and a mixed batch (M = 3, fp16
/// activations) that a backend may not fuse; outputs that do not match the tasks in number are
/// [`DeviceError::Length`].
pub fn batch_equals_one_by_one(ctor: &Ctor) {
    let Some(dev) = computing(ctor, "batch_equals_one_by_one") else {
        return;
    };
    let mut rng = CheckRng::new(11);
    let k = 100;
    let mut shapes = vec![
        (PackDtype::I8, 1, 1),
        (PackDtype::I8, 1, 31),
        (PackDtype::I8, 1, 32),
    ];
    shapes.extend([(PackDtype::I8, 1, 97), (PackDtype::I8, 1, 64)]);
    if chip_has(dev.as_ref(), ActPrecision::Int8, PackDtype::I4) {
        shapes.push((PackDtype::I4, 1, 70));
    }
    let f16_ok = chip_has(dev.as_ref(), ActPrecision::F16, PackDtype::I8);
    let mixed = [
        (PackDtype::I8, 1, 40),
        (PackDtype::I8, 3, 33),
        (PackDtype::I8, 1, 8),
    ];
    for (batch, fp16_middle) in [(&shapes[..], false), (&mixed[..], f16_ok)] {
        let weights: Vec<DeviceWeight> = batch
            .iter()
            .map(|&(dtype, _, n)| {
                let (pw, _) = random_weight(dtype, k, n, ScaleGroup::PerChannel, &mut rng);
                upload(dev.as_ref(), &pw, DomainId(0)).unwrap()
            })
            .collect();
        let a: Vec<i8> = (0..3 * k).map(|_| rng.i8()).collect();
        let ah: Vec<f16> = (0..k)
            .map(|i| f16::from_f32(i as f32 * 0.25 - 9.0))
            .collect();
        let sa = [0.031f32, 0.5, 0.07];
        let tasks: Vec<MatmulTask<'_>> = batch
            .iter()
            .zip(&weights)
            .enumerate()
            .map(|(i, (&(_, m, _), w))| {
                if fp16_middle && i == 1 {
                    task(1, Activations::HostF16(&ah), &[], w)
                } else {
                    task(m, Activations::Host(&a[..m * k]), &sa[..m], w)
                }
            })
            .collect();
        let want: Vec<Vec<f32>> = tasks
            .iter()
            .map(|t| {
                let mut o = vec![0f32; t.m * t.weight.layout.n];
                dev.matmul(t, &mut o).unwrap();
                o
            })
            .collect();
        let mut got: Vec<Vec<f32>> = want.iter().map(|w| vec![f32::NAN; w.len()]).collect();
        let before = dev.stats().tasks;
        let stats = {
            let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|o| &mut o[..]).collect();
            dev.matmul_batch(&tasks, &mut outs).unwrap()
        };
        assert_eq!(stats.len(), tasks.len());
        assert_eq!(dev.stats().tasks - before, tasks.len() as u64);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.iter().zip(w).all(|(x, y)| x.to_bits() == y.to_bits()),
                "task {i} of {batch:?}: the batch differs from the task alone"
            );
        }
        let mut one = vec![0f32; want[0].len()];
        let r = dev.matmul_batch(&tasks, &mut [&mut one[..]]);
        assert!(
            matches!(r, Err(DeviceError::Length { .. })),
            "one output for {} tasks: {r:?}",
            tasks.len()
        );
    }
}
