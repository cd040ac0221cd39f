//! `ork convert`, `ork inspect`, `ork verify`: the real model end to end, and the faults of the
//! issue (corrupt, stale, truncated, unsupported, kill -9, SIGINT, full disk, concurrency).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, MetaValue};
use ork_testkit::SmallFs;

use super::{code, converted, json, model, ork, other_files, run, stderr, stdout};

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Matmul weights of [`tiny_gguf`]: `token_embd` (64×32) and seven 64×64 weights of its block.
const TINY_WEIGHTS: u64 = 8;
/// Source bytes of those weights (Q8_0: 34 bytes per 32 values).
const TINY_BYTES_IN: u64 = 7 * 64 * 2 * 34 + 32 * 2 * 34;
/// Their blob + scale bytes as int8 (k·n + 4·n each).
const TINY_BYTES_OUT: u64 = 7 * (64 * 64 + 4 * 64) + (64 * 32 + 4 * 32);

/// The smallest llama ork runs (one block, width 64, vocab 32; no tokenizer), with Q8_0 matmul
/// weights; `attn_q`'s values are shifted by `tune` (same names, shapes and types for every
/// `tune`: a fine-tune).
fn tiny_gguf(path: &Path, tune: f32) {
    let vals = |n: usize, shift: f32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0 + shift)
            .collect()
    };
    let u32v = |v: u32| MetaValue::U32(v);
    let mut b = GgufBuilder::new()
        .kv("general.architecture", MetaValue::String("llama".into()))
        .kv("llama.block_count", u32v(1))
        .kv("llama.context_length", u32v(64))
        .kv("llama.embedding_length", u32v(64))
        .kv("llama.feed_forward_length", u32v(64))
        .kv("llama.attention.head_count", u32v(2))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .kv("llama.vocab_size", u32v(32))
        // A byte-level vocabulary of 32 single letters: `convert` packs only a model `run`
        // can run, tokenizer included.
        .kv("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", MetaValue::String("smollm".into()))
        .kv(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                (0..32u8)
                    .map(|i| MetaValue::String(char::from(b'A' + i).to_string()))
                    .collect(),
            ),
        )
        .kv("tokenizer.ggml.merges", MetaValue::Array(Vec::new()))
        .kv("tokenizer.ggml.bos_token_id", u32v(0))
        .kv("tokenizer.ggml.eos_token_id", u32v(1))
        .tensor_f32(
            "token_embd.weight",
            &[64, 32],
            GgmlType::Q8_0,
            &vals(64 * 32, 0.0),
        )
        .unwrap();
    for norm in [
        "blk.0.attn_norm.weight",
        "blk.0.ffn_norm.weight",
        "output_norm.weight",
    ] {
        b = b
            .tensor_f32(norm, &[64], GgmlType::F32, &[1.0; 64])
            .unwrap();
    }
    for (name, shift) in [
        ("blk.0.attn_q.weight", tune),
        ("blk.0.attn_k.weight", 0.0),
        ("blk.0.attn_v.weight", 0.0),
        ("blk.0.attn_output.weight", 0.0),
        ("blk.0.ffn_gate.weight", 0.0),
        ("blk.0.ffn_up.weight", 0.0),
        ("blk.0.ffn_down.weight", 0.0),
    ] {
        b = b
            .tensor_f32(name, &[64, 64], GgmlType::Q8_0, &vals(64 * 64, shift))
            .unwrap();
    }
    b.write(path).unwrap();
}

/// One line on stderr, naming `what`.
fn assert_one_line_naming(o: &std::process::Output, what: &str) {
    let err = stderr(o);
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(what), "error does not name {what}: {err}");
}

