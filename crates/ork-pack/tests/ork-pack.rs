//! Integration tests of the pack kernel: layout, quantization against a naive reference,
//! padding, errors, and (with the real model) the GGUF source.

use half::f16;
use ork_pack::{
    pack, pack_in, pack_into, untile, untile_q, GgufRows, MatrixRows, PackDtype, PackError,
    PackedWeight, RowSource, TiledLayout, INT4_EVEN_K_IN_LOW_NIBBLE,
};
use proptest::prelude::*;

const DTYPES: [PackDtype; 3] = [PackDtype::I8, PackDtype::I4, PackDtype::F16];

/// Naive per-row symmetric quantization, written from the documented rule:
/// `q = clamp(round_ties_even(w · lim/absmax), ±lim)`, `scale = absmax/lim`.
fn reference_quantize(w: &[f32], k: usize, lim: f32) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(w.len());
    let mut scales = Vec::new();
    for row in w.chunks(k) {
        let absmax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        if absmax == 0.0 {
            scales.push(0.0);
            q.extend(std::iter::repeat_n(0i8, k));
            continue;
        }
        scales.push(absmax / lim);
        let (mut factor, mut inv) = (1f32, lim / absmax);
        if !inv.is_finite() {
            // Rows this small are scaled by 2^64 first (exact), see the kernel docs.
            factor = 2f32.powi(64);
            inv = lim / (absmax * factor);
        }
        q.extend(
            row.iter()
                .map(|&x| ((x * factor) * inv).round_ties_even().clamp(-lim, lim) as i8),
        );
    }
    (q, scales)
}

fn lim(dtype: PackDtype) -> f32 {
    match dtype {
        PackDtype::I8 => 127.0,
        PackDtype::I4 => 7.0,
        PackDtype::F16 => unreachable!("fp16 is not quantized"),
    }
}

/// Raw bits of element `e` (tiled order) of a blob, decoded from the byte layout directly.
fn element_bits(dtype: PackDtype, data: &[u8], e: usize) -> u16 {
    match dtype {
        PackDtype::I8 => data[e] as u16,
        PackDtype::I4 => {
            let b = data[e / 2];
            let low_is_even = INT4_EVEN_K_IN_LOW_NIBBLE;
            let nib = if e.is_multiple_of(2) == low_is_even {
                b & 0xF
            } else {
                b >> 4
            };
            nib as u16
        }
        PackDtype::F16 => u16::from_le_bytes([data[2 * e], data[2 * e + 1]]),
    }
}

/// The tiled index written out from `docs/chip.md` ("Native operand layouts"), independent of
/// `TiledLayout::index`.
fn spec_index(dtype: PackDtype, k_pad: usize, k: usize, n: usize) -> usize {
    let tn = match dtype {
        PackDtype::I8 => 32,
        PackDtype::I4 => 64,
        PackDtype::F16 => 16,
    };
    (n / tn) * (tn * k_pad) + (k / 32) * (tn * 32) + (n % tn) * 32 + (k % 32)
}

fn assert_padding_zero(w: &PackedWeight) {
    let l = w.layout;
    let mut live = vec![false; l.elems()];
    for n in 0..l.n {
        for k in 0..l.k {
            live[spec_index(l.dtype, l.k_pad(), k, n)] = true;
        }
    }
    for (e, _) in live.iter().enumerate().filter(|(_, &x)| !x) {
        assert_eq!(
            element_bits(l.dtype, &w.data, e),
            0,
            "padding element {e} not zero"
        );
    }
    w.check().expect("check() accepts a freshly packed weight");
}

fn check_quantized(w: &[f32], k: usize, n: usize, dtype: PackDtype) {
    let src = MatrixRows::new(w, k, n).unwrap();
    let p = pack(&src, dtype).unwrap();
    assert_eq!(p.layout, TiledLayout::new(dtype, k, n));
    assert_eq!(p.data.len(), p.layout.blob_bytes());
    let (q_ref, s_ref) = reference_quantize(w, k, lim(dtype));
    assert_eq!(p.scales, s_ref, "scales");
    let q = untile_q(&p).unwrap();
    assert_eq!(q, q_ref, "codes");
    // Codes sit where the spec's formula puts them (not only where untile looks).
    for nn in 0..n {
        for kk in 0..k {
            let e = spec_index(dtype, p.layout.k_pad(), kk, nn);
            let bits = element_bits(dtype, &p.data, e);
            let code = if dtype == PackDtype::I4 {
                ((bits as u8) << 4) as i8 >> 4
            } else {
                bits as u8 as i8
            };
            assert_eq!(code, q_ref[nn * k + kk], "element ({kk},{nn})");
        }
    }
    let back = untile(&p).unwrap();
    for (i, (&x, &y)) in w.iter().zip(&back).enumerate() {
        let s = p.scales[i / k];
        // Half a step, up to f32 rounding of `w·inv` and `q·scale` (well under 1e-4 step).
        assert!(
            (x - y).abs() <= s * (0.5 + 1e-4),
            "w={x} back={y} scale={s} at {i}"
        );
        assert!(q[i].unsigned_abs() as f32 <= lim(dtype));
    }
    assert_padding_zero(&p);
}

