//! Issue 32, a second hostile pass: every command refuses what `run` would refuse, reads
//! bounded input under one rule for every path, and dies of nothing (a closed stdout ends it
//! quietly, killed by SIGPIPE like other Unix tools; docs/cli.md).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufFile, MetaValue};
use ork_testkit::moe::{moe_fixture, MoeFixture};

use super::safety::{mkfifo, run_within as within};
use super::{code, converted, model, ork, stderr};

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// One line on stderr, exit 2, naming every one of `what`.
fn refused(o: &Output, what: &[&str]) {
    let err = stderr(o);
    assert_eq!(code(o), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    for w in what {
        assert!(err.contains(w), "error does not name '{w}': {err}");
    }
}

fn run_args<'a>(m: &'a Path, pack: &'a Path) -> Vec<&'a str> {
    vec![
        "run",
        "--model",
        s(m),
        "--pack",
        s(pack),
        "--prompt",
        "Hi",
        "-n",
        "2",
        "--device",
        "emu",
    ]
}

/// `ork … | head -c1`: the reader goes away; ork dies of SIGPIPE at its next write, with no
/// panic, no error line and no exit 101.
#[test]
fn a_closed_stdout_ends_every_command_quietly_by_sigpipe() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("p.orkpack");
    std::fs::copy(converted(), &pack).unwrap();
    let m = model();
    let cases: Vec<Vec<&str>> = vec![
        vec!["plan", "--model", s(&m), "--json"],
        vec!["plan", "--model", s(&m)],
        vec!["inspect", s(&pack)],
        vec!["bench", "gemm"],
        run_args(&m, &pack),
    ];
    for args in cases {
        // A pipe whose read end is closed before ork starts.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut child = ork()
            .args(&args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(300);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "{args:?} hung");
            std::thread::sleep(Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(
            o.status.signal(),
            Some(libc_sigpipe()),
            "{args:?}: {:?}, stderr: {}",
            o.status,
            stderr(&o)
        );
        let err = stderr(&o);
        assert!(
            !err.contains("panicked") && !err.contains("error") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}

/// SIGPIPE's number on Linux (every architecture ork builds for).
fn libc_sigpipe() -> i32 {
    13
}

/// `--prompt-file`, `--calib` and `perplexity --file` refuse a file above the documented limit
/// before reading it (a sparse 1 TiB file; a 1 GiB one under a 6 GiB address-space limit), and
/// a device such as /dev/zero at once: never an abort, never gigabytes read.
#[test]
fn oversized_and_endless_inputs_are_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let huge = dir.path().join("huge.txt");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let gib = dir.path().join("gib.txt");
    std::fs::File::create(&gib)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let out = dir.path().join("o.orkpack");
    let inputs = |f: &Path| -> Vec<(Vec<String>, &'static str)> {
        let f = s(f).to_owned();
        let m = s(&m).to_owned();
        let v = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        vec![
            (
                v(&["run", "--model", &m, "--prompt-file", &f, "-n", "1"]),
                "--prompt-file",
            ),
            (v(&["perplexity", "--model", &m, "--file", &f]), "--file"),
            (
                v(&["convert", &m, "-o", s(&out), "--calib", &f]),
                "calibration file",
            ),
        ]
    };
    for f in [&huge, &gib] {
        for (args, flag) in inputs(f) {
            let o = within(ork().args(&args), 60);
            refused(&o, &[flag, s(f), "limit"]);
        }
    }
    // The same under an address-space limit of 6 GiB: refused, not aborted.
    for (args, flag) in inputs(&gib) {
        let script = format!(
            "ulimit -v 6291456 && exec {} {}",
            env!("CARGO_BIN_EXE_ork"),
            args.join(" ")
        );
        let o = within(Command::new("sh").args(["-c", &script]), 60);
        refused(&o, &[flag, "limit"]);
    }
    for (args, flag) in inputs(Path::new("/dev/zero")) {
        let o = within(ork().args(&args), 60);
        refused(&o, &[flag, "/dev/zero", "character device"]);
    }
    assert!(!out.exists());
}

/// A FIFO as `--calib`, `perplexity --file`, `--prompt-file`, `serve --chat-template-file` or
/// `ORK_RKNN_LIB` (run and doctor) is refused at once, as a FIFO `--model` or `--pack` is, naming the file.
#[test]
fn a_fifo_is_refused_at_once_wherever_a_path_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("f");
    mkfifo(&fifo);
    let m = model();
    let out = dir.path().join("o.orkpack");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "--model", s(&m), "--prompt-file", s(&fifo)],
            "--prompt-file",
        ),
        (
            vec!["perplexity", "--model", s(&m), "--file", s(&fifo)],
            "--file",
        ),
        (
            vec!["convert", s(&m), "-o", s(&out), "--calib", s(&fifo)],
            "calibration file",
        ),
        (
            vec![
                "serve",
                "--model",
                s(&m),
                "--port",
                "0",
                "--chat-template-file",
                s(&fifo),
            ],
            "--chat-template-file",
        ),
    ];
    for (args, flag) in cases {
        let o = within(ork().args(&args), 60);
        refused(&o, &[flag, s(&fifo), "FIFO"]);
    }
    let pack = dir.path().join("r.orkpack");
    let mut args = run_args(&m, &pack);
    let n = args.len();
    args[n - 1] = "rknn";
    let o = within(ork().args(&args).env("ORK_RKNN_LIB", &fifo), 60);
    refused(&o, &[s(&fifo), "FIFO"]);
    let o = within(ork().arg("doctor").env("ORK_RKNN_LIB", &fifo), 60);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let out_text = String::from_utf8_lossy(&o.stdout);
    assert!(out_text.contains("FIFO"), "{out_text}");
}

