//! `ork probe dma|stream|persist` on the emulated NPU.

use super::{code, json, run, stderr, stdout};

const MIB: u64 = 1 << 20;

#[test]
fn probe_dma_fails_where_the_board_did() {
    let o = run(&["probe", "dma", "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["count"], 63);
    assert_eq!(j["bytes"].as_u64(), Some(63 * 64 * MIB));
    let gb = j["gb"].as_f64().unwrap();
    assert!((gb - 4.23).abs() < 0.005, "{gb} GB");
    assert_eq!(j["failed_at_index"], 63);
    assert_eq!(j["error_kind"], "window_full");

    // Text form says the same.
    let o = run(&["probe", "dma", "--mode", "create-mmap"]);
    assert_eq!(code(&o), Some(0));
    let text = stdout(&o);
    assert!(
        text.contains("63 buffers") && text.contains("4.23 GB"),
        "{text}"
    );
    assert!(text.contains("failed at  #63"), "{text}");
}

#[test]
fn probe_dma_over_8_domains_holds_8_windows() {
    let o = run(&["probe", "dma", "--domains", "8", "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["count"], 8 * 63);
    assert_eq!(j["bytes"].as_u64(), Some(8 * 63 * 64 * MIB));
    let per: Vec<u64> = j["per_domain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(per, vec![63; 8]);
}

#[test]
fn probe_dma_with_more_domains_than_the_device_is_an_error() {
    let o = run(&["probe", "dma", "--domains", "17"]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("domain"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
}

#[test]
fn probe_stream_cycles_without_leaking() {
    let o = run(&["probe", "stream", "--total-gb", "1", "--mb", "64", "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["leaked_bytes"], 0);
    let cycled = j["bytes_cycled"].as_u64().unwrap();
    assert!(cycled >= 1_000_000_000, "{cycled}");
    // 1 GB in 64 MiB buffers: 15 of them, one resident at a time.
    assert_eq!(j["buffers"], 15);
    assert_eq!(cycled, 15 * 64 * MIB);
    assert_eq!(j["max_resident_bytes"].as_u64(), Some(64 * MIB));
}

#[test]
fn probe_stream_rejects_a_bad_total() {
    let o = run(&["probe", "stream", "--total-gb", "-1"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
}

#[test]
fn probe_persist_reloads_identical_bytes() {
    let o = run(&["probe", "persist", "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["identical"], true);
    assert_eq!(j["blob_bytes"].as_u64(), Some(16 * MIB));
    assert_eq!((j["k"].as_u64(), j["n"].as_u64()), (Some(4096), Some(4096)));
    assert!(j["pack_seconds"].as_f64().unwrap() > 0.0);
    assert!(j["load_seconds"].as_f64().unwrap() > 0.0);
    // The temp .orkpack is gone once the probe exits.
    let file = std::path::PathBuf::from(j["file"].as_str().unwrap());
    assert!(!file.exists(), "{} left behind", file.display());
}

#[test]
fn probe_on_a_missing_rknpu_device_says_so() {
    if std::path::Path::new("/dev/dri").exists() {
        // A machine with DRM nodes may have the NPU: the emulator-only assertions below do not
        // apply there.
        return;
    }
    let o = run(&["probe", "dma", "--device", "rknpu"]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("rknpu"), "{}", stderr(&o));
    // auto falls back to the emulator.
    let o = run(&["probe", "dma", "--device", "auto", "--mb", "1024", "--json"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(json(&o)["device"].as_str().unwrap().starts_with("emulated"));
}

/// `ORK_KERNEL` naming no kernel, or one this CPU cannot run, is refused before any work: exit
/// 2, one line naming the value and listing the kernels this CPU has. A kernel it has runs.
#[test]
fn ork_kernel_the_cpu_lacks_is_refused_with_the_available_list() {
    // An ISA of the other architecture is never available here.
    let foreign = if cfg!(target_arch = "aarch64") {
        "avx2"
    } else {
        "neon-dotprod"
    };
    for (bad, why) in [("sse9", "names no kernel"), (foreign, "cannot run")] {
        let o = super::ork()
            .env("ORK_KERNEL", bad)
            .args(["probe", "dma", "--json"])
            .output()
            .expect("the ork binary runs");
        assert_eq!(code(&o), Some(2), "{bad}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("ORK_KERNEL=\"{bad}\"")) && err.contains(why),
            "{err}"
        );
        assert!(err.contains("scalar"), "the list of kernels: {err}");
        assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    }
    let o = super::ork()
        .env("ORK_KERNEL", "scalar")
        .args(["probe", "dma", "--json"])
        .output()
        .expect("the ork binary runs");
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}