fn check_f16(w: &[f32], k: usize, n: usize) {
    let p = pack(&MatrixRows::new(w, k, n).unwrap(), PackDtype::F16).unwrap();
    assert!(p.scales.iter().all(|&s| s == 1.0));
    let back = untile(&p).unwrap();
    for (&x, &y) in w.iter().zip(&back) {
        let h = f16::from_f32(x);
        assert_eq!(y.to_bits(), h.to_f32().to_bits(), "x={x}");
        // Within fp16 rounding: half an fp16 ulp at x (subnormal spacing near zero).
        let ulp = (f16::from_bits(h.to_bits().wrapping_add(1)).to_f32() - h.to_f32()).abs();
        assert!((x - y).abs() <= ulp.max(2f32.powi(-24)) / 2.0 + f32::EPSILON * x.abs());
    }
    assert_padding_zero(&p);
}

/// A matrix `n × k`, values in ±`range`, some rows zero.
fn matrix(max_k: usize, max_n: usize) -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    (1..=max_k, 1..=max_n, -6i32..=6).prop_flat_map(|(k, n, exp)| {
        let range = 10f32.powi(exp / 2);
        (
            Just(k),
            Just(n),
            prop::collection::vec(-range..=range, k * n),
            prop::collection::vec(prop::bool::weighted(0.1), n),
        )
            .prop_map(move |(k, n, mut w, zero)| {
                for (row, z) in w.chunks_mut(k).zip(zero) {
                    if z {
                        row.fill(0.0);
                    }
                }
                (k, n, w)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn int8_matches_reference((k, n, w) in matrix(150, 100)) {
        check_quantized(&w, k, n, PackDtype::I8);
    }

    #[test]
    fn int4_matches_reference((k, n, w) in matrix(150, 140)) {
        check_quantized(&w, k, n, PackDtype::I4);
    }

    #[test]
    fn fp16_roundtrips((k, n, w) in matrix(150, 60)) {
        check_f16(&w, k, n);
    }

    #[test]
    fn index_is_a_bijection(k in 1usize..200, n in 1usize..200, d in 0usize..3) {
        let l = TiledLayout::new(DTYPES[d], k, n);
        let mut seen = vec![false; l.elems()];
        for nn in 0..l.n_pad() {
            for kk in 0..l.k_pad() {
                let e = l.index(kk, nn);
                prop_assert_eq!(e, spec_index(l.dtype, l.k_pad(), kk, nn));
                prop_assert!(!seen[e], "index {} hit twice", e);
                seen[e] = true;
            }
        }
        prop_assert!(seen.iter().all(|&s| s));
        prop_assert_eq!(l.checked_blob_bytes(), Some(l.blob_bytes()));
        prop_assert_eq!(l.n_tiles() * l.n_tile_bytes(), l.blob_bytes());
    }

    #[test]
    fn pack_into_writes_every_byte((k, n, w) in matrix(100, 70), d in 0usize..3) {
        let src = MatrixRows::new(&w, k, n).unwrap();
        let fresh = pack(&src, DTYPES[d]).unwrap();
        let mut data = vec![0xA5u8; fresh.data.len()];
        let mut scales = vec![f32::NAN; n];
        let layout = pack_into(&src, DTYPES[d], &mut data, &mut scales).unwrap();
        prop_assert_eq!(layout, fresh.layout);
        prop_assert!(data == fresh.data);
        prop_assert_eq!(scales, fresh.scales);
    }
}

/// Deterministic pseudo-random weights (xorshift), roughly Gaussian-free but varied per row.
fn weights(k: usize, n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..k * n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            u * (1.0 + (i / k % 7) as f32)
        })
        .collect()
}

#[test]
fn model_sized_shapes_match_reference() {
    // SmolLM2 ffn shapes (K=576, N=1536 and K=1536, N=576), plus odd ones.
    for &(k, n) in &[(576, 1536), (1536, 576), (1000, 333), (33, 65)] {
        let w = weights(k, n, (k * n) as u64);
        check_quantized(&w, k, n, PackDtype::I8);
        check_quantized(&w, k, n, PackDtype::I4);
        check_f16(&w, k, n);
    }
}

#[test]
fn thread_count_does_not_change_the_output() {
    let (k, n) = (200, 300);
    let w = weights(k, n, 7);
    let src = MatrixRows::new(&w, k, n).unwrap();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let two = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for d in DTYPES {
        assert_eq!(
            pack_in(&one, &src, d).unwrap(),
            pack_in(&two, &src, d).unwrap()
        );
    }
}

#[test]
fn tile_positions_follow_the_native_layout() {
    // K=64, N=70: w[n][k] = k + 100·n (exact in fp16 up to 2048, so use small coordinates).
    let (k, n) = (40, 20);
    let w: Vec<f32> = (0..n)
        .flat_map(|nn| (0..k).map(move |kk| (kk + 64 * nn) as f32))
        .collect();
    let p = pack(&MatrixRows::new(&w, k, n).unwrap(), PackDtype::F16).unwrap();
    // fp16 tile: (N/16, K/32, 16, 32), Kpad = 64. Element (k=33, n=17): n-tile 1, k-tile 1,
    // row 1 in tile, column 1 → 1·(16·64) + 1·(16·32) + 1·32 + 1 = 1569.
    let e = 1569;
    let h = f16::from_le_bytes([p.data[2 * e], p.data[2 * e + 1]]);
    assert_eq!(h.to_f32(), (33 + 64 * 17) as f32);
    // int8: one row's 32-value run is contiguous: elements 0..32 are row 0, k = 0..32.
    let p8 = pack(&MatrixRows::new(&w, k, n).unwrap(), PackDtype::I8).unwrap();
    let q = untile_q(&p8).unwrap();
    for (&byte, &code) in p8.data[..32].iter().zip(&q[..32]) {
        assert_eq!(byte as i8, code);
    }
    // Row 1 of the first K-tile follows at element 32.
    assert_eq!(p8.data[32] as i8, q[k]);
}

#[test]
fn int4_nibble_order_is_the_named_constant() {
    let (k, n) = (32, 1);
    let mut w = vec![0f32; k];
    w[0] = 7.0; // code 7
    w[1] = -3.0; // code -3
    let p = pack(&MatrixRows::new(&w, k, n).unwrap(), PackDtype::I4).unwrap();
    let (even, odd) = (7u8, (-3i8 as u8) & 0xF);
    let expected = if INT4_EVEN_K_IN_LOW_NIBBLE {
        even | odd << 4
    } else {
        odd | even << 4
    };
    assert_eq!(p.data[0], expected);
    assert_eq!(p.scales, vec![1.0]);
}

#[test]
fn zero_and_tiny_rows() {
    let k = 37;
    let tiny = f32::from_bits(3); // subnormal
    let mut w = vec![0f32; 3 * k];
    w[k] = tiny; // row 1: only a subnormal value
    w[k + 5] = -tiny / 3.0 * 2.0;
    w[2 * k + 3] = 1e-38; // row 2: normal but lim/absmax overflows
    for d in [PackDtype::I8, PackDtype::I4] {
        let p = pack(&MatrixRows::new(&w, k, 3).unwrap(), d).unwrap();
        let q = untile_q(&p).unwrap();
        assert_eq!(p.scales[0], 0.0);
        assert!(q[..k].iter().all(|&c| c == 0));
        let lim = lim(d) as i8;
        assert_eq!(q[k], lim);
        assert_eq!(q[2 * k + 3], lim);
        assert_eq!(q, reference_quantize(&w, k, lim as f32).0);
        assert!(p.scales.iter().all(|s| s.is_finite()));
    }
}

#[test]
fn non_finite_rows_are_refused() {
    let (k, n) = (50, 70);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut w = weights(k, n, 3);
        w[41 * k + 49] = bad;
        for d in DTYPES {
            let err = pack(&MatrixRows::new(&w, k, n).unwrap(), d).unwrap_err();
            assert!(
                matches!(err, PackError::NonFinite { row: 41 }),
                "{d:?} {bad}: {err:?}"
            );
        }
    }
}