fn entry_offset(pack: &Path, tensor: &str) -> u64 {
    let o = run(&["inspect", s(pack), "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let j = json(&o);
    j["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == tensor)
        .unwrap_or_else(|| panic!("no entry {tensor}"))["blob_offset"]
        .as_u64()
        .unwrap()
}

#[test]
fn convert_inspect_lists_all_211_weights() {
    let pack = converted();
    let o = run(&["inspect", s(pack), "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let j = json(&o);
    let entries = j["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 211);
    assert_eq!(j["total_entries"], 211);
    let embd = entries
        .iter()
        .find(|e| e["name"] == "token_embd.weight")
        .expect("token_embd.weight listed (tied output projection)");
    assert_eq!(
        (embd["k"].as_u64(), embd["n"].as_u64()),
        (Some(576), Some(49152))
    );
    assert_eq!(embd["dtype"], "i8");
    assert_eq!(embd["source_type"], "Q8_0");
    assert_eq!(
        j["model"]["model_file_bytes"].as_u64(),
        Some(std::fs::metadata(model()).unwrap().len())
    );
    let blob_sum: u64 = entries
        .iter()
        .map(|e| e["blob_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(j["total_blob_bytes"].as_u64(), Some(blob_sum));

    // The text form names every entry too.
    let o = run(&["inspect", s(pack)]);
    assert_eq!(code(&o), Some(0));
    let text = stdout(&o);
    assert!(text.contains("token_embd.weight") && text.contains("blk.29.ffn_down.weight"));
    assert!(text.contains("211 entries"), "{text}");
}

#[test]
fn verify_deep_accepts_a_fresh_conversion() {
    let o = run(&[
        "verify",
        s(converted()),
        "--model",
        s(&model()),
        "--deep",
        "--json",
    ]);
    assert_eq!(code(&o), Some(0), "{}{}", stdout(&o), stderr(&o));
    let j = json(&o);
    assert_eq!(j["checked"], 211);
    assert_eq!(j["valid"], 211);
    assert_eq!(j["ok"], true);
    assert!(j["problems"].as_array().unwrap().is_empty());
}

#[test]
fn flipped_blob_byte_fails_verify_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flipped.orkpack");
    let tensor = "blk.3.ffn_up.weight";
    let at = entry_offset(converted(), tensor) + 1000;
    let mut bytes = std::fs::read(converted()).unwrap();
    bytes[at as usize] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();

    let o = run(&["verify", s(&path), "--model", s(&model())]);
    assert_eq!(code(&o), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    let bad: Vec<&str> = out.lines().filter(|l| l.starts_with("CORRUPT")).collect();
    assert_eq!(bad.len(), 1, "{out}");
    assert!(bad[0].contains(tensor), "{out}");

    let o = run(&["verify", s(&path), "--model", s(&model()), "--json"]);
    assert_eq!(code(&o), Some(1));
    let j = json(&o);
    let problems = j["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0]["tensor"], tensor);
    assert_eq!(problems[0]["status"], "corrupt");
    assert_eq!(j["valid"], 210);
}

#[test]
fn pack_of_another_model_with_the_same_shapes_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    tiny_gguf(&a, 0.0);
    tiny_gguf(&b, 0.01);
    let pack = dir.path().join("a.orkpack");
    let o = run(&["convert", s(&a), "-o", s(&pack), "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(json(&o)["tensors_packed"], TINY_WEIGHTS);

    let o = run(&["verify", s(&pack), "--model", s(&a), "--deep"]);
    assert_eq!(code(&o), Some(0), "{}{}", stdout(&o), stderr(&o));

    let o = run(&["verify", s(&pack), "--model", s(&b)]);
    assert_eq!(code(&o), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(
        out.lines()
            .any(|l| l.starts_with("STALE") && l.contains("blk.0.attn_q.weight")),
        "{out}"
    );
    let o = run(&["verify", s(&pack), "--model", s(&b), "--json"]);
    let j = json(&o);
    assert_eq!(j["problems"][0]["status"], "stale");
    assert_eq!(j["problems"][0]["tensor"], "blk.0.attn_q.weight");

    // A pack built with another dtype is stale when a dtype is asked for.
    let o = run(&[
        "verify",
        s(&pack),
        "--model",
        s(&a),
        "--dtype",
        "i4",
        "--json",
    ]);
    assert_eq!(code(&o), Some(1));
    assert_eq!(json(&o)["problems"][0]["status"], "stale");
}

#[test]
fn truncated_or_bad_magic_pack_inspect_exits_2_verify_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(converted()).unwrap();

    let cut = dir.path().join("cut.orkpack");
    std::fs::write(&cut, &good[..good.len() / 2]).unwrap();
    let o = run(&["inspect", s(&cut)]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert_one_line_naming(&o, s(&cut));
    assert!(stdout(&o).is_empty());

    // verify reads the file and judges it: damaged = exit 1, with a verdict (also in JSON).
    let magic = dir.path().join("magic.orkpack");
    let mut b = good.clone();
    b[0] = b'X';
    std::fs::write(&magic, &b).unwrap();
    for bad in [&cut, &magic] {
        let o = run(&["verify", s(bad), "--model", s(&model())]);
        assert_eq!(code(&o), Some(1), "{}", stderr(&o));
        assert!(stdout(&o).contains(s(bad)), "{}", stdout(&o));
        let o = run(&["verify", s(bad), "--model", s(&model()), "--json"]);
        assert_eq!(code(&o), Some(1), "{}", stderr(&o));
        let j = json(&o);
        assert_eq!(j["ok"], false);
        assert!(j["unusable"].as_str().unwrap().contains(s(bad)), "{j}");
    }

    // A missing model is an I/O error too.
    let gone = dir.path().join("no-such-model.gguf");
    let o = run(&["verify", s(converted()), "--model", s(&gone)]);
    assert_eq!(code(&o), Some(2));
    assert_one_line_naming(&o, s(&gone));
}

#[test]
fn unsupported_tensor_type_fails_convert_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("iq4.gguf");
    // IQ4_NL (id 20): 32-element blocks of 18 bytes; opens, but ork cannot decode it.
    let iq4_nl = GgmlType::from_id(20);
    GgufBuilder::new()
        .kv("general.architecture", MetaValue::String("llama".into()))
        .tensor(
            "blk.0.ffn_up.weight",
            &[64, 32],
            iq4_nl,
            vec![0x11; 64 / 32 * 18 * 32],
        )
        .write(&src)
        .unwrap();
    let out = dir.path().join("iq4.orkpack");
    let o = run(&["convert", s(&src), "-o", s(&out)]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    // Refused by the model check before anything is packed (the store's own tests cover
    // an unsupported type naming the tensor).
    assert_one_line_naming(&o, s(&src));
    assert!(!out.exists(), "no output for a failed convert");
    assert_eq!(other_files(dir.path(), &[&src]), Vec::<String>::new());
}

/// Spawn `ork convert MODEL -o target` (one thread, so it runs long enough to interrupt).
fn spawn_convert(target: &Path) -> Child {
    ork()
        .args([
            "convert",
            s(&model()),
            "-o",
            s(target),
            "--threads",
            "1",
            "--json",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Wait until the convert writing `target` has created its temp file; `false` if the child
/// exited first.
fn wait_for_temp(child: &mut Child, target: &Path) -> bool {
    let dir = target.parent().unwrap();
    let prefix = format!(".orkpack-tmp.{}.", child.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let found = std::fs::read_dir(dir).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(&prefix)
        });
        if found {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no temp file appeared for {}", target.display());
}

#[test]
fn kill_9_during_convert_leaves_the_previous_file_or_a_complete_one() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("m.orkpack");
    std::fs::copy(converted(), &target).unwrap();
    let good = std::fs::read(&target).unwrap();

    let mut child = spawn_convert(&target);
    let interrupted = wait_for_temp(&mut child, &target);
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(interrupted, "convert finished before it could be killed");
    if status.success() {
        // Finished between the check and the kill: then the new file must be complete.
        let o = run(&["verify", s(&target), "--model", s(&model())]);
        assert_eq!(code(&o), Some(0), "{}", stdout(&o));
    } else {
        assert_eq!(
            std::fs::read(&target).unwrap(),
            good,
            "target changed by a killed convert"
        );
    }

    // kill -9 cannot be caught: the temp stays until the next writer for the target removes it.
    let tiny = dir.path().join("tiny.gguf");
    tiny_gguf(&tiny, 0.0);
    let o = run(&["convert", s(&tiny), "-o", s(&target)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(
        other_files(dir.path(), &[&target, &tiny]),
        Vec::<String>::new()
    );
}

#[test]
fn kill_9_during_a_first_convert_leaves_no_target() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("fresh.orkpack");
    let mut child = spawn_convert(&target);
    assert!(wait_for_temp(&mut child, &target));
    child.kill().unwrap();
    let status = child.wait().unwrap();
    if status.success() {
        let o = run(&["verify", s(&target), "--model", s(&model())]);
        assert_eq!(code(&o), Some(0));
    } else {
        assert!(!target.exists(), "partial file at the target after kill -9");
    }
}

#[test]
fn sigint_and_sigterm_during_convert_remove_the_temp_file() {
    use std::os::unix::process::ExitStatusExt;
    for sig in [rustix::process::Signal::INT, rustix::process::Signal::TERM] {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("m.orkpack");
        let mut child = spawn_convert(&target);
        assert!(
            wait_for_temp(&mut child, &target),
            "convert finished too early"
        );
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(sig.as_raw()),
            "dies of {sig:?}: {status}"
        );
        assert!(!target.exists(), "partial target after {sig:?}");
        assert_eq!(
            other_files(dir.path(), &[]),
            Vec::<String>::new(),
            "{sig:?}"
        );
    }
}

#[test]
fn full_disk_during_convert_exits_2_and_keeps_the_target() {
    let fs = match SmallFs::mount("8m") {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!(
                "\n!!! SKIPPED full_disk_during_convert: cannot mount a tmpfs here ({why}); \
                 ork-store's own tests cover ENOSPC with RLIMIT_FSIZE !!!\n"
            );
            return;
        }
    };
    let dir = fs.path();
    let tiny = std::env::temp_dir().join(format!("ork-cli-tiny-{}.gguf", std::process::id()));
    tiny_gguf(&tiny, 0.0);
    let target = dir.join("m.orkpack");
    let o = run(&["convert", s(&tiny), "-o", s(&target)]);
    std::fs::remove_file(&tiny).unwrap();
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let good = std::fs::read(&target).unwrap();

    // The real model's pack (~130 MiB) cannot fit in 8 MiB.
    let o = run(&["convert", s(&model()), "-o", s(&target)]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert_one_line_naming(&o, s(&target));
    assert!(
        stderr(&o).to_lowercase().contains("space"),
        "not reported as a full disk: {}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&target).unwrap(), good, "target changed");
    assert_eq!(
        other_files(dir, &[&target]),
        Vec::<String>::new(),
        "temp left"
    );
}

#[test]
fn two_concurrent_converts_to_one_path_both_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let target: PathBuf = dir.path().join("both.orkpack");
    let spawn = || {
        ork()
            .args(["convert", s(&model()), "-o", s(&target), "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for child in [a, b] {
        let o = child.wait_with_output().unwrap();
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        assert_eq!(json(&o)["tensors_packed"], 211);
    }
    let o = run(&["verify", s(&target), "--model", s(&model())]);
    assert_eq!(code(&o), Some(0), "{}", stdout(&o));
    assert_eq!(other_files(dir.path(), &[&target]), Vec::<String>::new());
}

#[test]
fn convert_json_reports_sizes_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (a, out) = (dir.path().join("a.gguf"), dir.path().join("a.orkpack"));
    tiny_gguf(&a, 0.0);
    let o = ork()
        .args(["convert", s(&a), "-o", s(&out), "--json", "--evict-src"])
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).is_empty(),
        "no progress bar with --json: {}",
        stderr(&o)
    );
    let j = json(&o);
    assert_eq!(j["evict_src"], true);
    assert_eq!(j["dtype"], "i8");
    assert_eq!(j["bytes_in"], TINY_BYTES_IN);
    assert_eq!(j["bytes_out"], TINY_BYTES_OUT);
    assert_eq!(
        j["file_bytes"].as_u64(),
        Some(std::fs::metadata(&out).unwrap().len())
    );
    let peak = j["peak_rss_bytes"].as_u64().unwrap();
    assert!(peak > 0 && peak >= j["baseline_rss_bytes"].as_u64().unwrap());
    assert!(j["peak_rss_anon_bytes"].as_u64().unwrap() > 0);

    // Default output path: MODEL with extension .orkpack.
    let o = run(&["convert", s(&a)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(dir.path().join("a.orkpack").is_file());
    assert!(
        stdout(&o).contains(&format!("{TINY_WEIGHTS} packed")),
        "{}",
        stdout(&o)
    );
}

/// `ork inspect` on a converted MoE model (the qwen3moe fixture of `ork_testkit::moe`: 6 blocks,
/// 8 experts): each 3-D expert tensor is one entry (count, bytes per expert, total) instead of
/// one per expert slice; the totals still count every slice.
#[test]
fn inspect_groups_the_expert_slices_of_a_moe_pack() {
    let m = ork_testkit::moe::moe_fixture(ork_testkit::moe::MoeFixture::Qwen3Moe);
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("moe.orkpack");
    let o = run(&["convert", s(&m), "-o", s(&pack), "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));

    let o = run(&["inspect", s(&pack), "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let j = json(&o);
    let entries = j["entries"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .all(|e| !e["name"].as_str().unwrap().contains('#')),
        "an expert slice listed alone: {j}"
    );
    let groups: Vec<_> = entries
        .iter()
        .filter(|e| e["experts"].is_object())
        .collect();
    let mut names: Vec<&str> = groups.iter().map(|g| g["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    let mut want: Vec<String> = (0..6)
        .flat_map(|l| ["gate", "up", "down"].map(|w| format!("blk.{l}.ffn_{w}_exps.weight")))
        .collect();
    want.sort_unstable();
    assert_eq!(names, want);
    for g in &groups {
        let x = &g["experts"];
        assert_eq!(
            (x["count"].as_u64(), x["first"].as_u64(), x["last"].as_u64()),
            (Some(8), Some(0), Some(7)),
            "{g}"
        );
        let per = x["blob_bytes_per_expert"].as_u64().unwrap();
        let (k, n) = (g["k"].as_u64().unwrap(), g["n"].as_u64().unwrap());
        assert_eq!(g["dtype"], "i8");
        assert_eq!(per, k * n, "{g}");
        assert_eq!(g["blob_bytes"].as_u64(), Some(8 * per), "{g}");
        assert_eq!(
            g["scale_bytes"].as_u64(),
            Some(8 * x["scale_bytes_per_expert"].as_u64().unwrap()),
            "{g}"
        );
        assert!(g["source_fingerprint"].is_null(), "{g}");
    }
    let singles = entries.len() - groups.len();
    assert!(singles > 0);
    assert_eq!(j["total_entries"].as_u64(), Some((singles + 18 * 8) as u64));
    let blob_sum: u64 = entries
        .iter()
        .map(|e| e["blob_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(j["total_blob_bytes"].as_u64(), Some(blob_sum));

    // The text form: one line per expert tensor, naming the count.
    let o = run(&["inspect", s(&pack)]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(!text.contains("exps.weight#"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("blk.0.ffn_up_exps.weight "))
        .unwrap_or_else(|| panic!("no line for blk.0.ffn_up_exps.weight: {text}"));
    assert!(line.contains("8 experts (0..=7)"), "{line}");
}
