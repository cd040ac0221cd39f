//! SmoothQuant-style smoothing on the real model: the folding into the norms, and into v (for o)
//! and up (for down), is exact in f32.
use super::real_model::{gguf, model, tokenizer};
use ork_exec::ops::rms_norm;
use ork_exec::{
    smooth_reference, smoothed_gguf, smoothing_factors, BlockSmoothing, CpuF32Linear, ExecError,
    KvType, Linear, Model, Session, SmoothTargets,
};
use std::sync::{Arc, OnceLock};

const CALIB: &str = "The quick brown fox jumps over the lazy dog. In 1887, a committee of \
    engineers met in Zurich to agree on the units of electrical resistance; their minutes, \
    written in French and German, list forty-two decisions.";

fn reference() -> &'static Arc<CpuF32Linear> {
    static L: OnceLock<Arc<CpuF32Linear>> = OnceLock::new();
    L.get_or_init(|| {
        Arc::new(CpuF32Linear::from_gguf(gguf(), model().matmul_weights()).expect("dequantize"))
    })
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

#[test]
fn folding_into_the_norms_is_exact_in_f32() {
    let tokens = tokenizer().encode(CALIB, true, false).unwrap();
    let s =
        smoothing_factors(model(), reference(), &tokens, 512, 0.5, SmoothTargets::NORM).unwrap();
    assert_eq!(s.len(), model().config().n_layer);
    // The factors do something: some channel moves by more than 2×.
    assert!(s[0].attn.iter().any(|&f| !(0.5..=2.0).contains(&f)));
    assert!(s.iter().all(|b| b.ffn.is_some()));
    assert!(s.iter().all(|b| b.vo.is_none() && b.down.is_none()));

    let file = Arc::new(smoothed_gguf(gguf(), model(), &s, "smoothed").unwrap());
    let smoothed = Arc::new(Model::load(&file).unwrap());
    let lin = CpuF32Linear::from_gguf(&file, smoothed.matmul_weights()).unwrap();

    // Each smoothed projection of the normed input equals the original's (block 0 and the last).
    let c = model().config();
    let d = c.n_embd;
    let mut rng = ork_testkit::Rng::new(7);
    let x = rng.vec(4 * d, 1.0);
    for il in [0, c.n_layer - 1] {
        for (norm, weights) in [
            ("attn_norm", &["attn_q", "attn_k", "attn_v"][..]),
            ("ffn_norm", &["ffn_gate", "ffn_up"][..]),
        ] {
            let norm = format!("blk.{il}.{norm}.weight");
            let orig_w = gguf()
                .dequantize_tensor(gguf().tensor(&norm).unwrap())
                .unwrap();
            let new_w = file.dequantize_tensor(file.tensor(&norm).unwrap()).unwrap();
            assert_ne!(orig_w, new_w, "{norm} is unchanged");
            let (mut h0, mut h1) = (x.clone(), x.clone());
            rms_norm(&mut h0, &orig_w, c.rms_eps);
            rms_norm(&mut h1, &new_w, c.rms_eps);
            for w in weights {
                let name = format!("blk.{il}.{w}.weight");
                let n = file.tensor(&name).unwrap().dims[1] as usize;
                let (mut y0, mut y1) = (vec![0.0; 4 * n], vec![0.0; 4 * n]);
                let id = model().manifest().id(&name).unwrap();
                reference().matmul(id, &h0, 4, &mut y0).unwrap();
                lin.matmul(id, &h1, 4, &mut y1).unwrap();
                let r = max_rel(&y0, &y1);
                assert!(r < 1e-4, "{name}: relative difference {r}");
            }
        }
    }

    // The whole model's logits agree too.
    let prompt = &tokens[..12];
    let mut a = Session::new(
        Arc::clone(model()),
        Arc::clone(reference()) as Arc<dyn Linear>,
    )
    .with_kv_type(KvType::F32);
    let mut b = Session::new(Arc::clone(&smoothed), Arc::new(lin) as Arc<dyn Linear>)
        .with_kv_type(KvType::F32);
    let la = a.prefill(prompt).unwrap();
    let lb = b.prefill(prompt).unwrap();
    let r = max_rel(&la, &lb);
    assert!(r < 1e-4, "logits: relative difference {r}");

    // smooth_reference gives the same weights as the smoothed file.
    let mut inplace = CpuF32Linear::from_gguf(gguf(), model().matmul_weights()).unwrap();
    smooth_reference(model(), &mut inplace, &s).unwrap();
    let q = model().manifest().id("blk.3.attn_q.weight").unwrap();
    let from_file = CpuF32Linear::from_gguf(&file, smoothed.matmul_weights()).unwrap();
    assert_eq!(inplace.weight(q), from_file.weight(q));
}

#[test]
fn bad_smoothing_parameters_are_refused() {
    let tokens = tokenizer().encode(CALIB, true, false).unwrap();
    for alpha in [-0.1, 1.5, f32::NAN] {
        let e = smoothing_factors(
            model(),
            reference(),
            &tokens,
            512,
            alpha,
            SmoothTargets::ALL,
        )
        .unwrap_err();
        assert!(matches!(e, ExecError::InvalidSmoothing { .. }), "{e:?}");
    }
    let e = smoothing_factors(model(), reference(), &[], 512, 0.5, SmoothTargets::ALL).unwrap_err();
    assert!(matches!(e, ExecError::InvalidSmoothing { .. }), "{e:?}");
    let e = smoothed_gguf(gguf(), model(), &[], "x").unwrap_err();
    assert!(matches!(e, ExecError::InvalidSmoothing { .. }), "{e:?}");
    // Factors of the wrong length for v → o or up → down are refused too.
    let good =
        smoothing_factors(model(), reference(), &tokens, 512, 0.5, SmoothTargets::ALL).unwrap();
    for bad in [
        |b: &mut BlockSmoothing| b.vo.as_mut().unwrap().pop(),
        |b: &mut BlockSmoothing| b.down.as_mut().unwrap().pop(),
    ] {
        let mut s = good.clone();
        bad(&mut s[1]);
        let e = smoothed_gguf(gguf(), model(), &s, "x").unwrap_err();
        assert!(matches!(e, ExecError::InvalidSmoothing { .. }), "{e:?}");
    }
}