#[test]
fn fp16_overflow_is_refused() {
    let mut w = vec![1f32; 64];
    w[40] = 70_000.0;
    let err = pack(&MatrixRows::new(&w, 32, 2).unwrap(), PackDtype::F16).unwrap_err();
    assert!(
        matches!(err, PackError::F16Overflow { row: 1, .. }),
        "{err:?}"
    );
    // The largest finite fp16 still packs.
    w[40] = 65_504.0;
    assert!(pack(&MatrixRows::new(&w, 32, 2).unwrap(), PackDtype::F16).is_ok());
}

#[test]
fn bad_shapes_and_buffers_are_refused() {
    assert!(matches!(
        MatrixRows::new(&[0.0; 10], 3, 3),
        Err(PackError::Length { .. })
    ));
    let empty = MatrixRows::new(&[], 0, 5).unwrap();
    assert!(matches!(
        pack(&empty, PackDtype::I8),
        Err(PackError::Shape { .. })
    ));
    let w = vec![1f32; 64];
    let src = MatrixRows::new(&w, 32, 2).unwrap();
    let mut data = vec![0u8; 32 * 32 - 1];
    let mut scales = vec![0f32; 2];
    assert!(matches!(
        pack_into(&src, PackDtype::I8, &mut data, &mut scales),
        Err(PackError::Length {
            expected: 1024,
            got: 1023,
            ..
        })
    ));
    let mut data = vec![0u8; 32 * 32];
    let mut scales = vec![0f32; 3];
    assert!(matches!(
        pack_into(&src, PackDtype::I8, &mut data, &mut scales),
        Err(PackError::Length {
            expected: 2,
            got: 3,
            ..
        })
    ));
    let mut out = vec![0f32; 32];
    assert!(matches!(
        src.read_rows(2, &mut out),
        Err(PackError::Shape { .. })
    ));
    let mut out = vec![0f32; 33];
    assert!(matches!(
        src.read_rows(0, &mut out),
        Err(PackError::Shape { .. })
    ));
}

