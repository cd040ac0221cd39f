//! Issue 9 from the user's side: ork never destroys a file it does not own, never dies of a
//! signal when a file changes under it, never hangs or aborts on odd input, and refuses
//! absurd numbers instead of reinterpreting them.

use std::os::unix::fs::symlink;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use super::{code, converted, json, model, ork, run, stderr, stdout};

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// A private copy of the real model in a fresh directory (tests may try to destroy it).
fn model_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.gguf");
    std::fs::copy(model(), &m).unwrap();
    (dir, m)
}

/// Run with a deadline: a hang is a failure, not a stuck test.
pub(crate) fn run_within(cmd: &mut std::process::Command, secs: u64) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ork hung for {secs} s: {cmd:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn run_args(m: &Path, pack: &str) -> Vec<String> {
    [
        "run",
        "--model",
        s(m),
        "--pack",
        pack,
        "--prompt",
        "Hi",
        "-n",
        "2",
        "--device",
        "emu",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

pub(crate) fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

#[test]
fn the_model_survives_every_spelling_as_the_pack_target() {
    let (dir, m) = model_copy();
    let original_len = std::fs::metadata(&m).unwrap().len();
    let head = std::fs::read(&m).unwrap()[..4096].to_vec();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    symlink(&m, dir.path().join("link.orkpack")).unwrap();
    std::fs::hard_link(&m, dir.path().join("hard.orkpack")).unwrap();
    let spellings = [
        "./m.gguf",
        "m.gguf",
        "sub/../m.gguf",
        "link.orkpack",
        "hard.orkpack",
    ];
    let unchanged = |what: &str| {
        let now = std::fs::read(&m).unwrap();
        assert_eq!(
            now.len() as u64,
            original_len,
            "{what}: model length changed"
        );
        assert_eq!(&now[..4096], &head[..], "{what}: model overwritten");
    };
    for sp in spellings {
        let abs = dir.path().join(sp);
        for pack in [sp.to_string(), s(&abs).to_string()] {
            let o = ork()
                .current_dir(dir.path())
                .args(run_args(Path::new("m.gguf"), &pack))
                .output()
                .unwrap();
            assert_eq!(code(&o), Some(2), "run --pack {pack}: {}", stderr(&o));
            unchanged(&pack);
            let o = ork()
                .current_dir(dir.path())
                .args(["convert", "m.gguf", "-o", &pack])
                .output()
                .unwrap();
            assert_eq!(code(&o), Some(2), "convert -o {pack}: {}", stderr(&o));
            unchanged(&pack);
        }
        // ORK_PERSIST names it.
        let mut args = run_args(&m, "x");
        args.drain(3..5); // no --pack
        let o = ork()
            .current_dir(dir.path())
            .env("ORK_PERSIST", sp)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(code(&o), Some(2), "ORK_PERSIST={sp}: {}", stderr(&o));
        unchanged(sp);
    }
    // A model whose own name ends in .orkpack, with the default pack path (MODEL.orkpack).
    let odd = dir.path().join("model.orkpack");
    std::fs::rename(&m, &odd).unwrap();
    let mut args = run_args(&odd, "x");
    args.drain(3..5);
    let o = ork().args(&args).output().unwrap();
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    std::fs::rename(&odd, &m).unwrap();
    unchanged("model.orkpack");
}

#[test]
fn files_that_are_not_packs_are_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let o = ork().args(run_args(&model(), s(&notes))).output().unwrap();
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(s(&notes)), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");
    // /dev/null is a device: refused, never replaced.
    let o = ork()
        .args(run_args(&model(), "/dev/null"))
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device_like());
}

trait CharDevice {
    fn is_char_device_like(&self) -> bool;
}
impl CharDevice for std::fs::FileType {
    fn is_char_device_like(&self) -> bool {
        std::os::unix::fs::FileTypeExt::is_char_device(self)
    }
}

#[test]
fn a_symlinked_pack_stays_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.orkpack");
    std::fs::copy(converted(), &real).unwrap();
    let link = dir.path().join("link.orkpack");
    symlink(&real, &link).unwrap();
    let o = run(&["convert", s(&model()), "-o", s(&link), "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let o = run(&["verify", s(&real), "--model", s(&model())]);
    assert_eq!(code(&o), Some(0), "{}", stdout(&o));
}

#[test]
fn fifos_and_directories_are_refused_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("f.gguf");
    mkfifo(&fifo);
    let o = run_within(ork().args(run_args(&fifo, "x.orkpack")), 60);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("FIFO"), "{}", stderr(&o));
    let pfifo = dir.path().join("p.orkpack");
    mkfifo(&pfifo);
    let o = run_within(ork().args(run_args(&model(), s(&pfifo))), 60);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    let o = run_within(ork().args(["inspect", s(&pfifo)]), 60);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    let o = run_within(ork().args(run_args(dir.path(), "x.orkpack")), 60);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("directory"), "{}", stderr(&o));
}