/// v → o (per kv head, shared by its group of q heads) and up → down fold exactly: v's and
/// up's outputs are divided by their factors, and the whole model's logits are unchanged.
#[test]
fn folding_into_v_and_up_is_exact_in_f32() {
    let tokens = tokenizer().encode(CALIB, true, false).unwrap();
    let s = smoothing_factors(model(), reference(), &tokens, 512, 0.5, SmoothTargets::ALL).unwrap();
    let c = model().config();
    assert!(
        c.n_head > c.n_head_kv,
        "the model shares kv heads (grouped-query attention)"
    );
    for b in &s {
        assert_eq!(b.vo.as_ref().unwrap().len(), c.n_head_kv * c.head_dim_v);
        assert_eq!(b.down.as_ref().unwrap().len(), c.n_ff);
    }
    // The factors do something.
    assert!(s[0]
        .vo
        .as_ref()
        .unwrap()
        .iter()
        .any(|&f| !(0.5..=2.0).contains(&f)));
    assert!(s[0]
        .down
        .as_ref()
        .unwrap()
        .iter()
        .any(|&f| !(0.5..=2.0).contains(&f)));

    let file = Arc::new(smoothed_gguf(gguf(), model(), &s, "smoothed-all").unwrap());
    let smoothed = Arc::new(Model::load(&file).unwrap());
    let lin = CpuF32Linear::from_gguf(&file, smoothed.matmul_weights()).unwrap();

    // v's and up's outputs are the original's divided by s (the norms smoothed as well).
    let d = c.n_embd;
    let mut rng = ork_testkit::Rng::new(11);
    let x = rng.vec(3 * d, 1.0);
    let il = c.n_layer / 2;
    for (norm, w, f) in [
        ("attn_norm", "attn_v", s[il].vo.as_ref().unwrap()),
        ("ffn_norm", "ffn_up", s[il].down.as_ref().unwrap()),
    ] {
        let norm = format!("blk.{il}.{norm}.weight");
        let orig_w = gguf()
            .dequantize_tensor(gguf().tensor(&norm).unwrap())
            .unwrap();
        let new_w = file.dequantize_tensor(file.tensor(&norm).unwrap()).unwrap();
        let (mut h0, mut h1) = (x.clone(), x.clone());
        rms_norm(&mut h0, &orig_w, c.rms_eps);
        rms_norm(&mut h1, &new_w, c.rms_eps);
        let name = format!("blk.{il}.{w}.weight");
        let n = f.len();
        let (mut y0, mut y1) = (vec![0.0; 3 * n], vec![0.0; 3 * n]);
        let id = model().manifest().id(&name).unwrap();
        reference().matmul(id, &h0, 3, &mut y0).unwrap();
        lin.matmul(id, &h1, 3, &mut y1).unwrap();
        for row in y1.chunks_exact_mut(n) {
            for (v, f) in row.iter_mut().zip(f.iter()) {
                *v *= f;
            }
        }
        let r = max_rel(&y0, &y1);
        assert!(r < 1e-4, "{name}: relative difference {r}");
    }

    // The whole model's logits agree (this also checks the q head → kv head grouping).
    let prompt = &tokens[..12];
    let mut a = Session::new(
        Arc::clone(model()),
        Arc::clone(reference()) as Arc<dyn Linear>,
    )
    .with_kv_type(KvType::F32);
    let mut b = Session::new(Arc::clone(&smoothed), Arc::new(lin) as Arc<dyn Linear>)
        .with_kv_type(KvType::F32);
    let r = max_rel(&a.prefill(prompt).unwrap(), &b.prefill(prompt).unwrap());
    assert!(r < 1e-4, "logits: relative difference {r}");

    // smooth_reference gives the same weights as the smoothed file, o and down included.
    let mut inplace = CpuF32Linear::from_gguf(gguf(), model().matmul_weights()).unwrap();
    smooth_reference(model(), &mut inplace, &s).unwrap();
    let from_file = CpuF32Linear::from_gguf(&file, smoothed.matmul_weights()).unwrap();
    for w in ["attn_v", "attn_output", "ffn_up", "ffn_down"] {
        let name = format!("blk.{il}.{w}.weight");
        let id = model().manifest().id(&name).unwrap();
        assert_eq!(inplace.weight(id), from_file.weight(id), "{name}");
        assert_ne!(
            inplace.weight(id),
            reference().weight(id),
            "{name} unchanged"
        );
    }
}

#[test]
fn smoothing_targets_parse_and_refuse_a_set_without_norm() {
    for t in [
        SmoothTargets::NORM,
        SmoothTargets::ALL,
        SmoothTargets {
            v_to_o: true,
            up_to_down: false,
        },
        SmoothTargets {
            v_to_o: false,
            up_to_down: true,
        },
    ] {
        assert_eq!(t.name().parse::<SmoothTargets>(), Ok(t));
    }
    assert_eq!(
        "norm,vo,down".parse::<SmoothTargets>(),
        Ok(SmoothTargets::ALL)
    );
    for bad in ["vo", "down", "norm,up", ""] {
        assert!(bad.parse::<SmoothTargets>().is_err(), "{bad}");
    }
}