#[test]
fn check_and_untile_refuse_malformed_weights() {
    let (k, n) = (40, 20);
    let w = weights(k, n, 11);
    let src = MatrixRows::new(&w, k, n).unwrap();
    for d in DTYPES {
        let good = pack(&src, d).unwrap();
        let mut short = good.clone();
        short.data.pop();
        assert!(matches!(short.check(), Err(PackError::Length { .. })));
        assert!(matches!(untile(&short), Err(PackError::Length { .. })));
        let mut bad_scale = good.clone();
        bad_scale.scales[3] = -1.0;
        assert!(matches!(
            bad_scale.check(),
            Err(PackError::Scale { row: 3, .. })
        ));
        // Element (k=45, n=2) is K padding (K=40, Kpad=64).
        let mut dirty = good.clone();
        let e = good.layout.index(45, 2);
        match d {
            PackDtype::I8 => dirty.data[e] = 1,
            PackDtype::I4 => {
                let low = e.is_multiple_of(2) == INT4_EVEN_K_IN_LOW_NIBBLE;
                dirty.data[e / 2] |= if low { 0x01 } else { 0x10 };
            }
            PackDtype::F16 => dirty.data[2 * e] = 1,
        }
        assert!(matches!(
            dirty.check(),
            Err(PackError::Padding { k: 45, n: 2, .. })
        ));
    }
    let f16w = pack(&src, PackDtype::F16).unwrap();
    assert!(matches!(
        untile_q(&f16w),
        Err(PackError::NotQuantized {
            dtype: PackDtype::F16
        })
    ));
}

/// A source that fails on one tile, to check errors pass through unchanged.
struct FailingRows;
impl RowSource for FailingRows {
    fn k(&self) -> usize {
        8
    }
    fn n(&self) -> usize {
        100
    }
    fn read_rows(&self, first: usize, out: &mut [f32]) -> Result<(), PackError> {
        if first == 64 {
            return Err(PackError::Source("tile 2 is unreadable".into()));
        }
        out.fill(1.0);
        Ok(())
    }
}

#[test]
fn source_errors_propagate() {
    assert!(matches!(
        pack(&FailingRows, PackDtype::I8),
        Err(PackError::Source(_))
    ));
}

#[test]
fn gguf_rows_refuse_non_matrices() {
    use ork_gguf::GgmlType;
    let bytes = vec![0u8; 20 * 6];
    let shape_err = |dims: &[u64], data: &[u8]| match GgufRows::from_blocks(
        "blk.0.x",
        GgmlType::Q4_1,
        dims,
        data,
    ) {
        Err(PackError::TensorShape { tensor, .. }) => assert_eq!(tensor, "blk.0.x"),
        other => panic!("{dims:?}: {other:?}"),
    };
    shape_err(&[32], &bytes);
    shape_err(&[32, 6, 2], &bytes);
    shape_err(&[32, 0], &bytes);
    shape_err(&[32, 7], &bytes);
    shape_err(&[33, 6], &bytes);
    shape_err(&[32, 6], &bytes[..119]);
    match GgufRows::from_blocks("x", GgmlType::Other(99), &[32, 6], &bytes) {
        Err(PackError::TensorShape { .. }) => {}
        other => panic!("unknown type accepted: {other:?}"),
    }
    let rows = GgufRows::from_blocks("blk.0.x", GgmlType::Q4_1, &[32, 6, 1], &bytes).unwrap();
    assert_eq!((rows.k(), rows.n(), rows.row_bytes()), (32, 6, 20));
}

/// The real model (SmolLM2-135M-Instruct Q4_1): `ORK_MODEL` or the path `scripts/fetch-model.sh`
/// downloads to.
fn model() -> ork_gguf::GgufFile {
    ork_gguf::GgufFile::open(&ork_testkit::model_path()).expect("open model")
}