#[test]
fn absurd_numbers_are_refused_not_reinterpreted() {
    let m = model();
    let m = s(&m);
    let base = ["--model", m, "--prompt", "Hi", "--device", "emu"];
    let cases: Vec<Vec<&str>> = vec![
        vec!["plan", "--model", m, "--window-mb", "0"],
        vec!["plan", "--model", m, "--domains", "0"],
        vec!["plan", "--model", m, "--domains", "17"],
        vec!["plan", "--model", m, "--budget-mb", "18446744073709551615"],
        [&["run", "--threads", "0"][..], &base].concat(),
        [&["run", "--domains", "0"][..], &base].concat(),
        [&["run", "--domains", "17"][..], &base].concat(),
        [&["run", "-n", "18446744073709551615"][..], &base].concat(),
        [&["run", "--budget-mb", "0"][..], &base].concat(),
        vec!["perplexity", "--model", m, "--file", m, "--chunks", "0"],
        vec![
            "perplexity",
            "--model",
            m,
            "--file",
            m,
            "--ctx",
            "9223372036854775808",
        ],
        vec!["bench", "stream", "--model", m, "--rounds", "0"],
        vec!["probe", "stream", "--mb", "100000000"],
        vec!["probe", "stream", "--mb", "5000"],
        vec!["probe", "stream", "--total-gb", "inf"],
        vec!["probe", "persist", "--mb", "5000"],
        vec!["probe", "dma", "--domains", "0"],
    ];
    for args in &cases {
        let o = run_within(ork().args(args), 60);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?}: {}", stdout(&o));
    }
    let o = run_within(
        ork()
            .env("ORK_WCACHE_BUDGET_MB", "18446744073709551615")
            .args(["plan", "--model", m]),
        60,
    );
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("ORK_WCACHE_BUDGET_MB"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_plan_that_cannot_run_names_the_short_limit_and_exits_1() {
    let m = model();
    let plan = |extra: &[&str]| {
        let o = run_within(ork().args(["plan", "--model", s(&m)]).args(extra), 60);
        (code(&o), stdout(&o), o)
    };
    // SmolLM2's largest weight (the embedding, tied as the output) is 27 MiB packed.
    for (extra, says, not) in [
        (
            &["--budget-mb", "10"][..],
            "the budget (10 MiB) must hold",
            "the window",
        ),
        (
            &["--window-mb", "20", "--budget-mb", "100"][..],
            "the window (20 MiB) must hold",
            "the budget (",
        ),
        (
            &["--window-mb", "20", "--budget-mb", "10"][..],
            "the budget (10 MiB) and the window (20 MiB) must hold",
            "RESIDENT",
        ),
    ] {
        let (c, out, o) = plan(extra);
        assert_eq!(c, Some(1), "{extra:?}: {}", stderr(&o));
        assert!(out.contains(&format!("NOT RUNNABLE: {says}")), "{out}");
        assert!(!out.contains(not), "{out}");
    }
    // --json says so too, with the same exit code; a plan that runs exits 0.
    let (c, _, o) = plan(&["--budget-mb", "10", "--json"]);
    assert_eq!(c, Some(1), "{}", stderr(&o));
    assert_eq!(json(&o)["runnable"], false);
    let (c, out, _) = plan(&["--budget-mb", "40"]);
    assert_eq!(c, Some(0), "{out}");
}

#[test]
fn an_unwritable_pack_location_runs_from_memory_with_a_warning() {
    // /proc/self is a directory nobody can create files in, not even root.
    let m = model();
    let o = run_within(
        ork()
            .args(run_args(&m, "/proc/self/x.orkpack"))
            .args(["--json"]),
        300,
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning"), "{}", stderr(&o));
    assert!(json(&o)["text"].is_string());
}

#[test]
fn an_unwritable_trace_is_reported_before_generating() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = run_args(&model(), s(&dir.path().join("p.orkpack")));
    args.extend([
        "--trace".into(),
        s(&dir.path().join("no/such/dir/t.json")).into(),
    ]);
    let o = run_within(ork().args(&args), 300);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stdout(&o).is_empty(),
        "generated before failing: {}",
        stdout(&o)
    );
    assert!(
        !dir.path().join("p.orkpack").exists(),
        "packed before failing"
    );
}