/// A mutant of `src` written to `dir/name`: the tensors `keep` accepts, metadata overridden.
fn mutant(
    dir: &Path,
    name: &str,
    src: &Path,
    keep: impl Fn(&str) -> bool,
    overrides: &[(&str, MetaValue)],
) -> PathBuf {
    let file = GgufFile::open(src).unwrap();
    let path = dir.join(name);
    GgufBuilder::from_file(&file, keep, overrides)
        .write(&path)
        .unwrap();
    path
}

/// `plan` refuses exactly what `convert` and `run` refuse (one validation, shared): models
/// that cannot run and MoE mutants exit 2 on all three, with one line naming the problem, and
/// `convert` writes nothing.
#[test]
fn plan_refuses_every_model_that_run_and_convert_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let moe = moe_fixture(MoeFixture::Identical);
    let all = |_: &str| true;
    let cases = [
        (
            mutant(
                dir.path(),
                "no-embd.gguf",
                &m,
                |n| n != "token_embd.weight",
                &[],
            ),
            "token_embd",
        ),
        (
            mutant(
                dir.path(),
                "blocks.gguf",
                &m,
                all,
                &[("llama.block_count", MetaValue::U32(1_000_000))],
            ),
            "block",
        ),
        (
            mutant(
                dir.path(),
                "arch.gguf",
                &m,
                all,
                &[("general.architecture", MetaValue::String("gpt2".into()))],
            ),
            "gpt2",
        ),
        (
            mutant(
                dir.path(),
                "used0.gguf",
                &moe,
                all,
                &[("llama.expert_used_count", MetaValue::U32(0))],
            ),
            "expert",
        ),
        (
            mutant(
                dir.path(),
                "norouter.gguf",
                &moe,
                |n| n != "blk.3.ffn_gate_inp.weight",
                &[],
            ),
            "ffn_gate_inp",
        ),
        // A block past block_count (llama.cpp refuses the file: a tensor no layer reads), and
        // no rotary dimensions at all (llama.cpp's llama wants them equal to the head size).
        (
            mutant(
                dir.path(),
                "stray.gguf",
                &m,
                all,
                &[("llama.block_count", MetaValue::U32(29))],
            ),
            "block 29 is past the file's llama.block_count 29",
        ),
        (
            mutant(
                dir.path(),
                "rope0.gguf",
                &m,
                all,
                &[("llama.rope.dimension_count", MetaValue::U32(0))],
            ),
            "llama.rope.dimension_count",
        ),
        // Not implemented, so refused rather than ignored (docs/models.md): a YaRN setting and
        // a fused q/k/v weight (implemented for phi3 only).
        (
            mutant(
                dir.path(),
                "yarn.gguf",
                &m,
                all,
                &[(
                    "llama.rope.scaling.yarn_log_multiplier",
                    MetaValue::F32(0.1),
                )],
            ),
            "llama.rope.scaling.yarn_log_multiplier",
        ),
        (
            {
                let path = dir.path().join("qkv.gguf");
                GgufBuilder::from_file(&GgufFile::open(&m).unwrap(), all, &[])
                    .tensor_f32("blk.0.attn_qkv.weight", &[32], GgmlType::F32, &[1.0; 32])
                    .unwrap()
                    .write(&path)
                    .unwrap();
                path
            },
            "blk.0.attn_qkv.weight",
        ),
    ];
    for (bad, what) in &cases {
        let o = within(ork().args(["plan", "--model", s(bad)]), 120);
        refused(&o, &[s(bad), what]);
        let o = within(ork().args(["plan", "--model", s(bad), "--json"]), 120);
        assert_eq!(code(&o), Some(2), "{}", stderr(&o));
        let out = dir.path().join("m.orkpack");
        let o = within(ork().args(["convert", s(bad), "-o", s(&out)]), 120);
        refused(&o, &[s(bad), what]);
        assert!(!out.exists(), "convert wrote a pack of {}", bad.display());
        let o = within(ork().args(run_args(bad, &out)), 120);
        refused(&o, &[s(bad), what]);
    }
}