#[test]
fn real_model_tensors_pack_exactly() {
    use ork_gguf::GgmlType;
    let file = model();
    // One Q4_1 matmul weight of each SmolLM2 shape, and the Q8_0 embedding (tied output).
    for (name, ty, k, n) in [
        ("blk.0.ffn_up.weight", GgmlType::Q4_1, 576, 1536),
        ("blk.7.ffn_down.weight", GgmlType::Q4_1, 1536, 576),
        ("blk.29.attn_k.weight", GgmlType::Q4_1, 576, 192),
        ("token_embd.weight", GgmlType::Q8_0, 576, 49152),
    ] {
        let t = file
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(t.ty, ty, "{name}");
        let rows = GgufRows::new(&file, t).unwrap();
        assert_eq!((rows.k(), rows.n(), rows.name()), (k, n, name));
        let dense = file.dequantize_tensor(t).unwrap();
        let dtypes: &[PackDtype] = if n > 10_000 {
            &[PackDtype::I8]
        } else {
            &DTYPES
        };
        for &dtype in dtypes {
            let packed = pack(&rows, dtype).unwrap();
            let reference = pack(&MatrixRows::new(&dense, k, n).unwrap(), dtype).unwrap();
            assert!(
                packed == reference,
                "{name} {dtype:?}: GGUF rows differ from decoded rows"
            );
            if dtype == PackDtype::F16 {
                check_f16(&dense, k, n);
            } else {
                check_quantized(&dense, k, n, dtype);
            }
        }
    }
}

#[test]
fn real_model_refuses_non_matrices() {
    let file = model();
    let norm = file.tensor("blk.0.attn_norm.weight").expect("attn_norm");
    match GgufRows::new(&file, norm) {
        Err(PackError::TensorShape { tensor, .. }) => assert_eq!(tensor, "blk.0.attn_norm.weight"),
        other => panic!("1-D tensor accepted: {other:?}"),
    }
}

/// A decodable-geometry type ork cannot decode: the GGUF layer's error comes back naming the
/// tensor.
#[test]
fn undecodable_type_names_the_tensor() {
    use ork_gguf::GgmlType;
    let ty = GgmlType::from_id(20); // IQ4_NL: 32-element blocks of 18 bytes, not decoded by ork
    let bytes = vec![0u8; 18 * 4];
    let rows = GgufRows::from_blocks("blk.3.iq", ty, &[64, 2], &bytes).unwrap();
    match pack(&rows, PackDtype::I8) {
        Err(PackError::Tensor { tensor, .. }) => assert_eq!(tensor, "blk.3.iq"),
        other => panic!("{other:?}"),
    }
}

/// Records every `read_rows` call, to check the kernel streams: one tile's rows per call, each
/// row read exactly once.
struct ProbeRows {
    k: usize,
    n: usize,
    reads: std::sync::Mutex<Vec<(usize, usize)>>,
}

impl RowSource for ProbeRows {
    fn k(&self) -> usize {
        self.k
    }
    fn n(&self) -> usize {
        self.n
    }
    fn read_rows(&self, first: usize, out: &mut [f32]) -> Result<(), PackError> {
        self.reads.lock().unwrap().push((first, out.len() / self.k));
        for (i, row) in out.chunks_mut(self.k).enumerate() {
            row.iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = ((first + i) * 7 + j) as f32);
        }
        Ok(())
    }
}

#[test]
fn kernel_streams_one_tile_of_rows_at_a_time() {
    for dtype in DTYPES {
        let src = ProbeRows {
            k: 300,
            n: 1000,
            reads: Default::default(),
        };
        pack(&src, dtype).unwrap();
        let mut reads = src.reads.into_inner().unwrap();
        reads.sort_unstable();
        let tn = dtype.n_tile();
        let expected: Vec<(usize, usize)> = (0..1000)
            .step_by(tn)
            .map(|first| (first, tn.min(1000 - first)))
            .collect();
        assert_eq!(reads, expected, "{dtype:?}");
    }
}

