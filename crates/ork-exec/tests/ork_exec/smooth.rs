//! SmoothQuant-style smoothing on the real model: the folding into the norms is exact in f32.
use super::real_model::{gguf, model, tokenizer};
use ork_exec::ops::rms_norm;
use ork_exec::{
    smooth_reference, smoothed_gguf, smoothing_factors, CpuF32Linear, ExecError, Linear, Model,
    Session,
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
    let s = smoothing_factors(model(), reference(), &tokens, 512, 0.5).unwrap();
    assert_eq!(s.len(), model().config().n_layer);
    // The factors do something: some channel moves by more than 2×.
    assert!(s[0].attn.iter().any(|&f| !(0.5..=2.0).contains(&f)));
    assert!(s.iter().all(|b| b.ffn.is_some()));

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
                reference().matmul(&name, &h0, 4, &mut y0).unwrap();
                lin.matmul(&name, &h1, 4, &mut y1).unwrap();
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
    );
    let mut b = Session::new(Arc::clone(&smoothed), Arc::new(lin) as Arc<dyn Linear>);
    let la = a.prefill(prompt).unwrap();
    let lb = b.prefill(prompt).unwrap();
    let r = max_rel(&la, &lb);
    assert!(r < 1e-4, "logits: relative difference {r}");

    // smooth_reference gives the same weights as the smoothed file.
    let mut inplace = CpuF32Linear::from_gguf(gguf(), model().matmul_weights()).unwrap();
    smooth_reference(model(), &mut inplace, &s).unwrap();
    let q = "blk.3.attn_q.weight";
    let from_file = CpuF32Linear::from_gguf(&file, smoothed.matmul_weights()).unwrap();
    assert_eq!(inplace.weight(q), from_file.weight(q));
}

#[test]
fn bad_smoothing_parameters_are_refused() {
    let tokens = tokenizer().encode(CALIB, true, false).unwrap();
    for alpha in [-0.1, 1.5, f32::NAN] {
        let e = smoothing_factors(model(), reference(), &tokens, 512, alpha).unwrap_err();
        assert!(matches!(e, ExecError::InvalidSmoothing { .. }), "{e:?}");
    }
    let e = smoothing_factors(model(), reference(), &[], 512, 0.5).unwrap_err();
    assert!(matches!(e, ExecError::InvalidSmoothing { .. }), "{e:?}");
    let e = smoothed_gguf(gguf(), model(), &[], "x").unwrap_err();
    assert!(matches!(e, ExecError::InvalidSmoothing { .. }), "{e:?}");
}