/// An 8-expert llama MoE as w4a16-g32 on the RK3576: the router (N = 8) fails the chip's N
/// alignment of the offsets matmul. `plan`, `convert` and `run` refuse it before anything is
/// converted, naming the weight and the limit; a precision the router fits still plans.
#[test]
fn a_weight_the_chip_cannot_run_is_refused_before_converting() {
    let dir = tempfile::tempdir().unwrap();
    let moe = moe_fixture(MoeFixture::Identical);
    let quant = ["--soc", "rk3576", "--quant", "w4a16-g32"];
    let mut plan = vec!["plan", "--model", s(&moe)];
    plan.extend(quant);
    let o = within(ork().args(&plan), 120);
    refused(&o, &["ffn_gate_inp", "N must be a multiple of", "rk3576"]);
    let out = dir.path().join("moe.orkpack");
    let mut convert = vec!["convert", s(&moe), "-o", s(&out)];
    convert.extend(quant);
    let o = within(ork().args(&convert), 120);
    refused(&o, &["ffn_gate_inp", "N must be a multiple of"]);
    assert!(!out.exists());
    let mut run = run_args(&moe, &out);
    run.extend(quant);
    let o = within(ork().args(&run), 120);
    refused(&o, &["ffn_gate_inp", "N must be a multiple of"]);
    assert!(!out.exists());
    let o = within(ork().args(["plan", "--model", s(&moe)]), 120);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

/// A pack whose scale is 3e38 with every checksum recomputed: plain `verify` names the entry
/// (exit 1), and a run rebuilds the pack, saying why, and gives the clean text.
#[test]
fn a_pack_with_absurd_scales_fails_verify_and_is_rebuilt_by_run() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("s.orkpack");
    std::fs::copy(converted(), &pack).unwrap();
    let m = model();
    let go = |pack: &Path| {
        let mut args = run_args(&m, pack);
        args.push("--json");
        within(ork().args(&args), 300)
    };
    let clean = go(&pack);
    assert_eq!(code(&clean), Some(0), "{}", stderr(&clean));
    let tensor = "blk.0.attn_q.weight";
    ork_testkit::forge::set_scale(&pack, tensor, 3, 3e38);
    let verify = |pack: &Path| within(ork().args(["verify", s(pack), "--model", s(&m)]), 120);
    let o = verify(&pack);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(all.contains(tensor), "verify does not name {tensor}: {all}");
    let rebuilt = go(&pack);
    assert_eq!(code(&rebuilt), Some(0), "{}", stderr(&rebuilt));
    let err = stderr(&rebuilt);
    assert!(err.contains("rebuilt") && err.contains(tensor), "{err}");
    assert_eq!(super::json(&rebuilt)["text"], super::json(&clean)["text"]);
    let o = verify(&pack);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

/// A calibration text shorter than smoothing needs is refused, naming the minimum.
#[test]
fn a_calibration_text_too_short_is_refused_naming_the_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let calib = dir.path().join("c.txt");
    std::fs::write(&calib, "x").unwrap();
    let out = dir.path().join("o.orkpack");
    let o = within(
        ork().args(["convert", s(&model()), "-o", s(&out), "--calib", s(&calib)]),
        120,
    );
    let min = format!("at least {} tokens", ork_runtime::CALIB_MIN_TOKENS);
    refused(&o, &[s(&calib), &min]);
    assert!(!out.exists());
}

/// The string literal starting at `src[at]` (a `"`), with `\`-newline continuations applied as
/// Rust applies them (the newline and the next line's leading whitespace dropped).
fn literal(src: &str, at: usize) -> Option<String> {
    let mut out = String::new();
    let mut chars = src[at + 1..].chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                '\n' => {
                    while chars.peek().is_some_and(|c| c.is_whitespace()) {
                        chars.next();
                    }
                }
                e => {
                    out.push('\\');
                    out.push(e);
                }
            },
            c => out.push(c),
        }
    }
    None
}