/// Truncate both mapped files under running streamed generations: never a signal death; exit 0
/// with the right text, or exit 2 with one line naming the file.
#[test]
fn truncating_model_and_pack_under_a_streamed_run_never_kills_ork() {
    let (dir, m) = model_copy();
    let pack = dir.path().join("m.orkpack");
    let golden = {
        let o = run(&[
            "run",
            "--model",
            s(&m),
            "--pack",
            s(&pack),
            "--prompt",
            "The capital of France is",
            "-n",
            "24",
            "--budget-mb",
            "40",
            "--device",
            "emu",
            "--json",
        ]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        json(&o)["text"].as_str().unwrap().to_owned()
    };
    let (m_bytes, p_bytes) = (std::fs::read(&m).unwrap(), std::fs::read(&pack).unwrap());
    let mut outcomes = (0, 0);
    for trial in 0..20u64 {
        std::fs::write(&m, &m_bytes).unwrap();
        std::fs::write(&pack, &p_bytes).unwrap();
        let child = ork()
            .args([
                "run",
                "--model",
                s(&m),
                "--pack",
                s(&pack),
                "--prompt",
                "The capital of France is",
                "-n",
                "24",
                "--budget-mb",
                "40",
                "--device",
                "emu",
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200 + trial * 150));
        // In place, as `truncate -s` or a shell `>` would: the inodes stay mapped.
        let cut = |p: &Path, len: usize| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len((len / 3) as u64)
                .unwrap()
        };
        // Odd trials cut only the pack: its weights are then repacked from the model and the
        // run must finish with the right text.
        cut(&pack, p_bytes.len());
        if trial % 2 == 0 {
            cut(&m, m_bytes.len());
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.signal(), None, "trial {trial}: killed by a signal");
        match code(&o) {
            Some(0) => {
                assert_eq!(
                    json(&o)["text"],
                    golden.as_str(),
                    "trial {trial}: wrong text"
                );
                outcomes.0 += 1;
            }
            Some(2) => {
                let err = stderr(&o);
                assert!(
                    err.contains(s(&m)) || err.contains(s(&pack)),
                    "trial {trial}: error names neither file: {err}"
                );
                if outcomes.1 == 0 {
                    eprintln!("first clean stop: {err}");
                }
                outcomes.1 += 1;
            }
            other => panic!("trial {trial}: exit {other:?}: {}", stderr(&o)),
        }
    }
    eprintln!(
        "truncation trials: {} finished, {} stopped cleanly",
        outcomes.0, outcomes.1
    );
}

#[test]
fn run_says_why_it_rebuilds_a_pack() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("r.orkpack");
    let m = model();
    let go = |extra: &[&str]| {
        let mut args = run_args(&m, s(&pack));
        args.extend(extra.iter().map(|a| a.to_string()));
        let o = ork().args(&args).output().unwrap();
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        stderr(&o)
    };
    let first = go(&[]);
    assert!(
        !first.contains("rebuilt"),
        "a first build is not a rebuild: {first}"
    );
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[4096 + 100] ^= 0x5a;
    std::fs::write(&pack, &bytes).unwrap();
    let err = go(&[]);
    assert!(err.contains("rebuilt") && err.contains("corrupt"), "{err}");
    let err = go(&["--dtype", "i4", "--soc", "rk3576"]);
    assert!(err.contains("rebuilt") && err.contains("dtype"), "{err}");
    std::fs::write(&pack, &bytes[..bytes.len() / 2]).unwrap();
    let err = go(&["--dtype", "i4", "--soc", "rk3576"]);
    assert!(
        err.contains("rebuilt") && err.contains("truncated"),
        "{err}"
    );
    let quiet = go(&["--dtype", "i4", "--soc", "rk3576"]);
    assert!(!quiet.contains("rebuilt"), "nothing to rebuild: {quiet}");
}

/// An error line names each cause once: no `: `-separated part of it is repeated (the causes of
/// library errors often already carry their source's text), and it is one line.
#[test]
fn error_causes_are_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let truncated = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(model()).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let garbage = dir.path().join("garbage.orkpack");
    std::fs::write(&garbage, b"not a pack at all, only words").unwrap();
    let missing = dir.path().join("missing.gguf");
    let out = dir.path().join("o.orkpack");
    let cases: Vec<Vec<&str>> = vec![
        vec!["run", "--model", s(&missing), "--prompt", "Hi", "-n", "1"],
        vec!["run", "--model", s(dir.path()), "--prompt", "Hi", "-n", "1"],
        vec!["inspect", s(&truncated)],
        vec!["verify", s(&garbage)],
        vec!["convert", s(&truncated), "-o", s(&out)],
    ];
    for args in cases {
        let o = run(&args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: one error line expected:\n{err}");
        let parts: Vec<&str> = lines[0]
            .split(": ")
            .map(str::trim)
            .filter(|p| p.len() >= 12)
            .collect();
        for (i, p) in parts.iter().enumerate() {
            assert!(
                !parts[i + 1..].contains(p),
                "{args:?}: cause {p:?} printed twice in {:?}",
                lines[0]
            );
        }
    }
}