#[test]
fn bench_pack_reports_the_run() {
    let (k, n) = (96, 80);
    let w = weights(k, n, 5);
    let src = MatrixRows::new(&w, k, n).unwrap();
    for dtype in DTYPES {
        let r = ork_pack::bench_pack(&src, dtype, 2, 3).unwrap();
        assert_eq!((r.dtype, r.k, r.n, r.threads, r.iters), (dtype, k, n, 2, 3));
        assert_eq!(r.out_bytes, TiledLayout::new(dtype, k, n).blob_bytes());
        assert!(r.best_seconds > 0.0 && r.best_seconds <= r.mean_seconds);
        assert_eq!(r.elems(), k * n);
    }
    let empty = MatrixRows::new(&[], 0, 0).unwrap();
    assert!(matches!(
        ork_pack::bench_pack(&empty, PackDtype::I8, 1, 1),
        Err(PackError::Shape { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Per-group scales

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// `pack_grouped` equals the per-row reference applied to every group on its own (the rows of
    /// `K/g` groups reshaped into `N·K/g` rows of `g` keep the `[N][K/g]` scale order), for int8
    /// and int4, over group sizes, group counts and tiny / zero groups; `untile` dequantizes with
    /// the group's scale and `check` accepts the weight.
    #[test]
    fn grouped_matches_the_reference_per_group(
        gi in 0usize..4, groups in 1usize..5, n in 1usize..70, int4 in any::<bool>(),
        exp in -6i32..=6, seed in any::<u64>(),
    ) {
        let g = [32, 64, 128, 256][gi];
        let k = g * groups;
        let dtype = if int4 { PackDtype::I4 } else { PackDtype::I8 };
        let mut s = seed | 1;
        let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
        let range = 10f32.powi(exp / 2);
        let mut w: Vec<f32> = (0..n * k)
            .map(|_| ((next() % 20001) as f32 / 10000.0 - 1.0) * range)
            .collect();
        // A zero group and a subnormal group where there are enough.
        if n * groups > 2 {
            w[g..2 * g].fill(0.0);
            w[2 * g..3 * g].iter_mut().for_each(|x| *x *= 1e-40);
        }
        let pw = ork_pack::pack_grouped(&MatrixRows::new(&w, k, n).unwrap(), dtype, g).unwrap();
        prop_assert_eq!(pw.group, ork_pack::ScaleGroup::Group(g));
        let (q, scales) = reference_quantize(&w, g, lim(dtype));
        prop_assert_eq!(&pw.scales, &scales);
        prop_assert_eq!(untile_q(&pw).unwrap(), q.clone());
        pw.check().unwrap();
        assert_padding_zero(&pw);
        let deq = untile(&pw).unwrap();
        for (i, (&d, &c)) in deq.iter().zip(&q).enumerate() {
            prop_assert_eq!(d, f32::from(c) * scales[i / g]);
        }
    }
}

#[test]
fn grouped_refuses_groups_that_do_not_fit() {
    let w = vec![1.0f32; 96 * 4];
    let rows = MatrixRows::new(&w, 96, 4).unwrap();
    for (g, d) in [
        (64, PackDtype::I8),
        (0, PackDtype::I8),
        (40, PackDtype::I4),
        (32, PackDtype::F16),
    ] {
        assert!(
            matches!(ork_pack::pack_grouped(&rows, d, g), Err(PackError::Group { group, k: 96, .. }) if group == g),
            "g{g} {d:?}"
        );
    }
    // A per-group weight whose scale count or group does not match is refused by `check`.
    let mut pw = ork_pack::pack_grouped(&rows, PackDtype::I8, 32).unwrap();
    pw.scales.pop();
    assert!(matches!(
        pw.check(),
        Err(PackError::Length { what: "scales", .. })
    ));
    let mut pw = ork_pack::pack_grouped(&rows, PackDtype::I8, 32).unwrap();
    pw.group = ork_pack::ScaleGroup::Group(64);
    assert!(matches!(
        pw.check(),
        Err(PackError::Group { group: 64, .. })
    ));
    let mut pw = ork_pack::pack_grouped(&rows, PackDtype::I8, 32).unwrap();
    pw.scales[5] = f32::NAN;
    // Scale 5 of 3 groups per channel belongs to output channel 1.
    assert!(matches!(pw.check(), Err(PackError::Scale { row: 1, .. })));
}

#[test]
fn real_model_groups_shrink_the_quantization_error() {
    // blk.7.ffn_down (K = 1536): relative RMS error vs the GGUF's own f32 dequantization falls
    // from per-channel to g512 to g256 to g128 (figures: `examples/group_error.rs`).
    let file = model();
    let t = file.tensor("blk.7.ffn_down.weight").expect("ffn_down");
    let dense = file.dequantize_tensor(t).unwrap();
    let (k, n) = (1536, 576);
    let rows = GgufRows::new(&file, t).unwrap();
    let err = |pw: &PackedWeight| {
        let deq = untile(pw).unwrap();
        let e: f64 = deq
            .iter()
            .zip(&dense)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum();
        let s: f64 = dense.iter().map(|&x| f64::from(x).powi(2)).sum();
        (e / s).sqrt()
    };
    let channel = err(&pack(&rows, PackDtype::I8).unwrap());
    let mut last = channel;
    for g in [512, 256, 128] {
        let pw = ork_pack::pack_grouped(&rows, PackDtype::I8, g).unwrap();
        // The GGUF rows stream to the same bytes as the decoded matrix.
        let dense_pw =
            ork_pack::pack_grouped(&MatrixRows::new(&dense, k, n).unwrap(), PackDtype::I8, g)
                .unwrap();
        assert!(pw == dense_pw, "g{g}: GGUF rows differ from decoded rows");
        let e = err(&pw);
        assert!(e < last, "g{g}: error {e} not below {last}");
        last = e;
    }
    assert!(last < 0.8 * channel, "g128 {last} vs per-channel {channel}");
}

// Affine groups (w4a16-gN: step and offset per group)

/// Max over a weight of `|packed − reference| / (ε · (|lo| + 15 · s))` per group of 32, where
/// `lo` and `s` are the reference group's minimum and step: the error in units of f32 rounding
/// of the group's magnitude.
fn affine_error_in_ulps(pw: &PackedWeight, reference: &[f32], k: usize) -> f64 {
    let deq = untile(pw).unwrap();
    let mut worst = 0f64;
    for (got, want) in deq.chunks(32).zip(reference.chunks(32)) {
        let lo = want.iter().fold(f32::INFINITY, |a, &b| a.min(b));
        let hi = want.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let unit = f64::from(f32::EPSILON) * (f64::from(lo.abs()) + f64::from(hi - lo));
        for (&g, &w) in got.iter().zip(want) {
            let d = (f64::from(g) - f64::from(w)).abs();
            if d > 0.0 {
                worst = worst.max(d / unit);
            }
        }
    }
    assert_eq!(deq.len() % k, 0);
    worst
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// A Q4_1 weight (ggml's reference quantizer, `ork_gguf::writer::quantize`) packed with
    /// affine groups of 32 gets back the GGUF's codes exactly (`q + 8` = the Q4_1 nibble) and
    /// its dequantized values within f32 rounding (at most 2 ulp of the group's magnitude).
    #[test]
    fn affine_g32_reproduces_q4_1(
        blocks in 1usize..6, n in 1usize..70, exp in -4i32..=4, shift in -2.0f32..2.0,
        seed in any::<u64>(),
    ) {
        use ork_gguf::GgmlType;
        let k = 32 * blocks;
        let mut s = seed | 1;
        let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
        let range = 10f32.powi(exp);
        let w: Vec<f32> = (0..n * k)
            .map(|_| ((next() % 20001) as f32 / 10000.0 - 1.0 + shift) * range)
            .collect();
        let bytes = ork_gguf::writer::quantize(GgmlType::Q4_1, &w).unwrap();
        let mut dense = vec![0f32; n * k];
        ork_gguf::dequant::dequantize(GgmlType::Q4_1, &bytes, &mut dense).unwrap();
        let pw = ork_pack::pack_affine(&MatrixRows::new(&dense, k, n).unwrap(), 32).unwrap();
        prop_assert_eq!(pw.group, ork_pack::ScaleGroup::Affine(32));
        prop_assert_eq!(pw.scales.len(), 2 * n * blocks);
        pw.check().unwrap();
        assert_padding_zero(&pw);
        // Q4_1 block: fp16 d, fp16 m, 16 bytes: element j in the low nibble of byte j, element
        // j + 16 in the high nibble.
        let codes = untile_q(&pw).unwrap();
        for (b, block) in bytes.chunks_exact(20).enumerate() {
            for j in 0..32 {
                let byte = block[4 + j % 16];
                let nib = if j < 16 { byte & 0xF } else { byte >> 4 };
                let all_equal = f16::from_le_bytes([block[0], block[1]]).to_f32() == 0.0;
                let want = if all_equal { -8 } else { nib as i8 - 8 };
                prop_assert_eq!(codes[b * 32 + j], want, "block {} element {}", b, j);
            }
        }
        let ulps = affine_error_in_ulps(&pw, &dense, k);
        prop_assert!(ulps <= 2.0, "{} ulp", ulps);
    }
}

#[test]
fn affine_edge_groups_and_errors() {
    let (k, n) = (64, 3);
    let mut w: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 - 3.0).collect();
    // Group 0 of channel 1 all equal (step 0, no division by zero); group 1 of channel 1 zero.
    w[k..k + 32].fill(-2.5);
    w[k + 32..2 * k].fill(0.0);
    let pw = ork_pack::pack_affine(&MatrixRows::new(&w, k, n).unwrap(), 32).unwrap();
    let (steps, offsets) = pw.group.split(&pw.scales);
    assert_eq!((steps.len(), offsets.len()), (6, 6));
    assert_eq!((steps[2], offsets[2]), (0.0, -2.5));
    assert_eq!((steps[3], offsets[3]), (0.0, 0.0));
    // Negative offsets are valid; every value here lies on the group's grid (−3..=3, step 0.4).
    pw.check().unwrap();
    let deq = untile(&pw).unwrap();
    assert_eq!(&deq[k..2 * k], &w[k..2 * k]);
    for (&d, &x) in deq.iter().zip(&w) {
        assert!((d - x).abs() <= 0.2 + 1e-6, "{d} vs {x}");
    }
    // A non-finite step is refused; a non-finite offset too.
    let mut bad = pw.clone();
    bad.scales[7] = f32::INFINITY;
    assert!(matches!(bad.check(), Err(PackError::Scale { row: 0, .. })));
    let mut bad = pw.clone();
    bad.scales[1] = -1.0;
    assert!(matches!(bad.check(), Err(PackError::Scale { row: 0, .. })));
    // Scales of the per-group length only (no offsets) do not make an affine weight.
    let mut bad = pw.clone();
    bad.scales.truncate(6);
    assert!(matches!(
        bad.check(),
        Err(PackError::Length { what: "scales", .. })
    ));
    // NaN names its output channel; a group that does not divide K is refused.
    w[2 * k + 5] = f32::NAN;
    assert!(matches!(
        ork_pack::pack_affine(&MatrixRows::new(&w, k, n).unwrap(), 32),
        Err(PackError::NonFinite { row: 2 })
    ));
    let ok = vec![1.0f32; 96 * 2];
    assert!(matches!(
        ork_pack::pack_affine(&MatrixRows::new(&ok, 96, 2).unwrap(), 64),
        Err(PackError::Group {
            group: 64,
            k: 96,
            ..
        })
    ));
    // Values beyond fp16's range are in no model: refused (their scales would lie beyond
    // MAX_SCALE, which readers refuse), for affine, symmetric groups and per channel alike.
    let wide = |v: f32| [v, -v].iter().cycle().take(32).copied().collect::<Vec<_>>();
    let huge_values = wide(f32::MAX);
    let huge = MatrixRows::new(&huge_values, 32, 1).unwrap();
    for r in [
        ork_pack::pack_affine(&huge, 32).map(drop),
        ork_pack::pack_grouped(&huge, PackDtype::I8, 32).map(drop),
        ork_pack::pack(&huge, PackDtype::I4).map(drop),
    ] {
        assert!(
            matches!(r, Err(PackError::F16Overflow { row: 0, .. })),
            "{r:?}"
        );
    }
    // The widest range fp16 holds gets a finite step and scales within MAX_SCALE.
    let edge = wide(65504.0);
    let pw = ork_pack::pack_affine(&MatrixRows::new(&edge, 32, 1).unwrap(), 32).unwrap();
    pw.check().unwrap();
    assert_eq!(ork_pack::bad_scale(&pw.scales), None);
}

#[test]
fn real_model_affine_g32_reproduces_the_gguf() {
    // Every SmolLM2 Q4_1 shape: affine groups of 32 (aligned to the Q4_1 blocks) give back the
    // GGUF's dequantized values within f32 rounding; g64 / g128 (several blocks per group) do
    // not, but stay far below the symmetric groups' error.
    let file = model();
    for name in [
        "blk.0.ffn_up.weight",
        "blk.7.ffn_down.weight",
        "blk.29.attn_k.weight",
    ] {
        let t = file.tensor(name).expect(name);
        let rows = GgufRows::new(&file, t).unwrap();
        let (k, n) = (rows.k(), rows.n());
        let dense = file.dequantize_tensor(t).unwrap();
        let pw = ork_pack::pack_affine(&rows, 32).unwrap();
        let dense_pw = ork_pack::pack_affine(&MatrixRows::new(&dense, k, n).unwrap(), 32).unwrap();
        assert!(pw == dense_pw, "{name}: GGUF rows differ from decoded rows");
        let ulps = affine_error_in_ulps(&pw, &dense, k);
        eprintln!("{name}: affine g32 vs GGUF: {ulps:.3} ulp");
        // Measured: bit for bit on these tensors (the bound the proptest allows is 2 ulp).
        assert!(ulps == 0.0, "{name}: {ulps} ulp");
        let rel = |pw: &PackedWeight| {
            let deq = untile(pw).unwrap();
            let e: f64 = deq
                .iter()
                .zip(&dense)
                .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                .sum();
            let s: f64 = dense.iter().map(|&x| f64::from(x).powi(2)).sum();
            (e / s).sqrt()
        };
        let sym = rel(&ork_pack::pack_grouped(&rows, PackDtype::I4, 32).unwrap());
        for g in [64, 128] {
            if k % g == 0 {
                let e = rel(&ork_pack::pack_affine(&rows, g).unwrap());
                assert!(
                    e > 0.0 && e < sym,
                    "{name} g{g}: {e} vs symmetric g32 {sym}"
                );
            }
        }
    }
}