/// No error message of any crate holds a run of spaces or a raw line break (a wrapped string
/// literal that lost its `\` continuation: "needs at least          27.0 MiB").
#[test]
fn no_error_message_holds_a_run_of_spaces() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut bad = Vec::new();
    let mut files = 0;
    for krate in std::fs::read_dir(&root).unwrap() {
        let src = krate.unwrap().path().join("src");
        let mut stack = vec![src];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                if p.extension().is_none_or(|x| x != "rs") {
                    continue;
                }
                files += 1;
                let text = std::fs::read_to_string(&p).unwrap();
                for marker in ["#[error(", "bail!(", "anyhow!(", "anyhow::anyhow!("] {
                    for (i, _) in text.match_indices(marker) {
                        let rest = &text[i + marker.len()..];
                        let Some(q) = rest.find(|c: char| !c.is_whitespace()) else {
                            continue;
                        };
                        if !rest[q..].starts_with('"') {
                            continue;
                        }
                        let Some(lit) = literal(&text, i + marker.len() + q) else {
                            continue;
                        };
                        if lit.contains("  ") || lit.contains('\n') {
                            bad.push(format!("{}: {lit:?}", p.display()));
                        }
                    }
                }
            }
        }
    }
    assert!(
        files > 50,
        "scanned only {files} files under {}",
        root.display()
    );
    assert!(
        bad.is_empty(),
        "messages with runs of spaces:\n{}",
        bad.join("\n")
    );
}

/// scripts/bench_vs_llama.py on a fresh clone: no `.cache/` yet. Its warm-up builds the pack
/// under `.cache/` of the working directory (whatever happens after, without llama.cpp).
#[test]
fn the_benchmark_script_makes_its_cache_directory() {
    let dir = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench_vs_llama.py");
    let o = within(
        Command::new("python3")
            .current_dir(dir.path())
            .arg(&script)
            .arg(model())
            .args(["--rounds", "1", "--decode", "1", "--repeat", "1"])
            .args(["--ork", env!("CARGO_BIN_EXE_ork")]),
        300,
    );
    assert!(
        dir.path().join(".cache/bench-w8a8.orkpack").is_file(),
        "no pack under .cache/: {}",
        stderr(&o)
    );
}

/// Outputs follow one rule (docs/cli.md): `--trace` naming the model (under another spelling,
/// or a symlink to it) or a FIFO with no reader is refused before any work, in one line, and
/// the model is left as it was.
#[test]
fn an_output_never_replaces_the_model_and_a_fifo_without_reader_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let before = std::fs::metadata(&m).unwrap().len();
    let link = dir.path().join("model-link.gguf");
    std::os::unix::fs::symlink(&m, &link).unwrap();
    let fifo = dir.path().join("trace-fifo");
    mkfifo(&fifo);
    let pack = dir.path().join("t.orkpack");
    for (target, what) in [
        (m.clone(), "an input"),
        (link.clone(), "an input"),
        (fifo.clone(), "no reader"),
    ] {
        let mut args = run_args(&m, &pack);
        args.extend(["--trace", s(&target)]);
        let o = within(ork().args(&args), 60);
        refused(&o, &["--trace", s(&target), what]);
    }
    assert_eq!(std::fs::metadata(&m).unwrap().len(), before);
    assert!(
        !pack.exists(),
        "the run went ahead before refusing the trace path"
    );
}

/// Issue 39: a chat template that doubles a string forty times asks for a terabyte in a few
/// hundred instructions, under the fuel and before any output. `ork` renders in a child whose
/// memory the kernel bounds (ork_exec::chat_worker): exit 2 naming the bound, in seconds, and
/// the same model with a plain template still chats.
#[test]
fn a_doubling_template_is_stopped_by_the_render_memory_bound() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let key = "tokenizer.chat_template";
    let bomb = r#"{% set ns = namespace(s="y") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"#;
    let plain = r#"{% for m in messages %}<|im_start|>{{ m.role }}{{ "\n" ~ m.content }}<|im_end|>{% endfor %}<|im_start|>assistant"#;
    for (name, template) in [("bomb.gguf", bomb), ("plain.gguf", plain)] {
        let path = mutant(
            dir.path(),
            name,
            &m,
            |_| true,
            &[(key, MetaValue::String(template.into()))],
        );
        let args = [
            "run",
            "--model",
            s(&path),
            "--chat",
            "--prompt",
            "Hi",
            "-n",
            "1",
        ];
        let start = Instant::now();
        let o = within(ork().args(args), 120);
        if template == bomb {
            refused(&o, &["chat template stopped", "MiB of memory"]);
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{:?}",
                start.elapsed()
            );
        } else {
            assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        }
    }
}
